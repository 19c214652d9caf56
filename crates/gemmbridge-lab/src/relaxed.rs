//! The churn's own data plumbing with the thread's stream-capture mode relaxed.
//!
//! While any thread of the process captures a graph in global mode, a "potentially unsafe"
//! CUDA call — an allocation, a free, a synchronous copy — on another thread whose capture mode
//! is global or thread-local fails and invalidates that capture; in relaxed mode it is allowed
//! (CUDA Programming Guide, "Stream Capture", cross-thread interactions;
//! `cuThreadExchangeStreamCaptureMode`). The churn relaxes its own uploads, downloads, waits
//! and frees, as a program beside a global-mode capture must, and leaves only the library's
//! calls in the thread's default mode, so that the run tests them.

use cudarc::driver::sys::{self as drv, CUstreamCaptureMode};
use gemmbridge::{Error, Result};

/// The thread's capture mode, relaxed while this lives; the previous mode is put back at drop.
pub(crate) struct Relaxed(CUstreamCaptureMode);

impl Relaxed {
    /// Enters relaxed mode.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses the exchange (or is not loaded).
    pub fn enter() -> Result<Relaxed> {
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: an in/out pointer to a local; the call only swaps this thread's mode.
        unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .map_err(driver("cuThreadExchangeStreamCaptureMode"))?;
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

/// A value (a cudarc buffer) dropped with the thread's capture mode relaxed: its
/// `cuMemFreeAsync` then neither fails nor breaks another thread's global-mode capture.
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

/// Runs `f` with the thread's capture mode relaxed (unchanged where the driver refuses).
pub(crate) fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let _relaxed = Relaxed::enter();
    f()
}

/// A driver error as gemmbridge's [`Error::Driver`] naming the call (the status by its C name,
/// e.g. `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn driver(operation: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver { operation, status: format!("{:?}", e.0) }
}
