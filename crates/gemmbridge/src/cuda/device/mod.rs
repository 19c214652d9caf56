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

mod capture;
mod copy;
mod fp8_cast;
mod kernels;
mod workspace;

pub(crate) use capture::{capture, is_capturing, CaptureStream, GraphExec};
pub(crate) use copy::{copy_pitched, pad_copy, zero_pitched, PadCopy, Pitched, Scratch};
pub(crate) use fp8_cast::{cast_launches, check_cast, enqueue_cast, launch_one, prepare_cast, CastJob};
pub(crate) use kernels::{arg, suffix, KernelSet, Kernels};
pub(crate) use workspace::{Workspace, WorkspacePool};

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaContext, CudaStream};

use super::status;
use crate::error::Result;

/// What a library backend keeps under the device's lock, and how it lets go of it.
pub(crate) trait Resources: Send {
    /// Destroys what needs the context (handles, graphs). Called once, from the device's
    /// drop, with the context bound and the device synchronised.
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
    /// gemmbridge's own kernels, one module per [`KernelSet`] (compiled on first use).
    kernels: [Option<Kernels>; 3],
}

impl DeviceState {
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
            if is_capturing(stream)? {
                return Err(crate::Error::NotCapturable {
                    action: "compile gemmbridge's kernels (NVRTC)",
                    problem: match set {
                        KernelSet::Fp8 => "the first FP8 quantisation; call Gpu::prepare_fp8 before capturing",
                        KernelSet::Train => "the first training step; run one step before capturing",
                        KernelSet::Copy => "the first padded (misaligned) call; call Gpu::prewarm before capturing",
                    }
                    .into(),
                });
            }
            let cc = self.ctx.compute_capability().map_err(status::driver("cuDeviceGetAttribute"))?;
            *slot = Some(Kernels::compile(&self.ctx, cc, set)?);
        }
        Ok(slot.as_ref().expect("set above"))
    }
}

/// Everything behind the lock: the device's state and the backends'.
pub(crate) struct Locked<L> {
    pub dev: DeviceState,
    pub libs: L,
}

/// A context, its default stream, and the locked state of the device and its backends.
pub(crate) struct Device<L: Resources> {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Mutex<Locked<L>>,
}

impl<L: Resources> Device<L> {
    /// Wraps `stream` (and its context) with the backends' state `libs`; new streams get
    /// workspaces of `workspace_bytes`.
    pub fn new(stream: Arc<CudaStream>, libs: L, workspace_bytes: usize) -> Device<L> {
        let dev = DeviceState {
            ctx: stream.context().clone(),
            workspaces: WorkspacePool::new(workspace_bytes),
            capture_stream: None,
            kernels: [None, None, None],
        };
        Device { ctx: stream.context().clone(), stream, state: Mutex::new(Locked { dev, libs }) }
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

    /// The lock. A panic while it was held cannot leave the state half-changed in a way that
    /// matters (each change is one insertion or one library call), so poison is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Locked<L>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<L: Resources> Drop for Device<L> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if self.ctx.bind_to_thread().is_err() {
            // No context to destroy graphs and streams in: leak them rather than call the
            // driver without one.
            st.libs.leak();
            std::mem::forget(st.dev.capture_stream.take());
            std::mem::forget(std::mem::take(&mut st.dev.kernels));
            return;
        }
        // Work still queued may use the workspaces: wait for it before freeing them. A
        // failure cannot be reported from Drop; it leaks at most the handles and workspaces.
        let _ = self.ctx.synchronize();
        st.libs.release();
        st.dev.capture_stream = None;
        st.dev.kernels = [None, None, None];
        st.dev.workspaces.free_all();
    }
}
