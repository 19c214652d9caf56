//! The CUDA backend: cuBLAS, cuBLASLt and cuDNN through cudarc, loaded at run time.
//!
//! - [`Gpu`]: context + stream + handles + per-stream workspaces + plan caches;
//!   [`Gpu::gemm`] / [`Gpu::gemm_fused`] (safe, cudarc buffers) and [`Gpu::gemm_raw`] with
//!   [`RawOperands`] (unsafe, raw device addresses on the caller's stream); FP8
//!   ([`Gpu::quantize`], [`Gpu::fp8_gemm`]), convolutions ([`Gpu::conv2d_forward`] and the
//!   rest), training layers ([`train::Mlp`]), RoPE and SwiGLU on gemmbridge's own kernels
//!   ([`Gpu::rope`], [`Gpu::swiglu`], [`Gpu::swiglu_backward`]).
//! - [`Backend`]: cuBLAS, cuBLASLt, or Auto (cuBLASLt where it serves).
//! - [`Gpu::prewarm`], [`Gpu::autotune_raw`] and the [`tactics`] database.
//! - [`DeviceInfo`]: what `gemmbridge info` prints.
//! - [`library`]: checks that the shared libraries load, with named errors.
//!
//! Inside, in floors (docs/DESIGN.md): the API (`api/`: one `impl Gpu` block per capability)
//! builds one call value (`call.rs`) per GEMM and hands it to the routing floor (`route/`: which
//! library serves, misaligned operands on padded copies), which calls one room per library
//! side by side (`blas/`, `lt/` with FP8 as a mode of it, `dnn/`), all on the device layer
//! (`device/`: context, streams, workspaces, graph capture and replay, gemmbridge's own
//! kernels), which sits on cudarc's bindings; `library.rs` and `status.rs` are the ground.

mod api;
mod blas;
mod call;
mod device;
mod dnn;
pub mod library;
mod lt;
mod route;
mod status;

pub use api::train;
pub use api::{
    cuda_version_string, AttnSaved, AttnSavedFp8, DeviceInfo, Extras, Gpu, GroupMember, RawBuffer, RawOperands, SeqLens,
};
pub use call::Scale;
pub use device::GraphReplay;
pub use dnn::{cudnn_version, ConvApi, ConvSearch};
pub use lt::launch::Algorithm;
pub use lt::tune::{TuneOptions, TuneReport};
pub use route::{Backend, Fp8Options, Fp8Out, Fp8Tensor, Padding, Served};

/// The tactic database (also at [`crate::tactics`]), kept at its former path.
pub use crate::tactics;

/// The raw CUDA stream type [`Gpu::gemm_raw`] takes (`CUstream`, a pointer).
pub use cudarc::driver::sys::CUstream;
