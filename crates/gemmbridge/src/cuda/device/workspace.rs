//! Per-stream workspaces: device memory a library may use during a call on one stream, and a
//! small scratch region after it for stream-ordered staging; and, per stream a caller passed,
//! an event marking this device's last use of it, which the teardown waits for.

use rustc_hash::FxHashMap as HashMap;

use cudarc::driver::sys::{self as drv, CUevent, CUstream};

use super::capture::{refuse_if_capturing, CaptureStream, Needs};
use super::lifetime::Relaxed;
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
    /// Allocates from the device's stream-ordered pool on the private stream `service` and
    /// waits for that allocation alone, so that any stream may use it from now on; freed the
    /// same way (`cuMemFreeAsync`), which, unlike `cuMemFree`, never synchronises the device.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a size whose rounding and scratch overflow (the engine's
    /// options refuse such sizes before; this keeps the arithmetic checked here too);
    /// [`Error::Driver`] from the allocation.
    fn new(matmul_bytes: usize, service: CUstream) -> Result<Workspace> {
        // cuBLASLt wants a 256-byte-aligned workspace; round the scratch start up to that.
        let (matmul_bytes, total) = sizes(matmul_bytes).ok_or_else(|| Error::OutOfRange {
            what: "workspace bytes",
            value: matmul_bytes as u64,
            expected: format!("at most {} (the workspace's arithmetic)", MAX_MATMUL_BYTES),
        })?;
        // SAFETY: `service` is a live private stream of the current context (bound by the
        // caller); the allocation is waited for before the address is used.
        let ptr = unsafe { cudarc::driver::result::malloc_async(service, total) }
            .map_err(status::driver("cuMemAllocAsync"))?;
        // SAFETY: as above; only the allocation is enqueued on the private stream.
        if let Err(e) = unsafe { cudarc::driver::result::stream::synchronize(service) } {
            // SAFETY: allocated just above on this stream, never handed out.
            let _ = unsafe { cudarc::driver::result::free_async(ptr, service) };
            return Err(status::driver("cuStreamSynchronize")(e));
        }
        Ok(Workspace { ptr, matmul_bytes, scratch: ptr + matmul_bytes as u64, scratch_bytes: SCRATCH_BYTES })
    }
}

/// The largest library workspace (bytes) [`sizes`] takes: rounded up to 256 bytes and with
/// the scratch added, it stays within `isize::MAX`.
pub(crate) const MAX_MATMUL_BYTES: usize = (isize::MAX as usize - SCRATCH_BYTES) & !255;

/// The library workspace rounded up to 256 bytes and the whole allocation with the scratch
/// after it; `None` above [`MAX_MATMUL_BYTES`].
fn sizes(matmul_bytes: usize) -> Option<(usize, usize)> {
    let rounded = matmul_bytes.checked_next_multiple_of(256)?;
    let total = rounded.checked_add(SCRATCH_BYTES)?;
    (total <= isize::MAX as usize).then_some((rounded, total))
}

/// The key of a stream's workspace. `CU_STREAM_PER_THREAD` (handle 0x2) names a different
/// stream on every host thread, so its workspaces are kept per thread; every other handle,
/// the legacy default stream (0x0, 0x1) included, names one stream.
type Key = (usize, Option<std::thread::ThreadId>);

fn workspace_key(stream: CUstream) -> Key {
    let h = stream as usize;
    (h, (h == 0x2).then(|| std::thread::current().id()))
}

/// Workspaces by stream, never shared between streams, kept until the device is dropped;
/// the last-use events of the streams callers passed; and the private stream the workspaces
/// are allocated and freed on.
pub(crate) struct WorkspacePool {
    map: HashMap<Key, Workspace>,
    /// An event per caller-passed stream, recorded after each use of it ([`Self::record_use`]).
    used: HashMap<Key, (CUstream, CUevent)>,
    /// The private stream of allocations and frees (created with the first workspace).
    service: Option<CaptureStream>,
    /// Library workspace size (bytes) for streams that get their first call from now on.
    pub bytes: usize,
}

// SAFETY: the raw event and stream handles are driver handles valid on any host thread of
// the process while their context lives; the pool is used only under the device's lock.
unsafe impl Send for WorkspacePool {}

