//! Set-up steps of the engine: prewarm (plans, workspaces and kernels before the first real
//! call) and autotuning (measured algorithm choice for the tactic database).

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::operands::{check_all, RawBuffer, RawOperands};
use crate::cuda::api::checks::same_context;
use crate::cuda::api::engine::Gpu;
use crate::cuda::call::Scale;
use crate::cuda::device::{Relaxed, Scratch};
use crate::cuda::lt::fp8::Fp8Key;
use crate::cuda::lt::jobs::{Fp8TuneJob, TuneJob};
use crate::cuda::lt::plan::{LtOperands, PlanKey};
use crate::cuda::lt::tune::{autotune, TuneOptions, TuneReport};
use crate::cuda::route::fp8::{fp8_shape, Fp8Call, Fp8Options, Fp8Tensor};
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::fp8::OutputKind;
use crate::mapping::column_major_call;
use crate::problem::GemmProblem;
use crate::tactics::Tactic;

/// Autotuning on one [`Gpu`] ([`Gpu::tune`]): each candidate algorithm of a problem timed on the device and
/// the fastest kept as the problem's tactic — dense GEMMs on raw buffers ([`GpuTuning::gemm_raw`]), FP8 GEMMs
/// ([`GpuTuning::fp8`]), grouped GEMMs' backends ([`GpuTuning::grouped`]).
#[derive(Clone, Copy, Debug)]
pub struct GpuTuning<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// Autotuning ([`GpuTuning`]).
    pub fn tune(&self) -> GpuTuning<'_> {
        GpuTuning { gpu: self }
    }
}

