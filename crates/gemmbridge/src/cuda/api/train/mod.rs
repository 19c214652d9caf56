//! The training layers on the GPU ([`crate::train`] says what fuses where): [`Mlp`] (its state
//! and parameters in `mlp.rs`, its buffers in `buffers.rs`, the step in `forward.rs` and
//! `backward.rs`), its FP8 mode's GEMMs (`fp8.rs`, [`crate::train::fp8`] says what runs in
//! FP8), and the launches that are not GEMMs (`kernels.rs`).

mod backward;
mod buffers;
mod forward;
mod fp8;
mod grads;
mod instruments;
mod kernels;
mod mlp;
mod observe;
mod placement;

pub use instruments::{GemmMark, GemmObserver, GemmRole, Tuned};
pub use kernels::prepare_kernels;
pub use mlp::{Mlp, MlpOptions};
