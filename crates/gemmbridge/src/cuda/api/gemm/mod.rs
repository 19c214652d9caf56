//! The GEMM entry points. Every call reads top to bottom: validate (every operand, before
//! anything is enqueued) → plan (the one row-major → column-major mapping) → backend (the
//! library chosen, with its fallbacks, in `route/dispatch.rs`) → launch (in the backend's room).

mod grouped;
pub(crate) mod operands;
mod plan;
mod tune;

pub use operands::{Extras, RawBuffer, RawOperands};
pub use plan::GemmPlan;
pub use tune::GpuTuning;

use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use crate::cuda::api::checks::{check_roles, either_ptr, same_context};
use crate::cuda::api::engine::Gpu;
use crate::cuda::call::{GemmCall, Scale};
use crate::cuda::device::check_extent;
use crate::cuda::route::dispatch;
use crate::dtype::Element;
use crate::error::{Result, Which};
use crate::mapping::{column_major_call, ColMajorCall};
use crate::problem::GemmProblem;
use crate::validate::BufferDesc;
use operands::{check_all, RawExtras};

/// The call value of checked buffers: `p` computed as `cm`, the scalars, A, B and C by
/// address, the epilogue's operands, and a separate C unless it is C itself.
pub(crate) fn checked_call(
    p: &GemmProblem,
    cm: ColMajorCall,
    scale: Scale,
    descs: [BufferDesc; 3],
    extras: RawExtras,
    stream: CUstream,
) -> GemmCall<'_> {
    let [a, b, c] = descs.map(|d| d.address);
    GemmCall {
        problem: p,
        cm,
        alpha: scale.alpha,
        beta: scale.beta,
        abc: (a, b, c),
        c_in: extras.c_in.map(|r| r.address).filter(|&ci| ci != c),
        bias: extras.bias.map(|r| r.address),
        aux: extras.aux.map(|r| r.address),
        stream,
    }
}

