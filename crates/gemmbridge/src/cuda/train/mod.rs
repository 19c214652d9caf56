//! The training layers on the GPU ([`crate::train`] says what fuses where): [`Mlp`], and the
//! launches that are not GEMMs (`kernels.rs`).

mod instruments;
mod kernels;
mod mlp;

pub use instruments::{GemmRole, Tuned};
pub use mlp::Mlp;
