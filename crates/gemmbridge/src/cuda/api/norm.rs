//! The RMSNorm entry points on cuDNN's norm graph: validate (the problem, every buffer's
//! dtype, length, alignment, context and overlap) before anything is enqueued → plan (once per
//! problem, direction and alignment, `dnn/norm/`) → launch on [`Gpu::stream`], no host
//! synchronisation.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::checks::{disjoint, read_span, same_context, write_span};
use super::engine::Gpu;
use crate::cuda::device::{refuse_if_capturing, Locked, Needs, Relaxed};
use crate::cuda::dnn::norm::{NormBuffers, NormCall, NormOp};
use crate::cuda::lt::transform::{self, Rows};
use crate::cuda::route::Fp8Out;
use crate::cuda::route::Libraries;
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, Which};
use crate::norm::{NormTensor, RmsNorm};

/// What the forward reads: `x` (strided as the problem's [`NormTensor::X`]), the weight
/// `w[features]` and, for a pre-norm residual add, `residual` (strided as
/// [`NormTensor::Residual`]): the norm then runs on `x + residual`, which is written to
/// [`RmsNormOut::sum`].
#[derive(Clone, Copy)]
pub struct RmsNormIn<'a, T> {
    /// The input `x[rows, features]`.
    pub x: &'a dyn DevicePtr<T>,
    /// The weight (scale) `w[features]`, contiguous.
    pub w: &'a dyn DevicePtr<T>,
    /// The residual added to `x` before the norm.
    pub residual: Option<&'a dyn DevicePtr<T>>,
}

impl<'a, T> RmsNormIn<'a, T> {
    /// `x` and `w`, no residual.
    pub fn new(x: &'a dyn DevicePtr<T>, w: &'a dyn DevicePtr<T>) -> RmsNormIn<'a, T> {
        RmsNormIn { x, w, residual: None }
    }
}

/// The forward's output `y[rows, features]` (strided as the problem's [`NormTensor::Y`]).
pub enum RmsNormY<'a, T> {
    /// `y` in the I/O type.
    Io(&'a mut dyn DevicePtrMut<T>),
    /// `y` in FP8 E4M3 (one byte per element, for a following FP8 GEMM): the norm's f32
    /// result multiplied by `out.d_scale` (one f32, read on the device) and converted to E4M3
    /// by cuDNN (its rounding, and what a value past ±448 becomes, are cuDNN's: choose the
    /// scale from an amax so that none does); `out.amax` (one f32) receives the largest |y|
    /// before the scale.
    Fp8 {
        /// The E4M3 bytes.
        y: &'a mut dyn DevicePtrMut<u8>,
        /// The scale read and the amax written.
        out: Fp8Out<'a>,
    },
}

/// What the forward writes: `y`; with `inv_rms` (f32 `[rows]`, dense) the training phase,
/// which saves each row's inverse RMS for [`Gpu::rms_norm_backward`], without it the
/// inference phase; with a residual, `sum = x + residual` (strided as the problem's
/// [`NormTensor::Sum`]; what the next residual add and the backward read).
pub struct RmsNormOut<'a, T> {
    /// The normalised output.
    pub y: RmsNormY<'a, T>,
    /// The inverse RMS of every row (training).
    pub inv_rms: Option<&'a mut dyn DevicePtrMut<f32>>,
    /// `x + residual`, given exactly when the input has a residual.
    pub sum: Option<&'a mut dyn DevicePtrMut<T>>,
}

