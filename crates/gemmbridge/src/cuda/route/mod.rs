//! The routing floor: which library serves a validated call ([`dispatch`]), and calls whose
//! operands are off 16-byte alignment run on aligned, zero-padded copies ([`padding`]: when;
//! [`padded`]: how); FP8 GEMMs' call value and staging ([`fp8`]). Its state under the device's lock is [`Libraries`] (`state.rs`). It knows
//! the library rooms below it and nothing of the entry points above it.

pub(crate) mod dispatch;
pub(crate) mod fp8;
pub(crate) mod grouped;
pub(crate) mod padded;
pub(crate) mod padding;
mod state;

pub use fp8::{Fp8Options, Fp8Out, Fp8Tensor};
pub use padding::Padding;
pub(crate) use state::Libraries;
pub use state::{Backend, Served};
