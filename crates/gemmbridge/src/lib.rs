//! # gemmbridge
//!
//! Row-major GEMM for Rust on NVIDIA's cuBLAS, correct by construction: one documented mapping
//! from row-major to cuBLAS's column-major call ([`mapping::column_major_call`]), precisions
//! chosen explicitly ([`Precision`]), every argument validated before launch with a named
//! error ([`Error`]), outputs written in place on the caller's stream, and a CPU backend
//! ([`cpu`]) with the same API for machines without a GPU.
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
//! On a GPU, [`cuda::Gpu::gemm`] takes cudarc device buffers and [`cuda::Gpu::gemm_raw`] raw
//! device addresses on the caller's stream, with the same [`GemmProblem`].
//!
//! # What is where
//! For users:
//! - the problem: [`GemmProblem`], [`MatrixLayout`], [`Operand`], [`Op`], [`Precision`],
//!   [`Epilogue`] ([`epilogue`] says what each computes), [`Error`];
//! - the backends: [`cuda::Gpu`] (cuBLASLt / cuBLAS, FP8 on Hopper, cuDNN convolutions,
//!   prewarm, tuning, [`cuda::tactics`]) and [`cpu`];
//! - FP8 formats, recipes and rules: [`fp8`]; convolutions as data: [`conv`]; attention as
//!   data, with its float64 reference: [`attention`]; mixture-of-experts grouped GEMMs as
//!   data, with theirs: [`grouped`]; a transformer layer's elementwise operations (RoPE on a
//!   fused QKV buffer, SwiGLU), their bit-exact f32 arithmetic and float64 references:
//!   [`layer_ops`]; training layers: [`train`] (CPU) and [`cuda::train`] (GPU).
#![cfg_attr(
    feature = "dist",
    doc = "- with the `dist` feature: the tensor-parallel split of an MLP block and its CPU arithmetic, [`dist`]."
)]
#![cfg_attr(
    not(feature = "dist"),
    doc = "- with the `dist` feature (off by default): `dist`, the tensor-parallel split of an MLP block and its CPU arithmetic."
)]
//!
//! Public because the command-line tool, the tests and the probe use them, and documented,
//! but not needed to use the library: [`mapping`] (the row-major → column-major translation,
//! for inspection), [`validate`] (the buffer checks every entry point already runs),
//! [`mod@reference`] (float64 reference GEMMs and error measures).
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
pub mod layer_ops;
mod layout;
pub mod mapping;
mod pad;
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
