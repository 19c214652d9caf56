//! The API floor: the engine ([`Gpu`], `engine.rs`) and one `impl` block per capability, on
//! `Gpu` or, for a capability of several operations, on its view borrowed from `Gpu`
//! ([`GpuAttention`], [`GpuConv`], [`GpuFp8`], [`GpuMoe`], [`GpuPaged`], [`GpuTuning`]) — its
//! settings (`options/`: the value, [`GpuOptions`], and the live update), its plans and tactics
//! (`plans.rs`, [`Plans`]), GEMMs (`gemm.rs`), FP8 (`quantize.rs`, `fp8.rs`), convolutions
//! (`conv.rs`), attention (`attention.rs`, `attention_packed.rs`), RMSNorm (`norm.rs`), RoPE and
//! SwiGLU (`layer_ops.rs`), the paged KV cache's append (`paged.rs`) and decode attention
//! (`paged_decode.rs`), grouped GEMMs (`grouped.rs`, FP8 groups `grouped_fp8.rs`), set-up and
//! tuning (`tune.rs`), device information (`info.rs`), the training layers ([`train`]), the
//! decoder layer ([`layer`]) — over the checks every entry shares (`checks.rs`) and the operand
//! types (`operands.rs`). Each entry validates its arguments, builds its call and hands it to the
//! routing floor (`crate::cuda::route`) or to a library room; no entry calls another file's entry
//! code.

mod attention;
mod attention_fp8;
mod attention_fp8_bwd;
mod attention_packed;
mod checks;
mod conv;
mod engine;
mod fp8;
mod gemm;
mod grouped;
mod grouped_fp8;
mod info;
pub mod layer;
mod layer_ops;
mod moe;
mod moe_routing;
mod norm;
mod operands;
mod options;
mod paged;
mod paged_decode;
mod plans;
mod quantize;
pub mod train;
mod tune;

pub use attention::{AttnSaved, GpuAttention, SeqLens};
pub use attention_fp8_bwd::AttnSavedFp8;
pub use conv::GpuConv;
pub use engine::Gpu;
pub use fp8::GpuFp8;
pub use info::{cuda_version_string, DeviceInfo};
pub use moe::{GpuMoe, MoeCombineGrads, MoeRouting};
pub use norm::{RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
pub use operands::{Extras, RawBuffer, RawOperands};
pub use options::{Applied, Change, GpuOptions, Reach};
pub use paged::{GpuPaged, PageIndex};
pub use plans::Plans;
pub use tune::GpuTuning;
