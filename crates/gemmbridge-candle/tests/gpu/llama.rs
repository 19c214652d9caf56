//! The LLaMA model on a GPU against candle-transformers' `llama` on candle's own CUDA ops, on
//! the checkpoint `common/llama.rs` writes: the bands of the CPU tests.

use candle_core::{DType, Device, Result};

use crate::llama_check::{run, run_batched};

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_on_the_gpu_equals_candle_transformers() -> Result<()> {
    run(&Device::new_cuda(0)?, DType::BF16, 2e-2)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_on_the_gpu_equals_candle_transformers() -> Result<()> {
    run(&Device::new_cuda(0)?, DType::F32, 1e-4)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_batched_on_a_paged_cache_on_the_gpu_equals_candle_transformers() -> Result<()> {
    gemmbridge_candle::set_poison_outputs(true);
    run_batched(&Device::new_cuda(0)?, DType::BF16, 2e-2)
}
