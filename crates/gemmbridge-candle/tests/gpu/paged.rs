//! [`gemmbridge_candle::PagedKvCache`] on the GPU: gemmbridge's append and RoPE kernels and
//! cuDNN's paged decode attention on candle's CUDA storage, with the checks of the CPU tests.

use candle_core::{DType, Result};

use crate::{gpu, paged};

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_paged_append_and_decode_attention() -> Result<()> {
    let mut rng = crate::common::rng("gpu_paged_append_and_decode_attention");
    for dtype in [DType::BF16, DType::F16] {
        paged::append_and_attend(&mut rng, &gpu()?, dtype, 1e-2)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_paged_rope_at_the_sequences_positions() -> Result<()> {
    let mut rng = crate::common::rng("gpu_paged_rope_at_the_sequences_positions");
    for dtype in [DType::BF16, DType::F16] {
        paged::rope_at_positions(&mut rng, &gpu()?, dtype)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_bad_paged_calls_are_named() -> Result<()> {
    paged::bad_calls(&gpu()?)
}