impl<'a, T> RmsNormOut<'a, T> {
    /// `y` in the I/O type, the inference phase, no sum.
    pub fn new(y: &'a mut dyn DevicePtrMut<T>) -> RmsNormOut<'a, T> {
        RmsNormOut { y: RmsNormY::Io(y), inv_rms: None, sum: None }
    }

    /// The same in the training phase: the inverse RMS written to `inv_rms`.
    pub fn training(self, inv_rms: &'a mut dyn DevicePtrMut<f32>) -> RmsNormOut<'a, T> {
        RmsNormOut { inv_rms: Some(inv_rms), ..self }
    }
}

/// What the backward reads: the forward's input `x` (with a residual: the sum it normalised),
/// the weight `w`, the forward's inverse RMS (f32 `[rows]`, as [`Gpu::rms_norm_forward`]
/// writes it in the training phase) and the output's gradient `dy` (strided as the problem's
/// [`NormTensor::Dy`]).
#[derive(Clone, Copy)]
pub struct RmsNormSaved<'a, T> {
    /// The forward's normalised input.
    pub x: &'a dyn DevicePtr<T>,
    /// The weight `w[features]`.
    pub w: &'a dyn DevicePtr<T>,
    /// The forward's inverse RMS.
    pub inv_rms: &'a dyn DevicePtr<f32>,
    /// The output's gradient.
    pub dy: &'a dyn DevicePtr<T>,
}

/// The weight gradient `dw[features]` the backward writes (overwritten, not accumulated), of
/// the type the problem's [`RmsNorm::dw`] names. What must agree is the element type
/// ([`RmsNorm::dw_dtype`]): for an f32 problem both forms hold f32 and either is taken.
pub enum RmsNormDw<'a, T> {
    /// In the I/O type ([`GradType::Io`](crate::norm::GradType::Io)).
    Io(&'a mut dyn DevicePtrMut<T>),
    /// In f32 ([`GradType::F32`](crate::norm::GradType::F32), or any f32 problem).
    F32(&'a mut dyn DevicePtrMut<f32>),
}

/// How [`Gpu::rms_norm_forward`] ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NormServed {
    /// cuDNN's norm graph, with the residual add inside it where there is one.
    Fused,
    /// The residual add first — cuBLASLt's matrix transform writes `sum = x + residual`
    /// (summed in f32, converted to the I/O type) — then cuDNN's norm graph on `sum`: where the
    /// loaded cuDNN has no engine for the graph with the add (cuDNN 9.14 on the H100 refused
    /// it at 4097 and 4104 features while it takes the norm alone), or with
    /// [`GpuOptions::norm_fusion`](crate::cuda::GpuOptions::norm_fusion) off. The norm then
    /// reads the sum in the I/O type, as PyTorch's `x + residual` followed by `F.rms_norm` does.
    AddThenNorm,
}

/// The problem's rules and the element type.
fn check_problem<T: Element>(p: &RmsNorm) -> Result<()> {
    p.validate()?;
    if T::DTYPE != p.dtype {
        return Err(Error::DTypeMismatch { operand: Which::Norm("x"), expected: p.dtype, got: T::DTYPE });
    }
    Ok(())
}

fn name(t: NormTensor) -> Which {
    Which::Norm(t.name())
}

/// A forward call's buffers checked (sizes, alignment, overlaps; their guards added to
/// `guards`, held until the call is enqueued), its direction and addresses.
fn forward_buffers<'g, 'i: 'g, 'o: 'g, T: Element>(
    s: &'g CudaStream,
    p: &RmsNorm,
    input: RmsNormIn<'i, T>,
    out: RmsNormOut<'o, T>,
    guards: &mut Vec<SyncOnDrop<'g>>,
) -> Result<(NormOp, NormBuffers)> {
    let elem = T::DTYPE.size_bytes();
    let rows = |t: NormTensor| (p.required_elems(t), elem);
    let mut read = vec![read_span(s, (name(NormTensor::X), input.x), rows(NormTensor::X), guards)?];
    read.push(read_span(s, (Which::Norm("w"), input.w), (p.features, elem), guards)?);
    if let Some(r) = input.residual {
        read.push(read_span(s, (name(NormTensor::Residual), r), rows(NormTensor::Residual), guards)?);
    }
    let mut written = Vec::with_capacity(4);
    let fp8 = match out.y {
        RmsNormY::Io(y) => {
            written.push(write_span(s, (name(NormTensor::Y), y), rows(NormTensor::Y), guards)?);
            None
        }
        RmsNormY::Fp8 { y, out } => {
            written.push(write_span(s, (name(NormTensor::Y), y), (p.required_elems(NormTensor::Y), 1), guards)?);
            let scale = read_span(s, (Which::Norm("scale"), out.d_scale), (1, 4), guards)?;
            let amax = write_span(s, (Which::Norm("amax"), out.amax), (1, 4), guards)?;
            read.push(scale);
            written.push(amax);
            Some((scale.addr, amax.addr))
        }
    };
    let mut b = NormBuffers { x: read[0].addr, w: read[1].addr, y: written[0].addr, ..Default::default() };
    if input.residual.is_some() {
        b.residual = read[2].addr;
    }
    if let Some((scale, amax)) = fp8 {
        (b.scale, b.amax) = (scale, amax);
    }
    if let Some(st) = out.inv_rms {
        let sp = write_span(s, (Which::Norm("inv_rms"), st), (p.rows, 4), guards)?;
        written.push(sp);
        b.inv_rms = sp.addr;
    }
    if let Some(sm) = out.sum {
        let sp = write_span(s, (name(NormTensor::Sum), sm), rows(NormTensor::Sum), guards)?;
        written.push(sp);
        b.sum = sp.addr;
    }
    disjoint(&written, &read)?;
    let op = NormOp::Forward { training: b.inv_rms != 0, residual: b.residual != 0, fp8: fp8.is_some() };
    Ok((op, b))
}

