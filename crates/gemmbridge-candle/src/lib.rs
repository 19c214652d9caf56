//! # gemmbridge-candle
//!
//! candle 0.11 operations through gemmbridge, as candle custom operations on candle's own
//! storage: [`matmul`] (broadcast batched, with its backward), [`linear`] with the bias and an
//! [`Activation`] fused into the GEMM's epilogue (and its backward), [`fp8_linear`] over an
//! [`Fp8Weight`] quantised once, [`rms_norm`] with its backward, rotary embeddings [`rope`] and
//! [`rope_i`] (candle-nn's) and [`swiglu`] over a fused gate/up projection, each with its
//! backward, [`grouped_matmul`] (a mixture-of-experts layer's product over rows sorted by
//! expert) with its backward, [`sdpa`] (scaled-dot-product attention: causal mask,
//! grouped-query heads) and [`sdpa_varlen`] (packed sequences of different lengths) with their
//! backward, [`conv2d`] (cuDNN, bias and ReLU fused) with its backward, and a paged key/value
//! cache, [`PagedKvCache`], whose steps append keys and values, rotate a fused QKV projection
//! at each sequence's position and run decode attention through the page table. Results are
//! ordinary candle tensors. A LLaMA-family model built from them, read from a Hugging Face
//! checkpoint, prefilling and decoding batches of sequences on a paged cache, is [`llama`].
//!
//! ```
//! use candle_core::{Device, Tensor};
//! let dev = Device::Cpu;
//! let a = Tensor::arange(0f32, 24., &dev)?.reshape((2, 3, 4))?;
//! let b = Tensor::ones((4, 5), candle_core::DType::F32, &dev)?; // broadcast over a's batch
//! let c = gemmbridge_candle::matmul(&a, &b)?;
//! assert_eq!(c.dims(), &[2, 3, 5]);
//! assert_eq!(c.to_vec3::<f32>()?[1][2][0], 20. + 21. + 22. + 23.);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! # Which path a call takes
//! Every operation describes its tensors, read in place at their strides and start offsets, as
//! one gemmbridge problem (a strided batch for `matmul`, the rows of `x` for `linear` and
//! `rms_norm`, per-tensor head strides for `sdpa`). Where that description exists the call is
//! **served**: on a CUDA device by gemmbridge's GPU path (cuBLASLt, cuDNN) on candle's buffers
//! and stream, with the crate's `cuda` feature; on the CPU by gemmbridge's CPU backend running
//! the same description (so the CPU tests check the layouts the GPU path is handed). Where a
//! tensor's strides cannot be described, it is copied contiguous first and the call is served
//! after the copy ([`Served::AfterCopy`]). Everything else — other dtypes than f32/f16/bf16
//! (f16/bf16 only for `sdpa`), empty tensors, other devices, [`set_enabled`]`(false)` — falls
//! back to candle's own operations ([`Served::Candle`]). Each operation has a `*_served` form
//! that also says which path ran.
//!
//! # Precision
//! f32 is strict f32 (no TF32); f16 and bf16 accumulate in f32 and are rounded once. The CPU
//! backend widens f16/bf16 to f32 and rounds each output once, as the GPU does.
//!
//! # Streams
//! On CUDA, work is enqueued on the stream of the storage it is given
//! (`CudaDevice::cuda_stream`), in order with candle's own work on it, with no host
//! synchronisation. One gemmbridge engine is made per candle device on first use and kept for
//! the process.

mod attention;
mod attention_bwd;
mod attention_varlen;
mod attention_varlen_batch;
mod attention_varlen_op;
mod conv;
mod conv_params;
mod cpu;
mod cpu_layer_ops;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_attention;
#[cfg(feature = "cuda")]
mod cuda_conv;
#[cfg(feature = "cuda")]
mod cuda_fp8;
#[cfg(feature = "cuda")]
mod cuda_grouped;
#[cfg(feature = "cuda")]
mod cuda_layer_ops;
#[cfg(feature = "cuda")]
mod cuda_paged;
mod fp8_linear;
mod grouped;
mod kv_cache;
mod layer_plan;
mod linear;
pub mod llama;
mod matmul;
mod norm;
mod paged_ops;
mod plan;
mod rope;
mod swiglu;

use std::sync::atomic::{AtomicBool, Ordering};

pub use attention::{sdpa, sdpa_candle, sdpa_served};
pub use attention_varlen::{sdpa_varlen, sdpa_varlen_candle, sdpa_varlen_served};
pub use attention_varlen_batch::{Causal, CuSeqlens};
pub use conv::{conv2d, conv2d_candle, conv2d_served};
pub use conv_params::{Conv2dParams, ConvAct};
pub use fp8_linear::{fp8_linear, fp8_linear_candle, fp8_linear_served, Fp8Scaling, Fp8Weight};
pub use gemmbridge::layer_ops::RopeStyle;
pub use grouped::{grouped_matmul, grouped_matmul_candle, grouped_matmul_served};
pub use kv_cache::PagedKvCache;
pub use linear::{linear, linear_candle, linear_served, Activation};
pub use matmul::{matmul, matmul_served};
pub use norm::{rms_norm, rms_norm_candle, rms_norm_served};
pub use rope::{rope, rope_candle, rope_i, rope_served};
pub use swiglu::{swiglu, swiglu_candle, swiglu_served};

/// Which path ran a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// gemmbridge on the tensors as they are (the GPU path on CUDA, the CPU backend on the
    /// CPU).
    Gemmbridge,
    /// gemmbridge after copying one or more inputs contiguous (strides it cannot describe).
    AfterCopy,
    /// candle's own operations.
    Candle,
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Switches gemmbridge off (every call then runs candle's own operations) or back on, for the
/// whole process; on by default.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether gemmbridge serves calls ([`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

static POISON: AtomicBool = AtomicBool::new(false);

/// A testing aid, off by default: with it on, every output the CUDA path allocates is filled
/// with all-ones bytes (a NaN in f32, f16 and bf16) on the stream before the operation writes
/// it, so that an element the operation leaves unwritten reads as NaN instead of as whatever
/// the memory held. It costs one memset per output. The CPU path always starts its outputs as
/// NaN.
pub fn set_poison_outputs(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

/// Whether CUDA outputs are filled with NaN first ([`set_poison_outputs`]).
pub fn poison_outputs() -> bool {
    POISON.load(Ordering::Relaxed)
}

/// Whether calls on this device can be served: the CPU, and CUDA devices with the `cuda`
/// feature.
fn device_served(dev: &candle_core::Device) -> bool {
    enabled() && (dev.is_cpu() || (cfg!(feature = "cuda") && dev.is_cuda()))
}

/// The README's examples, compiled as doctests so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
