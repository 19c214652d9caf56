//! # gemmbridge
//!
//! NVIDIA's cuBLAS, cuBLASLt and cuDNN under Rust tensor code: problems described row-major as
//! data, every argument validated before anything is launched (a named [`Error`] carrying the
//! offending values, nothing written), outputs written in place on the caller's stream with no
//! hidden synchronisation, every precision from f32 to FP8, forward and backward; and a CPU
//! backend ([`cpu`]) with the same problem types for machines without a GPU.
//!
//! ```
//! use gemmbridge::{cpu, GemmProblem, Precision};
//! // C[2,2] = A[2,3]·B[3,2], row-major, f32
//! let p = GemmProblem::matmul(2, 2, 3, Precision::F32)?;
//! let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut c = [f32::NAN; 4]; // β = 0: C is never read
//! cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c)?;
//! assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
//! # Ok::<(), gemmbridge::Error>(())
//! ```
//!
//! # Capabilities, and where each is documented
//!
//! | capability | the problem as data, its CPU form and float64 reference | on the GPU |
//! |---|---|---|
//! | dense GEMM, fused epilogues, tuning | [`GemmProblem`], [`Epilogue`], [`cpu::gemm`] | [`cuda`]: [`cuda::Gpu::gemm_fused`], [`cuda::Gpu::gemm_raw`] (cuBLASLt, cuBLAS) |
//! | FP8 GEMM (Hopper) | [`fp8`]: formats, recipes, scale layouts, rules, the quantisation | [`cuda::GpuFp8::quantize`], [`cuda::GpuFp8::gemm`] |
//! | training layers | [`train`], [`train::cpu::Mlp`] | [`cuda::train::Mlp`] (cuBLASLt epilogues) |
//! | 2-D convolution | [`conv`] | [`cuda::GpuConv::forward`] and the rest (cuDNN) |
//! | attention (SDPA) | [`attention`], [`cpu::attention_forward`], [`cpu::attention_backward`] | [`cuda::GpuAttention::forward`] and the rest (cuDNN) |
//! | grouped GEMM (mixture of experts) | [`grouped`], [`cpu::grouped_gemm`] | [`cuda::Gpu::grouped_gemm`], [`cuda::GpuFp8::grouped_gemm`] |
//! | mixture-of-experts routing: router top-k and sort, the capacity layout, gather, combine; expert products over device group starts | [`moe`], [`moe::reference`] | [`cuda::GpuMoe::route`], [`cuda::MoeRouting::pad`], [`cuda::GpuMoe::gather`], [`cuda::GpuMoe::combine`], [`cuda::GpuMoe::combine_backward`], [`cuda::GpuMoe::gemm`] (gemmbridge's own kernels; cuDNN) |
//! | RMSNorm (forward, backward) | [`norm`], [`cpu::rms_norm_forward`], [`cpu::rms_norm_backward`] | [`cuda::Gpu::rms_norm_forward`], [`cuda::Gpu::rms_norm_backward`] (cuDNN's norm graph) |
//! | RoPE, SwiGLU (forward, backward) | [`layer_ops`], [`cpu::rope`], [`cpu::swiglu`], [`cpu::swiglu_backward`] | [`cuda::Gpu::rope`], [`cuda::Gpu::swiglu`], [`cuda::Gpu::swiglu_backward`] (gemmbridge's own kernels) |
//! | a LLaMA-style decoder layer (forward, backward; FP8 forward projections as an option) | [`layer`]: sizes, weights, the problems of a step, float64 reference; [`layer::cpu::CpuDecoderLayer`] | [`cuda::layer::GpuDecoderLayer`] (built from the entries above) |
//! | paged KV cache: layout, tables, append, decode attention's float64 reference | [`paged`], [`cpu::paged_append`] | [`cuda::GpuPaged::append`] (gemmbridge's own kernel), [`cuda::GpuPaged::decode`] (cuDNN) |
//! | tactic database | [`tactics`] | [`cuda::Plans::load_tactics`] |
//!
//! # The problem
//!
//! Row-major is the only public convention. A [`GemmProblem`] is `C = α·op(A)·op(B) + β·C`:
//! `GemmProblem::matmul(m, n, k, precision)` (`x[m, k]·w[k, n]`), `GemmProblem::linear`
//! (`x[m, k]·w[n, k]ᵀ`, PyTorch's `F.linear`), or in general [`GemmProblem::new`] with a
//! [`MatrixLayout`] `{ rows, cols, ld, batch_stride }` and an [`Op`] per operand; column-major
//! data enters as [`Operand::col_major`] (the transposed row-major view of the same memory), a
//! strided batch with `.batched(n)` (a batch stride of 0 broadcasts an input). The one
//! translation to cuBLAS's column-major call is [`mapping::column_major_call`], derived in its
//! documentation and tested exhaustively against a float64 emulation of the call. `β = 0`
//! never reads C; `k = 0` gives `β·C`.
//!
//! # Precision and accuracy
//!
//! A [`Precision`] is three choices, named: the storage type of A and B, the compute type and the
//! output type — `F32` (strict `CUBLAS_COMPUTE_32F`, no TF32), `TF32` (`32F_FAST_TF32`), `F16` and
//! `BF16` with f32 accumulation and an f16/bf16 or f32 output. Every precision is checked against
//! float64 as ‖out − ref‖ / ‖ref‖ within [`Precision::tolerance`]: f32 1e-5, tf32 1e-3, f16/bf16
//! 1e-2; NaN never passes (`gemmbridge probe` measures them on the machine it runs on). FP8's
//! quantisation kernels equal the CPU specification ([`fp8::quantize`]) bit for bit.
//!
//! # Also public
//!
//! Used by the command-line tool, the tests and the probe, documented, but not needed to use
//! the library: [`mapping`] (the row-major → column-major translation, for inspection),
//! [`validate`] (the buffer checks every entry point already runs), [`mod@reference`] (float64
//! reference GEMMs and error measures).
//!
//! # Optional
#![cfg_attr(
    feature = "dist",
    doc = "With the `dist` feature: the tensor-parallel split of an MLP block and its CPU arithmetic, [`dist`]."
)]
#![cfg_attr(
    not(feature = "dist"),
    doc = "With the `dist` feature (off by default): `dist`, the tensor-parallel split of an MLP block and its CPU arithmetic."
)]
#![warn(missing_docs)]

pub mod attention;
pub mod conv;
pub mod cpu;
pub mod cuda;
#[cfg(feature = "dist")]
pub mod dist;
mod dtype;
pub mod epilogue;
mod error;
pub mod fp8;
pub mod grouped;
pub mod layer;
pub mod layer_ops;
mod layout;
pub mod mapping;
pub mod moe;
pub mod norm;
mod pad;
pub mod paged;
mod precision;
mod problem;
pub mod reference;
pub mod tactics;
pub mod train;
pub mod validate;

pub use dtype::{Compute, DType, Element};
pub use epilogue::Epilogue;
pub use error::{Error, Result, Which};
pub use layout::{MatrixLayout, Op, Operand};
pub use precision::Precision;
pub use problem::{GemmProblem, AUX_LD_MULTIPLE, MAX_DIM};

/// Re-exported so callers use the same element types: [`half::f16`], [`half::bf16`].
pub use half;

/// The cudarc crate gemmbridge is built with (0.19): its buffers (`cudarc::driver::CudaSlice`,
/// views) and streams are what the GPU API takes, so a user needs no cudarc dependency of
/// their own.
pub use cudarc;

/// The README's examples, compiled as doctests so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
