//! The device layer: the CUDA context, the default stream, the per-stream workspace pool, the
//! private capture stream, and the lock every library backend works under. It knows nothing
//! about GEMM or any library: the backends' own state is the type parameter `L`, kept behind
//! the same lock (docs/DESIGN.md, "The device layer").
//!
//! What the coming backends will find here (decided in docs/DESIGN.md):
//! - handles that are not `Send` in cudarc's safe wrappers (cuDNN) are held as raw handles in
//!   `L`, under the lock, bound to the call's stream per call, like cuBLAS's;
//! - gemmbridge's own kernels (NVRTC) in a per-device module cache beside the workspaces
//!   ([`Kernels`]);
//! - scratch beyond the fixed workspace from a stream-ordered pool beside the workspaces.

mod attn_scales;
mod capture;
mod copy;
mod fork;
mod fp8_cast;
mod kernels;
mod layer;
mod lifetime;
mod lru;
mod moe;
mod paged;
mod pointer;
mod replay;
mod timing;
mod workspace;

pub(crate) use attn_scales::AttnBwdScales;
pub(crate) use capture::{capture, capture_graph, is_capturing, refuse_if_capturing, CaptureStream, GraphExec, Needs};
pub(crate) use copy::{copy_pitched, pad_copy, zero_pitched, PadCopy, Pitched, Scratch};
pub(crate) use fork::Lanes;
pub(crate) use fp8_cast::{enqueue_cast, CastJob};
pub(crate) use kernels::{arg, suffix, KernelSet, Kernels};
pub(crate) use layer::{GluLaunch, RopeLaunch};
pub(crate) use lifetime::{capturing, first_stream, keep_primary, Pool, Relaxed, RelaxedDrop};
pub(crate) use lru::Lru;
pub(crate) use moe::MoeKernels;
pub(crate) use paged::AppendLaunch;
pub(crate) use pointer::check_extent;
pub use replay::GraphReplay;
pub(crate) use replay::{Cached, ReplayCache, ReplayKey};
pub(crate) use timing::{time_interleaved, Call, Timed};
pub(crate) use workspace::{Workspace, WorkspacePool, MAX_MATMUL_BYTES, SCRATCH_BYTES};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaStream};

use super::status;
use crate::error::Result;

/// Whether a new device checks raw addresses: off, since the check costs more than 0.3 µs per
/// call of three operands (`GpuOptions::check_raw_addresses` gives the measured cost).
pub(crate) const CHECK_RAW_DEFAULT: bool = false;

/// What a library backend keeps under the device's lock, and how it lets go of it.
pub(crate) trait Resources: Send {
    /// Lets go of what needs the context (handles, plans, graphs). Called once, from the
    /// device's drop, with the context bound and this device's work finished. Library
    /// handles of a primary context (kept alive by [`keep_primary`]) go back to their
    /// [`Pool`] instead of being destroyed: destroying one synchronises the whole device.
    fn release(&mut self);
    /// Forgets, without destroying, what cannot be destroyed without a bound context. Called
    /// instead of [`Resources::release`] when the context cannot be bound at drop.
    fn leak(&mut self);
}

/// The device's own state behind the lock.
pub(crate) struct DeviceState {
    /// The context the state belongs to (its device compiles and loads the kernels).
    ctx: Arc<CudaContext>,
    /// One workspace per stream used.
    pub workspaces: WorkspacePool,
    /// A private non-blocking stream to capture graphs on (created on first use).
    capture_stream: Option<CaptureStream>,
    /// gemmbridge's own kernels, one module per [`KernelSet`] (compiled on first use; for a
    /// primary context shared by every engine of the process, [`kernels::shared`]).
    kernels: [Option<Arc<Kernels>>; 5],
    /// The private streams work is forked to ([`Lanes`]; created on first use).
    lanes: Option<Lanes>,
}

impl DeviceState {
    /// At least `n` of the device's lanes (`n` bounded by the caller), each with its workspace,
    /// taken out of the state for the caller to enqueue through (give them back with
    /// [`DeviceState::put_lanes`]). Lanes are created, never while `caller` is capturing; the
    /// caller has bound the context.
    ///
    /// # Errors
    /// [`crate::Error::NotCapturable`] when a lane or its workspace would be created during a
    /// capture of `caller` (naming `describe()`); [`crate::Error::Driver`].
    pub fn take_lanes(&mut self, n: usize, caller: CUstream, describe: &dyn Fn() -> String) -> Result<Lanes> {
        let have = self.lanes.as_ref().map_or(0, Lanes::len);
        if have < n {
            refuse_if_capturing(caller, Needs::Make("create the streams a grouped GEMM is spread over"), || {
                format!("{}; with more streams, call once before capturing", describe())
            })?;
            let _relaxed = Relaxed::enter()?;
            let lanes = self.lanes()?;
            let grown = lanes.grow(n);
            let made: Vec<CUstream> = (0..lanes.len()).map(|i| lanes.stream(i)).collect();
            grown?;
            for s in made {
                self.workspaces.get(s, describe)?;
            }
        }
        Ok(self.lanes.take().expect("made above"))
    }