impl GpuTuning<'_> {
    /// Tunes the cuBLASLt algorithm for `p` on the given operands (on [`Gpu::stream`]), under this
    /// `Gpu`'s SM count target
    /// ([`GpuOptions::sm_count_target`](crate::cuda::GpuOptions::sm_count_target)): with a target
    /// set, the candidates are planned and timed for that many SMs and the entry's signature ends
    /// in ` sm<count>`, so that it serves only calls made under the same target.
    ///
    /// 1. Candidates: the heuristic's first `opts.candidates` algorithms for `p`, then those
    ///    it gives for the same GEMM without its epilogue and with smaller workspace limits
    ///    that cuBLASLt accepts for `p` (the heuristic ranks fused kernels separately and can
    ///    miss faster tiles: docs/DESIGN.md, Design rationale). Problems of at most 256³ multiply-adds
    ///    also get up to 160 configurations from a search of cuBLASLt's algorithm ids (each
    ///    id's tiles, stages, custom options and split-K settings; `cublasLtMatmulAlgoGetIds`,
    ///    accepted by `cublasLtMatmulAlgoCheck`; see `Plan::search` for its bounds).
    /// 2. Correctness: each runs once with β = 0; a candidate whose C differs from the first
    ///    choice's by more than the precision's band (‖·‖ relative, NaN never passes) is
    ///    never timed or kept.
    /// 3. Timing: after ~300 ms of the first choice (so every candidate runs at the sustained,
    ///    power-limited clock), `opts.reps` interleaved rounds each take one ~1 ms sample of
    ///    every candidate (CUDA events); the first choice is sampled twice per round, and the
    ///    relative difference of its two medians is the measured noise. When the first choice
    ///    takes < 20 µs per call, samples are replays of a captured graph of 64 calls, so that
    ///    the kernels' own durations are compared rather than the host's launch cost. Where
    ///    capturing fails twice (the legacy default stream cannot be captured; another
    ///    thread's first kernel launch can invalidate a capture), nothing more is timed and the
    ///    heuristic's first choice is kept, with [`TuneReport::graph_failed`] set: eager times
    ///    of such a problem rank launch costs.
    ///    With more than 24 candidates (the search's), a first pass of 3 rounds keeps the 15
    ///    fastest besides the first choice for these rounds.
    /// 4. The fastest candidate is kept only if its median beats the first choice's by more
    ///    than max(`opts.min_gain`, noise).
    ///
    /// The result serves every M in the same bucket ([`crate::tactics`]); cached plans are
    /// rebuilt.
    ///
    /// C (and any aux or bias gradient the epilogue writes) is overwritten many times: pass
    /// scratch buffers of the real shapes. Only C is compared between candidates (an aux or
    /// bias gradient is not). Synchronises [`Gpu::stream`], and holds this `Gpu`'s lock for
    /// the whole run (seconds): other threads' calls on it wait.
    ///
    /// Returns the report and the (signature, tactic) pair to store in a
    /// [`crate::tactics::TacticDb`].
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw`] with `stream` = [`Gpu::stream`].
    ///
    /// # Errors
    /// As [`Gpu::gemm_raw`], except that a bias or aux off 16-byte alignment is
    /// [`Error::Misaligned`] (not staged); [`Error::Unsupported`] for an empty or k = 0
    /// problem and without cuBLASLt.
    pub unsafe fn gemm_raw(
        &self,
        p: &GemmProblem,
        scale: Scale,
        ops: RawOperands,
        opts: TuneOptions,
    ) -> Result<(TuneReport, String, Tactic)> {
        let gpu = self.gpu;
        let (extras, [a, b, c]) = (ops.extras(), [ops.a, ops.b, ops.c]);
        check_all(p, ops.descs(p), extras)?;
        if p.is_empty() || p.k() == 0 {
            return Err(Error::Unsupported {
                backend: "autotune",
                what: format!("an empty problem ({})", p.describe()),
            });
        }
        if let Some(v) = extras.bias.filter(|v| v.address % 16 != 0) {
            return Err(Error::Misaligned { operand: crate::Which::Bias, address: v.address, align: 16 });
        }
        gpu.device().bind()?;
        let stream = gpu.stream();
        let mut st = gpu.lock();
        let st = &mut *st;
        let Some(lt) = st.libs.lt.as_mut() else {
            return Err(Error::Unsupported {
                backend: "autotune",
                what: "anything without cuBLASLt (libcublasLt not found)".into(),
            });
        };
        let ws = st.dev.workspaces.get(stream.cu_stream(), &|| p.describe())?;
        let cm = column_major_call(p);
        let ops = LtOperands::new(
            &cm,
            (a.address, b.address, c.address),
            extras.bias.map(|v| v.address),
            extras.aux.map(|v| v.address),
        )
        .with_c_in(extras.c_in.map(|v| v.address).filter(|&ci| ci != c.address));
        // under this Gpu's SM count target: candidates planned and timed for those SMs, the
        // entry's signature ends in " sm<count>" so that only calls under that target use it
        let key = PlanKey { sm_count: lt.sm_count, ..PlanKey::of(p, cm, &ops, ws.matmul_bytes) };
        let job = TuneJob { problem: p, key, ops, alpha: scale.alpha, beta: scale.beta, ws, stream };
        // SAFETY: validated above; the rest is the caller's contract.
        unsafe { autotune(lt, &job, opts) }
    }

    /// Tunes the cuBLASLt algorithm of an FP8 GEMM ([`GpuFp8::gemm`](crate::cuda::GpuFp8::gemm)'s arguments, no bias)
    /// on [`Gpu::stream`]: the heuristic's first `tune.candidates` algorithms, each checked
    /// against the first choice's output (relative error ≤ 1e-2, 1e-3 for f32; NaN never
    /// passes), timed interleaved with it (`tune.reps` rounds; the first choice twice per
    /// round gives the noise), the fastest kept only if it beats the first choice by more
    /// than max(`tune.min_gain`, noise). The result serves every M in the same bucket
    /// ([`crate::tactics`]); cached FP8 plans are rebuilt. `y` is overwritten many times.
    /// Synchronises [`Gpu::stream`] and holds this `Gpu`'s lock throughout (seconds).
    ///
    /// Returns the report and the (signature, tactic) pair to store in a
    /// [`crate::tactics::TacticDb`] (kind `fp8_gemm`).
    ///
    /// # Errors
    /// As [`GpuFp8::gemm`](crate::cuda::GpuFp8::gemm); [`Error::Unsupported`] without cuBLASLt.
    pub fn fp8<O: Element, Y: DevicePtrMut<O>>(
        &self,
        x: &Fp8Tensor,
        w: &Fp8Tensor,
        y: &mut Y,
        opts: Fp8Options,
        tune: TuneOptions,
    ) -> Result<(TuneReport, String, Tactic)> {
        let gpu = self.gpu;
        same_context(crate::Which::A, x.data.stream(), gpu.context())?;
        same_context(crate::Which::B, w.data.stream(), gpu.context())?;
        same_context(crate::Which::C, y.stream(), gpu.context())?;
        let s = gpu.stream();
        let y_len = y.num_bytes();
        let (py, _gy) = y.device_ptr_mut(s);
        let call = Fp8Call {
            x,
            w,
            y: (py, y_len),
            c_in: None,
            out: OutputKind::Dense(O::DTYPE),
            bias: None,
            d_scale: None,
            amax: None,
            opts,
        };
        call.validate(gpu.fp8_platform()?)?;
        let shape = fp8_shape(&x.layout, &w.layout, O::DTYPE.size_bytes(), py, None);
        gpu.device().bind()?;
        // a shape that runs staged is tuned on a scratch output of the staged size
        let scratch = if shape.staged {
            // SAFETY: a live stream of the bound context.
            Some(unsafe { Scratch::alloc(shape.m_used * shape.n_used * O::DTYPE.size_bytes(), s.cu_stream())? })
        } else {
            None
        };
        let d = scratch.as_ref().map_or(py, |t| t.ptr);
        let beta = if shape.staged { 0.0 } else { opts.beta };
        let mut st = gpu.lock();
        let st = &mut *st;
        let Some(lt) = st.libs.lt.as_mut() else {
            return Err(Error::Unsupported {
                backend: "autotune",
                what: "FP8 without cuBLASLt (libcublasLt not found)".into(),
            });
        };
        let key = call.key(shape);
        let ws = st.dev.workspaces.get(s.cu_stream(), &|| format!("FP8 {key:?}"))?;
        let (xd, _gx) = x.data.device_ptr(s);
        let (wd, _gw) = w.data.device_ptr(s);
        let (xs, _gxs) = x.scales.device_ptr(s);
        let (wsc, _gws) = w.scales.device_ptr(s);
        let ops = call.operands([xd, wd, xs, wsc], d);
        let job = Fp8TuneJob {
            key: Fp8Key { workspace: ws.matmul_bytes, align: crate::cuda::lt::plan::alignment(d), ..key },
            ops,
            alpha: opts.alpha,
            beta,
            ws,
            stream: s,
        };
        // SAFETY: validated above; every address is a live allocation borrowed for the call.
        unsafe { autotune(lt, &job, tune) }
    }
}

impl Gpu {
    /// Creates this stream's workspace, builds the plans and loads the kernels for `problems`,
    /// by running each once on scratch buffers (allocated and freed here), so that the first
    /// real call pays nothing extra and can be captured into a CUDA graph. Plans are keyed by
    /// pointer alignment too; scratch buffers are 256-byte aligned like any fresh allocation,
    /// so buffers that are offset into an allocation may still need a plan of their own.
    /// Synchronises [`Gpu::stream`] at the end (prewarm is a set-up step, not a hot path).
    ///
    /// # Errors
    /// As [`Gpu::gemm_fused`], and [`Error::Driver`] when scratch memory cannot be allocated.
    pub fn prewarm(&self, problems: &[GemmProblem]) -> Result<()> {
        let s = self.stream();
        let _relaxed = Relaxed::enter()?;
        let bytes = |elems: usize, d: DType| (elems * d.size_bytes()).max(1);
        for p in problems {
            let prec = p.precision();
            let alloc = |n: usize| s.alloc_zeros::<u8>(n).map_err(status::driver("cuMemAllocAsync"));
            let a = alloc(bytes(p.a().layout.required_elems(p.batch()).unwrap_or(0), prec.input()))?;
            let b = alloc(bytes(p.b().layout.required_elems(p.batch()).unwrap_or(0), prec.input()))?;
            let mut c = alloc(bytes(p.c().required_elems(p.batch()).unwrap_or(0), prec.output()))?;
            let vec = (p.vector_len() > 0).then(|| alloc(bytes(p.vector_len(), prec.output()))).transpose()?;
            let mut aux = p
                .uses_aux()
                .then(|| alloc(bytes(p.aux().required_elems(p.batch()).unwrap_or(0), prec.output())))
                .transpose()?;
            {
                let r =
                    |x: &cudarc::driver::CudaSlice<u8>| RawBuffer { address: x.device_ptr(s).0, len_bytes: x.len() };
                let (ra, rb) = (r(&a), r(&b));
                let c_len = c.len();
                let mut ops = RawOperands::new(ra, rb, RawBuffer { address: c.device_ptr_mut(s).0, len_bytes: c_len });
                ops.bias = vec.as_ref().map(r);
                ops.aux = aux.as_mut().map(|x| {
                    let len_bytes = x.len();
                    RawBuffer { address: x.device_ptr_mut(s).0, len_bytes }
                });
                // SAFETY: scratch buffers of this context sized by the layouts, on our stream,
                // alive until the synchronize below.
                unsafe { self.gemm_raw(p, Scale::PRODUCT, ops, s.cu_stream()) }?;
            }
            s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        }
        Ok(())
    }
}
