//! What creating and dropping an engine may do to other owners of the same context, and the
//! process-wide state that keeps it from doing more (docs/DESIGN.md, "Creation and teardown").
//!
//! - [`Relaxed`]: this thread's stream-capture mode set to relaxed for the length of a creation
//!   or teardown, so that another thread's capture in global mode neither fails our
//!   allocations, module loads and handle creations nor is invalidated by them.
//! - [`keep_primary`]: one reference to a device's primary context held for the life of the
//!   process, so that it is never reset (destroyed and made again) while threads create and
//!   drop engines on it.
//! - [`first_stream`]: a context object's first stream without cudarc's context-wide
//!   synchronisation.
//! - [`Pool`]: handles of a library kept per device for reuse instead of destroyed, since
//!   destroying one synchronises the whole device.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self as drv, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream};

use crate::cuda::status;
use crate::error::Result;

/// This thread's capture mode set to `CU_STREAM_CAPTURE_MODE_RELAXED` until dropped, then put
/// back (`cuThreadExchangeStreamCaptureMode`). In the default (global) mode a thread may not
/// make "potentially unsafe" calls — `cuMemAlloc`, `cuModuleLoad`, synchronising calls, the
/// handle creations of the libraries that make them — while any thread captures in global
/// mode; such a call fails and invalidates that capture (CUDA Programming Guide, "Stream
/// Capture", cross-thread interactions). Relaxed mode allows them. It does not make a call
/// on a capturing stream legal: every path that would create something on a stream that is
/// itself capturing still checks and returns [`crate::Error::NotCapturable`].
pub(crate) struct Relaxed(CUstreamCaptureMode);

impl Relaxed {
    /// Enters relaxed mode (the driver is loaded: checked by the caller).
    pub fn enter() -> Result<Relaxed> {
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: an in/out pointer to a local; the call only swaps this thread's mode.
        unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .map_err(status::driver("cuThreadExchangeStreamCaptureMode"))?;
        Ok(Relaxed(mode))
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        let mut mode = self.0;
        // SAFETY: as in enter; puts back the mode that was in force before it.
        let _ = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

/// A value (a cudarc buffer) dropped with this thread's capture mode relaxed: its
/// `cuMemFreeAsync` then neither fails nor breaks another thread's capture in global mode
/// (a failure in a drop would be kept by cudarc and returned by the context's next call).
pub(crate) struct RelaxedDrop<T>(std::mem::ManuallyDrop<T>);

impl<T> RelaxedDrop<T> {
    pub fn new(value: T) -> RelaxedDrop<T> {
        RelaxedDrop(std::mem::ManuallyDrop::new(value))
    }
}

impl<T> std::ops::Deref for RelaxedDrop<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for RelaxedDrop<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> Drop for RelaxedDrop<T> {
    fn drop(&mut self) {
        let _relaxed = Relaxed::enter();
        // SAFETY: dropped once, here; the field is never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) }
    }
}

/// This process's own graph captures (shared) against its own context-wide synchronisations
/// (exclusive). The driver has faulted (SIGSEGV inside `cuCtxSynchronize`) when one thread
/// synchronised the context while another began a capture or instantiated a graph on the
/// same context; engines of a primary context never synchronise it (handles are pooled), so
/// this only orders the handle destructions of other contexts against captures.
static GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held for the length of one capture and its instantiation.
pub(crate) fn capturing() -> std::sync::RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|p| p.into_inner())
}

/// Held for the length of a call that synchronises the whole context (a library handle's
/// destruction).
pub(crate) fn synchronising() -> std::sync::RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|p| p.into_inner())
}

/// The primary contexts kept, one reference per device ordinal.
static KEPT: Mutex<Vec<Option<Arc<CudaContext>>>> = Mutex::new(Vec::new());

