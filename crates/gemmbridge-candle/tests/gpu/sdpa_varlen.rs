//! `sdpa_varlen` on a GPU (cuDNN's flash-attention engines with their padding mask, on
//! candle's buffers and stream): the checks of `cpu_sdpa_varlen.rs` on `Device::new_cuda(0)`,
//! the adapter's outputs filled with NaN first (`set_poison_outputs`) so that an element left
//! unwritten fails, against float64 and against `sdpa_varlen_candle` on the GPU. Each test
//! needs a CUDA GPU: `cargo test -p gemmbridge-candle --features cuda --test gpu --
//! --include-ignored sdpa_varlen`.

#[path = "../common/varlen.rs"]
mod varlen;

use candle_core::{DType, Device, Result};
use varlen::{cases, check_bad_inputs, check_case, check_host_and_tensor_lengths, check_paths};

use crate::common::rng;

/// GPU 0, with the adapter's outputs poisoned.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda(0)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_varlen_forward_and_backward_against_float64() -> Result<()> {
    let mut rng = rng("gpu_sdpa_varlen_forward_and_backward_against_float64");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        for (i, case) in cases().iter().enumerate() {
            check_case(&mut rng, case, dtype, &dev, i % 2 == 1)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_varlen_lengths_on_the_host_or_in_a_tensor() -> Result<()> {
    let mut rng = rng("gpu_sdpa_varlen_lengths_on_the_host_or_in_a_tensor");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        check_host_and_tensor_lengths(&mut rng, dtype, &dev)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_varlen_paths_copy_and_fall_back() -> Result<()> {
    check_paths(&mut rng("gpu_sdpa_varlen_paths_copy_and_fall_back"), &gpu()?)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_varlen_bad_inputs_are_named_errors() -> Result<()> {
    check_bad_inputs(&gpu()?)
}
