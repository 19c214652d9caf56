//! Timing candidates for the tuner: interleaved rounds of ~1 ms samples between CUDA events,
//! after heat, in graph replay for problems whose launch cost would hide the kernel.

use std::sync::Arc;

use cudarc::driver::result::event;
use cudarc::driver::sys::{CUevent, CUevent_flags, CUstream};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::cuda::status;
use crate::error::Result;

/// A function that enqueues one call of a candidate.
pub(crate) type Call<'a> = Box<dyn Fn() -> Result<()> + 'a>;

/// A pair of CUDA events around a timed region.
struct Events(CUevent, CUevent);

impl Events {
    fn new() -> Result<Events> {
        let create = || event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(status::driver("cuEventCreate"));
        Ok(Events(create()?, create()?))
    }

    /// Device ms per call of `n` calls that `body` enqueues on `stream` (waits for them).
    fn per_call(&self, stream: CUstream, n: usize, body: &dyn Fn() -> Result<()>) -> Result<f64> {
        let drv = status::driver;
        // SAFETY: live events and stream of the current context.
        unsafe {
            event::record(self.0, stream).map_err(drv("cuEventRecord"))?;
            body()?;
            event::record(self.1, stream).map_err(drv("cuEventRecord"))?;
            event::synchronize(self.1).map_err(drv("cuEventSynchronize"))?;
            Ok(event::elapsed(self.0, self.1).map_err(drv("cuEventElapsedTime"))? as f64 / n as f64)
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: created in Events::new, destroyed once.
        unsafe {
            let _ = event::destroy(self.0);
            let _ = event::destroy(self.1);
        }
    }
}

/// How long the GPU is kept busy with the first candidate before the timed rounds, ms: long
/// enough to reach the sustained clock a real workload runs at under the power limit, so that
/// no candidate is timed on a cooler, faster-clocked GPU than another.
const HEAT_MS: f64 = 300.0;

/// A problem whose first candidate takes less than this per call (ms, the fastest of three
/// samples of ~1 ms of back-to-back calls between CUDA events) is timed in graph replay:
/// eager back-to-back calls of it are bound by the host's launch cost (6–11 µs per call on the
/// H200 hosts), which would hide every difference between the
/// kernels, while in a graph — and behind any caller that keeps the GPU busy — the kernel's
/// own duration is what counts.
const GRAPH_BELOW_MS: f64 = 0.02;

/// Calls captured per graph, and graph launches per timed sample, in graph replay.
const GRAPH_CALLS: usize = 64;
const GRAPH_LAUNCHES: usize = 4;

/// Captures [`GRAPH_CALLS`] calls of `f` on `stream` into a graph (thread-local capture, which
/// leaves other threads' CUDA calls alone). `None` when the stream
/// cannot be captured at all (the legacy default stream cannot) or the capture failed: the
/// caller times eagerly.
fn capture(stream: &Arc<CudaStream>, f: &dyn Fn() -> Result<()>) -> Option<CudaGraph> {
    let _gate = crate::cuda::device::capturing();
    match super::capture::capture_graph(stream, || (0..GRAPH_CALLS).try_for_each(|_| f())) {
        Ok(g) => g,
        Err(e) => {
            // e.g. invalidated by another thread's first launch of a kernel (lazy module
            // loading synchronises the device): time eagerly instead
            tracing::debug!(error = %e, "capture for graph timing failed; timing eagerly");
            None
        }
    }
}

/// What [`time_interleaved`] measured.
pub(crate) struct Timed {
    /// Median ms per call of each function.
    pub medians: Vec<f64>,
    /// Whether samples were graph replays.
    pub in_graph: bool,
    /// Graph replay was called for (a problem under [`GRAPH_BELOW_MS`]) but capturing failed
    /// twice. Nothing was then sampled: every median is the first function's eager time per
    /// call (host launch cost, not kernel time).
    pub graph_failed: bool,
}

/// Median ms per call of each of `fs` on `stream`, timed as the benchmark times (warm-up,
/// samples of ~1 ms of back-to-back calls between CUDA events), but interleaved: after
/// [`HEAT_MS`] of the first function, each of `reps` rounds takes one sample of every
/// function, starting one further along each round and running every other round backwards,
/// so that all see the same clock and temperature drift. Problems below [`GRAPH_BELOW_MS`] per
/// call are sampled as replays of a captured graph of [`GRAPH_CALLS`] calls (see [`Timed`])
/// where `graphs` allows it; with `graphs` false every sample is eager (for functions some of
/// which cannot be captured, and that run eagerly when used).
pub(crate) fn time_interleaved(stream: &Arc<CudaStream>, reps: usize, fs: &[Call<'_>], graphs: bool) -> Result<Timed> {
    let raw_stream = stream.cu_stream();
    let ev = Events::new()?;
    let eager = |f: &dyn Fn() -> Result<()>, n: usize| ev.per_call(raw_stream, n, &|| (0..n).try_for_each(|_| f()));
    // calls per ~1 ms eager sample, per function (after 3 warm-up calls)
    let mut inner = Vec::with_capacity(fs.len());
    for f in fs {
        for _ in 0..3 {
            f()?;
        }
        let once = eager(f.as_ref(), 1)?;
        inner.push(((1.0 / once.max(1e-3)) as usize).clamp(1, 1000));
    }
    // one call alone includes its launch latency: judge by ~1 ms of back-to-back calls, the
    // fastest of three such samples (one preempted host thread once made a tuning run time a
    // 6 µs problem eagerly)
    let mut per_call = f64::INFINITY;
    for _ in 0..3 {
        per_call = per_call.min(eager(fs[0].as_ref(), inner[0])?);
    }
    let wanted = graphs && per_call < GRAPH_BELOW_MS;
    let capture_all = || fs.iter().map(|f| capture(stream, f.as_ref())).collect::<Option<Vec<CudaGraph>>>();
    // one retry: a capture invalidated by another thread's kernel load usually succeeds again
    let graphs = if wanted { capture_all().or_else(capture_all) } else { None };
    if wanted && graphs.is_none() {
        // eager rounds would rank launch costs (the caller keeps the first choice): skip the
        // heat and the rounds, and report the first choice's eager time for every function
        return Ok(Timed { medians: vec![per_call; fs.len()], in_graph: false, graph_failed: true });
    }
    let sample = |i: usize| -> Result<f64> {
        match &graphs {
            Some(g) => ev.per_call(raw_stream, GRAPH_CALLS * GRAPH_LAUNCHES, &|| {
                (0..GRAPH_LAUNCHES).try_for_each(|_| g[i].launch().map_err(status::driver("cuGraphLaunch")))
            }),
            None => eager(fs[i].as_ref(), inner[i]),
        }
    };
    let calls_per_sample = if graphs.is_some() { GRAPH_CALLS * GRAPH_LAUNCHES } else { inner[0] };
    let medians = rounds(fs.len(), reps, calls_per_sample, &sample)?;
    Ok(Timed { medians, in_graph: graphs.is_some(), graph_failed: false })
}

/// [`HEAT_MS`] of samples of function 0 (`calls_per_sample` calls each), then `reps` rounds
/// of one sample of each of `n` functions; the median of each.
fn rounds(n: usize, reps: usize, calls_per_sample: usize, sample: &dyn Fn(usize) -> Result<f64>) -> Result<Vec<f64>> {
    let mut heated = 0.0;
    while heated < HEAT_MS {
        heated += sample(0)? * calls_per_sample as f64;
    }
    let mut times = vec![Vec::with_capacity(reps.max(1)); n];
    for round in 0..reps.max(1) {
        for j in 0..n {
            // every other round runs backwards, so no candidate always follows the same one
            let i = (round + if round % 2 == 0 { j } else { n - 1 - j }) % n;
            times[i].push(sample(i)?);
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect())
}
