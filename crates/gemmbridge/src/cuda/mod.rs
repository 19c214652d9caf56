//! The CUDA backend: cuBLAS and cuBLASLt through cudarc, loaded at run time.
//!
//! - [`Gpu`]: context + stream + handles + per-stream workspaces + plan cache;
//!   [`Gpu::gemm`] / [`Gpu::gemm_fused`] (safe, cudarc buffers) and [`Gpu::gemm_raw`] /
//!   [`Gpu::gemm_raw_fused`] (unsafe, raw device addresses on the caller's stream).
//! - [`Backend`]: cuBLAS, cuBLASLt, or Auto (cuBLASLt where it serves).
//! - [`Gpu::prewarm`], [`Gpu::autotune_raw`] and the [`tactics`] database.
//! - [`DeviceInfo`]: what `gemmbridge info` prints.
//! - [`library`]: checks that the shared libraries load, with named errors.

mod diagnostics;
mod gpu;
mod info;
pub mod library;
mod lt;
mod replay;
mod status;
pub mod tactics;
mod tune;
mod workspace;

pub use gpu::{Backend, Extras, Gpu, RawBuffer, RawExtras, Served, TuneReport};
pub use info::{cuda_version_string, DeviceInfo};
pub use lt::Algorithm;
pub use replay::GraphReplay;
pub use tune::TuneOptions;

/// The raw CUDA stream type [`Gpu::gemm_raw`] takes (`CUstream`, a pointer).
pub use cudarc::driver::sys::CUstream;
