//! Graph replay of repeated eager calls: a library call made again with the same operands is
//! launched as one cached CUDA graph (`cuGraphLaunch`) instead of through the library (for
//! GEMMs, `cublasLtMatmul`). The cache is generic over the backend's plan key `K`; the
//! settings ([`GraphReplay`]) are shared by every backend that replays.
//!
//! Why: on a tiny GEMM the host cost of the launch is the whole cost. A bare `cublasLtMatmul`
//! with a prebuilt plan took 6.2–9.9 µs of host time per 64³ call on the H200 hosts
//! (measured with `gemmbridge bench --ops launch`), most of it cuBLASLt's own work before the kernel launch; a
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
//! capture in flight (seen with GPU tests running on parallel threads).
//! The capture is on a private stream, so nothing of the caller's is affected: the call runs
//! directly, and the key is captured again later, up to [`MAX_CAPTURE_FAILURES`] times.

use rustc_hash::FxHashMap as HashMap;

use cudarc::driver::sys::CUstream;

use super::capture::{capture, is_capturing, CaptureStream, GraphExec};
use crate::error::{Error, Result};

/// When repeated eager calls are replayed from cached CUDA graphs
/// ([`GpuOptions::graph_replay`](crate::cuda::GpuOptions::graph_replay)).
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
    /// Most graphs kept per `Gpu`. Default 1024; 0 keeps none (replay then never happens). When
    /// full, further keys run directly (nothing is evicted); the cache empties with
    /// [`Plans::clear`](crate::cuda::Plans::clear),
    /// [`GpuOptions::graph_replay`](crate::cuda::GpuOptions::graph_replay),
    /// [`Plans::load_tactics`](crate::cuda::Plans::load_tactics) and tuning (a graph bakes in its
    /// algorithm).
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
    #[must_use = "returns new settings; put them in GpuOptions::graph_replay"]
    pub fn with_max_macs(self, max_macs: u64) -> Self {
        GraphReplay { max_macs, ..self }
    }

    /// These settings with [`GraphReplay::after_calls`] set (0 counts as 1).
    #[must_use = "returns new settings; put them in GpuOptions::graph_replay"]
    pub fn with_after_calls(self, after_calls: u32) -> Self {
        GraphReplay { after_calls, ..self }
    }

    /// These settings with [`GraphReplay::capacity`] (graphs) set.
    #[must_use = "returns new settings; put them in GpuOptions::graph_replay"]
    pub fn with_capacity(self, capacity: usize) -> Self {
        GraphReplay { capacity, ..self }
    }
}

/// Everything a captured launch depends on (see the module docs): the backend's plan key `K`
/// and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReplayKey<K> {
    pub plan: K,
    /// The stream handle the graph is launched on.
    pub stream: usize,
    /// The operand addresses the launch reads and writes (for a GEMM: first and second
    /// column-major operand, D, a separate C, bias, aux; 0 when absent).
    pub operands: [u64; 6],
    /// α and β as bit patterns.
    pub scalars: [u32; 2],
    /// The workspace address the launch was given.
    pub workspace: u64,
}

impl<K> ReplayKey<K> {
    /// The key of a launch of `plan` on `operands` with α, β, the workspace at `workspace` and
    /// `stream`.
    pub fn new(plan: K, operands: [u64; 6], (alpha, beta): (f32, f32), workspace: u64, stream: CUstream) -> Self {
        ReplayKey { plan, stream: stream as usize, operands, scalars: [alpha.to_bits(), beta.to_bits()], workspace }
    }
}

/// What [`ReplayCache::launch_cached`] did.
pub(crate) enum Cached {
    /// The cached graph was launched: the call is done.
    Launched,
    /// Nothing was launched. `graph_unused`: a graph exists but was not used because the
    /// stream is being captured (the direct call is captured instead, and nothing is counted).
    NotLaunched { graph_unused: bool },
}

/// Failed captures of one key after which it always runs directly.
pub(crate) const MAX_CAPTURE_FAILURES: u8 = 3;

/// The cache: graphs by key, and how often keys without a graph were seen.
pub(crate) struct ReplayCache<K> {
    pub options: GraphReplay,
    pub graphs: HashMap<ReplayKey<K>, GraphExec>,
    seen: HashMap<ReplayKey<K>, u32>,
    failures: HashMap<ReplayKey<K>, u8>,
}

impl<K> Default for ReplayCache<K> {
    fn default() -> Self {
        let options = GraphReplay::default();
        ReplayCache { options, graphs: HashMap::default(), seen: HashMap::default(), failures: HashMap::default() }
    }
}

impl<K: Clone + Eq + std::hash::Hash> ReplayCache<K> {
    /// Whether a problem of `macs` multiply-adds qualifies.
    pub fn qualifies(&self, macs: u64) -> bool {
        self.options.enabled && macs <= self.options.max_macs
    }