/// Holds one reference to the primary context of `ctx`'s device for the life of the process
/// (nothing for a context that is not a primary one).
///
/// Why: `cuDevicePrimaryCtxRelease` resets the primary context — destroys it with every
/// allocation, stream and module in it — when its last reference goes (CUDA Driver API,
/// `cuDevicePrimaryCtxRelease`). With every engine holding one reference, a process whose
/// threads create and drop engines reaches zero whenever all of them are dropped at once, and
/// the next engine builds the context again while others may be tearing down; library handles
/// kept in a [`Pool`] would also outlive their context. PyTorch never releases the primary
/// context either.
///
/// # Errors
/// [`crate::Error::Driver`] from `cuDevicePrimaryCtxRetain`.
pub(crate) fn keep_primary(ctx: &Arc<CudaContext>) -> Result<()> {
    if !ctx.is_primary() {
        return Ok(());
    }
    let i = ctx.ordinal();
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() <= i {
        kept.resize(i + 1, None);
    }
    if kept[i].is_none() {
        kept[i] = Some(CudaContext::new(i).map_err(status::driver("cuDevicePrimaryCtxRetain"))?);
    }
    Ok(())
}

/// A new non-blocking stream of `ctx`, without the context-wide `cuCtxSynchronize` cudarc's
/// `new_stream` runs for a context object's first stream (it waits for every other owner's
/// work on the device, and fails while another thread captures in global mode).
///
/// cudarc synchronises there so that buffers made before the first stream, whose uses it did
/// not track, are idle before it starts tracking them. `ctx` must be a context object nothing
/// has allocated through yet (made by `CudaContext::new` for this engine alone), so there are
/// none; its event tracking is switched off for the creation only.
pub(crate) fn first_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    let tracking = ctx.is_event_tracking();
    // SAFETY: no buffer of this context object exists (the caller's contract), so none is
    // made while tracking is off, and enabling it again affects only buffers made later.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(status::driver("cuStreamCreate"));
    if tracking {
        // SAFETY: as above.
        unsafe { ctx.enable_event_tracking() };
    }
    stream
}

/// Library handles kept per device ordinal for the next engine instead of destroyed: the
/// libraries' destroy calls synchronise the whole device (cuBLAS and cuBLASLt:
/// "cublasDestroy()/cublasLtDestroy() will implicitly call cudaDeviceSynchronize()"; cuDNN:
/// `cudnnDestroy` likewise), which would wait for, and race with, every other owner of the
/// context. Only handles of primary contexts are pooled: [`keep_primary`] keeps those
/// contexts alive, so a pooled handle never outlives its context. `C` is the library's opaque
/// context type; its handles are `*mut C`.
pub(crate) struct Pool<C> {
    free: Mutex<Vec<(usize, Idle<C>)>>,
}

/// A raw library handle lying idle in a [`Pool`].
struct Idle<C>(*mut C);

// SAFETY: a pool holds only raw library handles, which the libraries allow on any host thread
// as long as no two threads use one at once (cuBLAS and cuDNN documentation, "Thread Safety");
// an idle one is used by nobody until one engine takes it, and then under that engine's lock.
unsafe impl<C> Send for Idle<C> {}

impl<C> Pool<C> {
    /// An empty pool (for a `static`).
    pub const fn new() -> Pool<C> {
        Pool { free: Mutex::new(Vec::new()) }
    }

    /// A handle for the current context: an idle one of device `pool`'s (`Some(ordinal)` for
    /// a primary context), else a new one from `create`; and whether it came from the pool (it
    /// may carry an earlier engine's settings).
    ///
    /// # Errors
    /// `create`'s.
    pub fn take_or_create(
        &self,
        pool: Option<usize>,
        create: impl FnOnce() -> Result<*mut C>,
    ) -> Result<(*mut C, bool)> {
        let idle = pool.and_then(|ordinal| {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let at = free.iter().position(|(o, _)| *o == ordinal)?;
            Some(free.swap_remove(at).1 .0)
        });
        match idle {
            Some(h) => Ok((h, true)),
            None => Ok((create()?, false)),
        }
    }

    /// Lets go of `handle` (idle: nothing enqueued with it is still to run): back to device
    /// `pool`'s idle ones, or — the handle of a context that is not a primary one — destroyed
    /// by `destroy` while this process's own captures are held off ([`synchronising`]).
    pub fn release(&self, pool: Option<usize>, handle: *mut C, destroy: impl FnOnce(*mut C)) {
        match pool {
            Some(ordinal) => self.free.lock().unwrap_or_else(|p| p.into_inner()).push((ordinal, Idle(handle))),
            None => {
                let _gate = synchronising();
                destroy(handle);
            }
        }
    }
}
