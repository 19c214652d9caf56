//! The CUDA backend: cuBLAS through cudarc, loaded at run time.
//!
//! - [`Gpu`]: context + stream + cuBLAS handle; [`Gpu::gemm`] (safe, cudarc buffers) and
//!   [`Gpu::gemm_raw`] (unsafe, raw device addresses on the caller's stream).
//! - [`DeviceInfo`]: what `gemmbridge info` prints.
//! - [`library`]: checks that the shared libraries load, with named errors.

mod gpu;
mod info;
pub mod library;
mod status;

pub use gpu::{Gpu, RawBuffer};
pub use info::{cuda_version_string, DeviceInfo};

/// The raw CUDA stream type [`Gpu::gemm_raw`] takes (`CUstream`, a pointer).
pub use cudarc::driver::sys::CUstream;