impl WorkspacePool {
    pub fn new(bytes: usize) -> WorkspacePool {
        WorkspacePool { map: HashMap::default(), used: HashMap::default(), service: None, bytes }
    }

    /// This stream's workspace (a copy of its addresses and sizes), allocated on first use,
    /// never while `stream` is capturing (then [`Error::NotCapturable`], naming `describe()`).
    /// One lookup when it exists: this is on every call's path. The caller has bound the
    /// context.
    pub fn get(&mut self, stream: CUstream, describe: &dyn Fn() -> String) -> Result<Workspace> {
        let key = workspace_key(stream);
        if let Some(ws) = self.map.get(&key) {
            return Ok(*ws);
        }
        refuse_if_capturing(stream, Needs::Make("allocate this stream's workspace"), describe)?;
        let _relaxed = Relaxed::enter()?;
        if self.service.is_none() {
            self.service = Some(CaptureStream::new()?);
        }
        let ws = Workspace::new(self.bytes, self.service.as_ref().expect("made above").raw())?;
        self.map.insert(key, ws);
        Ok(ws)
    }

    /// Records `stream`'s last-use event after this device enqueued work on it (`stream` is
    /// not capturing: checked by the caller). One `cuEventRecord`; the event is created on
    /// the stream's first use.
    pub fn record_use(&mut self, stream: CUstream) -> Result<()> {
        let key = workspace_key(stream);
        let event = match self.used.get(&key) {
            Some(&(_, e)) => e,
            None => {
                let mut e = std::ptr::null_mut();
                let flags = drv::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: out-pointer to a local; the context is bound by the caller.
                unsafe { drv::cuEventCreate(&mut e, flags) }.result().map_err(status::driver("cuEventCreate"))?;
                self.used.insert(key, (stream, e));
                e
            }
        };
        // SAFETY: a live event of this context; `stream` is the caller's live stream.
        unsafe { drv::cuEventRecord(event, stream) }.result().map_err(status::driver("cuEventRecord"))
    }

    /// Waits for the last recorded use of every caller-passed stream (`cuEventSynchronize`:
    /// this device's work only, however much else those streams hold) and destroys the
    /// events. Whether every wait succeeded.
    pub fn wait_for_uses(&mut self) -> bool {
        let mut ok = true;
        for (_, (_, e)) in self.used.drain() {
            // SAFETY: events created in record_use, each waited for and destroyed once.
            ok &= unsafe { drv::cuEventSynchronize(e) }.result().is_ok();
            let _ = unsafe { drv::cuEventDestroy_v2(e) };
        }
        ok
    }

    /// Frees every workspace in stream order on the private stream, then lets go of that
    /// stream (destroyed: its frees still run). The caller has bound the context and waited
    /// for every use of the workspaces.
    pub fn free_all(&mut self) {
        if let Some(service) = self.service.take() {
            for (_, ws) in self.map.drain() {
                // SAFETY: allocated on this stream in Workspace::new and freed once (the map
                // is drained); its users are done (the caller's contract).
                let _ = unsafe { cudarc::driver::result::free_async(ws.ptr, service.raw()) };
            }
        }
    }

    /// Forgets the workspaces and events without freeing them (no bound context, or uses
    /// that could not be waited for).
    pub fn leak(&mut self) {
        self.map.clear();
        self.used.clear();
        std::mem::forget(self.service.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_sizes_are_checked_arithmetic() {
        assert_eq!(sizes(0), Some((0, SCRATCH_BYTES)));
        assert_eq!(sizes(1), Some((256, 256 + SCRATCH_BYTES)));
        assert_eq!(sizes(32 << 20), Some((32 << 20, (32 << 20) + SCRATCH_BYTES)));
        assert_eq!(sizes(MAX_MATMUL_BYTES), Some((MAX_MATMUL_BYTES, MAX_MATMUL_BYTES + SCRATCH_BYTES)));
        for bad in [MAX_MATMUL_BYTES + 1, isize::MAX as usize, usize::MAX - (1 << 20), usize::MAX] {
            assert_eq!(sizes(bad), None, "{bad}");
        }
    }
}
