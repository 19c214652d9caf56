//! Graph replay of repeated eager calls: a small GEMM called again with the same operands is
//! launched as one cached CUDA graph (`cuGraphLaunch`) instead of through `cublasLtMatmul`.
//!
//! Why: on a tiny GEMM the host cost of the launch is the whole cost. A bare `cublasLtMatmul`
//! with a prebuilt plan took 6.2–9.9 µs of host time per 64³ call on the H200 hosts
//! (docs/PERFORMANCE.md §3), most of it cuBLASLt's own work before the kernel launch; a
//! `cuGraphLaunch` of the same captured kernel skips that work.
//!
//! What makes a replay equal to the direct call: the [`ReplayKey`] holds everything the
//! captured launch baked in — the plan (shapes, lds, dtypes, ops, epilogue, alignment,
//! workspace size, and through the plan its algorithm), every operand address, α and β (host
//! scalars, copied into the kernel's parameters at capture), the workspace address and the
//! stream the graph is launched on. A graph is launched only into the stream its key names,
//! so launches of one graph are already serialised by stream order, and never into a stream
//! that is itself being captured (the direct call is used there). Memory behind an address
//! may be freed and reallocated between calls: the graph reads and writes the address, as the
//! direct call would.
//!
//! A capture can fail without anything being wrong with the call: another thread's first
//! launch of a kernel (CUDA's lazy module loading synchronises the device) invalidates a
//! capture in flight (seen in device calls 22–23, with GPU tests running on parallel threads).
//! The capture is on a private stream, so nothing of the caller's is affected: the call runs
//! directly, and the key is captured again later, up to [`MAX_CAPTURE_FAILURES`] times.

use rustc_hash::FxHashMap as HashMap;

use cudarc::driver::sys::{self as drv, CUgraphExec, CUstream, CUstreamCaptureMode};

use super::lt::PlanKey;
use super::status;
use crate::error::Result;

/// When repeated eager calls are replayed from cached CUDA graphs ([`Gpu::set_graph_replay`]).
///
/// A call qualifies when it goes to cuBLASLt, its problem has at most `max_macs`
/// multiply-adds, its bias needs no staging (16-byte aligned) and its stream is not being
/// captured. The `after_calls`-th call with the same operands (plan, addresses, α, β,
/// workspace, stream) is captured once into a graph on a private stream (a capture and an
/// instantiation, once per distinct call; their cost was not measured separately) and from
/// then on every such call is one `cuGraphLaunch` on the caller's stream.
///
/// Build it from [`GraphReplay::default`] or [`GraphReplay::off`] and the `with_*` methods
/// (or by setting fields of such a value): it is `#[non_exhaustive]`, so settings can be added
/// without breaking callers.
///
/// [`Gpu::set_graph_replay`]: super::Gpu::set_graph_replay
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphReplay {
    /// Whether replay is used at all. Default: on.
    pub enabled: bool,
    /// Largest problem that qualifies, in multiply-adds (m·n·k·batch). Default 2³⁰ (1024³):
    /// above that the GPU time (≥ 4 µs at f16 on an H200) hides the host cost.
    pub max_macs: u64,
    /// On which call with the same operands the graph is built; 0 counts as 1. Default 2: a
    /// call made once never pays for a capture.
    pub after_calls: u32,
    /// Most graphs kept per `Gpu`. Default 1024; 0 keeps none (replay then never happens).
    /// When full, further keys run directly (nothing is evicted); the cache empties with
    /// [`Gpu::clear_plans`](super::Gpu::clear_plans), [`Gpu::set_graph_replay`](super::Gpu::set_graph_replay),
    /// [`Gpu::load_tactics`](super::Gpu::load_tactics) and tuning (a graph bakes in its algorithm).
    pub capacity: usize,
}

impl Default for GraphReplay {
    fn default() -> Self {
        GraphReplay { enabled: true, max_macs: 1 << 30, after_calls: 2, capacity: 1024 }
    }
}

impl GraphReplay {
    /// Replay off: every call goes through `cublasLtMatmul`.
    pub fn off() -> Self {
        GraphReplay { enabled: false, ..GraphReplay::default() }
    }

    /// These settings with [`GraphReplay::max_macs`] (multiply-adds) set.
    #[must_use = "returns new settings; pass them to Gpu::set_graph_replay"]
    pub fn with_max_macs(self, max_macs: u64) -> Self {
        GraphReplay { max_macs, ..self }
    }

    /// These settings with [`GraphReplay::after_calls`] set (0 counts as 1).
    #[must_use = "returns new settings; pass them to Gpu::set_graph_replay"]
    pub fn with_after_calls(self, after_calls: u32) -> Self {
        GraphReplay { after_calls, ..self }
    }

    /// These settings with [`GraphReplay::capacity`] (graphs) set.
    #[must_use = "returns new settings; pass them to Gpu::set_graph_replay"]
    pub fn with_capacity(self, capacity: usize) -> Self {
        GraphReplay { capacity, ..self }
    }
}

/// Everything a captured launch depends on (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReplayKey {
    pub plan: PlanKey,
    /// The stream handle the graph is launched on.
    pub stream: usize,
    /// First and second column-major operand, C/D, bias, aux (0 when absent).
    pub operands: [u64; 5],
    /// α and β as bit patterns.
    pub scalars: [u32; 2],
    /// The workspace address the launch was given.
    pub workspace: u64,
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

/// Failed captures of one key after which it always runs directly.
pub(crate) const MAX_CAPTURE_FAILURES: u8 = 3;

/// The private stream replay captures on: created raw (`cuStreamCreate`, non-blocking), not
/// through cudarc, whose `new_stream` may synchronise the context and switches on its
/// multi-stream event tracking for every buffer. Destroyed on drop (the Gpu synchronises first).
pub(crate) struct CaptureStream(CUstream);

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