impl Gpu {
    /// RMSNorm's forward, PyTorch's `F.rms_norm(x, (features,), w, eps)` (the definition and
    /// shapes: [`crate::norm`]), on cuDNN's norm graph on [`Gpu::stream`]: `y = x · inv_rms ·
    /// w` with `inv_rms = 1/√(mean(x²) + ε)` per row, f32 arithmetic, `y` overwritten. Every
    /// row-major tensor has the leading dimension the problem gives it, so `x` may be a row
    /// slice of a wider buffer (and `y` be written into one) where the loaded cuDNN takes
    /// strided rows. The phase follows `out.inv_rms`: given, the training phase saves the
    /// inverse RMS (f32 `[rows]`); absent, the inference phase writes only `y`.
    ///
    /// Options, each where the loaded cuDNN has an engine for the graph ([`Error::Unsupported`]
    /// naming it otherwise; `gemmbridge probe --only norm` tells which this machine's cuDNN
    /// takes): a pre-norm residual add (`input.residual`; `x + residual` written to `out.sum`
    /// and normalised), `y` in FP8 E4M3 with a scale and an amax ([`RmsNormY::Fp8`]), strided
    /// rows, f32 I/O. Where cuDNN takes the norm but not the graph with the residual add, the
    /// add runs first on cuBLASLt and the norm on its sum; the result says which ran
    /// ([`NormServed`]).
    ///
    /// The first call of a problem (rows, features, types, leading dimensions), direction and
    /// buffer alignment builds its cuDNN operation graph and plan (cuDNN's best-ranked engine
    /// configuration; ε is passed per call); later calls only launch and can be captured into
    /// a CUDA graph. The workspace is this stream's where it fits, else the cuDNN room's own (up
    /// to [`GpuOptions::conv_workspace_limit`](crate::cuda::GpuOptions::conv_workspace_limit)).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::NormShape`] (the problem's rules; a residual
    /// without a sum or a sum without a residual); [`Error::DTypeMismatch`] (an element type
    /// other than the problem's), [`Error::BufferTooSmall`], [`Error::Misaligned`] (an address
    /// off its element size), [`Error::OutputOverlapsInput`] (any two outputs, or an output
    /// and an input, whose spans overlap), [`Error::WrongContext`] for a buffer;
    /// [`Error::LibraryNotFound`] without libcudnn; [`Error::NotCapturable`] for a first call
    /// inside a capture; [`Error::Unsupported`] on a GPU before Ampere, a cuDNN before 8.9.6,
    /// or where no engine of the loaded cuDNN takes the graph (with a residual: neither the
    /// fused graph nor the norm alone, or no cuBLASLt for the add). From cuDNN:
    /// [`Error::Cudnn`]; from the add: [`Error::Cublas`].
    pub fn rms_norm_forward<T: Element>(
        &self,
        p: &RmsNorm,
        input: RmsNormIn<'_, T>,
        out: RmsNormOut<'_, T>,
    ) -> Result<NormServed> {
        check_problem::<T>(p)?;
        let bad = |what: &'static str| Err(Error::NormShape { what, detail: p.describe() });
        match (input.residual.is_some(), out.sum.is_some()) {
            (true, false) => return bad("a residual was given without the sum output (x + residual)"),
            (false, true) => return bad("a sum output was given without a residual"),
            _ => {}
        }
        self.forward_contexts(&input, &out)?;
        let mut guards = Vec::with_capacity(8);
        let (op, b) = forward_buffers(self.stream(), p, input, out, &mut guards)?;
        let r = self.norm_forward_run(p, op, b);
        drop(guards);
        r
    }

