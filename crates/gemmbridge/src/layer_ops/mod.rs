//! A transformer layer's elementwise operations as data: rotary position embedding ([`Rope`],
//! applied in place to q and k inside a fused QKV projection's output) and the SwiGLU gate
//! ([`SwiGlu`], over the gate/up projection's output), forward and backward, with every rule a
//! problem must meet, checked on the CPU before anything is launched.
//!
//! The arithmetic is defined here, element by element, in f32 from the stored values with one
//! rounding to the storage type at the end ([`arith`]: the angles, cosines, sines and the
//! rotation; the exponential, the sigmoid, the gate and its gradient): gemmbridge's
//! own GPU kernels (`cuda/device/kernels/layer.cu`) compute exactly these operations in this
//! order, so their results equal the CPU backend's ([`crate::cpu::rope`],
//! [`crate::cpu::swiglu`], [`crate::cpu::swiglu_backward`]) bit for bit. [`mod@reference`] holds
//! the float64 definitions the accuracy checks compare against.
//!
//! # RoPE
//! The buffer `qkv[b, s, (h_q + 2·h_kv)·d]` (row-major, rows `ld` elements apart) holds, per
//! token, `h_q` query heads, then `h_kv` key heads, then `h_kv` value heads, `d` elements each
//! (a fused QKV projection's output, as attention reads it in place:
//! [`crate::attention::HeadLayout`]). Every query and key head is rotated in place; value heads,
//! the elements of a head past the rotary dimension `r` and the row padding past the heads are
//! neither read nor written. Pair `i < r/2` of a head is `(x[i], x[i + r/2])` for
//! [`RopeStyle::RotateHalf`] (LLaMA, GPT-NeoX) or `(x[2i], x[2i+1])` for
//! [`RopeStyle::Interleaved`] (GPT-J), rotated by the angle `θ_i(p)` of the token's position
//! `p`: `(x₁, x₂) ← (x₁·cos − x₂·sin, x₂·cos + x₁·sin)`. The backward (the gradient of that
//! rotation, an orthogonal map) is the rotation by `−θ_i(p)`, applied in place to `dq`, `dk`.
//! Angles come from `θ` ([`RopeAngles::Theta`]: `inv_freq_i = θ^(−2i/r)`, optionally with
//! LLaMA 3's frequency scaling, `θ_i(p) = p·inv_freq_i`) or from the caller's f32 tables
//! `cos[max_pos, r/2]`, `sin[max_pos, r/2]` ([`RopeAngles::Tables`]). Positions are `start + t`
//! for the `t`-th token of every sequence, or one `i32` per token ([`Positions`]).
//!
//! # SwiGLU
//! `y[r, j] = silu(g[r, j])·u[r, j]` with `silu(x) = x·σ(x)`, over the gate/up projection's
//! output `[rows, 2·f]` (rows `ld_in` apart) whose gate `g` and up `u` halves are laid out as
//! [`GluLayout`] says; `y[rows, f]` (rows `ld_out` apart). The backward, from `dy` (shaped as
//! `y`) and the same `g`, `u`: `dg = dy·u·silu′(g)` and `du = dy·silu(g)`, written into a
//! `[rows, 2·f]` buffer laid out as the input (`ld_in`).

pub mod arith;
pub mod reference;
mod rope;
mod swiglu;

pub use rope::{Llama3Scaling, Positions, Rope, RopeAngles, RopeDirection, RopeStyle, RopeTables};
pub use swiglu::{GluLayout, SwiGlu};

use crate::error::{Error, Result};

/// The largest rotary dimension ([`Rope::rotary_dim`]): the GPU kernels take the `r/2`
/// frequencies as one kernel argument of 256 f32.
pub const MAX_ROTARY_DIM: usize = 512;

/// Positions with angles computed from θ lie in `0..MAX_POSITION`: every such position is an
/// f32 integer exactly (2²⁴), so `p·inv_freq` is one correctly rounded f32 product.
pub const MAX_POSITION: usize = 1 << 24;

/// The largest size, head count or leading dimension a problem may have (the GPU kernels
/// take them as 32-bit integers).
pub const MAX_SIZE: usize = i32::MAX as usize;

/// The widest element these operations take (f32): the problems' `validate` bound their
/// buffers' bytes with it, so that every count they report is exact.
const MAX_ELEM_BYTES: usize = 4;

/// [`Error::LayerOp`] for `op`.
fn bad<T>(op: &'static str, what: &'static str, detail: String) -> Result<T> {
    Err(Error::LayerOp { op, what, detail })
}

#[cfg(test)]
mod tests;
