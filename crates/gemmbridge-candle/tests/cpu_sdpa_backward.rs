//! The backward of `sdpa` through candle's autograd on the CPU (gemmbridge's CPU attention
//! backward, on the description the CUDA path is given): `dq`, `dk`, `dv` against float64 by
//! the definition and beside candle's autograd through `sdpa_candle`, bf16 and f16, at odd
//! shapes and on views.

mod common;
#[path = "common/sdpa_grad.rs"]
mod sdpa_grad;

use candle_core::{DType, Device, Result};
use common::rng;
use sdpa_grad::{cases, check_case, check_fallback, check_fused_qkv, check_one_tensor_as_q_k_v, check_sum_twice};

#[test]
fn sdpa_backward_against_float64_and_candles_autograd() -> Result<()> {
    let mut rng = rng("sdpa_backward_against_float64_and_candles_autograd");
    for dtype in [DType::BF16, DType::F16] {
        for case in cases() {
            check_case(&mut rng, case, dtype, &Device::Cpu)?;
        }
    }
    Ok(())
}

#[test]
fn sdpa_backward_of_views_into_one_fused_qkv_buffer() -> Result<()> {
    let mut rng = rng("sdpa_backward_of_views_into_one_fused_qkv_buffer");
    for dtype in [DType::BF16, DType::F16] {
        check_fused_qkv(&mut rng, dtype, &Device::Cpu)?;
    }
    Ok(())
}

#[test]
fn sdpa_backward_of_a_sum_twice_through_one_input() -> Result<()> {
    let mut rng = rng("sdpa_backward_of_a_sum_twice_through_one_input");
    for dtype in [DType::BF16, DType::F16] {
        check_sum_twice(&mut rng, dtype, &Device::Cpu)?;
    }
    Ok(())
}

#[test]
fn sdpa_backward_of_one_tensor_as_q_k_v() -> Result<()> {
    let mut rng = rng("sdpa_backward_of_one_tensor_as_q_k_v");
    for dtype in [DType::BF16, DType::F16] {
        check_one_tensor_as_q_k_v(&mut rng, dtype, &Device::Cpu)?;
    }
    Ok(())
}

#[test]
fn sdpa_fallback_backward_is_candles_autograd() -> Result<()> {
    let mut rng = rng("sdpa_fallback_backward_is_candles_autograd");
    check_fallback(&mut rng, &Device::Cpu)
}
