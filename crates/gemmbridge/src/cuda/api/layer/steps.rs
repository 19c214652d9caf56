//! The layer's steps that are neither GEMMs nor attention — RMSNorm (cuDNN), RoPE and SwiGLU
//! (gemmbridge's own kernels), forward and backward — each one call of the entry that serves
//! it, on the problems of [`crate::layer`] ([`DecoderLayer::norm_problem`],
//! [`DecoderLayer::rope_problem`], [`DecoderLayer::swiglu_problem`]), and the residual
//! gradient's add (cuBLAS `axpy`).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::cuda::api::engine::Gpu;
use crate::cuda::api::{RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::layer::{DecoderLayer, Tokens};
use crate::layer_ops::{Positions, RopeDirection};
use crate::norm::GradType;

/// An RMSNorm forward over the layer's `T` rows of `d`: `h = x·rstd∘weight`, and with `rstd`
/// (a training forward) `rstd = 1/sqrt(mean(x²) + eps)` per row (f32).
pub(super) struct NormForward<'a, T> {
    pub x: &'a dyn DevicePtr<T>,
    pub weight: &'a CudaSlice<T>,
    pub h: &'a mut CudaSlice<T>,
    pub rstd: Option<&'a mut CudaSlice<f32>>,
}

/// Where an RMSNorm backward writes its weight gradient: f32 or the I/O type, as the layer's
/// [`GradType`] says (the other is not written).
pub(super) struct NormDw<'a, T> {
    pub f32: &'a mut CudaSlice<f32>,
    pub io: &'a mut CudaSlice<T>,
}

/// An RMSNorm backward: from `dh` and the forward's `x`, `weight` and `rstd`, writes
/// `dx = rstd·weight∘dh − x·rstd³·Σ(weight∘dh∘x)/d` per row (overwritten: the layer adds the
/// residual's gradient itself) and the weight gradient `Σ_rows dh∘x·rstd` (overwritten).
pub(super) struct NormBackward<'a, T> {
    pub x: &'a dyn DevicePtr<T>,
    pub weight: &'a CudaSlice<T>,
    pub rstd: &'a CudaSlice<f32>,
    pub dh: &'a CudaSlice<T>,
    pub dx: &'a mut CudaSlice<T>,
    pub dw: NormDw<'a, T>,
}

/// [`Gpu::rms_norm_forward`] (the inference phase without `rstd`, the training phase with it).
pub(super) fn norm_forward<T: Element>(
    gpu: &Gpu,
    (l, t): (&DecoderLayer, Tokens),
    s: NormForward<'_, T>,
) -> Result<()> {
    let p = l.norm_problem(t, GradType::Io);
    let out = RmsNormOut { y: RmsNormY::Io(s.h), inv_rms: s.rstd.map(|r| r as &mut dyn DevicePtrMut<f32>), sum: None };
    gpu.rms_norm_forward(&p, RmsNormIn::new(s.x, s.weight), out).map(|_| ())
}

/// [`Gpu::rms_norm_backward`] with the weight gradient in `dw_type`.
pub(super) fn norm_backward<T: Element>(
    gpu: &Gpu,
    (l, t, dw_type): (&DecoderLayer, Tokens, GradType),
    s: NormBackward<'_, T>,
) -> Result<()> {
    let p = l.norm_problem(t, dw_type);
    let saved = RmsNormSaved { x: s.x, w: s.weight, inv_rms: s.rstd, dy: s.dh };
    let dw = match dw_type {
        GradType::F32 => RmsNormDw::F32(s.dw.f32),
        GradType::Io => RmsNormDw::Io(s.dw.io),
    };
    gpu.rms_norm_backward(&p, saved, s.dx, dw)
}

/// RoPE in place on the q and k heads of the fused `qkv` ([`DecoderLayer::rope_problem`]:
/// position = the token's place in its sequence, angles from the layer's θ); `backward`: the
/// rotation by the opposite angles, applied to `dqkv`.
pub(super) fn rope<T: Element>(
    gpu: &Gpu,
    (l, t): (&DecoderLayer, Tokens),
    qkv: &mut CudaSlice<T>,
    backward: bool,
) -> Result<()> {
    let direction = if backward { RopeDirection::Backward } else { RopeDirection::Forward };
    gpu.rope(&l.rope_problem(t), direction, qkv, Positions::Contiguous { start: 0 }, None)
}

/// SwiGLU forward: `act[r, i] = silu(gu[r, i])·gu[r, ffn + i]` (gate the first half).
pub(super) fn swiglu_forward<T: Element>(
    gpu: &Gpu,
    (l, t): (&DecoderLayer, Tokens),
    gu: &CudaSlice<T>,
    act: &mut CudaSlice<T>,
) -> Result<()> {
    gpu.swiglu(&l.swiglu_problem(t), gu, act)
}

/// SwiGLU backward: `d_gu = [d_act·up·silu'(gate), d_act·silu(gate)]` from `gu` and `d_act`.
pub(super) fn swiglu_backward<T: Element>(
    gpu: &Gpu,
    (l, t): (&DecoderLayer, Tokens),
    (gu, d_act): (&CudaSlice<T>, &CudaSlice<T>),
    d_gu: &mut CudaSlice<T>,
) -> Result<()> {
    gpu.swiglu_backward(&l.swiglu_problem(t), d_act, gu, d_gu)
}

/// `y += x` over `n` elements of `dtype` (cuBLAS `axpy`, f32 arithmetic): a residual's gradient
/// added to the gradient through its branch, or a norm's weight gradient accumulated.
///
/// # Safety
/// `x` and `y` are distinct device buffers of this engine's context holding `n` elements of
/// `dtype` each, live until the add has run on the engine's stream.
pub(super) unsafe fn add_into(gpu: &Gpu, dtype: DType, n: usize, x: u64, y: u64) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { gpu.enqueue_axpy(dtype, n, 1.0, x, y) }
}

/// [`add_into`] on two buffers of `T` of `n` elements each (checked by the caller).
pub(super) fn add_buffers<T: Element>(gpu: &Gpu, x: &dyn DevicePtr<T>, y: &mut dyn DevicePtrMut<T>) -> Result<()> {
    let s = gpu.stream();
    let n = y.num_bytes() / T::DTYPE.size_bytes();
    debug_assert!(x.num_bytes() >= y.num_bytes());
    let (px, _gx) = x.device_ptr(s);
    let (py, _gy) = y.device_ptr_mut(s);
    // SAFETY: the caller passes x holding at least y's elements (the layer's own buffers, or
    // its input checked against the token count), distinct buffers of this context.
    unsafe { add_into(gpu, T::DTYPE, n, px, py) }
}
