//! The FP8 GEMM entry points: validate (every operand and every FP8 rule, before anything is
//! enqueued) → the routing floor's staging plan and launch (`route/fp8.rs`). Staging: where
//! the output's rows or address miss the FP8 kernels' alignment rules, the GEMM runs on an
//! aligned copy of `y` from the stream-ordered pool (one `cuMemAllocAsync` and one or two
//! pitched copies per call; none on the aligned path; `crate::fp8` lists the measured rules).

mod grouped;
mod quantize;

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::library;
use crate::cuda::route::fp8::{broken, enqueue, no_lt, Fp8Call, Fp8Options, Fp8Out, Fp8Tensor};
use crate::dtype::{DType, Element};
use crate::error::{Fp8Rule, Result, Which};
use crate::fp8::{Fp8Format, OutputKind};

/// The FP8 operations of one [`Gpu`] ([`Gpu::fp8`]): quantisation into FP8 tensors with their scales
/// ([`GpuFp8::quantize`], [`GpuFp8::grouped_quantize`], [`GpuFp8::prepare`] to compile the kernels ahead),
/// and the FP8 GEMMs on cuBLASLt ([`GpuFp8::gemm`], [`GpuFp8::gemm_to_fp8`], [`GpuFp8::grouped_gemm`]), each
/// enqueued on [`Gpu::stream`].
#[derive(Clone, Copy, Debug)]
pub struct GpuFp8<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The FP8 operations ([`GpuFp8`]).
    pub fn fp8(&self) -> GpuFp8<'_> {
        GpuFp8 { gpu: self }
    }
}

