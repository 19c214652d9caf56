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
pub use gemm::{Extras, GpuTuning, RawBuffer, RawOperands};
pub use info::{cuda_version_string, DeviceInfo};
pub use moe::{GpuMoe, MoeCombineGrads, MoeRouting};
pub use norm::{RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
pub use options::{Applied, Change, GpuOptions, Reach};
pub use paged::{GpuPaged, PageIndex};
pub use plans::Plans;