    /// Counts one more direct call with `key`; true when it is time to capture its graph.
    pub fn count(&mut self, key: &ReplayKey<K>) -> bool {
        if self.graphs.len() >= self.options.capacity
            || self.failures.get(key).is_some_and(|&n| n >= MAX_CAPTURE_FAILURES)
        {
            return false;
        }
        // Keys that never repeat only cost a counter; keep the counters bounded.
        if self.seen.len() >= self.counter_bound() {
            self.seen.clear();
        }
        let n = self.seen.entry(key.clone()).or_insert(0);
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
    pub fn postpone(&mut self, key: &ReplayKey<K>) {
        let short = self.options.after_calls.max(1) - 1;
        if short > 0 {
            self.seen.insert(key.clone(), short);
        }
    }

    /// Records a failed capture of `key` (it is counted again from zero).
    pub fn failed(&mut self, key: &ReplayKey<K>) {
        if self.failures.len() >= self.counter_bound() {
            self.failures.clear();
        }
        *self.failures.entry(key.clone()).or_insert(0) += 1;
    }

    /// Most entries kept in each counter map (`seen`, `failures`) before it is emptied.
    fn counter_bound(&self) -> usize {
        self.options.capacity.max(1).saturating_mul(4)
    }

    /// Launches the graph cached for `key`, if there is one and `stream` is not being
    /// captured (never into a capture). A graph whose launch fails is dropped and counted as
    /// a failed capture; the call then runs directly.
    ///
    /// # Safety
    /// `stream` is the key's stream and every address in the key is valid for the call (the
    /// caller validated them).
    pub unsafe fn launch_cached(
        &mut self,
        key: &ReplayKey<K>,
        stream: CUstream,
        describe: &dyn Fn() -> String,
    ) -> Cached {
        let Some(graph) = self.graphs.get(key) else { return Cached::NotLaunched { graph_unused: false } };
        if is_capturing(stream).unwrap_or(true) {
            return Cached::NotLaunched { graph_unused: true };
        }
        // SAFETY: the caller's contract.
        match unsafe { graph.launch(stream) } {
            Ok(()) => Cached::Launched,
            Err(e) => {
                // run this call directly, and capture the key again later
                tracing::warn!(problem = %describe(), error = %e, "replay graph launch failed; running directly");
                self.graphs.remove(key);
                self.failed(key);
                Cached::NotLaunched { graph_unused: false }
            }
        }
    }

    /// Counts this direct call of `key` and says whether its capture is due now. The driver
    /// is asked about a capture only when one is due, not on every call that does not repeat:
    /// a call in the caller's capture counts, and a capture due then is postponed to the next
    /// call.
    pub fn due(&mut self, key: &ReplayKey<K>, graph_unused: bool, stream: CUstream) -> bool {
        if graph_unused || !self.count(key) {
            return false;
        }
        if is_capturing(stream).unwrap_or(true) {
            self.postpone(key);
            return false;
        }
        true
    }

    /// Captures `launch` on the private stream `cap`, launches the graph on `stream` and
    /// caches it under `key`. Returns whether that happened; on any failure (no capture
    /// stream, an invalidated capture, a failed launch) nothing was enqueued on `stream`, the
    /// failure is counted, and the caller runs the call directly.
    ///
    /// # Safety
    /// As [`ReplayCache::launch_cached`]; `cap` is private to this device and used only under
    /// its lock; `launch` enqueues this call's launch on the stream it is given.
    pub unsafe fn capture_and_launch(
        &mut self,
        key: ReplayKey<K>,
        cap: Option<&CaptureStream>,
        stream: CUstream,
        launch: impl FnOnce(CUstream) -> Result<()>,
        describe: &dyn Fn() -> String,
    ) -> bool {
        let captured = match cap {
            // SAFETY: the caller's contract.
            Some(cap) => unsafe { capture(cap.raw(), launch) },
            None => {
                Err(Error::Unsupported { backend: "graph replay", what: "capturing without a capture stream".into() })
            }
        };
        // SAFETY (launch): as for a cached graph.
        match captured.and_then(|graph| unsafe { graph.launch(stream) }.map(|()| graph)) {
            Ok(graph) => {
                self.graphs.insert(key, graph);
                true
            }
            Err(e) => {
                // e.g. invalidated by another thread's lazy kernel load (see the module docs)
                tracing::debug!(problem = %describe(), error = %e, "graph capture failed; this call runs directly");
                self.failed(&key);
                false
            }
        }
    }

    /// Drops every graph and counter (plans or tactics changed).
    pub fn clear(&mut self) {
        self.graphs.clear();
        self.seen.clear();
        self.failures.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of a backend whose plan key is a number.
    fn key(c: u64) -> ReplayKey<u32> {
        ReplayKey::new(64, [0x2000, 0x1000, c, 0, 0, 0], (0.0, 0.0), 0x9000, 7 as CUstream)
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
        let mut cache = ReplayCache::<u32>::default();
        assert!(cache.qualifies(1 << 30));
        assert!(!cache.qualifies((1 << 30) + 1));
        cache.options = GraphReplay::off();
        assert!(!cache.qualifies(1));
    }
}
