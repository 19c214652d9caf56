//! [`Gpu`]: the engine a caller holds — the device layer with the backends' state under its
//! lock — and its construction.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::options::value::GpuOptions;
use crate::cuda::blas::BlasHandle;
use crate::cuda::device::{first_stream, keep_primary, Device, Held, Relaxed};
use crate::cuda::dnn::{ConvApi, ConvSearch};
use crate::cuda::library;
use crate::cuda::lt::LtState;
use crate::cuda::route::{Backend, Libraries, Padding};
use crate::cuda::status;
use crate::error::{Error, Result};

/// Owns a CUDA context, a stream, one cuBLAS and one cuBLASLt handle, a workspace per stream
/// used, and a cache of cuBLASLt plans; runs row-major GEMMs.
///
/// # Threads and streams
/// `Gpu` is `Send + Sync`. Every call locks the handles for the microseconds it takes to
/// enqueue the GEMM, so calls from several threads are safe but serialise on the host; for
/// parallel host submission use one `Gpu` per thread. GPU work is never synchronised by
/// gemmbridge: [`Gpu::gemm`] enqueues on [`Gpu::stream`], [`Gpu::gemm_raw`] on the stream the
/// caller passes, and both return once the work is enqueued. Each stream gets its own
/// workspace ([`GpuOptions::workspace_bytes`]; 32 MiB on Hopper and later, 4 MiB before, the
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
/// holds at most [`GpuOptions::plan_cache_capacity`] plans (4096 by default): beyond that,
/// building a new plan drops the least recently used (rebuilt on its next use), so a program
/// with more distinct problems than that should prewarm just before capturing, or hold its
/// plans ([`GemmPlan`](crate::cuda::GemmPlan): never dropped, capturable once made). A captured graph
/// uses the capture stream's workspace: replay it on that stream (or serialised with it), and
/// not after the `Gpu` is dropped.
///
/// # Graph replay of repeated small calls
/// Eagerly, a cuBLASLt call of at most 1024³ multiply-adds that is made again with the same
/// operands (addresses, α, β, stream) is captured once, on a private stream, into a CUDA graph;
/// from then on such a call is one `cuGraphLaunch` on the caller's stream instead of a
/// `cublasLtMatmul`, which costs the host less (docs/PERFORMANCE.md, host cost per call). The
/// result is the direct call's: same kernel, same stream order, operands read when the GEMM runs.
/// Graphs are never launched into a stream being captured, and a bias that needs staging is never
/// replayed. A capture and an instantiation are paid once per distinct call. See
/// [`GraphReplay`](crate::cuda::GraphReplay) and [`GpuOptions::graph_replay`] (`GraphReplay::off()`
/// turns it off).
///
/// Captures and other threads: another thread's first launch of a kernel can invalidate a
/// capture in flight (CUDA's lazy module loading synchronises the device). gemmbridge's own captures then fall back (replay: the call runs directly and is
/// captured again later; tuning: eager timing). For captures of your own, launch every kernel
/// once first (or [`Gpu::prewarm`]), or set `CUDA_MODULE_LOADING=EAGER`.
///
/// # Settings and plans
/// Every setting is one [`GpuOptions`] value: given at creation ([`Gpu::with_options`],
/// [`Gpu::with_stream`]), read with [`Gpu::options`], changed on a live engine with
/// [`Gpu::update_options`] (which says what each change reaches and drops). The plan and
/// replay caches and the tactic database are under [`Gpu::plans`].
///
/// # Errors at creation
/// In this order: [`Error::OutOfRange`] for an option [`GpuOptions::validate`] refuses
/// (checked before the driver is loaded); [`Error::LibraryNotFound`] when libcuda or libcublas
/// cannot be loaded, [`Error::NoDevice`] when the driver finds no GPU, [`Error::Driver`] /
/// [`Error::Cublas`] for other failures; [`Error::OutOfRange`] for an SM count target above
/// the device's SMs (the one option checked against the device).
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
    /// Opens device `ordinal` (its primary context) with a new non-blocking stream and the
    /// default settings ([`GpuOptions::default`]; [`Gpu::with_options`] takes others).
    ///
    /// # Errors
    /// See [`Gpu`].
    pub fn new(ordinal: usize) -> Result<Gpu> {
        Gpu::open(ordinal, GpuOptions::default())
    }

    /// [`Gpu::new`] and [`Gpu::with_options`].
    pub(super) fn open(ordinal: usize, options: GpuOptions) -> Result<Gpu> {
        options.validate()?; // before the driver: a bad option is named without a GPU
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
        Gpu::with_stream(stream, options)
    }

    /// Uses a stream the caller already has (and its context), with `options`
    /// ([`GpuOptions::default()`] for the defaults). Work is enqueued on it in order with the
    /// caller's other work on it.
    ///
    /// # Errors
    /// In the order of [`Gpu::with_options`]: [`Error::OutOfRange`] for an option
    /// [`GpuOptions::validate`] refuses, first; then the loading and driver errors of [`Gpu`];
    /// then [`Error::OutOfRange`] for an SM count target above the device's SMs.
    pub fn with_stream(stream: Arc<CudaStream>, options: GpuOptions) -> Result<Gpu> {
        options.validate()?;
        library::ensure_driver()?;
        library::ensure_cublas()?;
        let ctx = stream.context().clone();
        ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(status::driver("cuDeviceGetAttribute"))?;
        options.validate_for(sms as u32)?;
        let _relaxed = Relaxed::enter()?;
        // A primary context stays for the life of the process, and its library handles are
        // pooled: dropping an engine then neither resets the context nor synchronises it.
        keep_primary(&ctx)?;
        let pool = ctx.is_primary().then(|| ctx.ordinal());
        let blas = BlasHandle::new(pool)?;
        let lt = if library::has_cublaslt() { Some(LtState::new(pool)?) } else { None };
        // the defaults, then `options` applied as a live engine's update applies them
        let libs = Libraries {
            backend: Backend::Auto,
            blas,
            lt,
            padding: Padding::default(),
            dnn: None,
            conv_search: ConvSearch::default(),
            conv_fuse: true,
            norm_fuse: true,
            conv_api: ConvApi::default(),
            conv_ws_limit: crate::cuda::dnn::CONV_WORKSPACE_LIMIT,
            dnn_tactics: Default::default(),
            attn_search: false,
            sm_count_target: 0,
            grouped: Default::default(),
        };
        let gpu = Gpu { device: Device::new(stream, libs, 0) };
        gpu.device.lock().dev.workspaces.bytes = gpu.recommended_workspace()?;
        let defaults = gpu.options();
        gpu.apply(&defaults, &options)?;
        Ok(gpu)
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
    pub(super) fn with_lt(&self, f: impl FnOnce(&mut LtState)) {
        let mut st = self.lock();
        let _ = self.device.bind();
        if let Some(lt) = st.libs.lt.as_mut() {
            f(lt);
        }
    }
}
