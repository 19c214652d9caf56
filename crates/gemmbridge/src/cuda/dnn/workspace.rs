//! The room's own workspace for plans that need more than the stream's: stream-ordered, grown
//! (never shrunk) when a new plan needs more, the ones it replaced kept until the room is
//! released.

use cudarc::driver::sys::CUstream;
use rustc_hash::FxHashMap as HashMap;

use super::replay::ReplayKey;
use crate::cuda::device::{refuse_if_capturing, GraphExec, Needs, Scratch};
use crate::error::Result;

/// The room's larger workspace and its size in bytes.
struct Big(Scratch, usize);

// SAFETY: the memory and the stream it is freed on are the Gpu's own; the value is used and
// dropped only under the device's Mutex.
unsafe impl Send for Big {}

/// The room's workspaces: the one in use, and those it replaced, kept until the room is
/// released (a graph the caller captured may still name one).
#[derive(Default)]
pub(super) struct BigWorkspaces {
    current: Option<Big>,
    retired: Vec<Big>,
}

impl BigWorkspaces {
    /// The address of `bytes` of workspace for a call on `stream`: the stream's own
    /// (`stream_ws`) when it is large enough, else the room's, grown first if needed (a new
    /// stream-ordered allocation; the old one is retired, not freed, and the room's replay
    /// graphs that name it are dropped). Growing inside a capture is refused.
    pub(super) fn get(
        &mut self,
        graphs: &mut HashMap<ReplayKey, GraphExec>,
        stream_ws: (u64, usize),
        bytes: usize,
        stream: CUstream,
    ) -> Result<u64> {
        if bytes <= stream_ws.1 {
            return Ok(stream_ws.0);
        }
        if let Some(Big(s, n)) = self.current.as_ref() {
            if *n >= bytes {
                return Ok(s.ptr);
            }
        }
        refuse_if_capturing(stream, Needs::Make("grow the cuDNN workspace"), || format!("{bytes} bytes of workspace"))?;
        // SAFETY: the Gpu's live stream, context bound by the caller; every use of the memory is
        // enqueued on this stream (or replayed on it) after this allocation.
        let s = unsafe { Scratch::alloc(bytes, stream)? };
        let ptr = s.ptr;
        if let Some(old) = self.current.replace(Big(s, bytes)) {
            graphs.retain(|k, _| k.2 != old.0.ptr);
            self.retired.push(old);
        }
        tracing::debug!(bytes, "convolution workspace grown beyond the stream's");
        Ok(ptr)
    }
}
