//! The device owner: CUDA context, stream, cuBLAS and cuBLASLt handles, per-stream workspaces,
//! the plan cache, and the GEMM entry points.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

use super::lt::{alignment, Algorithm, LtHandle, Plan, PlanKey};
use super::replay::{self, CaptureStream, GraphReplay, ReplayCache, ReplayKey};
use super::workspace::{is_capturing, Workspace};
use super::{library, status};
use crate::dtype::{Compute, DType, Element, Precision};
use crate::epilogue::{Epilogue, VectorUse};
use crate::error::{Error, Result, Which};
use crate::layout::Op;
use crate::mapping::{column_major_call, ColMajorCall};
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, check_epilogue, BufferDesc};

/// A device buffer given by address, for memory gemmbridge does not own (another framework's
/// tensor storage). Zero-copy: only the address is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBuffer {
    /// Device address of the first element (a `CUdeviceptr`).
    pub address: u64,
    /// Bytes valid from `address` on; checked against what the layout addresses.
    pub len_bytes: usize,
}

/// The epilogue's extra operands by address (see [`crate::epilogue`]), for
/// [`Gpu::gemm_raw_fused`]. Element type: the precision's output dtype.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawExtras {
    /// The bias `[n]` an epilogue reads, or the bias gradient (`[m]` or `[n]`) it writes.
    pub bias: Option<RawBuffer>,
    /// The aux `[m, n]` matrix (layout [`GemmProblem::aux`]) an epilogue writes or reads.
    pub aux: Option<RawBuffer>,
}

/// The epilogue's extra operands as cudarc buffers, for [`Gpu::gemm_fused`]. Give exactly the
/// ones the epilogue uses (see [`crate::epilogue`]).
pub struct Extras<'a, T> {
    /// A bias `[n]` the epilogue reads.
    pub bias: Option<&'a dyn DevicePtr<T>>,
    /// A bias gradient the epilogue writes (`[m]` for `BiasGradA`, `[n]` for `BiasGradB`).
    pub bias_grad: Option<&'a mut dyn DevicePtrMut<T>>,
    /// An aux matrix the epilogue reads (`DGelu`).
    pub aux_in: Option<&'a dyn DevicePtr<T>>,
    /// An aux matrix the epilogue writes (`GeluAux`, `GeluAuxBias`).
    pub aux_out: Option<&'a mut dyn DevicePtrMut<T>>,
}

impl<T> Default for Extras<'_, T> {
    fn default() -> Self {
        Extras { bias: None, bias_grad: None, aux_in: None, aux_out: None }
    }
}

/// Which library runs a GEMM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// cuBLASLt wherever it supports the problem (and is installed), cuBLAS otherwise.
    /// Epilogues always need cuBLASLt.
    #[default]
    Auto,
    /// cuBLAS (`cublasGemmEx` / `cublasGemmStridedBatchedEx`); no epilogues.
    Blas,
    /// cuBLASLt (`cublasLtMatmul`) with cached plans; an error where it cannot run. Two cases
    /// still go to cuBLAS: α = 0 without an epilogue (C = β·C, A and B not read) and the
    /// unfused bias gradient where cuBLASLt has no BGRAD algorithm.
    Lt,
}

/// Which library a call was served by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// cuBLAS.
    Blas,
    /// cuBLASLt.
    Lt,
}

/// What tuning found for a problem (see [`Gpu::autotune_raw`]). `#[non_exhaustive]`: fields
/// may be added.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TuneReport {
    /// Time per call of the heuristic's first choice, ms: the smaller of its two medians (it
    /// is sampled twice per round).
    pub heuristic_ms: f64,
    /// Median time of the kept algorithm (the heuristic's if nothing beat it), ms.
    pub best_ms: f64,
    /// Candidates considered (the heuristic's, plus `added`).
    pub candidates: usize,
    /// Of those, how many were added beyond the heuristic's list for the problem and accepted
    /// for it by `cublasLtMatmulAlgoCheck`: from the heuristic's lists for neighbouring
    /// queries (the same GEMM without its epilogue, or with a smaller workspace limit) and,
    /// for problems of at most 256³ multiply-adds, from the configuration search.
    pub added: usize,
    /// Whether the kept algorithm is one of those (neighbouring query or search).
    pub kept_added: bool,
    /// Whether the candidates were timed as replays of a captured CUDA graph (problems whose
    /// first choice takes < 20 µs per call, where eager timing measures the host's launch
    /// cost).
    pub timed_in_graph: bool,
    /// Whether graph timing was called for but capturing failed twice (see
    /// [`Gpu::autotune_raw`], step 3): nothing was timed, the heuristic's first choice is kept,
    /// and `heuristic_ms` is its eager time per call (launch-bound), `best_ms` the same, and
    /// `threshold` is `TuneOptions::min_gain` (no noise was measured). Such a result is not
    /// worth storing in a tactic database.
    pub graph_failed: bool,
    /// Candidates whose output did not match the first choice's (never kept).
    pub mismatched: usize,
    /// The noise threshold used: max(`TuneOptions::min_gain`, the relative difference of the
    /// first choice timed twice), as a fraction.
    pub threshold: f64,
    /// Whether a candidate other than the heuristic's first choice was kept.
    pub improved: bool,
    /// The kept algorithm.
    pub algorithm: Algorithm,
}

pub(crate) struct BlasHandle {
    raw: cublas_sys::cublasHandle_t,
    bound: CUstream,
}

/// Everything behind the Gpu's lock.
pub(crate) struct State {
    pub blas: BlasHandle,
    pub lt: Option<LtHandle>,
    pub backend: Backend,
    /// Per stream (keyed by its address), its workspace. Never shared between streams.
    pub workspaces: HashMap<(usize, Option<std::thread::ThreadId>), Workspace>,
    pub workspace_bytes: usize,
    pub plans: HashMap<PlanKey, Plan>,
    /// Problems cuBLASLt's heuristic had no algorithm for (Auto then uses cuBLAS).
    pub lt_unsupported: HashSet<PlanKey>,
    /// Tuned algorithms by bucketed signature (see tactics::signature).
    pub tuned: HashMap<String, Algorithm>,
    /// Cached graphs of repeated small calls (see [`replay`]).
    pub replay: ReplayCache,
    /// The private stream those graphs are captured on (created on first capture).
    pub capture_stream: Option<CaptureStream>,
}