impl GpuFp8<'_> {
    /// `y[M, N] = α·(x[M, K]·w[N, K]ᵀ) + β·y (+ bias[N])` in FP8 with f32 accumulation, on
    /// [`Gpu::stream`]; `y` row-major, contiguous, of f32, f16 or bf16 (the bias, if any, of
    /// the same type). The scales are applied as cuBLASLt does: element `(i, j)` is
    /// `α·Σ_k q_x[i,k]·s_x(i,k)·q_w[j,k]·s_w(j,k)` (+ β·y + bias).
    ///
    /// Every rule of [`crate::fp8`] is checked first; shapes the hardware cannot take
    /// directly run on a staged copy of `y` (module documentation of this file, summarised in
    /// docs/DESIGN.md). No host synchronisation.
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::Fp8`](crate::Error::Fp8) (the rule broken, with the values),
    /// [`Error::BufferTooSmall`](crate::Error::BufferTooSmall) / [`Error::Misaligned`](crate::Error::Misaligned) for `y` or the bias,
    /// [`Error::WrongContext`](crate::Error::WrongContext) (an operand, `y` or the bias from another context),
    /// [`Error::LibraryNotFound`](crate::Error::LibraryNotFound) without cuBLASLt. From the launch:
    /// [`Error::Cublas`](crate::Error::Cublas), [`Error::NotCapturable`](crate::Error::NotCapturable), [`Error::Driver`](crate::Error::Driver).
    pub fn gemm<O: Element, Y: DevicePtrMut<O>>(
        &self,
        x: &Fp8Tensor,
        w: &Fp8Tensor,
        y: &mut Y,
        bias: Option<&dyn DevicePtr<O>>,
        opts: Fp8Options,
    ) -> Result<()> {
        let gpu = self.gpu;
        gpu.fp8_dense(x, w, (None, y), bias, opts)
    }

    /// [`GpuFp8::gemm`] with an E4M3 output `y[M, N]` (bytes, row-major), its D scale and
    /// amax ([`Fp8Out`]); tensor-wise scales only, β = 0, the bias (if any) bf16.
    ///
    /// # Errors
    /// As [`GpuFp8::gemm`]; [`Error::Fp8`](crate::Error::Fp8) with [`Fp8Rule::OutputDtype`] for other scales
    /// or β ≠ 0.
    pub fn gemm_to_fp8<Y: DevicePtrMut<u8>>(
        &self,
        x: &Fp8Tensor,
        w: &Fp8Tensor,
        y: &mut Y,
        out: Fp8Out<'_>,
        bias: Option<&dyn DevicePtr<half::bf16>>,
        opts: Fp8Options,
    ) -> Result<()> {
        let gpu = self.gpu;
        if opts.beta != 0.0 {
            return Err(broken(
                Fp8Rule::OutputDtype,
                format!("β = {} with an FP8 output: only β = 0 is offered", opts.beta),
            ));
        }
        let ctx = gpu.context();
        same_context(Which::A, x.data.stream(), ctx)?;
        same_context(Which::B, w.data.stream(), ctx)?;
        same_context(Which::C, y.stream(), ctx)?;
        same_context(Which::Scale, out.d_scale.stream(), ctx)?;
        same_context(Which::Scale, out.amax.stream(), ctx)?;
        if let Some(b) = bias {
            same_context(Which::Bias, b.stream(), ctx)?;
        }
        let s = gpu.stream();
        let (y_len, ds_len, am_len) = (y.num_bytes(), out.d_scale.num_bytes(), out.amax.num_bytes());
        let (py, _gy) = y.device_ptr_mut(s);
        let (pd, _gd) = out.d_scale.device_ptr(s);
        let (pa, _ga) = out.amax.device_ptr_mut(s);
        let (bias, _gb) = match bias {
            Some(b) => {
                let (p, g) = b.device_ptr(s);
                (Some((p, b.num_bytes(), DType::BF16)), Some(g))
            }
            None => (None, None),
        };
        let out = OutputKind::Fp8(Fp8Format::E4M3);
        let call = Fp8Call {
            x,
            w,
            y: (py, y_len),
            c_in: None,
            out,
            bias,
            d_scale: Some((pd, ds_len)),
            amax: Some((pa, am_len)),
            opts,
        };
        // SAFETY: as in GpuFp8::gemm.
        unsafe { gpu.fp8_run(&call, s.cu_stream()) }
    }
}

impl Gpu {
    /// [`GpuFp8::gemm`], with `c_in`: `y = α·(x·wᵀ) + β·c_in (+ bias)`, `c_in` a read-only C
    /// laid out as `y` and apart from it (the decoder layer's residual adds).
    ///
    /// # Errors
    /// As [`GpuFp8::gemm`]; for `c_in` as for `y` ([`Which::CIn`]), and
    /// [`crate::Error::OutputOverlapsInput`] where it overlaps `y`.
    pub(crate) fn fp8_dense<O: Element>(
        &self,
        x: &Fp8Tensor,
        w: &Fp8Tensor,
        (c_in, y): (Option<&dyn DevicePtr<O>>, &mut dyn DevicePtrMut<O>),
        bias: Option<&dyn DevicePtr<O>>,
        opts: Fp8Options,
    ) -> Result<()> {
        let ctx = self.context();
        same_context(Which::A, x.data.stream(), ctx)?;
        same_context(Which::B, w.data.stream(), ctx)?;
        same_context(Which::C, y.stream(), ctx)?;
        if let Some(c) = c_in {
            same_context(Which::CIn, c.stream(), ctx)?;
        }
        if let Some(b) = bias {
            same_context(Which::Bias, b.stream(), ctx)?;
        }
        let s = self.stream();
        let y_len = y.num_bytes();
        let (py, _gy) = y.device_ptr_mut(s);
        let (c_in, _gc) = match c_in {
            Some(c) => {
                let (p, g) = c.device_ptr(s);
                let used = (x.layout.rows * w.layout.rows * O::DTYPE.size_bytes()).min(y_len);
                let spans =
                    [Span { which: Which::C, addr: py, bytes: used }, Span { which: Which::CIn, addr: p, bytes: used }];
                disjoint(&spans[..1], &spans[1..])?;
                (Some((p, c.num_bytes())), Some(g))
            }
            None => (None, None),
        };
        let (bias, _gb) = match bias {
            Some(b) => {
                let (p, g) = b.device_ptr(s);
                (Some((p, b.num_bytes(), O::DTYPE)), Some(g))
            }
            None => (None, None),
        };
        let out = OutputKind::Dense(O::DTYPE);
        let call = Fp8Call { x, w, y: (py, y_len), c_in, out, bias, d_scale: None, amax: None, opts };
        // SAFETY: every address is a live cudarc allocation of this context borrowed for the
        // call (cudarc's events order later uses); lengths are checked in fp8_run.
        unsafe { self.fp8_run(&call, s.cu_stream()) }
    }
}

impl Gpu {
    /// validate → the routing floor (staging plan, launch).
    ///
    /// # Safety
    /// Every address in `call` is device memory of this context valid for its length until
    /// the GEMM has run on `stream`, a live stream of the context.
    pub(crate) unsafe fn fp8_run(&self, call: &Fp8Call, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        if !library::has_cublaslt() {
            return Err(no_lt());
        }
        call.validate(self.fp8_platform()?)?;
        self.device().bind()?;
        let s = self.stream();
        let (xd, _gx) = call.x.data.device_ptr(s);
        let (wd, _gw) = call.w.data.device_ptr(s);
        let (xs, _gxs) = call.x.scales.device_ptr(s);
        let (ws, _gws) = call.w.scales.device_ptr(s);
        let mut st = self.lock();
        // SAFETY: validated above; the rest is the caller's contract.
        unsafe { enqueue(&mut st, call, [xd, wd, xs, ws], stream) }
    }
}
