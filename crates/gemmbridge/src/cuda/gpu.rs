//! [`Gpu`]: the engine a caller holds — the device layer with the cuBLAS and cuBLASLt
//! backends' state under its lock — its construction and settings, and the public types of
//! the GEMM entry points (which are in `entry.rs`).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

use super::blas::BlasHandle;
use super::device::{first_stream, keep_primary, Device, Held, Relaxed, Resources};
use super::dnn::{ConvApi, ConvSearch, DnnState};
use super::lt::plan::Algorithm;
use super::lt::replay::GraphReplay;
use super::lt::LtState;
use super::padding::Padding;
use super::{library, status, tactics};
use crate::error::{Error, Result};

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
    /// The aux `[m, n]` matrix (layout [`GemmProblem::aux`](crate::GemmProblem::aux)) an epilogue writes or reads.
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

/// The backends' state, kept under the device's lock.
pub(crate) struct Libraries {
    /// The library chosen for calls.
    pub backend: Backend,
    pub blas: BlasHandle,
    /// `None` without libcublasLt.
    pub lt: Option<LtState>,
    /// When misaligned calls run on aligned copies.
    pub padding: Padding,
    /// cuDNN (created on the first convolution) and how it chooses algorithms.
    pub dnn: Option<DnnState>,
    pub conv_search: ConvSearch,
    pub conv_fuse: bool,
    pub conv_api: ConvApi,
    pub conv_ws_limit: usize,
    /// The tactic database's convolution entries ([`Gpu::load_tactics`]), handed to the cuDNN
    /// room when it is created (it keeps those of its cuDNN version).
    pub conv_tactics: std::collections::BTreeMap<String, tactics::Tactic>,
    /// [`Gpu::set_sm_count_target`]'s value (0: all SMs); cuBLASLt's room keeps its own copy.
    pub sm_count_target: u32,
}

impl Resources for Libraries {
    fn release(&mut self) {
        self.lt = None; // plans, graphs and the handle
        self.blas.release();
        if let Some(d) = self.dnn.as_mut() {
            d.release();
        }
    }

