//! The layer's steps that are neither GEMMs nor attention — RMSNorm, RoPE, SwiGLU, forward and
//! backward — each as one function over the buffers it reads and writes (named in its
//! argument struct), so that each is one call of the entry that serves it. None is served
//! yet: each answers [`Error::Unsupported`] with [`NOT_WIRED`] as the backend, naming the step
//! and what it must compute, and enqueues nothing.

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::cuda::api::engine::Gpu;
use crate::error::{Error, Result};
use crate::layer::{DecoderLayer, Tokens};

/// The backend named by the errors of the steps not wired yet (see the module).
pub const NOT_WIRED: &str = "the GPU decoder layer (step not wired yet)";

fn not_wired(step: &str, computes: &str) -> Result<()> {
    Err(Error::Unsupported { backend: NOT_WIRED, what: format!("{step}: {computes}") })
}

/// An RMSNorm forward over `rows` rows of `d`: `h = x·rstd∘weight`, `rstd = 1/sqrt(mean(x²) +
/// eps)` per row (f32), both written.
pub(super) struct NormForward<'a, T> {
    /// "the first RMSNorm" or "the second RMSNorm".
    pub which: &'static str,
    pub x: &'a dyn DevicePtr<T>,
    pub weight: &'a CudaSlice<T>,
    pub h: &'a mut CudaSlice<T>,
    pub rstd: &'a mut CudaSlice<f32>,
    pub rows: usize,
    pub d: usize,
    pub eps: f64,
}

/// An RMSNorm backward: from `dh` and the forward's `x`, `weight` and `rstd`, writes
/// `dx = rstd·weight∘dh − x·rstd³·Σ(weight∘dh∘x)/d` per row (overwritten: the layer adds the
/// residual's gradient itself) and `d_weight = Σ_rows dh∘x·rstd` (overwritten, or added to
/// with `accumulate`).
pub(super) struct NormBackward<'a, T> {
    pub which: &'static str,
    pub x: &'a dyn DevicePtr<T>,
    pub weight: &'a CudaSlice<T>,
    pub rstd: &'a CudaSlice<f32>,
    pub dh: &'a CudaSlice<T>,
    pub dx: &'a mut CudaSlice<T>,
    pub d_weight: &'a mut CudaSlice<T>,
    pub accumulate: bool,
    pub rows: usize,
    pub d: usize,
}

/// RoPE in place on the q and k heads of a fused `qkv[T, (h_q + 2·h_kv)·hd]` (the first
/// `h_q + h_kv` heads of each row; v untouched), position of row `r` = `r mod s`, the layer's
/// θ and style ([`crate::layer`]); `inverse`: the transpose (the rotation by the negative
/// angle), which applied to `dqkv` is RoPE's backward.
pub(super) struct Rope<'a, T> {
    pub qkv: &'a mut CudaSlice<T>,
    pub layer: DecoderLayer,
    pub tokens: Tokens,
    pub inverse: bool,
}

/// SwiGLU forward over `rows` rows: `act[r, i] = silu(gu[r, i])·gu[r, ffn + i]`.
pub(super) struct SwigluForward<'a, T> {
    pub gu: &'a CudaSlice<T>,
    pub act: &'a mut CudaSlice<T>,
    pub rows: usize,
    pub ffn: usize,
}

/// SwiGLU backward: `d_gu[r, i] = d_act·up·silu'(gate)`, `d_gu[r, ffn + i] = d_act·silu(gate)`
/// with `gate = gu[r, i]`, `up = gu[r, ffn + i]`, `silu'(g) = σ(g)·(1 + g·(1 − σ(g)))`.
pub(super) struct SwigluBackward<'a, T> {
    pub gu: &'a CudaSlice<T>,
    pub d_act: &'a CudaSlice<T>,
    pub d_gu: &'a mut CudaSlice<T>,
    pub rows: usize,
    pub ffn: usize,
}

/// Phase to come: `Gpu::rms_norm_forward` on `s`'s buffers.
pub(super) fn norm_forward<T>(_gpu: &Gpu, s: NormForward<'_, T>) -> Result<()> {
    let _ = (s.x, s.weight, s.h, s.rstd, s.rows, s.d, s.eps);
    not_wired(&format!("{} forward", s.which), "h = x·rstd∘w and rstd[T] (f32)")
}

/// Phase to come: `Gpu::rms_norm_backward` on `s`'s buffers.
pub(super) fn norm_backward<T>(_gpu: &Gpu, s: NormBackward<'_, T>) -> Result<()> {
    let _ = (s.x, s.weight, s.rstd, s.dh, s.dx, s.d_weight, s.accumulate, s.rows, s.d);
    not_wired(&format!("{} backward", s.which), "dx and d_weight from dh, x, w and rstd")
}

/// Phase to come: `Gpu::rope` on `s.qkv`.
pub(super) fn rope<T>(_gpu: &Gpu, s: Rope<'_, T>) -> Result<()> {
    let _ = (s.qkv, s.layer, s.tokens);
    let step = if s.inverse { "RoPE's backward" } else { "RoPE" };
    not_wired(step, "the q and k heads of the fused qkv rotated in place")
}

/// Phase to come: `Gpu::swiglu` on `s`'s buffers.
pub(super) fn swiglu_forward<T>(_gpu: &Gpu, s: SwigluForward<'_, T>) -> Result<()> {
    let _ = (s.gu, s.act, s.rows, s.ffn);
    not_wired("SwiGLU", "act = silu(gate)·up from gu = [gate, up]")
}

/// Phase to come: `Gpu::swiglu_backward` on `s`'s buffers.
pub(super) fn swiglu_backward<T>(_gpu: &Gpu, s: SwigluBackward<'_, T>) -> Result<()> {
    let _ = (s.gu, s.d_act, s.d_gu, s.rows, s.ffn);
    not_wired("SwiGLU's backward", "d_gu = [d_gate, d_up] from gu and d_act")
}
