//! The cuBLAS handle: taken from (and given back to) the device's pool, bound per call to
//! the call's stream and that stream's workspace.

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUstream;

use crate::cuda::device::{DeviceState, Pool};
use crate::cuda::status;
use crate::error::Result;

/// An owned cuBLAS handle, the stream it is bound to, and the device whose pool it goes back
/// to (a primary context's) instead of being destroyed.
pub(crate) struct BlasHandle {
    pub(super) raw: cublas_sys::cublasHandle_t,
    bound: CUstream,
    pool: Option<usize>,
}

/// Handles of dropped engines, by device.
static POOL: Pool<cublas_sys::cublasContext> = Pool::new();

// SAFETY: the raw handle is used only under the device's Mutex; cuBLAS allows a handle to be
// used from any host thread when calls on it do not overlap (cuBLAS documentation, "Thread
// Safety").
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    /// A handle for the current context (bound by the caller): one from device `pool`'s
    /// [`Pool`] (its SM count target reset) or a new one; `pool` is `Some(ordinal)` for a
    /// primary context, `None` otherwise (the handle is then destroyed at the end).
    pub fn new(pool: Option<usize>) -> Result<BlasHandle> {
        let (raw, reused) = POOL.take_or_create(pool, || {
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
            status::cublas(unsafe { cublas_sys::cublasCreate_v2(&mut raw) }, "cublasCreate_v2", String::new)?;
            Ok(raw)
        })?;
        let mut h = BlasHandle { raw, bound: std::ptr::null_mut(), pool };
        if reused {
            h.set_sm_count_target(0)?;
        }
        Ok(h)
    }

    /// Tells cuBLAS how many SMs its kernels should use (`cublasSetSmCountTarget`; 0: all).
    pub fn set_sm_count_target(&mut self, sms: i32) -> Result<()> {
        // SAFETY: a live handle; the call only records the value.
        status::cublas(
            unsafe { cublas_sys::cublasSetSmCountTarget(self.raw, sms) },
            "cublasSetSmCountTarget",
            String::new,
        )
    }

    /// Lets go of the handle: back to its pool, or destroyed (which synchronises the device:
    /// cuBLAS's documentation of `cublasDestroy`). The context is bound and the work enqueued
    /// with the handle has finished (the caller's contract).
    pub fn release(&mut self) {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if !raw.is_null() {
            POOL.release(self.pool, raw, |raw| {
                // SAFETY: created in new and destroyed once (the field is null from now on).
                let _ = unsafe { cublas_sys::cublasDestroy_v2(raw) };
            });
        }
    }

    /// Binds the handle to `stream` and its workspace, unless it is bound to it already.
    pub(super) fn bind(
        &mut self,
        dev: &mut DeviceState,
        stream: CUstream,
        describe: &dyn Fn() -> String,
    ) -> Result<()> {
        if self.bound != stream || self.bound.is_null() {
            let ws = dev.workspaces.get(stream, describe)?;
            // SAFETY: live handle; the workspace belongs to `stream` alone (cublasSetWorkspace
            // documentation: it must not be used by another stream concurrently).
            unsafe {
                status::cublas(
                    cublas_sys::cublasSetStream_v2(self.raw, stream as _),
                    "cublasSetStream_v2",
                    String::new,
                )?;
                status::cublas(
                    cublas_sys::cublasSetWorkspace_v2(self.raw, ws.ptr as *mut _, ws.matmul_bytes),
                    "cublasSetWorkspace_v2",
                    String::new,
                )?;
            }
            self.bound = stream;
        }
        Ok(())
    }
}
