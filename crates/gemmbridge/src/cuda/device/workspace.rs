//! Per-stream workspaces: device memory a library may use during a call on one stream, and a
//! small scratch region after it for stream-ordered staging.

use rustc_hash::FxHashMap as HashMap;

use cudarc::driver::sys::CUstream;

use super::capture::is_capturing;
use crate::cuda::status;
use crate::error::{Error, Result};

/// Bytes after the library workspace reserved for staging (a misaligned bias vector, a ones
/// vector): 262 144 f32 or 524 288 half elements.
pub(crate) const SCRATCH_BYTES: usize = 1 << 20;

/// One stream's device workspace: `matmul_bytes` for the libraries, then a scratch region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workspace {
    pub ptr: u64,
    pub matmul_bytes: usize,
    pub scratch: u64,
    pub scratch_bytes: usize,
}

impl Workspace {
    /// Allocates (cuMemAlloc, not stream-ordered, so any stream of the context may use it).
    fn new(matmul_bytes: usize) -> Result<Workspace> {
        // cuBLASLt wants a 256-byte-aligned workspace; round the scratch start up to that.
        let matmul_bytes = matmul_bytes.next_multiple_of(256);
        let total = matmul_bytes + SCRATCH_BYTES;
        // SAFETY: plain allocation of `total` bytes in the current context (bound by caller).
        let ptr = unsafe { cudarc::driver::result::malloc_sync(total) }.map_err(status::driver("cuMemAlloc"))?;
        Ok(Workspace { ptr, matmul_bytes, scratch: ptr + matmul_bytes as u64, scratch_bytes: SCRATCH_BYTES })
    }

    /// Frees it. The caller has synchronised every stream that used it.
    fn free(self) {
        // SAFETY: allocated in new and freed once (the map it lived in was drained).
        let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
    }
}

/// The key of a stream's workspace. `CU_STREAM_PER_THREAD` (handle 0x2) names a different
/// stream on every host thread, so its workspaces are kept per thread; every other handle,
/// the legacy default stream (0x0, 0x1) included, names one stream.
fn workspace_key(stream: CUstream) -> (usize, Option<std::thread::ThreadId>) {
    let h = stream as usize;
    (h, (h == 0x2).then(|| std::thread::current().id()))
}

/// Workspaces by stream, never shared between streams, kept until the device is dropped.
pub(crate) struct WorkspacePool {
    map: HashMap<(usize, Option<std::thread::ThreadId>), Workspace>,
    /// Library workspace size (bytes) for streams that get their first call from now on.
    pub bytes: usize,
}

impl WorkspacePool {
    pub fn new(bytes: usize) -> WorkspacePool {
        WorkspacePool { map: HashMap::default(), bytes }
    }

    /// This stream's workspace (a copy of its addresses and sizes), allocated on first use,
    /// never while `stream` is capturing (then [`Error::NotCapturable`], naming `describe()`).
    /// One lookup when it exists: this is on every call's path.
    pub fn get(&mut self, stream: CUstream, describe: &dyn Fn() -> String) -> Result<Workspace> {
        let key = workspace_key(stream);
        if let Some(ws) = self.map.get(&key) {
            return Ok(*ws);
        }
        if is_capturing(stream)? {
            return Err(Error::NotCapturable { action: "allocate this stream's workspace", problem: describe() });
        }
        let ws = Workspace::new(self.bytes)?;
        self.map.insert(key, ws);
        Ok(ws)
    }

    /// Frees every workspace. The caller has bound the context and synchronised it.
    pub fn free_all(&mut self) {
        for (_, ws) in self.map.drain() {
            ws.free();
        }
    }
}