impl Gpu {
    /// `C = α·op(A)·op(B) + β·C` on cudarc device memory, enqueued on [`Gpu::stream`].
    ///
    /// - `a`, `b`: stored row-major A and B ([`cudarc::driver::CudaSlice`] or views), element
    ///   type the precision's input dtype, in this `Gpu`'s context;
    /// - `c`: stored C, element type the precision's output dtype, written in place through
    ///   `&mut` (the real storage; never a copy). Padding between rows is not touched.
    ///
    /// BLAS semantics: `β = 0` never reads C (NaN in C does not leak); `k = 0` gives
    /// `C = β·C`; m, n or batch 0 launches nothing. One difference from reference BLAS: with
    /// `α = 0` (or `k = 0`) and `β = 1` C is still rewritten as `1·C` (reference BLAS returns
    /// without touching it), so a signalling NaN in C comes back as a quiet NaN; every other
    /// value is unchanged. cudarc's own cross-stream event tracking
    /// (if the buffers were last used on another stream) is honoured; no host synchronisation.
    /// For a problem with an epilogue use [`Gpu::gemm_fused`].
    ///
    /// # Errors
    /// Before launching, with no buffer touched: [`Error::WrongContext`](crate::Error::WrongContext),
    /// [`Error::DTypeMismatch`](crate::Error::DTypeMismatch), [`Error::BufferTooSmall`](crate::Error::BufferTooSmall), [`Error::Misaligned`](crate::Error::Misaligned),
    /// [`Error::OutputOverlapsInput`](crate::Error::OutputOverlapsInput), [`Error::EpilogueOperand`](crate::Error::EpilogueOperand). From the launch:
    /// [`Error::Cublas`](crate::Error::Cublas), [`Error::NotCapturable`](crate::Error::NotCapturable), [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn gemm<TI, TO, A, B, C>(&self, p: &GemmProblem, alpha: f32, a: &A, b: &B, beta: f32, c: &mut C) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        self.gemm_fused(p, Scale::new(alpha, beta), a, b, c, Extras::default())
    }

    /// [`Gpu::gemm`] with the epilogue's extra operands ([`crate::epilogue`]): a bias it reads,
    /// a bias gradient or aux it writes, an aux it reads; and a read-only C apart from the
    /// output ([`Extras::c_in`]: `c = epilogue(α·op(A)·op(B) + β·c_in)`, `c_in` untouched).
    /// All of the output's element type.
    /// `scale` holds α and β ([`Scale::PRODUCT`]: α = 1, β = 0).
    /// An aux must be 16-byte aligned; a bias that is not is staged through the stream's
    /// 1 MiB scratch region (so at most 1 MiB of bias). With an epilogue, α = 0 still reads
    /// A and B (cuBLASLt computes the product); without one it never does.
    ///
    /// # Errors
    /// As [`Gpu::gemm`]; [`Error::EpilogueOperand`](crate::Error::EpilogueOperand) when an operand the epilogue needs is
    /// missing, one it does not use is given, or one it writes is passed read-only;
    /// [`Error::Misaligned`](crate::Error::Misaligned) for an aux off 16 bytes; for `c_in`, C's
    /// errors named [`Which::CIn`](crate::Which::CIn) and
    /// [`Error::OutputOverlapsInput`](crate::Error::OutputOverlapsInput) where a written operand
    /// shares a byte with it; [`Error::Unsupported`](crate::Error::Unsupported) with
    /// [`Backend::Blas`](crate::cuda::Backend::Blas) or past the staging limit; [`Error::LibraryNotFound`](crate::Error::LibraryNotFound) without
    /// libcublasLt.
    pub fn gemm_fused<TI, TO, A, B, C>(
        &self,
        p: &GemmProblem,
        scale: Scale,
        a: &A,
        b: &B,
        c: &mut C,
        extras: Extras<'_, TO>,
    ) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        // SAFETY: `with_typed` hands over addresses of live cudarc allocations of this
        // context, borrowed until the call returns, with their byte lengths.
        self.with_typed(p, a, b, c, extras, |descs, extras, s| unsafe { self.run(p, scale, descs, extras, s) })
    }

    /// The addresses of typed operands (every one checked to be of this `Gpu`'s context, the
    /// epilogue's roles checked against `p`), handed to `launch` with [`Gpu::stream`]; cudarc's
    /// cross-stream events are honoured, and its last-use events recorded after `launch`
    /// returns (the borrows drop then). `launch` validates the lengths and enqueues.
    pub(crate) fn with_typed<TI, TO, A, B, C>(
        &self,
        p: &GemmProblem,
        a: &A,
        b: &B,
        c: &mut C,
        extras: Extras<'_, TO>,
        launch: impl FnOnce([BufferDesc; 3], RawExtras, CUstream) -> Result<()>,
    ) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        let Extras { c_in, bias, bias_grad, aux_in, aux_out } = extras;
        // Every operand in this Gpu's context (checked without allocating: this is the
        // per-call path).
        let ctx = self.context();
        let same = |which: Which, s: &Arc<CudaStream>| same_context(which, s, ctx);
        same(Which::A, a.stream())?;
        same(Which::B, b.stream())?;
        same(Which::C, c.stream())?;
        let extra_streams = [
            (Which::CIn, c_in.as_ref().map(|v| v.stream())),
            (Which::Bias, bias.as_ref().map(|v| v.stream())),
            (Which::Bias, bias_grad.as_ref().map(|v| v.stream())),
            (Which::Aux, aux_in.as_ref().map(|v| v.stream())),
            (Which::Aux, aux_out.as_ref().map(|v| v.stream())),
        ];
        for (which, s) in extra_streams {
            if let Some(s) = s {
                same(which, s)?;
            }
        }
        check_roles(p.epilogue(), bias.is_some(), bias_grad.is_some(), aux_in.is_some(), aux_out.is_some())?;
        let s = self.stream();
        let (la, lb, lc) = (a.num_bytes(), b.num_bytes(), c.num_bytes());
        let (pa, _ra) = a.device_ptr(s);
        let (pb, _rb) = b.device_ptr(s);
        let (pc, _wc) = c.device_ptr_mut(s);
        let (pci, ci_len, _gci) = either_ptr(c_in, None, s);
        let (pv, vec_len, _gv) = either_ptr(bias, bias_grad, s);
        let (px, aux_len, _gx) = either_ptr(aux_in, aux_out, s);
        let raw = |address, len_bytes| RawBuffer { address, len_bytes };
        let descs = [
            BufferDesc { address: pa, len_bytes: la, dtype: TI::DTYPE },
            BufferDesc { address: pb, len_bytes: lb, dtype: TI::DTYPE },
            BufferDesc { address: pc, len_bytes: lc, dtype: TO::DTYPE },
        ];
        let extras = RawExtras {
            c_in: pci.map(|a| raw(a, ci_len)),
            bias: pv.map(|a| raw(a, vec_len)),
            aux: px.map(|a| raw(a, aux_len)),
        };
        // Every address comes from a live cudarc allocation of this context, borrowed for this
        // call (cudarc's events, recorded when the guards drop after the enqueue, order later
        // uses); `launch` checks lengths against the layouts.
        launch(descs, extras, s.cu_stream())
    }

    /// `C = epilogue(α·op(A)·op(B) + β·C)` on device memory given by address ([`RawOperands`]:
    /// A, B, C, a separate read-only C if given, and the epilogue's operands, named), enqueued
    /// on `stream`, with `scale`'s α and
    /// β. Zero-copy interop with other frameworks' buffers; returns once the GEMM is enqueued.
    /// The epilogue's rules are [`Gpu::gemm_fused`]'s.
    ///
    /// Each buffer's element type is the one the precision names (inputs: `precision.input()`,
    /// C and the epilogue's operands: `precision.output()`); lengths are in bytes.
    ///
    /// # Safety
    /// - every address is device memory (or null where the layout addresses nothing) in this
    ///   `Gpu`'s context, valid for `len_bytes` until the GEMM has run on `stream`;
    /// - `stream` is a live stream of this context (or null, the legacy default stream);
    /// - nothing writes A or B, or touches C, concurrently with the GEMM except in stream order.
    ///
    /// With [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses) on,
    /// an address that is not memory this GPU can access over the bytes the problem touches is an
    /// error instead of a fault.
    ///
    /// A `stream` other than [`Gpu::stream`] gets a last-use event recorded after the call
    /// (one `cuEventRecord` unless the stream is capturing; 0.23 µs of host time per call on
    /// the H200, `gemmbridge bench --ops launch` field `host_raw_other_stream_us`): dropping
    /// the `Gpu` waits for that event, not for the stream or the context, so the stream may
    /// be destroyed first.
    ///
    /// # Errors
    /// Before anything is enqueued, with no buffer touched: [`Error::NullPointer`](crate::Error::NullPointer),
    /// [`Error::Misaligned`](crate::Error::Misaligned), [`Error::BufferTooSmall`](crate::Error::BufferTooSmall), [`Error::OutputOverlapsInput`](crate::Error::OutputOverlapsInput),
    /// [`Error::NotDeviceMemory`](crate::Error::NotDeviceMemory) (with the check on), and the epilogue's as
    /// [`Gpu::gemm_fused`]. From the launch: [`Error::Cublas`](crate::Error::Cublas) (status by name),
    /// [`Error::NotCapturable`](crate::Error::NotCapturable) (a plan or workspace would be created while `stream` is
    /// capturing), [`Error::Driver`](crate::Error::Driver).
    pub unsafe fn gemm_raw(&self, p: &GemmProblem, scale: Scale, ops: RawOperands, stream: CUstream) -> Result<()> {
        let (descs, extras) = (ops.descs(p), ops.extras());
        if self.device().checks_raw_addresses() {
            check_all(p, descs, extras)?;
            self.check_addresses(p, descs, extras)?;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.run(p, scale, descs, extras, stream) }
    }

    /// Whether every byte the call touches lies in one allocation this GPU can access
    /// (`cuPointerGetAttributes` per operand;
    /// [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses)).
    pub(super) fn check_addresses(&self, p: &GemmProblem, descs: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
        let out = p.precision().output();
        let d = |r: RawBuffer| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype: out };
        let ordinal = self.context().ordinal();
        self.device().bind()?;
        for (which, e, _) in crate::validate::spans(p, descs, extras.bias.map(d), extras.aux.map(d))? {
            check_extent(which, e.start, (e.end - e.start) as usize, ordinal)?;
        }
        if let Some(ci) = extras.c_in.filter(|ci| ci.address != descs[2].address) {
            let batch = if p.is_empty() { 0 } else { p.batch() };
            let bytes = p.c().required_elems(batch).unwrap_or(0).saturating_mul(out.size_bytes());
            check_extent(Which::CIn, ci.address, bytes, ordinal)?;
        }
        Ok(())
    }

    /// The one path of every call: validate → the call value → the routing floor (library,
    /// fallbacks, padded copies) → the library room's launch.
    ///
    /// # Safety
    /// The caller's contract of [`Gpu::gemm_raw`].
    pub(crate) unsafe fn run(
        &self,
        p: &GemmProblem,
        scale: Scale,
        descs: [BufferDesc; 3],
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        check_all(p, descs, extras)?;
        // SAFETY: checked above; the rest is the caller's contract.
        unsafe { self.enqueue_checked(p, scale, descs, extras, stream) }
    }

    /// [`Gpu::run`] after its buffer checks (`check_all`), for a caller that has made them
    /// already (a grouped GEMM checks every group before it launches any).
    ///
    /// # Safety
    /// As [`Gpu::run`]; `check_all(p, descs, extras)` has passed.
    pub(crate) unsafe fn enqueue_checked(
        &self,
        p: &GemmProblem,
        scale: Scale,
        descs: [BufferDesc; 3],
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        if p.is_empty() {
            return Ok(());
        }
        let request = checked_call(p, column_major_call(p), scale, descs, extras, stream);
        self.device().bind()?;
        let mut st = self.lock();
        // SAFETY: validated above; the rest is the caller's contract.
        let served = unsafe { dispatch::enqueue(&mut st, &request) };
        // Even after a failure: part of the call (a padded copy) may be enqueued.
        self.device().note_use(&mut st, stream)?;
        let served = served?;
        tracing::debug!(problem = %p.describe(), ?served, "gemm enqueued");
        Ok(())
    }
}
