//! Per-stream workspaces and graph-capture detection.

use cudarc::driver::sys::{CUstream, CUstreamCaptureStatus};

use super::status;
use crate::error::Result;

/// Bytes after the matmul workspace reserved for staging a misaligned bias vector
/// (262 144 f32 or 524 288 half elements).
pub(crate) const SCRATCH_BYTES: usize = 1 << 20;

/// One stream's device workspace: `matmul_bytes` for cuBLAS/cuBLASLt, then a scratch region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workspace {
    pub ptr: u64,
    pub matmul_bytes: usize,
    pub scratch: u64,
    pub scratch_bytes: usize,
}

impl Workspace {
    /// Allocates (cuMemAlloc, not stream-ordered, so any stream of the context may use it).
    pub fn new(matmul_bytes: usize) -> Result<Workspace> {
        // cuBLASLt wants a 256-byte-aligned workspace; round the scratch start up to that.
        let matmul_bytes = matmul_bytes.next_multiple_of(256);
        let total = matmul_bytes + SCRATCH_BYTES;
        // SAFETY: plain allocation of `total` bytes in the current context (bound by caller).
        let ptr = unsafe { cudarc::driver::result::malloc_sync(total) }.map_err(status::driver("cuMemAlloc"))?;
        Ok(Workspace { ptr, matmul_bytes, scratch: ptr + matmul_bytes as u64, scratch_bytes: SCRATCH_BYTES })
    }

    /// Frees it. The caller has synchronised every stream that used it.
    pub fn free(self) {
        // SAFETY: allocated in new and freed once (the map it lived in was drained).
        let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
    }
}

/// Whether `stream` is being captured into a CUDA graph (cuStreamIsCapturing).
pub(crate) fn is_capturing(stream: CUstream) -> Result<bool> {
    let mut s = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; the stream belongs to the current context.
    unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream, &mut s) }
        .result()
        .map_err(status::driver("cuStreamIsCapturing"))?;
    Ok(s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
