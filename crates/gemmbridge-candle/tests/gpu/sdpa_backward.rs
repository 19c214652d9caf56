//! The backward of `sdpa` through candle's autograd on a GPU (cuDNN's fused attention
//! backward on candle's buffers and stream): the checks of `cpu_sdpa_backward.rs` on
//! `Device::new_cuda(0)`, with the adapter's outputs filled with NaN first
//! (`set_poison_outputs`), so that an element left unwritten fails. Each test needs a CUDA GPU:
//! `cargo test -p gemmbridge-candle --features cuda --test gpu -- --include-ignored`.

use candle_core::{DType, Device, Result};

use crate::common::rng;
use crate::sdpa_grad::{
    cases, check_case, check_fallback, check_fused_qkv, check_one_tensor_as_q_k_v, check_sum_twice,
};

/// GPU 0, with the adapter's outputs poisoned.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda(0)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_backward_against_float64_and_candles_autograd() -> Result<()> {
    let mut rng = rng("gpu_sdpa_backward_against_float64_and_candles_autograd");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        for case in cases() {
            check_case(&mut rng, case, dtype, &dev)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_backward_of_views_into_one_fused_qkv_buffer() -> Result<()> {
    let mut rng = rng("gpu_sdpa_backward_of_views_into_one_fused_qkv_buffer");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        check_fused_qkv(&mut rng, dtype, &dev)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_backward_of_a_sum_twice_through_one_input() -> Result<()> {
    let mut rng = rng("gpu_sdpa_backward_of_a_sum_twice_through_one_input");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        check_sum_twice(&mut rng, dtype, &dev)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_backward_of_one_tensor_as_q_k_v() -> Result<()> {
    let mut rng = rng("gpu_sdpa_backward_of_one_tensor_as_q_k_v");
    let dev = gpu()?;
    for dtype in [DType::BF16, DType::F16] {
        check_one_tensor_as_q_k_v(&mut rng, dtype, &dev)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_fallback_backward_is_candles_autograd() -> Result<()> {
    let mut rng = rng("gpu_sdpa_fallback_backward_is_candles_autograd");
    check_fallback(&mut rng, &gpu()?)
}