    fn leak(&mut self) {
        if let Some(lt) = self.lt.as_mut() {
            std::mem::forget(std::mem::take(&mut lt.replay.graphs));
        }
        if let Some(d) = self.dnn.as_mut() {
            d.leak();
        }
    }
}

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
/// create either while capturing fails with [`Error::NotCapturable`] instead. The plan cache
/// holds at most 4096 plans: beyond that, building a new plan drops an old one (rebuilt on its
/// next use), so a program with more distinct problems than that should prewarm just before
/// capturing. A captured graph
/// uses the capture stream's workspace: replay it on that stream (or serialised with it), and
/// not after the `Gpu` is dropped.
///
/// # Graph replay of repeated small calls
/// Eagerly, a cuBLASLt call of at most 1024³ multiply-adds that is made again with the same
/// operands (addresses, α, β, stream) is captured once, on a private stream, into a CUDA graph;
/// from then on such a call is one `cuGraphLaunch` on the caller's stream instead of a
/// `cublasLtMatmul`, which costs the host less (docs/notes/performance-history.md §3.1). The result is the
/// direct call's: same kernel, same stream order, operands read when the GEMM runs. Graphs are
/// never launched into a stream being captured, and a bias that needs staging is never
/// replayed. A capture and an instantiation are paid once per distinct call. See [`GraphReplay`] and
/// [`Gpu::set_graph_replay`] (`GraphReplay::off()` turns it off).
///
/// Captures and other threads: another thread's first launch of a kernel can invalidate a
/// capture in flight (CUDA's lazy module loading synchronises the device). gemmbridge's own captures then fall back (replay: the call runs directly and is
/// captured again later; tuning: eager timing). For captures of your own, launch every kernel
/// once first (or [`Gpu::prewarm`]), or set `CUDA_MODULE_LOADING=EAGER`.
///
/// # Errors at creation
/// [`Error::LibraryNotFound`] when libcuda or libcublas cannot be loaded, [`Error::NoDevice`]
/// when the driver finds no GPU, [`Error::Driver`] / [`Error::Cublas`] for other failures.
/// A missing libcublasLt is not an error: [`Backend::Auto`] then uses cuBLAS.
pub struct Gpu {
    device: Device<Libraries>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.context().ordinal())
            .field("stream", &self.stream().cu_stream())
            .finish()
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
        let _relaxed = Relaxed::enter()?;
        let ctx = CudaContext::new(ordinal).map_err(status::driver("cuDevicePrimaryCtxRetain"))?;
        // Without cudarc's context-wide synchronisation of a context object's first stream:
        // `ctx` is this engine's own object, with no buffer made through it yet.
        let stream = first_stream(&ctx)?;
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
        let _relaxed = Relaxed::enter()?;
        // A primary context stays for the life of the process, and its library handles are
        // pooled: dropping an engine then neither resets the context nor synchronises it.
        keep_primary(&ctx)?;
        let pool = ctx.is_primary().then(|| ctx.ordinal());
        let blas = BlasHandle::new(pool)?;
        let lt = if library::has_cublaslt() { Some(LtState::new(pool)?) } else { None };
        let major = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(status::driver("cuDeviceGetAttribute"))?;
        // cuBLASLt's documentation recommends 32 MiB of workspace on Hopper and later, 4 MiB
        // before.
        let workspace_bytes = if major >= 9 { 32 << 20 } else { 4 << 20 };
        let libs = Libraries {
            backend: Backend::Auto,
            blas,
            lt,
            padding: Padding::default(),
            dnn: None,
            conv_search: ConvSearch::default(),
            conv_fuse: true,
            conv_api: ConvApi::default(),
            conv_ws_limit: super::dnn::CONV_WORKSPACE_LIMIT,
            conv_tactics: Default::default(),
            sm_count_target: 0,
        };
        Ok(Gpu { device: Device::new(stream, libs, workspace_bytes) })
    }

    /// The context everything runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.device.context()
    }

    /// The stream [`Gpu::gemm`] enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.device.stream()
    }

    /// The device layer (context binding, lock).
    pub(crate) fn device(&self) -> &Device<Libraries> {
        &self.device
    }

    /// The lock over the device's and the backends' state.
    pub(crate) fn lock(&self) -> Held<'_, Libraries> {
        self.device.lock()
    }

    /// Runs `f` on the cuBLASLt state (if there is one) under the lock, with the context bound
    /// (graphs may be destroyed).
    fn with_lt(&self, f: impl FnOnce(&mut LtState)) {
        let mut st = self.lock();
        let _ = self.device.bind();
        if let Some(lt) = st.libs.lt.as_mut() {
            f(lt);
        }
    }

    /// Chooses the library for later calls (default [`Backend::Auto`]).
    pub fn set_backend(&self, backend: Backend) {
        self.lock().libs.backend = backend;
    }

    /// The library chosen for calls.
    pub fn backend(&self) -> Backend {
        self.lock().libs.backend
    }

    /// Whether cuBLASLt was found.
    pub fn has_lt(&self) -> bool {
        self.lock().libs.lt.is_some()
    }

    /// Sets the workspace size (bytes) for streams that get their first call from now on.
    pub fn set_workspace_bytes(&self, bytes: usize) {
        self.lock().dev.workspaces.bytes = bytes;
    }

    /// The workspace size (bytes) new streams get.
    pub fn workspace_bytes(&self) -> usize {
        self.lock().dev.workspaces.bytes
    }

    /// Loads tuned algorithms (from [`tactics::TacticDb::load`]): plans built from now on use
    /// them wherever cuBLASLt confirms they are valid (cublasLtMatmulAlgoCheck); cached plans
    /// are dropped so that they are rebuilt.
    ///
    /// Convolutions: the entries of kind "conv2d" tuned with the cuDNN version this process
    /// loads (entries of another are left out with a warning, once the cuDNN room exists) are
    /// kept by problem signature. The first time a problem with an entry is planned, its plan is
    /// rebuilt from the entry without a search, whatever [`Gpu::set_conv_search`] says: the
    /// graph API's engine by its global index with the recorded knobs (the legacy API's
    /// algorithm with its math type), used if cuDNN finalizes it, it keeps the precision's
    /// promise and its workspace fits [`Gpu::set_conv_workspace_limit`] (the legacy API: the
    /// stream's workspace); otherwise a warning is logged and the problem is planned as without
    /// the database. Convolution plans an entry replaces are dropped.
    pub fn load_tactics(&self, db: &tactics::TacticDb) {
        {
            let mut st = self.lock();
            let conv = db.entries.iter().filter(|(_, t)| t.kind == tactics::ProblemKind::Conv2d);
            st.libs.conv_tactics.extend(conv.map(|(k, t)| (k.clone(), t.clone())));
            if let Some(d) = st.libs.dnn.as_mut() {
                let _ = self.device.bind(); // replay graphs may be destroyed
                d.load_tactics(db.entries.iter());
            }
        }
        self.with_lt(|lt| {
            // GEMM and FP8 GEMM keys share the map: their prefixes never collide (tactics docs)
            let lt_kinds = [tactics::ProblemKind::Gemm, tactics::ProblemKind::Fp8Gemm];
            for (sig, t) in db.entries.iter().filter(|(_, t)| lt_kinds.contains(&t.kind)) {
                if let Some((data, workspace)) = t.lt_algo() {
                    lt.tuned.insert(sig.clone(), Algorithm { data, workspace });
                }
            }
            lt.forget_plans(|_| true);
        });
    }

    /// Number of cached cuBLASLt plans.
    pub fn cached_plans(&self) -> usize {
        self.lock().libs.lt.as_ref().map_or(0, |lt| lt.plans.len())
    }

    /// Drops every cached plan and replay graph (they are rebuilt on next use).
    pub fn clear_plans(&self) {
        self.with_lt(|lt| {
            lt.forget_plans(|_| true);
            lt.unsupported.clear();
        });
    }

    /// Chooses when repeated small eager calls are replayed from cached CUDA graphs
    /// ([`GraphReplay`]; default on, for problems up to 1024³ multiply-adds, from the second
    /// call with the same operands). Changing it drops the graphs cached so far. Without
    /// cuBLASLt nothing is replayed and the setting is not kept.
    pub fn set_graph_replay(&self, options: GraphReplay) {
        self.with_lt(|lt| {
            lt.replay.clear();
            lt.replay.options = options;
        });
    }

    /// The replay settings in use.
    pub fn graph_replay(&self) -> GraphReplay {
        self.lock().libs.lt.as_ref().map_or_else(GraphReplay::default, |lt| lt.replay.options)
    }

    /// Chooses when calls whose operands are off 16-byte alignment run on aligned copies
    /// ([`Padding`]; default on above the measured thresholds).
    pub fn set_padding(&self, padding: Padding) {
        self.lock().libs.padding = padding;
    }

    /// The padding settings in use.
    pub fn padding(&self) -> Padding {
        self.lock().libs.padding
    }

    /// Leaves SMs free for kernels that run beside gemmbridge's GEMMs: dense GEMMs planned from
    /// now on are told to use `Some(sms)` SMs (cuBLASLt's `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`
    /// for [`Backend::Lt`] and Auto, `cublasSetSmCountTarget` for [`Backend::Blas`]); `None`
    /// (the default) uses them all. Plans are kept per target, and a tactic database entry
    /// applies only under the target it was tuned with (tuning runs under the `Gpu`'s target,
    /// [`Gpu::autotune_raw`]; `gemmbridge tune --sm-count-target`): entries tuned on the whole
    /// GPU are not applied under a target, where the heuristic chooses for that SM count unless
    /// an entry tuned for it exists. FP8 GEMMs and convolutions are not affected.
    ///
    /// Why: a kernel that stays resident while a GEMM runs — the spin kernel that orders the
    /// burn adapter's GEMMs with cubecl's stream — can keep one of the GEMM's CTAs from an SM
    /// until the others finish. Measured on the H200 (132 SMs, bf16 4096³, cuBLASLt 13.1): a
    /// one-thread kernel resident on another stream made the GEMM 1.46× slower; with a target
    /// of 131 SMs, 1.14× (1.055× without the resident kernel). See docs/PERFORMANCE.md.
    ///
    /// `Some(n)` with `n` equal to the device's SM count is a target too: its plans are cached
    /// apart and only entries tuned under it apply; `None` is the default.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for 0 or more SMs than the device has (nothing changed);
    /// [`Error::Driver`] from the device query; [`Error::Cublas`] from cuBLAS.
    pub fn set_sm_count_target(&self, sms: Option<u32>) -> Result<()> {
        let have = self
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(status::driver("cuDeviceGetAttribute"))? as u32;
        let n = match sms {
            None => 0,
            Some(n) if (1..=have).contains(&n) => n,
            Some(n) => {
                return Err(Error::OutOfRange {
                    what: "SM count target",
                    value: u64::from(n),
                    expected: format!("1 to {have}, the device's SMs (or None for all of them)"),
                })
            }
        };
        let mut st = self.lock();
        self.device.bind()?;
        st.libs.blas.set_sm_count_target(n as i32)?;
        st.libs.sm_count_target = n;
        if let Some(lt) = st.libs.lt.as_mut() {
            lt.sm_count = n;
        }
        Ok(())
    }

    /// The SM count target set by [`Gpu::set_sm_count_target`] (`None`: all SMs).
    pub fn sm_count_target(&self) -> Option<u32> {
        Some(self.lock().libs.sm_count_target).filter(|&n| n > 0)
    }

    /// Checks, before each raw call ([`Gpu::gemm_raw`], [`Gpu::gemm_raw_fused`]), that every
    /// byte the call reads or writes lies inside one allocation this GPU can access — its own
    /// device memory (plain, stream-ordered pool or virtual-memory-managed), managed memory,
    /// or host memory CUDA allocated or registered — with `cuPointerGetAttributes`, one query
    /// per operand. Without the check, a host pointer given as a device address is enqueued
    /// and faults on the GPU, which breaks the context for every later call of the process
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`); with it, the call returns [`Error::NotDeviceMemory`]
    /// before anything is enqueued and the engine stays usable. Off by default, because it
    /// costs the host 0.44–0.51 µs per call with A, B and C on the H200 (1.55 → 1.99 µs for a
    /// replayed f32 64³ call, 1.65 → 2.16 µs bf16: `gemmbridge bench --ops launch`, fields
    /// `host_raw_us` and `host_raw_checked_us`), a third of the call itself.
    pub fn set_check_raw_addresses(&self, on: bool) {
        self.device.set_check_raw_addresses(on);
    }

    /// Whether raw addresses are checked ([`Gpu::set_check_raw_addresses`]).
    pub fn check_raw_addresses(&self) -> bool {
        self.device.checks_raw_addresses()
    }

    /// Number of cached replay graphs.
    pub fn cached_graphs(&self) -> usize {
        self.lock().libs.lt.as_ref().map_or(0, |lt| lt.replay.graphs.len())
    }
}