/// The cache: graphs by key, and how often keys without a graph were seen.
#[derive(Default)]
pub(crate) struct ReplayCache {
    pub options: GraphReplay,
    pub graphs: HashMap<ReplayKey, GraphExec>,
    seen: HashMap<ReplayKey, u32>,
    failures: HashMap<ReplayKey, u8>,
}

impl ReplayCache {
    /// Whether a problem of `macs` multiply-adds qualifies.
    pub fn qualifies(&self, macs: u64) -> bool {
        self.options.enabled && macs <= self.options.max_macs
    }

    /// Counts one more direct call with `key`; true when it is time to capture its graph.
    pub fn count(&mut self, key: &ReplayKey) -> bool {
        if self.graphs.len() >= self.options.capacity
            || self.failures.get(key).is_some_and(|&n| n >= MAX_CAPTURE_FAILURES)
        {
            return false;
        }
        // Keys that never repeat only cost a counter; keep the counters bounded.
        if self.seen.len() >= self.counter_bound() {
            self.seen.clear();
        }
        let n = self.seen.entry(*key).or_insert(0);
        *n += 1;
        if *n >= self.options.after_calls.max(1) {
            self.seen.remove(key);
            true
        } else {
            false
        }
    }

    /// Puts `key` back one call short of due: its capture fell due while the caller's stream
    /// was being captured (nothing is captured or replayed then), so the next call outside a
    /// capture captures it.
    pub fn postpone(&mut self, key: &ReplayKey) {
        let short = self.options.after_calls.max(1) - 1;
        if short > 0 {
            self.seen.insert(*key, short);
        }
    }

    /// Records a failed capture of `key` (it is counted again from zero).
    pub fn failed(&mut self, key: &ReplayKey) {
        if self.failures.len() >= self.counter_bound() {
            self.failures.clear();
        }
        *self.failures.entry(*key).or_insert(0) += 1;
    }

    /// Most entries kept in each counter map (`seen`, `failures`) before it is emptied.
    fn counter_bound(&self) -> usize {
        self.options.capacity.max(1).saturating_mul(4)
    }

    /// Drops every graph and counter (plans or tactics changed).
    pub fn clear(&mut self) {
        self.graphs.clear();
        self.seen.clear();
        self.failures.clear();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GemmProblem, Precision};

    fn key(c: u64) -> ReplayKey {
        let p = GemmProblem::linear(64, 64, 64, Precision::F16).unwrap();
        let plan = super::super::gpu::Gpu::plan_key(&p, (0x1000, 0x2000, c), None, 1 << 20);
        ReplayKey { plan, stream: 7, operands: [0x2000, 0x1000, c, 0, 0], scalars: [0, 0], workspace: 0x9000 }
    }

    #[test]
    fn a_graph_is_due_on_the_after_calls_th_call() {
        let mut cache = ReplayCache { options: GraphReplay::default().with_after_calls(3), ..Default::default() };
        let (k1, k2) = (key(0x3000), key(0x4000));
        assert!(!cache.count(&k1));
        assert!(!cache.count(&k2));
        assert!(!cache.count(&k1));
        assert!(cache.count(&k1), "third call with k1");
        assert!(!cache.count(&k2), "k2 was seen twice only");
        cache.options.after_calls = 0; // treated as 1
        assert!(cache.count(&key(0x5000)));
    }

    #[test]
    fn a_full_cache_captures_nothing_more_and_counters_stay_bounded() {
        let mut cache = ReplayCache {
            options: GraphReplay::default().with_after_calls(2).with_capacity(2).with_max_macs(1 << 20),
            ..Default::default()
        };
        assert_eq!(cache.options.max_macs, 1 << 20);
        assert!(cache.options.enabled);
        for c in 0..100u64 {
            assert!(!cache.count(&key(0x10_0000 + 256 * c)), "each key once");
        }
        assert!(cache.seen.len() <= 8, "{} counters for capacity 2", cache.seen.len());
        cache.options.capacity = 0;
        let k = key(3 << 20);
        assert!(!cache.count(&k));
        assert!(!cache.count(&k), "full: no capture");
    }

    #[test]
    fn a_capture_due_during_the_callers_capture_is_postponed_to_the_next_call() {
        for after_calls in [1, 2, 5] {
            let mut cache =
                ReplayCache { options: GraphReplay::default().with_after_calls(after_calls), ..Default::default() };
            let k = key(0x3000);
            for _ in 1..after_calls {
                assert!(!cache.count(&k));
            }
            assert!(cache.count(&k), "due on call {after_calls}");
            cache.postpone(&k);
            assert!(cache.count(&k), "due again on the next call (after_calls {after_calls})");
            assert!(!cache.count(&k) || after_calls == 1, "counted from zero after a capture");
        }
    }

    #[test]
    fn a_key_whose_capture_keeps_failing_runs_directly() {
        let mut cache = ReplayCache { options: GraphReplay::default().with_after_calls(1), ..Default::default() };
        let k = key(0x3000);
        for _ in 0..MAX_CAPTURE_FAILURES {
            assert!(cache.count(&k), "retried after a failure");
            cache.failed(&k);
        }
        assert!(!cache.count(&k), "given up after {MAX_CAPTURE_FAILURES} failures");
        cache.clear();
        assert!(cache.count(&k), "clear forgets failures");
    }

    #[test]
    fn qualifies_by_size_and_switch() {
        let mut cache = ReplayCache::default();
        assert!(cache.qualifies(1 << 30));
        assert!(!cache.qualifies((1 << 30) + 1));
        cache.options = GraphReplay::off();
        assert!(!cache.qualifies(1));
    }
}