impl State {
    /// Forgets cached plans matching `drop` and every cached graph (a graph bakes in its
    /// plan's algorithm). The caller has bound the context (graphs are destroyed here).
    pub fn forget_plans(&mut self, drop: impl Fn(&PlanKey) -> bool) {
        self.plans.retain(|k, _| !drop(k));
        self.replay.clear();
    }
}

// SAFETY: the raw handles are used only under the Gpu's Mutex; cuBLAS and cuBLASLt allow a
// handle to be used from any host thread when calls on it do not overlap (cuBLAS
// documentation, "Thread Safety"). The replay graphs (CUgraphExec) and the capture stream
// (CUstream) are driver handles, valid on any host thread of the process while their context
// lives, and likewise used only under the Mutex.
unsafe impl Send for State {}

/// Owns a CUDA context, a stream, one cuBLAS and one cuBLASLt handle, a workspace per stream
/// used, and a cache of cuBLASLt plans; runs row-major GEMMs.
///
/// # Threads and streams
/// `Gpu` is `Send + Sync`. Every call locks the handles for the microseconds it takes to
/// enqueue the GEMM, so calls from several threads are safe but serialise on the host; for
/// parallel host submission use one `Gpu` per thread. GPU work is never synchronised by
/// gemmbridge: [`Gpu::gemm`] enqueues on [`Gpu::stream`], [`Gpu::gemm_raw`] on the stream the
/// caller passes, and both return once the work is enqueued. Each stream gets its own
/// workspace ([`Gpu::set_workspace_bytes`]; 32 MiB on Hopper and later, 4 MiB before, the
/// sizes cuBLASLt's documentation recommends, plus 1 MiB of scratch), so two streams never
/// share one (`CU_STREAM_PER_THREAD` gets one per host thread). Workspaces are keyed by the
/// stream handle and kept until the `Gpu` is dropped: a program that creates many
/// short-lived streams should give each its own `Gpu`, and must not reuse a `Gpu` on a new
/// stream while work of a destroyed stream with the same handle may still be running.
///
/// # Graph capture
/// Every call can be captured into a CUDA graph on its stream once its plan and the stream's
/// workspace exist (after one ordinary call or [`Gpu::prewarm`]); a call that would have to
/// create either while capturing fails with [`Error::NotCapturable`] instead. A captured graph
/// uses the capture stream's workspace: replay it on that stream (or serialised with it), and
/// not after the `Gpu` is dropped.
///
/// # Graph replay of repeated small calls
/// Eagerly, a cuBLASLt call of at most 1024³ multiply-adds that is made again with the same
/// operands (addresses, α, β, stream) is captured once, on a private stream, into a CUDA graph;
/// from then on such a call is one `cuGraphLaunch` on the caller's stream instead of a
/// `cublasLtMatmul`, which costs the host less (docs/PERFORMANCE.md §3.1). The result is the
/// direct call's: same kernel, same stream order, operands read when the GEMM runs. Graphs are
/// never launched into a stream being captured, and a bias that needs staging is never
/// replayed. A capture and an instantiation are paid once per distinct call. See [`GraphReplay`] and
/// [`Gpu::set_graph_replay`] (`GraphReplay::off()` turns it off).
///
/// Captures and other threads: another thread's first launch of a kernel can invalidate a
/// capture in flight (CUDA's lazy module loading synchronises the device; device calls
/// 22–23). gemmbridge's own captures then fall back (replay: the call runs directly and is
/// captured again later; tuning: eager timing). For captures of your own, launch every kernel
/// once first (or [`Gpu::prewarm`]), or set `CUDA_MODULE_LOADING=EAGER`.
///
/// # Errors at creation
/// [`Error::LibraryNotFound`] when libcuda or libcublas cannot be loaded, [`Error::NoDevice`]
/// when the driver finds no GPU, [`Error::Driver`] / [`Error::Cublas`] for other failures.
/// A missing libcublasLt is not an error: [`Backend::Auto`] then uses cuBLAS.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("ordinal", &self.ctx.ordinal()).field("stream", &self.stream.cu_stream()).finish()
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context) with a new non-blocking stream.
    ///
    /// # Errors
    /// See [`Gpu`].
    pub fn new(ordinal: usize) -> Result<Gpu> {
        library::ensure_driver()?;
        let count = CudaContext::device_count().map_err(status::driver("cuInit/cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(Error::NoDevice { detail: "cuDeviceGetCount returned 0".into() });
        }
        let ctx = CudaContext::new(ordinal).map_err(status::driver("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(status::driver("cuStreamCreate"))?;
        Gpu::with_stream(stream)
    }

    /// Uses a stream the caller already has (and its context). Work is enqueued on it in
    /// order with the caller's other work on it.
    ///
    /// # Errors
    /// See [`Gpu`].
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Gpu> {
        library::ensure_driver()?;
        library::ensure_cublas()?;
        let ctx = stream.context().clone();
        ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
        status::cublas(unsafe { cublas_sys::cublasCreate_v2(&mut raw) }, "cublasCreate_v2", String::new)?;
        let blas = BlasHandle { raw, bound: std::ptr::null_mut() };
        let lt = if library::has_cublaslt() { Some(LtHandle::new()?) } else { None };
        let major = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(status::driver("cuDeviceGetAttribute"))?;
        let state = State {
            blas,
            lt,
            backend: Backend::Auto,
            workspaces: HashMap::default(),
            workspace_bytes: if major >= 9 { 32 << 20 } else { 4 << 20 },
            plans: HashMap::default(),
            lt_unsupported: HashSet::default(),
            tuned: HashMap::default(),
            replay: ReplayCache::default(),
            capture_stream: None,
        };
        Ok(Gpu { ctx, stream, state: Mutex::new(state) })
    }

    /// The context everything runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream [`Gpu::gemm`] enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the state half-changed in a way that
        // matters (each change is one insertion or one library call), so poison is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chooses the library for later calls (default [`Backend::Auto`]).
    pub fn set_backend(&self, backend: Backend) {
        self.lock().backend = backend;
    }

    /// The library chosen for calls.
    pub fn backend(&self) -> Backend {
        self.lock().backend
    }

    /// Whether cuBLASLt was found.
    pub fn has_lt(&self) -> bool {
        self.lock().lt.is_some()
    }

    /// Sets the workspace size (bytes) for streams that get their first call from now on.
    pub fn set_workspace_bytes(&self, bytes: usize) {
        self.lock().workspace_bytes = bytes;
    }

    /// The workspace size (bytes) new streams get.
    pub fn workspace_bytes(&self) -> usize {
        self.lock().workspace_bytes
    }

    /// Loads tuned algorithms (from [`tactics::TacticDb::load`](super::tactics::TacticDb::load)):
    /// plans built from now on use them wherever cuBLASLt confirms they are valid
    /// (cublasLtMatmulAlgoCheck); cached plans are dropped so that they are rebuilt.
    pub fn load_tactics(&self, db: &super::tactics::TacticDb) {
        let mut st = self.lock();
        for (sig, t) in &db.entries {
            if t.kind != super::tactics::ProblemKind::Gemm {
                continue;
            }
            if let Some((data, workspace)) = t.lt_algo() {
                st.tuned.insert(sig.clone(), Algorithm { data, workspace });
            }
        }
        let _ = self.ctx.bind_to_thread();
        st.forget_plans(|_| true);
    }

    /// Number of cached cuBLASLt plans.
    pub fn cached_plans(&self) -> usize {
        self.lock().plans.len()
    }

    /// Drops every cached plan and replay graph (they are rebuilt on next use).
    pub fn clear_plans(&self) {
        let mut st = self.lock();
        let _ = self.ctx.bind_to_thread();
        st.forget_plans(|_| true);
        st.lt_unsupported.clear();
    }

    /// Chooses when repeated small eager calls are replayed from cached CUDA graphs
    /// ([`GraphReplay`]; default on, for problems up to 1024³ multiply-adds, from the second
    /// call with the same operands). Changing it drops the graphs cached so far.
    pub fn set_graph_replay(&self, options: GraphReplay) {
        let mut st = self.lock();
        let _ = self.ctx.bind_to_thread();
        st.replay.clear();
        st.replay.options = options;
    }

    /// The replay settings in use.
    pub fn graph_replay(&self) -> GraphReplay {
        self.lock().replay.options
    }

    /// Number of cached replay graphs.
    pub fn cached_graphs(&self) -> usize {
        self.lock().replay.graphs.len()
    }

    /// `C = α·op(A)·op(B) + β·C` on cudarc device memory, enqueued on [`Gpu::stream`].
    ///
    /// - `a`, `b`: stored row-major A and B ([`cudarc::driver::CudaSlice`] or views), element
    ///   type the precision's input dtype, in this `Gpu`'s context;
    /// - `c`: stored C, element type the precision's output dtype, written in place through
    ///   `&mut` (the real storage; never a copy). Padding between rows is not touched.
    ///
    /// BLAS semantics: `β = 0` never reads C (NaN in C does not leak); `k = 0` gives
    /// `C = β·C`; m, n or batch 0 launches nothing. cudarc's own cross-stream event tracking
    /// (if the buffers were last used on another stream) is honoured; no host synchronisation.
    /// For a problem with an epilogue use [`Gpu::gemm_fused`].
    ///
    /// # Errors
    /// Before launching, with no buffer touched: [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`], [`Error::BufferTooSmall`], [`Error::Misaligned`],
    /// [`Error::OutputOverlapsInput`], [`Error::EpilogueOperand`]. From the launch:
    /// [`Error::Cublas`], [`Error::NotCapturable`], [`Error::Unsupported`].
    pub fn gemm<TI, TO, A, B, C>(&self, p: &GemmProblem, alpha: f32, a: &A, b: &B, beta: f32, c: &mut C) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        self.gemm_fused(p, alpha, a, b, beta, c, Extras::default())
    }

    /// [`Gpu::gemm`] with the epilogue's extra operands ([`crate::epilogue`]): a bias it reads,
    /// a bias gradient or aux it writes, an aux it reads. All of the output's element type.
    /// An aux must be 16-byte aligned; a bias that is not is staged through the stream's
    /// 1 MiB scratch region (so at most 1 MiB of bias). With an epilogue, α = 0 still reads
    /// A and B (cuBLASLt computes the product); without one it never does.
    ///
    /// # Errors
    /// As [`Gpu::gemm`]; [`Error::EpilogueOperand`] when an operand the epilogue needs is
    /// missing, one it does not use is given, or one it writes is passed read-only;
    /// [`Error::Misaligned`] for an aux off 16 bytes; [`Error::Unsupported`] with
    /// [`Backend::Blas`] or past the staging limit; [`Error::LibraryNotFound`] without
    /// libcublasLt.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fused<TI, TO, A, B, C>(
        &self,
        p: &GemmProblem,
        alpha: f32,
        a: &A,
        b: &B,
        beta: f32,
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
        let Extras { bias, bias_grad, aux_in, aux_out } = extras;
        // Every operand in this Gpu's context (checked without allocating: this is the
        // per-call path, docs/PERFORMANCE.md §3.1).
        let same = |which: Which, s: &Arc<CudaStream>| {
            if s.context() == &self.ctx {
                Ok(())
            } else {
                Err(Error::WrongContext {
                    operand: which,
                    ordinal: s.context().ordinal(),
                    expected: self.ctx.ordinal(),
                })
            }
        };
        same(Which::A, a.stream())?;
        same(Which::B, b.stream())?;
        same(Which::C, c.stream())?;
        if let Some(v) = &bias {
            same(Which::Bias, v.stream())?;
        }
        if let Some(v) = &bias_grad {
            same(Which::Bias, v.stream())?;
        }
        if let Some(v) = &aux_in {
            same(Which::Aux, v.stream())?;
        }
        if let Some(v) = &aux_out {
            same(Which::Aux, v.stream())?;
        }
        use crate::epilogue::AuxUse;
        let e = p.epilogue();
        if bias.is_some() && e.vector() == VectorUse::WritesGrad {
            return Err(Error::EpilogueOperand {
                epilogue: e,
                operand: "bias",
                problem: "is written by this epilogue: pass it as bias_grad (&mut), not bias (&)",
            });
        }
        if aux_in.is_some() && e.aux() == AuxUse::Writes {
            return Err(Error::EpilogueOperand {
                epilogue: e,
                operand: "aux",
                problem: "is written by this epilogue: pass it as aux_out (&mut), not aux_in (&)",
            });
        }
        if bias.is_some() && bias_grad.is_some() {
            return Err(Error::EpilogueOperand {
                epilogue: p.epilogue(),
                operand: "bias",
                problem: "was given twice (bias and bias_grad)",
            });
        }
        if aux_in.is_some() && aux_out.is_some() {
            return Err(Error::EpilogueOperand {
                epilogue: p.epilogue(),
                operand: "aux",
                problem: "was given twice (aux_in and aux_out)",
            });
        }
        let s = &self.stream;
        let (la, lb, lc) = (a.num_bytes(), b.num_bytes(), c.num_bytes());
        let (pa, _ra) = a.device_ptr(s);
        let (pb, _rb) = b.device_ptr(s);
        let (pc, _wc) = c.device_ptr_mut(s);
        let (pv, vec_len, _gv) = either_ptr(bias, bias_grad, s);
        let (px, aux_len, _gx) = either_ptr(aux_in, aux_out, s);
        let raw = |address, len_bytes| RawBuffer { address, len_bytes };
        let descs = [
            BufferDesc { address: pa, len_bytes: la, dtype: TI::DTYPE },
            BufferDesc { address: pb, len_bytes: lb, dtype: TI::DTYPE },
            BufferDesc { address: pc, len_bytes: lc, dtype: TO::DTYPE },
        ];
        let extras = RawExtras { bias: pv.map(|a| raw(a, vec_len)), aux: px.map(|a| raw(a, aux_len)) };
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        // SAFETY: every address comes from a live cudarc allocation of this context, borrowed
        // for this call (cudarc's events, recorded when the guards drop after the enqueue,
        // order later uses); check_all verifies lengths against the layouts.
        unsafe { self.checked_enqueue(p, alpha, descs, beta, extras, s.cu_stream()) }
    }

    /// `C = α·op(A)·op(B) + β·C` on device memory given by address, enqueued on `stream`.
    /// Zero-copy interop with other frameworks' buffers; returns once the GEMM is enqueued.
    ///
    /// Each buffer's element type is the one the precision names (inputs: `precision.input()`,
    /// C: `precision.output()`); lengths are in bytes.
    ///
    /// # Safety
    /// - every address is device memory (or null where the layout addresses nothing) in this
    ///   `Gpu`'s context, valid for `len_bytes` until the GEMM has run on `stream`;
    /// - `stream` is a live stream of this context (or null, the legacy default stream);
    /// - nothing writes A or B, or touches C, concurrently with the GEMM except in stream order.
    ///
    /// # Errors
    /// Before anything is enqueued, with no buffer touched: [`Error::NullPointer`],
    /// [`Error::Misaligned`], [`Error::BufferTooSmall`], [`Error::OutputOverlapsInput`]. From
    /// the launch: [`Error::Cublas`] (status by name), [`Error::NotCapturable`] (a plan or
    /// workspace would be created while `stream` is capturing), [`Error::Driver`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_raw(
        &self,
        p: &GemmProblem,
        alpha: f32,
        a: RawBuffer,
        b: RawBuffer,
        beta: f32,
        c: RawBuffer,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.gemm_raw_fused(p, alpha, a, b, beta, c, RawExtras::default(), stream) }
    }

    /// [`Gpu::gemm_raw`] with the epilogue's extra operands by address.
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw`], for the extra operands too.
    ///
    /// # Errors
    /// As [`Gpu::gemm_fused`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_raw_fused(
        &self,
        p: &GemmProblem,
        alpha: f32,
        a: RawBuffer,
        b: RawBuffer,
        beta: f32,
        c: RawBuffer,
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        let descs = raw_descs(p, a, b, c);
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.checked_enqueue(p, alpha, descs, beta, extras, stream) }
    }

    /// Validates every operand, then enqueues.
    unsafe fn checked_enqueue(
        &self,
        p: &GemmProblem,
        alpha: f32,
        [a, b, c]: [BufferDesc; 3],
        beta: f32,
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        check_all(p, [a, b, c], extras)?;
        if p.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        // SAFETY: validated above; the rest is the caller's contract.
        let served = unsafe {
            self.enqueue(
                &mut st,
                p,
                alpha,
                (a.address, b.address, c.address),
                beta,
                extras.bias.map(|r| r.address),
                extras.aux.map(|r| r.address),
                stream,
            )
        }?;
        tracing::debug!(problem = %p.describe(), ?served, "gemm enqueued");
        Ok(())
    }

    /// Picks the library and enqueues; returns which served.
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue(
        &self,
        st: &mut State,
        p: &GemmProblem,
        alpha: f32,
        (a, b, c): (u64, u64, u64),
        beta: f32,
        bias: Option<u64>,
        aux: Option<u64>,
        stream: CUstream,
    ) -> Result<Served> {
        let fused = p.epilogue() != Epilogue::None;
        if alpha == 0.0 && !fused {
            // BLAS semantics: A and B are not read; cuBLAS's k = 0 call gives C = β·C.
            // SAFETY: forwarded.
            unsafe { self.enqueue_blas(st, p, alpha, (a, b, c), beta, stream) }?;
            return Ok(Served::Blas);
        }
        let use_lt = match st.backend {
            Backend::Blas if fused => {
                return Err(Error::Unsupported {
                    backend: "cuBLAS (Backend::Blas)",
                    what: format!("epilogue {} (use Backend::Auto or Backend::Lt)", p.epilogue()),
                })
            }
            Backend::Blas => false,
            Backend::Lt | Backend::Auto if st.lt.is_none() => {
                if st.backend == Backend::Lt || fused {
                    return Err(Error::LibraryNotFound {
                        library: "cuBLASLt (libcublasLt)",
                        tried: library::tried("cublasLt"),
                        hint: "install the CUDA 13 toolkit's cuBLAS (it ships libcublasLt) and add its folder to LD_LIBRARY_PATH",
                    });
                }
                false
            }
            Backend::Lt => true,
            // cuBLASLt does not take k = 0; cuBLAS does (C = β·C).
            Backend::Auto => p.k() > 0 || fused,
        };
        if use_lt {
            // SAFETY: forwarded.
            match unsafe { self.enqueue_lt(st, p, alpha, (a, b, c), beta, bias, aux, stream) } {
                Ok(()) => return Ok(Served::Lt),
                Err(LtFailure::NoAlgorithm(_)) if st.backend == Backend::Auto && !fused => {}
                Err(LtFailure::NoAlgorithm(_)) if p.epilogue().vector() == VectorUse::WritesGrad => {
                    // cuBLASLt's BGRAD epilogues exist only for some layouts (on the H200 with
                    // cuBLASLt 13.1: BiasGradA needs op(A) = T, BiasGradB needs op(B) = N;
                    // docs/PERFORMANCE.md). Elsewhere: the plain GEMM, then the gradient as a
                    // second GEMM against a ones vector.
                    let ws = self.workspace(st, stream, &|| p.describe())?;
                    if p.k() * p.precision().input().size_bytes() > ws.scratch_bytes {
                        return Err(Error::Unsupported {
                            backend: "cuBLASLt",
                            what: format!(
                                "the bias gradient of {} (no BGRAD algorithm, and k = {} exceeds the ones vector the {}-byte scratch holds)",
                                p.describe(),
                                p.k(),
                                ws.scratch_bytes
                            ),
                        });
                    }
                    let plain = p.with_epilogue(Epilogue::None)?;
                    // SAFETY: forwarded; the plain problem reads and writes a subset of p's.
                    unsafe { self.enqueue(st, &plain, alpha, (a, b, c), beta, None, None, stream) }?;
                    // SAFETY: forwarded; `bias` is the validated gradient buffer.
                    unsafe { self.bias_grad_unfused(st, p, (a, b), bias.unwrap_or(0), stream) }?;
                    return Ok(Served::Lt);
                }
                Err(LtFailure::NoAlgorithm(e) | LtFailure::Other(e)) => return Err(e),
            }
        }
        // SAFETY: forwarded.
        unsafe { self.enqueue_blas(st, p, alpha, (a, b, c), beta, stream) }?;
        Ok(Served::Blas)
    }

    /// This stream's workspace (a copy of its addresses and sizes), allocated on first use
    /// (never while capturing). One lookup when it exists: this is on every call's path.
    pub(crate) fn workspace(
        &self,
        st: &mut State,
        stream: CUstream,
        describe: &dyn Fn() -> String,
    ) -> Result<Workspace> {
        let key = workspace_key(stream);
        if let Some(ws) = st.workspaces.get(&key) {
            return Ok(*ws);
        }
        if is_capturing(stream)? {
            return Err(Error::NotCapturable { action: "allocate this stream's workspace", problem: describe() });
        }
        let ws = Workspace::new(st.workspace_bytes)?;
        st.workspaces.insert(key, ws);
        Ok(ws)
    }

    /// The plan key of a call (`workspace`: the stream's matmul workspace, bytes).
    pub(crate) fn plan_key(p: &GemmProblem, (a, b, c): (u64, u64, u64), bias: Option<u64>, ws: usize) -> PlanKey {
        let call = column_major_call(p);
        let (first, second) = call.operands(a, b);
        let aux = p.aux();
        let (aux_ld, aux_stride) = if p.uses_aux() { (aux.ld as i64, aux.batch_stride as i64) } else { (0, 0) };
        PlanKey {
            call,
            precision: p.precision(),
            epilogue: p.epilogue(),
            aux_ld,
            aux_stride,
            align: [alignment(first), alignment(second), alignment(c), bias.map_or(256, alignment)],
            workspace: ws,
        }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_lt(
        &self,
        st: &mut State,
        p: &GemmProblem,
        alpha: f32,
        (a, b, c): (u64, u64, u64),
        beta: f32,
        bias: Option<u64>,
        aux: Option<u64>,
        stream: CUstream,
    ) -> std::result::Result<(), LtFailure> {
        let ws = self.workspace(st, stream, &|| p.describe())?;
        // cuBLASLt is given only 16-byte-aligned bias vectors: a public cuBLASLt integration
        // (Marian NMT, src/tensors/gpu/prod.cpp) found misaligned ones fail and uses 16 bytes;
        // the exact requirement was not probed here. Any other bias is staged through the
        // stream's scratch region (a stream-ordered copy of n elements), so it never faults.
        let vec_bytes = p.vector_len() * p.precision().output().size_bytes();
        let stage = bias.filter(|&v| v % 16 != 0);
        if stage.is_some() && vec_bytes > ws.scratch_bytes {
            return Err(LtFailure::Other(Error::Unsupported {
                backend: "cuBLASLt",
                what: format!(
                    "a bias of {vec_bytes} bytes at a non-16-byte-aligned address (staging holds {} bytes): align the bias",
                    ws.scratch_bytes
                ),
            }));
        }
        let bias_ptr = if stage.is_some() { Some(ws.scratch) } else { bias };
        if aux.is_some_and(|x| x % 16 != 0) {
            return Err(LtFailure::Other(Error::Misaligned {
                operand: Which::Aux,
                address: aux.unwrap_or(0),
                align: 16,
            }));
        }
        let key = Gpu::plan_key(p, (a, b, c), bias_ptr, ws.matmul_bytes);
        let (first, second) = key.call.operands(a, b);
        // Graph replay (see `replay`): a staged bias is excluded, its copy is not in the key.
        let replay_key = (stage.is_none() && st.replay.qualifies(p.macs())).then(|| ReplayKey {
            plan: key,
            stream: stream as usize,
            operands: [first, second, c, bias_ptr.unwrap_or(0), aux.unwrap_or(0)],
            scalars: [alpha.to_bits(), beta.to_bits()],
            workspace: ws.ptr,
        });
        // Whether the key has a graph that this call does not use (its stream is capturing).
        let mut graph_unused = false;
        if let Some(rk) = &replay_key {
            if let Some(graph) = st.replay.graphs.get(rk) {
                // Never into a stream being captured (the direct call below is captured instead).
                if is_capturing(stream).unwrap_or(true) {
                    graph_unused = true;
                } else {
                    // SAFETY: the key holds this stream and every address the graph uses; they
                    // are the ones this call was validated with.
                    match unsafe { graph.launch(stream) } {
                        Ok(()) => return Ok(()),
                        Err(e) => {
                            // run this call directly, and capture the key again later
                            tracing::warn!(problem = %p.describe(), error = %e, "replay graph launch failed; running directly");
                            st.replay.graphs.remove(rk);
                            st.replay.failed(rk);
                        }
                    }
                }
            }
        }
        if !st.plans.contains_key(&key) {
            if st.lt_unsupported.contains(&key) {
                return Err(LtFailure::NoAlgorithm(no_algorithm(p)));
            }
            if is_capturing(stream)? {
                return Err(LtFailure::Other(Error::NotCapturable {
                    action: "build a cuBLASLt plan (heuristic query)",
                    problem: p.describe(),
                }));
            }
            let lt = st.lt.as_ref().expect("use_lt implies a handle");
            let mut plan = match Plan::build(lt, &key, 1) {
                Ok(plan) => plan,
                Err(e) => {
                    st.lt_unsupported.insert(key);
                    return Err(LtFailure::NoAlgorithm(e));
                }
            };
            if let Some(algo) = st.tuned.get(&super::tactics::signature(&key)) {
                match plan.check_algo(lt, algo) {
                    Some(need) if need <= key.workspace => plan.algo = Algorithm { workspace: need, ..*algo },
                    _ => {
                        tracing::warn!(problem = %p.describe(), "tuned algorithm not valid here; using the heuristic's")
                    }
                }
            }
            st.plans.insert(key, plan);
        }
        // The one launch of this call: validated operands, this stream's workspace (which no
        // other stream uses); `s` is the caller's stream, or the private capture stream.
        let launch = |plan: &Plan, lt: &LtHandle, s: CUstream| {
            // SAFETY: as above; the caller of enqueue_lt guarantees the addresses.
            unsafe {
                plan.launch(
                    lt,
                    &plan.algo,
                    alpha,
                    first,
                    second,
                    beta,
                    c,
                    bias_ptr,
                    aux,
                    ws.ptr,
                    ws.matmul_bytes,
                    s as _,
                )
            }
        };
        if let Some(rk) = replay_key {
            // (the graph lookup above decided whether one exists: one hash of the key less).
            // The driver is asked about a capture only when one is due, not on every call that
            // does not repeat: a call in the caller's capture counts, and a capture due then is
            // postponed to the next call.
            let due = !graph_unused
                && st.replay.count(&rk)
                && if is_capturing(stream).unwrap_or(true) {
                    st.replay.postpone(&rk);
                    false
                } else {
                    true
                };
            if due {
                if st.capture_stream.is_none() {
                    // a failure here only means no replay for now
                    st.capture_stream = CaptureStream::new()
                        .map_err(|e| tracing::debug!(error = %e, "no capture stream for graph replay"))
                        .ok();
                }
                let captured = match (&st.capture_stream, &st.plans[&key], st.lt.as_ref()) {
                    // SAFETY: the capture stream is private to this Gpu and used only here,
                    // under the lock; the launch is this call's, on it instead of `stream`.
                    (Some(cap), plan, Some(lt)) => unsafe { replay::capture(cap.raw(), |s| launch(plan, lt, s)) },
                    _ => Err(Error::Unsupported {
                        backend: "graph replay",
                        what: "capturing without a capture stream or cuBLASLt handle".into(),
                    }),
                };
                // SAFETY (launch): as for the cached graph above.
                match captured.and_then(|graph| unsafe { graph.launch(stream) }.map(|()| graph)) {
                    Ok(graph) => {
                        st.replay.graphs.insert(rk, graph);
                        return Ok(());
                    }
                    Err(e) => {
                        // e.g. invalidated by another thread's lazy kernel load (see `replay`)
                        tracing::debug!(problem = %p.describe(), error = %e, "graph capture failed; this call runs directly");
                        st.replay.failed(&rk);
                    }
                }
            }
        }
        let plan = &st.plans[&key];
        let lt = st.lt.as_ref().expect("use_lt implies a handle");
        // SAFETY: validated addresses; the scratch region belongs to this stream's workspace
        // and is ordered with the matmul on the same stream.
        unsafe {
            if let (Some(user), VectorUse::ReadsBias) = (stage, p.epilogue().vector()) {
                cudarc::driver::result::memcpy_dtod_async(ws.scratch, user, vec_bytes, stream)
                    .map_err(status::driver("cuMemcpyDtoDAsync"))?;
            }
            launch(plan, lt, stream).map_err(|e| with_problem(e, p))?;
            if let (Some(user), VectorUse::WritesGrad) = (stage, p.epilogue().vector()) {
                cudarc::driver::result::memcpy_dtod_async(user, ws.scratch, vec_bytes, stream)
                    .map_err(status::driver("cuMemcpyDtoDAsync"))?;
            }
        }
        Ok(())
    }

    unsafe fn enqueue_blas(
        &self,
        st: &mut State,
        p: &GemmProblem,
        alpha: f32,
        (a, b, c): (u64, u64, u64),
        beta: f32,
        stream: CUstream,
    ) -> Result<()> {
        let mut call = column_major_call(p);
        if alpha == 0.0 {
            // BLAS semantics: with α = 0, A and B are not read (an inf or NaN there must not
            // reach C); C = β·C is the k = 0 product.
            call.k = 0;
        }
        let (first, second) = call.operands(a, b);
        // SAFETY: forwarded.
        unsafe { self.blas_call(st, &call, p.precision(), alpha, first, second, beta, c, stream) }
            .map_err(|e| with_problem(e, p))
    }

    /// The bias gradient of `p` (sums of op(A)'s rows, or op(B)'s columns, over k) as a GEMM
    /// against a vector of ones held in the stream's scratch region, written to `grad`.
    ///
    /// # Safety
    /// `a`, `b`, `grad` validated for `p`; `stream` of this context.
    unsafe fn bias_grad_unfused(
        &self,
        st: &mut State,
        p: &GemmProblem,
        (a, b): (u64, u64),
        grad: u64,
        stream: CUstream,
    ) -> Result<()> {
        use crate::layout::{MatrixLayout, Operand};
        let ws = self.workspace(st, stream, &|| p.describe())?;
        let (k, prec) = (p.k(), p.precision());
        let esz = prec.input().size_bytes();
        if k * esz > ws.scratch_bytes {
            return Err(Error::Unsupported {
                backend: "cuBLASLt",
                what: format!(
                    "the bias gradient of {} (k = {k} exceeds the ones vector the scratch holds)",
                    p.describe()
                ),
            });
        }
        // SAFETY: the scratch region is this stream's, sized above; stream-ordered memsets.
        unsafe {
            use cudarc::driver::sys::{cuMemsetD16Async, cuMemsetD32Async};
            let r = match prec.input() {
                DType::F32 => cuMemsetD32Async(ws.scratch, 1.0f32.to_bits(), k, stream),
                DType::F16 => cuMemsetD16Async(ws.scratch, crate::half::f16::ONE.to_bits(), k, stream),
                DType::BF16 => cuMemsetD16Async(ws.scratch, crate::half::bf16::ONE.to_bits(), k, stream),
            };
            r.result().map_err(status::driver("cuMemsetD16Async/cuMemsetD32Async"))?;
        }
        let (gp, ga, gb) = if p.epilogue() == Epilogue::BiasGradA {
            // grad[m] = op(A)[m, k]·ones[k]
            let g = GemmProblem::new(
                p.a(),
                Operand::n(MatrixLayout::row_major(k, 1)),
                MatrixLayout::row_major(p.m(), 1),
                1,
                prec,
            )?;
            (g, a, ws.scratch)
        } else {
            // grad[n] = ones[k]ᵀ·op(B)[k, n]
            let g = GemmProblem::new(
                Operand::n(MatrixLayout::row_major(1, k)),
                p.b(),
                MatrixLayout::row_major(1, p.n()),
                1,
                prec,
            )?;
            (g, ws.scratch, b)
        };
        // SAFETY: forwarded.
        unsafe { self.enqueue_blas(st, &gp, 1.0, (ga, gb, grad), 0.0, stream) }
    }

    /// Binds the cuBLAS handle to `stream` (and its workspace) if needed, then one GemmEx call.
    ///
    /// # Safety
    /// As [`launch_blas`]; `stream` of this context.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn blas_call(
        &self,
        st: &mut State,
        call: &ColMajorCall,
        precision: Precision,
        alpha: f32,
        first: u64,
        second: u64,
        beta: f32,
        c: u64,
        stream: CUstream,
    ) -> Result<()> {
        if st.blas.bound != stream || st.blas.bound.is_null() {
            let ws = self.workspace(st, stream, &|| format!("{call:?}"))?;
            // SAFETY: live handle; the workspace belongs to `stream` alone (cublasSetWorkspace
            // documentation: it must not be used by another stream concurrently).
            unsafe {
                status::cublas(
                    cublas_sys::cublasSetStream_v2(st.blas.raw, stream as _),
                    "cublasSetStream_v2",
                    String::new,
                )?;
                status::cublas(
                    cublas_sys::cublasSetWorkspace_v2(st.blas.raw, ws.ptr as *mut _, ws.matmul_bytes),
                    "cublasSetWorkspace_v2",
                    String::new,
                )?;
            }
            st.blas.bound = stream;
        }
        // SAFETY: forwarded.
        unsafe { launch_blas(&st.blas, call, precision, alpha, first, second, beta, c) }
    }

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
        let s = &self.stream;
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
                let extras = RawExtras {
                    bias: vec.as_ref().map(r),
                    aux: aux.as_mut().map(|x| {
                        let len_bytes = x.len();
                        RawBuffer { address: x.device_ptr_mut(s).0, len_bytes }
                    }),
                };
                let (ra, rb) = (r(&a), r(&b));
                let c_len = c.len();
                let rc = RawBuffer { address: c.device_ptr_mut(s).0, len_bytes: c_len };
                // SAFETY: scratch buffers of this context sized by the layouts, on our stream,
                // alive until the synchronize below.
                unsafe { self.gemm_raw_fused(p, 1.0, ra, rb, 0.0, rc, extras, s.cu_stream()) }?;
            }
            s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// Runs a column-major cuBLAS GEMM exactly as given, without any of gemmbridge's checks,
    /// on [`Gpu::stream`]. For diagnostics (the convention table of `gemmbridge probe` calls
    /// cuBLAS with deliberately wrong arguments); use [`Gpu::gemm`] for real work.
    ///
    /// `first`/`second` are the column-major call's A and B device addresses.
    ///
    /// # Safety
    /// Every address must be device memory of this context large enough for everything the
    /// call can read or write given its sizes and leading dimensions, as in a direct cuBLAS
    /// call.
    ///
    /// # Errors
    /// [`Error::Cublas`] with the status cuBLAS returned.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_colmajor_unchecked(
        &self,
        call: &ColMajorCall,
        precision: Precision,
        alpha: f32,
        first: u64,
        second: u64,
        beta: f32,
        c: u64,
    ) -> Result<()> {
        let mut st = self.lock();
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.blas_call(&mut st, call, precision, alpha, first, second, beta, c, self.stream.cu_stream()) }
    }
}

/// The key of a stream's workspace. `CU_STREAM_PER_THREAD` (handle 0x2) names a different
/// stream on every host thread, so its workspaces are kept per thread; every other handle,
/// the legacy default stream (0x0, 0x1) included, names one stream.
fn workspace_key(stream: CUstream) -> (usize, Option<std::thread::ThreadId>) {
    let h = stream as usize;
    (h, (h == 0x2).then(|| std::thread::current().id()))
}

/// The address, length in bytes and cudarc guard of an operand given either for reading or for
/// writing (never both: the caller has checked).
fn either_ptr<'g, 'o: 'g, T>(
    read: Option<&'g (dyn DevicePtr<T> + 'o)>,
    write: Option<&'g mut (dyn DevicePtrMut<T> + 'o)>,
    s: &'g CudaStream,
) -> (Option<u64>, usize, Option<cudarc::driver::SyncOnDrop<'g>>) {
    match (read, write) {
        (Some(v), _) => {
            let len = v.num_bytes();
            let (p, g) = v.device_ptr(s);
            (Some(p), len, Some(g))
        }
        (None, Some(v)) => {
            let len = v.num_bytes();
            let (p, g) = v.device_ptr_mut(s);
            (Some(p), len, Some(g))
        }
        (None, None) => (None, 0, None),
    }
}

/// Buffer descriptions of raw A, B, C for `p` (inputs of the input dtype, C of the output's).
pub(crate) fn raw_descs(p: &GemmProblem, a: RawBuffer, b: RawBuffer, c: RawBuffer) -> [BufferDesc; 3] {
    let prec = p.precision();
    let desc = |r: RawBuffer, dtype| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype };
    [desc(a, prec.input()), desc(b, prec.input()), desc(c, prec.output())]
}

/// Every buffer check for a call: A, B, C, then the epilogue's operands.
pub(crate) fn check_all(p: &GemmProblem, [a, b, c]: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
    check_buffers(p, a, b, c)?;
    let out = p.precision().output();
    let d = |r: RawBuffer| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype: out };
    check_epilogue(p, [a, b, c], extras.bias.map(d), extras.aux.map(d))
}

enum LtFailure {
    /// cuBLASLt has no algorithm for the problem (Auto may use cuBLAS instead).
    NoAlgorithm(Error),
    /// Anything else.
    Other(Error),
}

impl From<Error> for LtFailure {
    fn from(e: Error) -> Self {
        LtFailure::Other(e)
    }
}

fn no_algorithm(p: &GemmProblem) -> Error {
    Error::Cublas {
        operation: "cublasLtMatmulAlgoGetHeuristic",
        status: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
        problem: p.describe(),
    }
}

/// One cuBLAS GemmEx / GemmStridedBatchedEx call.
///
/// # Safety
/// Live handle bound to the intended stream; addresses valid for the call.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_blas(
    h: &BlasHandle,
    call: &ColMajorCall,
    precision: Precision,
    alpha: f32,
    first: u64,
    second: u64,
    beta: f32,
    c: u64,
) -> Result<()> {
    let op = |o: Op| match o {
        Op::N => cublas_sys::cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublas_sys::cublasOperation_t::CUBLAS_OP_T,
    };
    let (ti, to) = (cuda_dtype(precision.input()), cuda_dtype(precision.output()));
    let compute = compute_type(precision.compute());
    let algo = cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
    let (alpha, beta) = (&alpha as *const f32 as *const _, &beta as *const f32 as *const _);
    let ptr = |v: u64| v as *const std::ffi::c_void;
    let describe = || {
        format!(
            "transa={} transb={} m={} n={} k={} lda={} ldb={} ldc={} batch={} {}",
            call.transa, call.transb, call.m, call.n, call.k, call.lda, call.ldb, call.ldc, call.batch, precision
        )
    };
    // SAFETY: the handle is live and bound; alpha/beta point to f32 host scalars, as the 32F
    // compute types require (cuBLAS documentation, cublasGemmEx: alpha and beta are of the
    // scaling type, CUDA_R_32F for CUBLAS_COMPUTE_32F*); the buffers are the caller's contract.
    if call.batch == 1 {
        let s = unsafe {
            cublas_sys::cublasGemmEx(
                h.raw,
                op(call.transa),
                op(call.transb),
                call.m,
                call.n,
                call.k,
                alpha,
                ptr(first),
                ti,
                call.lda,
                ptr(second),
                ti,
                call.ldb,
                beta,
                c as *mut std::ffi::c_void,
                to,
                call.ldc,
                compute,
                algo,
            )
        };
        status::cublas(s, "cublasGemmEx", describe)
    } else {
        let s = unsafe {
            cublas_sys::cublasGemmStridedBatchedEx(
                h.raw,
                op(call.transa),
                op(call.transb),
                call.m,
                call.n,
                call.k,
                alpha,
                ptr(first),
                ti,
                call.lda,
                call.stride_a,
                ptr(second),
                ti,
                call.ldb,
                call.stride_b,
                beta,
                c as *mut std::ffi::c_void,
                to,
                call.ldc,
                call.stride_c,
                call.batch,
                compute,
                algo,
            )
        };
        status::cublas(s, "cublasGemmStridedBatchedEx", describe)
    }
}

fn with_problem(e: Error, p: &GemmProblem) -> Error {
    match e {
        Error::Cublas { operation, status, problem } => {
            let sep = if problem.is_empty() { "" } else { "; " };
            Error::Cublas { operation, status, problem: format!("{problem}{sep}row-major {}", p.describe()) }
        }
        other => other,
    }
}

fn cuda_dtype(d: DType) -> cublas_sys::cudaDataType {
    match d {
        DType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
        DType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
    }
}

/// The cuBLAS compute type; values per cublas_api.h (32F = 68, FAST_TF32 = 77), taken from
/// cudarc's generated enum rather than written as numbers (docs/BACKGROUND.md §2: a wrong
/// number gives NOT_SUPPORTED).
fn compute_type(c: Compute) -> cublas_sys::cublasComputeType_t {
    match c {
        Compute::F32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Compute::Tf32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if self.ctx.bind_to_thread().is_err() {
            // No context to destroy graphs and streams in: leak them rather than call the
            // driver without one.
            std::mem::forget(std::mem::take(&mut st.replay.graphs));
            std::mem::forget(st.capture_stream.take());
            return;
        }
        // Work still queued may use the workspaces: wait for it before freeing them. A
        // failure cannot be reported from Drop; it leaks at most the handles and workspaces.
        let _ = self.ctx.synchronize();
        st.forget_plans(|_| true);
        st.capture_stream = None;
        st.lt = None;
        for (_, ws) in st.workspaces.drain() {
            ws.free();
        }
        if !st.blas.raw.is_null() {
            // SAFETY: created in with_stream and destroyed once, here.
            let _ = unsafe { cublas_sys::cublasDestroy_v2(st.blas.raw) };
            st.blas.raw = std::ptr::null_mut();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_type_constants_match_cublas_api_h() {
        // cublas_api.h: CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77
        assert_eq!(compute_type(Compute::F32) as u32, 68);
        assert_eq!(compute_type(Compute::Tf32) as u32, 77);
        // library_types.h: CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14
        assert_eq!(cuda_dtype(DType::F32) as u32, 0);
        assert_eq!(cuda_dtype(DType::F16) as u32, 2);
        assert_eq!(cuda_dtype(DType::BF16) as u32, 14);
    }
}