    /// Orders a graph launched next on `caller` that holds lanes' work or was captured on the
    /// capture stream after the other users of the workspaces it holds ([`Lanes::before_graph`]);
    /// call [`DeviceState::graph_fence_after`] once it is launched. The caller has bound the
    /// context.
    ///
    /// # Safety
    /// `caller` is a live stream of the context, not being captured.
    pub unsafe fn graph_fence_before(&mut self, caller: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.lanes()?.before_graph(caller) }
    }

    /// The lanes, made (with no streams yet) on first use; the caller has bound the context.
    fn lanes(&mut self) -> Result<&mut Lanes> {
        if self.lanes.is_none() {
            let _relaxed = Relaxed::enter()?;
            self.lanes = Some(Lanes::new()?);
        }
        Ok(self.lanes.as_mut().expect("made above"))
    }

    /// After such a graph's launch on `caller` ([`Lanes::after_graph`]).
    ///
    /// # Safety
    /// As [`DeviceState::graph_fence_before`], which came first.
    pub unsafe fn graph_fence_after(&mut self, caller: CUstream) -> Result<()> {
        match &self.lanes {
            // SAFETY: the caller's contract.
            Some(lanes) => unsafe { lanes.after_graph(caller) },
            None => Ok(()),
        }
    }

    /// Gives back the lanes [`DeviceState::take_lanes`] took.
    pub fn put_lanes(&mut self, lanes: Lanes) {
        self.lanes = Some(lanes);
    }

    /// The private capture stream, created on first use; `None` when it cannot be created
    /// (the caller then runs without capturing).
    pub fn capture_stream(&mut self) -> Option<&CaptureStream> {
        if self.capture_stream.is_none() {
            self.capture_stream =
                CaptureStream::new().map_err(|e| tracing::debug!(error = %e, "no private capture stream")).ok();
        }
        self.capture_stream.as_ref()
    }

    /// A set of gemmbridge's own kernels for the context's device, compiled on first use —
    /// never while `stream` is capturing. The caller has bound the context.
    ///
    /// # Errors
    /// [`crate::Error::NotCapturable`] when they would be compiled during a capture; as
    /// [`Kernels::compile`]; a failure is not cached (the next call tries again).
    pub fn kernels(&mut self, stream: cudarc::driver::sys::CUstream, set: KernelSet) -> Result<&Kernels> {
        let slot = &mut self.kernels[set.index()];
        if slot.is_none() {
            refuse_if_capturing(stream, Needs::Compile("compile gemmbridge's kernels (NVRTC)"), || {
                match set {
                    KernelSet::Fp8 => "the first FP8 quantisation; call GpuFp8::prepare before capturing",
                    KernelSet::Train => "the first training step; run one step before capturing",
                    KernelSet::Copy => "the first padded (misaligned) call; call Gpu::prewarm before capturing",
                    KernelSet::Layer => {
                        "the first RoPE, SwiGLU or mixture-of-experts routing call; make one before capturing"
                    }
                    KernelSet::Paged => "the first paged-cache append; make one before capturing",
                }
                .into()
            })?;
            let _relaxed = Relaxed::enter()?; // NVRTC, cuModuleLoadData
            *slot = Some(kernels::shared(&self.ctx, set)?);
        }
        Ok(slot.as_deref().expect("set above"))
    }
}

/// Everything behind the lock: the device's state and the backends'.
pub(crate) struct Locked<L> {
    pub dev: DeviceState,
    pub libs: L,
}

/// The locked state, with the thread's capture mode relaxed until it is let go (the mode is
/// put back after the lock is released: fields drop in order).
pub(crate) struct Held<'a, L> {
    guard: MutexGuard<'a, Locked<L>>,
    _relaxed: Option<Relaxed>,
}

impl<L> std::ops::Deref for Held<'_, L> {
    type Target = Locked<L>;
    fn deref(&self) -> &Locked<L> {
        &self.guard
    }
}

impl<L> std::ops::DerefMut for Held<'_, L> {
    fn deref_mut(&mut self) -> &mut Locked<L> {
        &mut self.guard
    }
}