    /// The forward's one checked call; with a residual whose fused graph cuDNN refuses, the
    /// add and the norm as two steps ([`NormServed::AddThenNorm`]), the norm planned before
    /// the add is enqueued so that a norm cuDNN refuses too writes nothing.
    fn norm_forward_run(&self, p: &RmsNorm, op: NormOp, b: NormBuffers) -> Result<NormServed> {
        let NormOp::Forward { training, residual: true, fp8 } = op else {
            return self.norm_run(p, op, b, None)?.map(|()| NormServed::Fused);
        };
        let (fuse, has_lt) = {
            let st = self.lock();
            (st.libs.norm_fuse, st.libs.lt.is_some())
        };
        if fuse {
            let refusal = match self.norm_run(p, op, b, None)? {
                Ok(()) => return Ok(NormServed::Fused),
                Err(refusal) => refusal,
            };
            if !has_lt {
                let Error::Unsupported { backend, what } = refusal else { return Err(refusal) };
                let what = format!("{what}; the add alone would run on cuBLASLt, which is not loaded");
                return Err(Error::Unsupported { backend, what });
            }
        } else if !has_lt {
            let what =
                format!("{}: the residual add unfused (GpuOptions::norm_fusion off) without libcublasLt", p.describe());
            return Err(Error::Unsupported { backend: "cuBLASLt", what });
        }
        let rows = Rows {
            dtype: p.dtype,
            rows: p.rows,
            cols: p.features,
            lds: [p.ld(NormTensor::X), p.ld(NormTensor::Residual), p.ld(NormTensor::Sum)],
        };
        let norm = p.with_ld(NormTensor::X, p.ld(NormTensor::Sum));
        let plain = NormOp::Forward { training, residual: false, fp8 };
        let on_sum = NormBuffers { x: b.sum, residual: 0, sum: 0, ..b };
        tracing::debug!(problem = %p.describe(), "RMSNorm: the residual add and the norm as two steps");
        self.norm_run(&norm, plain, on_sum, Some((rows, [b.x, b.residual, b.sum])))??;
        Ok(NormServed::AddThenNorm)
    }

