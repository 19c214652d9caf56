//! # gemmbridge-burn
//!
//! burn 0.21's `matmul` through gemmbridge (cuBLASLt / cuBLAS) on burn's own CUDA buffers:
//! zero-copy, the output allocated by burn's allocator and returned as an ordinary burn tensor.
//!
//! ```ignore
//! use gemmbridge_burn::matmul;
//! let y = matmul(x, w); // x: Tensor<B, D>, w: Tensor<B, D>, B: GemmOps
//! ```
//!
//! - [`GemmOps`] is implemented for the plain CUDA backend
//!   (`CubeBackend<CudaRuntime, F, I, BT>`), for it under burn's fusion layer (`Fusion<…>`,
//!   what `burn::backend::Cuda` is with burn's default features) as a custom operation, and for
//!   either under `Autodiff` (backward: `dA = dC·Bᵀ`, `dB = Aᵀ·dC`, transposes as views).
//! - Where a call cannot be served — a dtype other than f32/f16/bf16, a layout a GEMM cannot
//!   read ([`layout::Fallback`]), no GPU library — it falls back to burn's own matmul, and a
//!   `tracing` debug line says which path each shape took. [`set_enabled`] switches the
//!   adapter off and on at run time (A/B tests).
//! - Ordering with cubecl's streams (which cubecl 0.10 does not expose): before the GEMM the
//!   host waits for the calling thread's cubecl stream (`client.sync()`), and after it for
//!   gemmbridge's stream. See README.md for the cost and the upstream hook that would remove
//!   both waits.
//!
//! Status: the layout mapping is tested on the CPU; the GPU paths compile against burn 0.21
//! and are exercised by `tests/gpu.rs` on a CUDA machine.

mod autodiff;
mod cube;
mod fusion;
pub mod layout;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

static ENABLED: AtomicBool = AtomicBool::new(true);
static TF32: AtomicBool = AtomicBool::new(false);
static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

/// Calls served by gemmbridge and calls that fell back to burn's matmul, since the start of
/// the process (the per-shape detail is in the `tracing` debug log).
pub fn counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

pub(crate) fn count(served: bool) {
    (if served { &SERVED } else { &FELL_BACK }).fetch_add(1, Ordering::Relaxed);
}

/// Turns the adapter on (default) or off; off, every call runs burn's own matmul.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the adapter is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Lets f32 matmuls use tf32 tensor cores (gemmbridge's `Precision::TF32`, ‖err‖/‖ref‖ ≤ 1e-3);
/// off by default (strict f32, as burn computes it).
pub fn set_tf32(on: bool) {
    TF32.store(on, Ordering::Relaxed);
}

pub(crate) fn tf32() -> bool {
    TF32.load(Ordering::Relaxed)
}

/// Backends whose matmul gemmbridge can serve.
pub trait GemmOps: Backend {
    /// `lhs[.., m, k] · rhs[.., k, n]` with burn's broadcasting of the batch dimensions.
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `lhs[.., m, k] · rhs[.., k, n]` through gemmbridge, as burn's `Tensor::matmul` (same
/// broadcasting, same result type), falling back to burn's matmul where gemmbridge cannot serve.
pub fn matmul<B: GemmOps, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    let out = B::gemm_matmul(lhs.into_primitive().tensor(), rhs.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
