//! The CUDA backend: cuBLAS and cuBLASLt through cudarc, loaded at run time.
//!
//! - [`Gpu`]: context + stream + handles + per-stream workspaces + plan cache;
//!   [`Gpu::gemm`] / [`Gpu::gemm_fused`] (safe, cudarc buffers) and [`Gpu::gemm_raw`] /
//!   [`Gpu::gemm_raw_fused`] (unsafe, raw device addresses on the caller's stream).
//! - [`Backend`]: cuBLAS, cuBLASLt, or Auto (cuBLASLt where it serves).
//! - [`Gpu::prewarm`], [`Gpu::autotune_raw`] and the [`tactics`] database.
//! - [`DeviceInfo`]: what `gemmbridge info` prints.
//! - [`library`]: checks that the shared libraries load, with named errors.
//! - [`train::Mlp`]: linear layers forward and backward on fused GEMMs ([`crate::train`]).
//!
//! Inside (docs/DESIGN.md): the entry points (`entry.rs`, `setup.rs`, `diagnostics.rs`) call
//! the dispatch (`dispatch.rs`), which calls one room per library (`blas.rs`, `lt/`), which
//! borrow from the device layer (`device/`), which sits on cudarc's bindings.

mod blas;
pub mod churn;
mod conv;
mod device;
mod diagnostics;
mod dispatch;
mod dnn;
mod entry;
mod fp8_gemm;
mod fp8_tensor;
mod gpu;
mod info;
pub mod library;
mod lt;
mod padded;
mod padding;
mod request;
mod setup;
mod status;
pub mod tactics;
pub mod train;

pub use dnn::{cudnn_version, ConvApi, ConvSearch};
pub use fp8_gemm::{Fp8Options, Fp8Out};
pub use fp8_tensor::Fp8Tensor;
pub use gpu::{Backend, Extras, Gpu, RawBuffer, RawExtras, Served};
pub use info::{cuda_version_string, DeviceInfo};
pub use lt::plan::Algorithm;
pub use lt::replay::GraphReplay;
pub use lt::tune::{TuneOptions, TuneReport};
pub use padding::Padding;

/// The raw CUDA stream type [`Gpu::gemm_raw`] takes (`CUstream`, a pointer).
pub use cudarc::driver::sys::CUstream;
