//! The API floor: the engine ([`Gpu`], `engine.rs`) and one place per capability — a folder
//! where it has several files, its `impl` block on `Gpu` or, for a capability of several
//! operations, on its view borrowed from `Gpu` ([`GpuAttention`], [`GpuConv`], [`GpuFp8`],
//! [`GpuMoe`], [`GpuPaged`], [`GpuTuning`]): settings (`options/`: the value, [`GpuOptions`],
//! and the live update), plans and tactics (`plans.rs`, [`Plans`]), dense and grouped GEMMs,
//! their raw operands, set-up and tuning (`gemm/`), FP8 (`fp8/`: quantisation, dense and
//! grouped FP8 GEMMs), convolutions (`conv.rs`), attention (`attention/`: f16/bf16, packed
//! gradients, FP8 forward and backward), RMSNorm (`norm.rs`), RoPE and SwiGLU (`layer_ops.rs`),
//! the paged KV cache (`paged/`: the append, decode attention), mixture-of-experts routing
//! (`moe/`), device information (`info.rs`), the training layers ([`train`]), the decoder
//! layer ([`layer`]) — over the checks every entry shares (`checks.rs`). Each entry validates
//! its arguments, builds its call and hands it to the routing floor (`crate::cuda::route`) or to
//! a library room; no entry calls another capability's entry code.
//!
//! # From a problem to its launch
//! - **Dense GEMM**: a [`crate::GemmProblem`] (checked when built) → [`Gpu::gemm_fused`] /
//!   [`Gpu::gemm_raw`] (`gemm/`: buffer checks, `validate.rs`) → one `GemmCall` (`call.rs`, the
//!   column-major translation of `mapping.rs`) → `route/dispatch.rs` (aligned copies from
//!   `route/padded.rs`; cuBLAS or cuBLASLt and the fallbacks) → `lt/` (plan, graph replay,
//!   `lt/launch.rs`) or `blas/gemm.rs`. Held instead of cached: [`GemmPlan::new`] (`gemm/plan.rs`)
//!   makes the cuBLASLt plan once (the same key, `lt/plan.rs`, and builder, `lt/mod.rs`, as the
//!   eager path) and [`GemmPlan::run`] checks the buffers and launches it (`lt/launch.rs`).
//! - **FP8 GEMM**: operands made by [`GpuFp8::quantize`] (`fp8/quantize.rs`, the cast kernels of
//!   `device/fp8_cast.rs`) → [`GpuFp8::gemm`] (`fp8/`) → one `Fp8Call` with every rule of
//!   `route/fp8.rs` → `lt/fp8.rs` → `lt/launch.rs`.
//! - **Grouped GEMM**: a [`crate::grouped::GroupedProblem`] → [`Gpu::grouped_gemm`]
//!   (`gemm/grouped.rs`: every group checked, the way chosen) → `route/grouped.rs` (in order, one
//!   cuBLAS grouped call `blas/grouped.rs`, or over the lanes of `device/fork.rs`, replayed where
//!   it repeats).
//! - **Convolution**: a [`crate::conv::Conv2d`] → [`GpuConv`] (`conv.rs`) → the cuDNN room's plan
//!   (`dnn/graph*.rs`, or `dnn/legacy*.rs`; from the tactic database, `dnn/rebuild.rs`) →
//!   `dnn/run.rs`.
//! - **Attention**: a [`crate::attention::Attention`] → [`GpuAttention`] (`attention/`) → its
//!   graph (`dnn/attention/graphs.rs`, FP8 `fp8.rs`, `fp8_bwd.rs`) and plan (`plan.rs`) →
//!   `dnn/attention/run.rs`.
//! - **RMSNorm**: a [`crate::norm::RmsNorm`] → [`Gpu::rms_norm_forward`] / [`Gpu::rms_norm_backward`]
//!   (`norm.rs`) → `dnn/norm/` (graph, plan, run).
//! - **RoPE, SwiGLU**: a [`crate::layer_ops::Rope`] / [`crate::layer_ops::SwiGlu`] → [`Gpu::rope`],
//!   [`Gpu::swiglu`] (`layer_ops.rs`) → gemmbridge's kernels (`device/layer.rs`,
//!   `device/kernels/layer.cu`).
//! - **Paged KV cache**: a [`crate::paged::PagedAppend`] / [`crate::paged::PagedDecode`] →
//!   [`GpuPaged`] (`paged/`) → the append kernel (`device/paged.rs`) / cuDNN's paged decode graph
//!   (`dnn/attention/paged.rs`).
//! - **Mixture of experts**: [`crate::moe::MoeRouter`], [`crate::moe::MoeGemm`],
//!   [`crate::moe::MoeCombine`] → [`GpuMoe`] (`moe/`) → the routing, gather and combine kernels
//!   (`device/moe.rs`) and cuDNN's MoE grouped matmul (`dnn/moe/`).

mod attention;
mod checks;
mod conv;
mod engine;
mod fp8;
mod gemm;
mod info;
pub mod layer;
mod layer_ops;
mod moe;
mod norm;
mod options;
mod paged;
mod plans;
pub mod train;

pub use attention::{AttnSaved, AttnSavedFp8, GpuAttention, SeqLens};
pub use conv::GpuConv;
pub use engine::Gpu;
pub use fp8::GpuFp8;
pub use gemm::{Extras, GemmPlan, GpuTuning, RawBuffer, RawOperands};
pub use info::{cuda_version_string, DeviceInfo};
pub use moe::{GpuMoe, MoeCombineGrads, MoeRouting};
pub use norm::{NormServed, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
pub use options::{Applied, Change, GpuOptions, Reach};
pub use paged::{GpuPaged, PageIndex};
pub use plans::Plans;