    /// Every buffer of a forward call belongs to this context.
    fn forward_contexts<T>(&self, input: &RmsNormIn<'_, T>, out: &RmsNormOut<'_, T>) -> Result<()> {
        let ctx = self.context();
        let mut streams = vec![(name(NormTensor::X), input.x.stream()), (Which::Norm("w"), input.w.stream())];
        streams.extend(input.residual.map(|r| (name(NormTensor::Residual), r.stream())));
        streams.extend(out.inv_rms.as_ref().map(|b| (Which::Norm("inv_rms"), b.stream())));
        streams.extend(out.sum.as_ref().map(|b| (name(NormTensor::Sum), b.stream())));
        match &out.y {
            RmsNormY::Io(b) => streams.push((name(NormTensor::Y), b.stream())),
            RmsNormY::Fp8 { y, out } => streams.extend([
                (name(NormTensor::Y), y.stream()),
                (Which::Norm("scale"), out.d_scale.stream()),
                (Which::Norm("amax"), out.amax.stream()),
            ]),
        }
        streams.into_iter().try_for_each(|(which, st)| same_context(which, st, ctx))
    }

    /// The backward of [`Gpu::rms_norm_forward`] on cuDNN's norm graph, on [`Gpu::stream`]:
    /// `dx` (strided as the problem's [`NormTensor::Dx`]; overwritten) and the weight gradient
    /// `dw` (overwritten, in the type [`RmsNorm::dw`] names; cuDNN reduces it over the rows)
    /// from what the training forward saved ([`RmsNormSaved`]):
    /// `dx = inv_rms·(g − x̂·mean(g·x̂))`, `dw = Σ_rows dy·x̂` with `x̂ = x·inv_rms`, `g = dy·w`.
    /// Plans, capture and workspace as the forward.
    ///
    /// # Errors
    /// As [`Gpu::rms_norm_forward`]; [`Error::DTypeMismatch`] for a `dw` whose element type is
    /// not [`RmsNorm::dw_dtype`] (for an f32 problem either form is taken); [`Error::Unsupported`] where the loaded cuDNN does not take an f32 `dw`
    /// beside f16/bf16 I/O or strided rows.
    pub fn rms_norm_backward<T: Element>(
        &self,
        p: &RmsNorm,
        saved: RmsNormSaved<'_, T>,
        dx: &mut dyn DevicePtrMut<T>,
        dw: RmsNormDw<'_, T>,
    ) -> Result<()> {
        check_problem::<T>(p)?;
        let RmsNormSaved { x, w, inv_rms, dy } = saved;
        let (got, dw_stream) = match &dw {
            RmsNormDw::Io(b) => (p.dtype, b.stream()),
            RmsNormDw::F32(b) => (DType::F32, b.stream()),
        };
        if got != p.dw_dtype() {
            return Err(Error::DTypeMismatch { operand: Which::Norm("dw"), expected: p.dw_dtype(), got });
        }
        let (ctx, s) = (self.context(), self.stream());
        for (which, st) in [
            (name(NormTensor::X), x.stream()),
            (Which::Norm("w"), w.stream()),
            (Which::Norm("inv_rms"), inv_rms.stream()),
            (name(NormTensor::Dy), dy.stream()),
            (name(NormTensor::Dx), dx.stream()),
            (Which::Norm("dw"), dw_stream),
        ] {
            same_context(which, st, ctx)?;
        }
        let elem = T::DTYPE.size_bytes();
        let rows = |t: NormTensor| (p.required_elems(t), elem);
        let mut guards = Vec::with_capacity(6);
        let read = [
            read_span(s, (name(NormTensor::X), x), rows(NormTensor::X), &mut guards)?,
            read_span(s, (Which::Norm("w"), w), (p.features, elem), &mut guards)?,
            read_span(s, (Which::Norm("inv_rms"), inv_rms), (p.rows, 4), &mut guards)?,
            read_span(s, (name(NormTensor::Dy), dy), rows(NormTensor::Dy), &mut guards)?,
        ];
        let dw_span = match dw {
            RmsNormDw::Io(b) => write_span(s, (Which::Norm("dw"), b), (p.features, elem), &mut guards)?,
            RmsNormDw::F32(b) => write_span(s, (Which::Norm("dw"), b), (p.features, 4), &mut guards)?,
        };
        let written = [write_span(s, (name(NormTensor::Dx), dx), rows(NormTensor::Dx), &mut guards)?, dw_span];
        disjoint(&written, &read)?;
        let b = NormBuffers {
            x: read[0].addr,
            w: read[1].addr,
            inv_rms: read[2].addr,
            dy: read[3].addr,
            dx: written[0].addr,
            dw: written[1].addr,
            ..Default::default()
        };
        let r = self.norm_run(p, NormOp::Backward, b, None);
        drop(guards);
        r?
    }

