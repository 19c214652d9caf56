//! CUDA graphs and stream capture: whether a stream is capturing, a private stream to capture
//! on, capturing one launch into an instantiated graph, and launching it.

use cudarc::driver::sys::{self as drv, CUgraphExec, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::cuda::status;
use crate::error::{Error, Result};

/// Whether `stream` is being captured into a CUDA graph (cuStreamIsCapturing).
pub(crate) fn is_capturing(stream: CUstream) -> Result<bool> {
    let mut s = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; the stream belongs to the current context.
    unsafe { drv::cuStreamIsCapturing(stream, &mut s) }.result().map_err(status::driver("cuStreamIsCapturing"))?;
    Ok(s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// What a call would have to do that a CUDA graph capture cannot hold: why it is refused while
/// its stream is capturing. Every refusal of the library goes through [`refuse_if_capturing`]
/// with one of these; the text is the `action` of [`Error::NotCapturable`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Needs {
    /// Build a plan: a library's heuristic query, descriptors, operation graph or engine choice
    /// (host work and allocations, not stream work). Gone once the same call ran uncaptured.
    Plan(&'static str),
    /// Copy between pageable host memory and the device: a capture would record the host
    /// address, not the values of a later replay.
    HostCopy(&'static str),
    /// Make memory or streams (a workspace, the lanes): an allocation a capture cannot record.
    /// Gone once the same call ran uncaptured.
    Make(&'static str),
    /// Compile gemmbridge's own kernels (NVRTC), once per process and kernel set.
    Compile(&'static str),
}

impl Needs {
    fn action(self) -> &'static str {
        match self {
            Needs::Plan(a) | Needs::HostCopy(a) | Needs::Make(a) | Needs::Compile(a) => a,
        }
    }
}

/// [`Error::NotCapturable`] (`needs` saying why, `problem` what was called) when `stream` is
/// being captured; `Ok(())` otherwise. Checked before anything of the call is enqueued.
pub(crate) fn refuse_if_capturing(stream: CUstream, needs: Needs, problem: impl FnOnce() -> String) -> Result<()> {
    if is_capturing(stream)? {
        return Err(Error::NotCapturable { action: needs.action(), problem: problem() });
    }
    Ok(())
}

/// Captures what `launch` enqueues on `stream` into a cudarc graph (thread-local capture mode,
/// which leaves other threads' CUDA calls alone); the capture is ended even when `launch`
/// fails, so the stream is usable again. `Ok(None)`: nothing was captured. The one place a
/// graph the caller keeps is begun (the replay cache's graphs: [`capture`]).
///
/// # Errors
/// `launch`'s error; [`Error::Driver`] from beginning or ending the capture (a stream that
/// cannot be captured, such as the legacy default stream; a capture invalidated by another
/// thread's synchronising call).
pub(crate) fn capture_graph(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    launch: impl FnOnce() -> Result<()>,
) -> Result<Option<cudarc::driver::CudaGraph>> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(status::driver("cuStreamBeginCapture"))?;
    let launched = launch();
    let graph = stream.end_capture(drv::CUgraphInstantiate_flags(0)).map_err(status::driver("cuStreamEndCapture"));
    launched?;
    graph
}

/// An instantiated graph, destroyed on drop (an in-flight launch still completes: the driver
/// frees it afterwards, cuGraphExecDestroy's documentation).
pub(crate) struct GraphExec(CUgraphExec);

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: instantiated in `capture`, destroyed once.
        let _ = unsafe { drv::cuGraphExecDestroy(self.0) };
    }
}

impl GraphExec {
    /// Launches the graph on `stream`.
    ///
    /// # Safety
    /// `stream` is the stream of the key this graph was cached under (a live stream of the
    /// graph's context), not being captured, and the operands in that key are valid.
    pub unsafe fn launch(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { drv::cuGraphLaunch(self.0, stream) }.result().map_err(status::driver("cuGraphLaunch"))
    }
}

/// A private stream to capture on: created raw (`cuStreamCreate`, non-blocking), not
/// through cudarc, whose `new_stream` may synchronise the context and switches on its
/// multi-stream event tracking for every buffer. Destroyed on drop (the device synchronises
/// first).
pub(crate) struct CaptureStream(CUstream);

// SAFETY (both): driver handles are valid on any host thread of the process while their
// context lives; gemmbridge uses them only under the device's lock.
unsafe impl Send for CaptureStream {}
unsafe impl Send for GraphExec {}

impl CaptureStream {
    /// The raw handle (for capturing on it).
    pub fn raw(&self) -> CUstream {
        self.0
    }

    /// Creates it in the current context.
    pub fn new() -> Result<CaptureStream> {
        cudarc::driver::result::stream::create(cudarc::driver::result::stream::StreamKind::NonBlocking)
            .map(CaptureStream)
            .map_err(status::driver("cuStreamCreate"))
    }
}

impl Drop for CaptureStream {
    fn drop(&mut self) {
        // SAFETY: created in new, destroyed once; nothing is enqueued on it outside a capture.
        let _ = unsafe { cudarc::driver::result::stream::destroy(self.0) };
    }
}

/// Captures what `launch` enqueues on `cap` (a private stream, captured thread-locally so no
/// other thread is affected) and instantiates it. The capture is always ended, also when the
/// launch failed, so `cap` stays usable.
///
/// # Safety
/// `cap` is a live, non-blocking stream of the current context, used by nothing else;
/// `launch` enqueues only on the stream it is given.
pub(crate) unsafe fn capture(cap: CUstream, launch: impl FnOnce(CUstream) -> Result<()>) -> Result<GraphExec> {
    // Instantiation may be refused while another thread captures in global mode.
    let _relaxed = super::lifetime::Relaxed::enter()?;
    let _gate = super::lifetime::capturing();
    // SAFETY: the caller's contract.
    unsafe { drv::cuStreamBeginCapture_v2(cap, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
        .result()
        .map_err(status::driver("cuStreamBeginCapture"))?;
    let launched = launch(cap);
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above; `graph` is an out-pointer to a local.
    let ended =
        unsafe { drv::cuStreamEndCapture(cap, &mut graph) }.result().map_err(status::driver("cuStreamEndCapture"));
    let result = launched.and(ended).and_then(|()| {
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` is the graph just captured; `exec` an out-pointer to a local.
        unsafe { drv::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
            .result()
            .map_err(status::driver("cuGraphInstantiateWithFlags"))?;
        Ok(GraphExec(exec))
    });
    if !graph.is_null() {
        // SAFETY: the captured graph, no longer needed once instantiated (or on failure).
        let _ = unsafe { drv::cuGraphDestroy(graph) };
    }
    result
}
