//! `sdpa_varlen` on the CPU (gemmbridge's CPU attention on the padded batch the CUDA path is
//! given): the output and the gradients through candle's autograd against float64 per
//! sequence and beside candle's autograd through `sdpa_varlen_candle`, bf16 and f16, uneven
//! batches with empty and one-row sequences, grouped heads, every mask; the paths taken; every
//! bad input.

mod common;
#[path = "common/varlen.rs"]
mod varlen;

use candle_core::{DType, Device, Result};
use common::rng;
use varlen::{cases, check_bad_inputs, check_case, check_host_and_tensor_lengths, check_paths};

#[test]
fn sdpa_varlen_forward_and_backward_against_float64() -> Result<()> {
    let mut rng = rng("sdpa_varlen_forward_and_backward_against_float64");
    for dtype in [DType::BF16, DType::F16] {
        for (i, case) in cases().iter().enumerate() {
            check_case(&mut rng, case, dtype, &Device::Cpu, i % 2 == 0)?;
        }
    }
    Ok(())
}

#[test]
fn sdpa_varlen_lengths_on_the_host_or_in_a_tensor() -> Result<()> {
    let mut rng = rng("sdpa_varlen_lengths_on_the_host_or_in_a_tensor");
    for dtype in [DType::BF16, DType::F16] {
        check_host_and_tensor_lengths(&mut rng, dtype, &Device::Cpu)?;
    }
    Ok(())
}

#[test]
fn sdpa_varlen_paths_copy_and_fall_back() -> Result<()> {
    check_paths(&mut rng("sdpa_varlen_paths_copy_and_fall_back"), &Device::Cpu)
}

#[test]
fn sdpa_varlen_bad_inputs_are_named_errors() -> Result<()> {
    check_bad_inputs(&Device::Cpu)
}

/// Bounds far above the batch's sequences pad to the longest sequence (rounded up to a power of
/// two), not to the bounds: the same bits as tight bounds, served, and no giant allocation.
#[test]
fn sdpa_varlen_loose_bounds_pad_to_the_batch() -> Result<()> {
    let mut rng = rng("sdpa_varlen_loose_bounds_pad_to_the_batch");
    let dev = Device::Cpu;
    let q = common::random(&mut rng, &[10, 4, 16], DType::BF16, &dev)?;
    let k = common::random(&mut rng, &[12, 2, 16], DType::BF16, &dev)?;
    let v = common::random(&mut rng, &[12, 2, 16], DType::BF16, &dev)?;
    let (cq, ckv) = ([0u32, 3, 10], [0u32, 5, 12]);
    let run = |mq: usize, mkv: usize| {
        gemmbridge_candle::sdpa_varlen_served(&q, &k, &v, &cq, &ckv, mq, mkv, gemmbridge_candle::Causal::TopLeft, None)
    };
    let (tight, served) = run(7, 7)?;
    assert_eq!(served, gemmbridge_candle::Served::Gemmbridge);
    let start = std::time::Instant::now();
    let (loose, served) = run(1 << 22, 1 << 22)?;
    assert_eq!(served, gemmbridge_candle::Served::Gemmbridge);
    assert!(start.elapsed().as_secs_f64() < 5.0, "loose bounds took {:?}", start.elapsed());
    assert_eq!(common::f64s(&tight)?, common::f64s(&loose)?);
    Ok(())
}