    /// Plans (on first use) and launches one checked call, after `add` (the addends' and the
    /// sum's shape and addresses: cuBLASLt's transform, enqueued once the plan, the handle and
    /// the workspace are ready, so that only the launch itself can fail after it).
    /// `Ok(Err(refusal))`: cuDNN has no engine for the graph ([`Error::Unsupported`]), and
    /// nothing was enqueued.
    fn norm_run(&self, p: &RmsNorm, op: NormOp, b: NormBuffers, add: Option<(Rows, [u64; 3])>) -> Result<Result<()>> {
        let stream = self.stream().cu_stream();
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        let mut call = NormCall { problem: p, op, buffers: b, workspace: (0, 0), stream };
        if let Err(refusal) = self.norm_prepare(st, &mut call)? {
            return Ok(Err(refusal));
        }
        let ready = st.libs.dnn.as_mut().expect("made by norm_prepare").norm_ready(&call)?;
        if let Some((rows, ptrs)) = add {
            let lt = st.libs.lt.as_ref().expect("checked by the caller");
            // SAFETY: the addends and the sum were checked against the problem's sizes (the
            // sum overlaps neither), belong to this context and are borrowed until enqueued;
            // the stream is the Gpu's own. Ordered before the norm that reads the sum.
            unsafe { transform::add(&lt.handle, rows, ptrs, stream as _) }.map_err(|e| match e {
                Error::Cublas { operation, status, .. } => {
                    Error::Cublas { operation, status, problem: format!("the residual add of {}", p.describe()) }
                }
                e => e,
            })?;
        }
        let dnn = st.libs.dnn.as_mut().expect("made by norm_prepare");
        // SAFETY: every address was checked above against the problem's sizes and belongs to
        // this context, borrowed (guards) until the call is enqueued; the workspace is this
        // stream's; the stream is the Gpu's own, live.
        unsafe { dnn.norm_launch(&call, ready) }?;
        Ok(Ok(()))
    }

    /// The call's plan made if it is not (never while the stream is being captured), and its
    /// workspace: `Ok(Err(refusal))` where cuDNN has no engine for the graph.
    fn norm_prepare(&self, st: &mut Locked<Libraries>, call: &mut NormCall) -> Result<Result<()>> {
        let (p, op, stream) = (call.problem, call.op, call.stream);
        let planned = st.libs.dnn.as_ref().is_some_and(|d| d.norm_planned(call));
        if !planned {
            let needs = Needs::Plan("plan an RMSNorm call (cuDNN operation graph and engine choice)");
            refuse_if_capturing(stream, needs, || format!("{} {op:?}", p.describe()))?;
            // cudnn-frontend's RMSNorm samples skip before Ampere
            let (major, minor) = self.context().compute_capability().map_err(status::driver("cuDeviceGetAttribute"))?;
            if major < 8 {
                let what =
                    format!("RMSNorm on a GPU of compute capability {major}.{minor}: it needs Ampere (8.0) or later");
                return Err(Error::Unsupported { backend: "cuDNN", what });
            }
        }
        // Planning may allocate and load kernels: allowed while another thread captures in
        // global mode.
        let _relaxed = if planned { None } else { Some(Relaxed::enter()?) };
        let ctx = self.context();
        st.libs.ensure_dnn(ctx.is_primary().then(|| ctx.ordinal()))?;
        let ws = st.dev.workspaces.get(stream, &|| p.describe())?;
        call.workspace = (ws.ptr, ws.matmul_bytes);
        st.libs.dnn.as_mut().expect("created above").norm_plan(call)
    }
}