/// A context, its default stream, and the locked state of the device and its backends.
pub(crate) struct Device<L: Resources> {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Mutex<Locked<L>>,
    /// Whether raw addresses are checked with the driver before a call ([`Device::set_check_raw_addresses`]).
    check_raw: AtomicBool,
    /// This device value's number, unique in the process ([`Device::id`]).
    id: u64,
}

/// The next [`Device::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl<L: Resources> Device<L> {
    /// Wraps `stream` (and its context) with the backends' state `libs`; new streams get
    /// workspaces of `workspace_bytes`.
    pub fn new(stream: Arc<CudaStream>, libs: L, workspace_bytes: usize) -> Device<L> {
        let dev = DeviceState {
            ctx: stream.context().clone(),
            workspaces: WorkspacePool::new(workspace_bytes),
            capture_stream: None,
            kernels: Default::default(),
            lanes: None,
        };
        let check_raw = AtomicBool::new(CHECK_RAW_DEFAULT);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Device { ctx: stream.context().clone(), stream, state: Mutex::new(Locked { dev, libs }), check_raw, id }
    }

    /// A number no other device value of this process has (a value that moves keeps it):
    /// what a plan made on this device records, so that it runs only under this device's lock.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether raw addresses are checked ([`pointer::check_extent`]) before a call.
    pub fn checks_raw_addresses(&self) -> bool {
        self.check_raw.load(Ordering::Relaxed)
    }

    /// Turns the raw-address check on or off for later calls.
    pub fn set_check_raw_addresses(&self, on: bool) {
        self.check_raw.store(on, Ordering::Relaxed)
    }

    /// Notes that work of this device was enqueued on `stream`, a stream the caller passed
    /// (not [`Device::stream`]): its last-use event is recorded so that the teardown waits
    /// for that work and for nothing else (nothing while `stream` is capturing: the work is
    /// then in the caller's graph, which must not run after the device is dropped).
    pub fn note_use(&self, st: &mut Locked<L>, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        if stream == self.stream.cu_stream() || is_capturing(stream)? {
            return Ok(());
        }
        st.dev.workspaces.record_use(stream)
    }

    /// The context everything runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The default stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Makes the context current on this thread (every driver call below needs it).
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))
    }

    /// The lock, with this thread's capture mode relaxed while it is held ([`Relaxed`]: what
    /// the backends create or allocate under it is allowed while another thread captures in
    /// global mode; two `cuThreadExchangeStreamCaptureMode` calls, about 22 ns). A panic
    /// while it was held cannot leave the state half-changed in a way that matters (each
    /// change is one insertion or one library call), so poison is ignored.
    pub fn lock(&self) -> Held<'_, L> {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        Held { guard, _relaxed: Relaxed::enter().ok() }
    }
}

impl<L: Resources> Drop for Device<L> {
    /// The teardown, in this order (docs/DESIGN.md, "Creation and teardown"): wait for this
    /// device's own work only — each caller stream's last-use event, then its default
    /// stream (unless that is being captured) — never the whole context; library handles
    /// back to their pools (primary contexts) or destroyed; graphs, plans and the private
    /// streams; last the workspaces, freed in stream order. The thread's capture mode is
    /// relaxed throughout, so that another thread's capture is neither refused nor broken.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let relaxed = self.ctx.bind_to_thread().ok().and_then(|()| Relaxed::enter().ok());
        if relaxed.is_none() {
            // No context to destroy graphs and streams in: leak them rather than call the
            // driver without one.
            st.libs.leak();
            std::mem::forget(st.dev.capture_stream.take());
            std::mem::forget(st.dev.lanes.take());
            std::mem::forget(std::mem::take(&mut st.dev.kernels));
            st.dev.workspaces.leak();
            return;
        }
        // A failure cannot be reported from Drop; a wait that fails leaks at most the
        // workspaces (freed only once their users are known to be done).
        let mut idle = st.dev.workspaces.wait_for_uses();
        match is_capturing(self.stream.cu_stream()) {
            Ok(false) => idle &= self.stream.synchronize().is_ok(),
            // its uses before the capture cannot be waited for: keep the workspaces
            _ => idle = false,
        }
        // the lanes are private: waiting for them waits for this device's work only
        if let Some(lanes) = st.dev.lanes.take() {
            idle &= lanes.synchronize();
            if idle {
                drop(lanes);
            } else {
                std::mem::forget(lanes);
            }
        }
        st.libs.release();
        st.dev.capture_stream = None;
        st.dev.kernels = Default::default();
        if idle {
            st.dev.workspaces.free_all();
        } else {
            st.dev.workspaces.leak();
        }
        drop(relaxed);
    }
}
