//! A small pool of private streams that work is forked to from a caller's stream and joined
//! back from, with events: the caller's stream records the fork event, each lane waits for it,
//! runs what it is given and records its own event, and the caller's stream waits for every
//! lane's event. What follows on the caller's stream therefore sees all of the lanes' work, and
//! a capture of the caller's stream takes the lanes' work with it (the driver follows event
//! waits into other streams during a capture and requires them joined back before the capture
//! ends: CUDA programming guide, "Cross-stream dependencies and events").
//!
//! The lanes are created raw and non-blocking (as the capture stream: cudarc's `new_stream` may
//! synchronise the context), each with its own events, and are kept until the device is
//! dropped; the device synchronises them first (they are private, so that waits for this
//! device's work only).

use cudarc::driver::sys::{self as drv, CUevent, CUstream};

use super::capture::{is_capturing, CaptureStream};
use crate::cuda::status;
use crate::error::Result;

/// An event without timing, destroyed on drop.
struct Event(CUevent);

// SAFETY: a driver handle, valid on any host thread while its context lives; used only under
// the device's lock.
unsafe impl Send for Event {}

impl Event {
    fn new() -> Result<Event> {
        let mut e = std::ptr::null_mut();
        let flags = drv::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer to a local; the caller has bound the context.
        unsafe { drv::cuEventCreate(&mut e, flags) }.result().map_err(status::driver("cuEventCreate"))?;
        Ok(Event(e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in new, destroyed once (a pending record completes first: the driver
        // releases it afterwards, cuEventDestroy's documentation).
        let _ = unsafe { drv::cuEventDestroy_v2(self.0) };
    }
}

/// The lanes: each a private stream with its join event, the one fork event, and the event of
/// the last graph launched with lane work in it ([`Lanes::before_graph`]).
pub(crate) struct Lanes {
    fork: Event,
    graph_done: Event,
    lanes: Vec<(CaptureStream, Event)>,
}

impl Lanes {
    /// No lanes yet, and the fork event (the context bound by the caller).
    pub fn new() -> Result<Lanes> {
        Ok(Lanes { fork: Event::new()?, graph_done: Event::new()?, lanes: Vec::new() })
    }

    /// Adds lanes up to `n` (bounded by the caller); lanes are never taken away, so a stream
    /// handle (and the workspace kept under it) is never reused while its work may run.
    pub fn grow(&mut self, n: usize) -> Result<()> {
        while self.lanes.len() < n {
            self.lanes.push((CaptureStream::new()?, Event::new()?));
        }
        Ok(())
    }

    /// How many lanes there are.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Lane `i`'s stream.
    ///
    /// # Panics
    /// For `i` past the lanes.
    pub fn stream(&self, i: usize) -> CUstream {
        self.lanes[i].0.raw()
    }

    /// Records the fork on `caller`.
    ///
    /// # Safety
    /// `caller` is a live stream of the lanes' context.
    pub unsafe fn record_fork(&self, caller: CUstream) -> Result<()> {
        // SAFETY: a live event of this context; the caller's contract for the stream.
        unsafe { drv::cuEventRecord(self.fork.0, caller) }.result().map_err(status::driver("cuEventRecord"))
    }

    /// Lane `i` waits for the fork.
    pub fn wait_fork(&self, i: usize) -> Result<()> {
        wait(self.stream(i), &self.fork)
    }

    /// Records lane `i`'s join event.
    pub fn record_join(&self, i: usize) -> Result<()> {
        let (s, e) = &self.lanes[i];
        // SAFETY: a live event and a live lane of this context.
        unsafe { drv::cuEventRecord(e.0, s.raw()) }.result().map_err(status::driver("cuEventRecord"))
    }

    /// `caller` waits for lane `i`'s join event.
    ///
    /// # Safety
    /// As [`Lanes::record_fork`].
    pub unsafe fn wait_join(&self, caller: CUstream, i: usize) -> Result<()> {
        wait(caller, &self.lanes[i].1)
    }

    /// Orders a graph launched next on `caller` that holds the lanes' work (captured from a
    /// fork) after everything else that uses what that work uses: the lanes' streams run
    /// nothing of the graph's (its nodes run on `caller`), so without this a graph could run
    /// beside work still on a lane, or beside another such graph launched on another stream,
    /// with the same lane workspace (or the capture stream's, which every such graph shares).
    /// `caller` waits for all work enqueued on every lane so far and for the last such graph.
    /// A lane taken into a capture of the caller's (a pooled call inside it) is left alone:
    /// what it holds there runs only when that graph is launched.
    ///
    /// # Safety
    /// As [`Lanes::record_fork`]; `caller` is not being captured.
    pub unsafe fn before_graph(&self, caller: CUstream) -> Result<()> {
        for i in self.idle_lanes() {
            self.record_join(i)?;
            // SAFETY: the caller's contract.
            unsafe { self.wait_join(caller, i) }?;
        }
        wait(caller, &self.graph_done)
    }

    /// After a graph's launch on `caller` ([`Lanes::before_graph`]): it becomes the last such
    /// graph, which the next graph and the next eager fork to the lanes wait for
    /// ([`Lanes::wait_last_graph`]), so later lane work does not overlap it.
    ///
    /// # Safety
    /// As [`Lanes::before_graph`].
    pub unsafe fn after_graph(&self, caller: CUstream) -> Result<()> {
        // SAFETY: a live event of this context; the caller's contract for the stream.
        unsafe { drv::cuEventRecord(self.graph_done.0, caller) }.result().map_err(status::driver("cuEventRecord"))
    }

    /// `caller` waits for the last graph fenced by [`Lanes::after_graph`]: before an eager
    /// fork to the lanes (a fork inside a capture runs nothing now and needs no wait).
    ///
    /// # Safety
    /// As [`Lanes::before_graph`].
    pub unsafe fn wait_last_graph(&self, caller: CUstream) -> Result<()> {
        wait(caller, &self.graph_done)
    }

    /// The lanes not being captured (see [`Lanes::before_graph`]).
    fn idle_lanes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.lanes.len()).filter(|&i| matches!(is_capturing(self.stream(i)), Ok(false)))
    }

    /// Waits for every lane's work (private streams: nothing else is on them). False when a
    /// lane is being captured (its work cannot be waited for) or a wait failed.
    pub fn synchronize(&self) -> bool {
        self.lanes.iter().all(|(s, _)| {
            // SAFETY: a live lane of the bound context.
            matches!(is_capturing(s.raw()), Ok(false))
                && unsafe { cudarc::driver::result::stream::synchronize(s.raw()) }.is_ok()
        })
    }
}

/// `stream` waits for `event` (both live, of the bound context).
fn wait(stream: CUstream, event: &Event) -> Result<()> {
    let flags = drv::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as u32;
    // SAFETY: a live event; `stream` a live stream of its context (a lane, or the caller's
    // by the contract of the public waits).
    unsafe { drv::cuStreamWaitEvent(stream, event.0, flags) }.result().map_err(status::driver("cuStreamWaitEvent"))
}
