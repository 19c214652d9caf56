//! Autotuning: time cuBLASLt's candidate algorithms on the caller's operands and keep one only
//! when it is both right and measurably faster than the heuristic's first choice.

use cudarc::driver::result::event;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::gpu::{check_all, raw_descs, Gpu, RawBuffer, RawExtras, TuneReport};
use super::lt::{Algorithm, LtHandle, Plan, PlanKey};
use super::status;
use super::tactics::{signature, Tactic};
use crate::dtype::DType;
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::half::{bf16, f16};
use crate::layout::MatrixLayout;
use crate::problem::GemmProblem;

/// How hard to tune.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TuneOptions {
    /// Candidates to ask the heuristic for, per query (values outside 1..=32 are clamped to
    /// it): the problem itself, and up to five neighbouring queries that add candidates.
    pub candidates: usize,
    /// Timed samples per candidate (each ~1 ms of back-to-back calls, or 4 replays of a
    /// 64-call graph for problems under 20 µs per call); the median counts. With more than 24
    /// candidates, all get 3 samples first and only the 15 fastest (and the first choice) get
    /// `reps`.
    pub reps: usize,
    /// The least relative gain that counts as faster (default 0.02); raised to the measured
    /// noise of the heuristic's choice timed twice when that is larger.
    pub min_gain: f64,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions { candidates: 16, reps: 15, min_gain: 0.02 }
    }
}

struct Events(CUevent, CUevent);

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: created in time_interleaved, destroyed once.
        unsafe {
            let _ = event::destroy(self.0);
            let _ = event::destroy(self.1);
        }
    }
}

impl Gpu {
    /// Tunes the cuBLASLt algorithm for `p` on the given operands (on [`Gpu::stream`]).
    ///
    /// 1. Candidates: the heuristic's first `opts.candidates` algorithms for `p`, then those
    ///    it gives for the same GEMM without its epilogue and with smaller workspace limits
    ///    that cuBLASLt accepts for `p` (the heuristic ranks fused kernels separately and can
    ///    miss faster tiles; docs/PERFORMANCE.md §2.1). Problems of at most 256³ multiply-adds
    ///    also get up to 160 configurations from a search of cuBLASLt's algorithm ids (each
    ///    id's tiles, stages, custom options and split-K settings; `cublasLtMatmulAlgoGetIds`,
    ///    accepted by `cublasLtMatmulAlgoCheck`; see `Plan::search` for its bounds).
    /// 2. Correctness: each runs once with β = 0; a candidate whose C differs from the first
    ///    choice's by more than the precision's band (‖·‖ relative, NaN never passes) is
    ///    never timed or kept.
    /// 3. Timing: after ~300 ms of the first choice (so every candidate runs at the sustained,
    ///    power-limited clock), `opts.reps` interleaved rounds each take one ~1 ms sample of
    ///    every candidate (CUDA events); the first choice is sampled twice per round, and the
    ///    relative difference of its two medians is the measured noise. When the first choice
    ///    takes < 20 µs per call, samples are replays of a captured graph of 64 calls, so that
    ///    the kernels' own durations are compared rather than the host's launch cost. Where
    ///    capturing fails twice (the legacy default stream cannot be captured; another
    ///    thread's first kernel launch can invalidate a capture), nothing more is timed and the
    ///    heuristic's first choice is kept, with [`TuneReport::graph_failed`] set: eager times
    ///    of such a problem rank launch costs.
    ///    With more than 24 candidates (the search's), a first pass of 3 rounds keeps the 15
    ///    fastest besides the first choice for these rounds.
    /// 4. The fastest candidate is kept only if its median beats the first choice's by more
    ///    than max(`opts.min_gain`, noise).
    ///
    /// The result serves every M in the same bucket ([`super::tactics`]); cached plans are
    /// rebuilt.
    ///
    /// C (and any aux or bias gradient the epilogue writes) is overwritten many times: pass
    /// scratch buffers of the real shapes. Only C is compared between candidates (an aux or
    /// bias gradient is not). Synchronises [`Gpu::stream`], and holds this `Gpu`'s lock for
    /// the whole run (seconds): other threads' calls on it wait.
    ///
    /// Returns the report and the (signature, tactic) pair to store in a
    /// [`super::tactics::TacticDb`].
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw_fused`] with `stream` = [`Gpu::stream`].
    ///
    /// # Errors
    /// As [`Gpu::gemm_raw_fused`], except that a bias or aux off 16-byte alignment is
    /// [`Error::Misaligned`] (not staged); [`Error::Unsupported`] for an empty or k = 0
    /// problem and without cuBLASLt.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn autotune_raw(
        &self,
        p: &GemmProblem,
        alpha: f32,
        a: RawBuffer,
        b: RawBuffer,
        beta: f32,
        c: RawBuffer,
        extras: RawExtras,
        opts: TuneOptions,
    ) -> Result<(TuneReport, String, Tactic)> {
        let prec = p.precision();
        check_all(p, raw_descs(p, a, b, c), extras)?;
        if p.is_empty() || p.k() == 0 {
            return Err(Error::Unsupported {
                backend: "autotune",
                what: format!("an empty problem ({})", p.describe()),
            });
        }
        if extras.bias.is_some_and(|v| v.address % 16 != 0) {
            return Err(Error::Misaligned {
                operand: crate::Which::Bias,
                address: extras.bias.map_or(0, |v| v.address),
                align: 16,
            });
        }
        self.context().bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        let stream = self.stream().cu_stream();
        let mut st = self.lock();
        if st.lt.is_none() {
            return Err(Error::Unsupported {
                backend: "autotune",
                what: "anything without cuBLASLt (libcublasLt not found)".into(),
            });
        }
        let ws = self.workspace(&mut st, stream, &|| p.describe())?;
        let key = Gpu::plan_key(p, (a.address, b.address, c.address), extras.bias.map(|v| v.address), ws.matmul_bytes);
        let lt = st.lt.as_ref().expect("checked above");
        let plan = Plan::build(lt, &key, opts.candidates)?;
        let search = p.macs() <= SEARCH_MAX_MACS;
        let (cands, added) = candidates(lt, &plan, &key, opts.candidates, ws.matmul_bytes, search);
        let (first, second) = key.call.operands(a.address, b.address);
        let bias = extras.bias.map(|v| v.address);
        let aux = extras.aux.map(|v| v.address);
        let c_bytes = p.c().required_elems(p.batch()).unwrap_or(0) * prec.output().size_bytes();
        let run = |algo: &Algorithm, beta: f32| {
            // SAFETY: validated operands; workspace of this stream.
            unsafe {
                plan.launch(
                    lt,
                    algo,
                    alpha,
                    first,
                    second,
                    beta,
                    c.address,
                    bias,
                    aux,
                    ws.ptr,
                    ws.matmul_bytes,
                    stream as _,
                )
            }
        };
        let output = |algo: &Algorithm| -> Result<Vec<u8>> {
            run(algo, 0.0)?;
            // SAFETY: a live stream of this context.
            unsafe { cudarc::driver::result::stream::synchronize(stream) }
                .map_err(status::driver("cuStreamSynchronize"))?;
            let mut host = vec![0u8; c_bytes];
            // SAFETY: C holds c_bytes (checked); the stream is idle.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, c.address) }
                .map_err(status::driver("cuMemcpyDtoH"))?;
            Ok(logical_elements(host, p.c(), p.batch(), prec.output().size_bytes()))
        };

        // Correctness first: a candidate is timed only if its C matches the first choice's.
        let want = output(&cands[0])?;
        let mut timed: Vec<usize> = vec![0];
        for (i, cand) in cands.iter().enumerate().skip(1) {
            if rel_error_bytes(&output(cand)?, &want, prec.output()) <= prec.tolerance() {
                timed.push(i);
            }
        }
        let mismatched = cands.len() - timed.len();
        // The first choice is timed twice (first and last in each round) to measure noise.
        timed.push(0);
        let time = |timed: &[usize], reps: usize| {
            let (cands, run) = (&cands, &run);
            let runs: Vec<Box<dyn Fn() -> Result<()> + '_>> =
                timed.iter().map(|&i| Box::new(move || run(&cands[i], beta)) as Box<dyn Fn() -> Result<()>>).collect();
            time_interleaved(self.stream(), reps, &runs)
        };
        // `timed` holds the first choice twice
        let mut quick = None;
        if timed.len() - 1 > PREFILTER_ABOVE {
            // Many candidates (the search's): a quick pass of PREFILTER_REPS rounds, then the
            // full rounds for the first choice and the fastest PREFILTER_KEEP of the rest.
            let q = time(&timed, PREFILTER_REPS)?;
            if !q.graph_failed {
                let mut order: Vec<usize> = (1..timed.len() - 1).collect();
                order.sort_by(|&x, &y| q.medians[x].total_cmp(&q.medians[y]));
                let mut kept: Vec<usize> = vec![0];
                kept.extend(order.iter().take(PREFILTER_KEEP).map(|&j| timed[j]));
                kept.push(0);
                timed = kept;
            } else {
                quick = Some(q); // eager ranks launch costs: no full rounds, nothing kept
            }
        }
        let Timed { medians: ms, in_graph, graph_failed } = match quick {
            Some(q) => q,
            None => time(&timed, opts.reps)?,
        };
        if graph_failed {
            // eager timing of a problem this short ranks the host's launch cost, not the
            // kernels: keep the heuristic's choice rather than store a misleading winner
            tracing::warn!(problem = %p.describe(), "graph capture failed twice; keeping the heuristic's algorithm");
        }
        let (first_ms, again) = (ms[0], ms[ms.len() - 1]);
        let noise = (first_ms - again).abs() / first_ms.min(again);
        let threshold = opts.min_gain.max(noise);
        let base = first_ms.min(again);
        let best = (1..ms.len() - 1).min_by(|&x, &y| ms[x].total_cmp(&ms[y]));
        let (algo, best_ms, improved, kept_added) = match best {
            Some(j) if !graph_failed && ms[j] < base * (1.0 - threshold) => {
                (cands[timed[j]], ms[j], true, timed[j] >= cands.len() - added)
            }
            _ => (cands[0], base, false, false),
        };
        let sig = signature(&key);
        st.tuned.insert(sig.clone(), algo);
        st.forget_plans(|k| signature(k) == sig);
        let report = TuneReport {
            heuristic_ms: base,
            best_ms,
            candidates: cands.len(),
            added,
            kept_added,
            timed_in_graph: in_graph,
            graph_failed,
            mismatched,
            threshold,
            improved,
            algorithm: algo,
        };
        // SAFETY: takes no arguments; st.lt is Some (checked above), so libcublasLt is loaded.
        let version = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
        let tactic = Tactic::lt_gemm(algo.data, algo.workspace, version, base, best_ms);
        Ok((report, sig, tactic))
    }
}

/// Smaller workspace limits the heuristic is also asked with, bytes (PyTorch's cuBLASLt calls
/// run with 1 MiB or 4 MiB, depending on its version and settings): its ranking changes with
/// the limit, and an algorithm that needs little workspace can be the fastest.
const OTHER_WORKSPACES: [usize; 2] = [1 << 20, 4 << 20];

/// The heuristic's candidates for `key` (best first, those needing more than `ws_bytes` of
/// workspace left out), then the distinct candidates of neighbouring queries that cuBLASLt
/// accepts for `key` (`cublasLtMatmulAlgoCheck`): the same GEMM without its epilogue (the
/// heuristic ranks fused kernels on their own and can leave out tiles that also run the
/// epilogue faster: up to 17 % faster at 5120×8192×2048 on the H200, docs/PERFORMANCE.md §2.1),
/// and [`OTHER_WORKSPACES`]; with `search`, then [`Plan::search`]'s distinct configurations.
/// Returns the list and how many were added (they are at its end).
fn candidates(
    lt: &LtHandle,
    plan: &Plan,
    key: &PlanKey,
    n: usize,
    ws_bytes: usize,
    search: bool,
) -> (Vec<Algorithm>, usize) {
    let mut list: Vec<Algorithm> = plan.candidates.iter().copied().filter(|c| c.workspace <= ws_bytes).collect();
    let before = list.len();
    let plain = PlanKey { epilogue: Epilogue::None, aux_ld: 0, aux_stride: 0, ..*key };
    let mut queries: Vec<PlanKey> = Vec::new();
    if key.epilogue != Epilogue::None {
        queries.push(plain);
    }
    for ws in OTHER_WORKSPACES.into_iter().filter(|&ws| ws < key.workspace) {
        queries.push(PlanKey { workspace: ws, ..*key });
        if key.epilogue != Epilogue::None {
            queries.push(PlanKey { workspace: ws, ..plain });
        }
    }
    for q in &queries {
        let Ok(other) = Plan::build(lt, q, n) else { continue };
        for cand in &other.candidates {
            if list.iter().any(|c| c.data == cand.data) {
                continue;
            }
            if let Some(need) = plan.check_algo(lt, cand).filter(|&need| need <= ws_bytes) {
                list.push(Algorithm { data: cand.data, workspace: need });
            }
        }
    }
    if search {
        for cand in plan.search(lt, key, ws_bytes, SEARCH_LIMIT, SEARCH_CHECKS) {
            if !list.iter().any(|c| c.data == cand.data) {
                list.push(cand);
            }
        }
    }
    let added = list.len() - before;
    (list, added)
}

/// Problems of at most this many multiply-adds (256³) also get configurations from
/// [`Plan::search`] as candidates: the heuristic gives them 1–15 (calls 19 and 23's tuning,
/// docs/PERFORMANCE.md §2.1), and each costs only µs to check and time.
const SEARCH_MAX_MACS: u64 = 1 << 24;
/// At most this many searched configurations are added, after at most this many checks (both
/// shared among the algorithm ids).
const SEARCH_LIMIT: usize = 160;
const SEARCH_CHECKS: usize = 20_000;
/// With more than this many candidates to time, a quick pass of `PREFILTER_REPS` rounds picks
/// the `PREFILTER_KEEP` fastest for the full rounds (the search offers up to 160).
const PREFILTER_ABOVE: usize = 24;
const PREFILTER_REPS: usize = 3;
const PREFILTER_KEEP: usize = 15;

/// The bytes of C's m×n×batch logical elements, in order, out of the bytes of its whole span:
/// the padding between rows (ld > n) and between batch entries is never written by a GEMM and
/// may hold anything (NaN poison, say), so it must not enter the comparison.
fn logical_elements(span: Vec<u8>, c: MatrixLayout, batch: usize, size: usize) -> Vec<u8> {
    if c.ld == c.cols && (batch <= 1 || c.batch_stride == c.rows * c.cols) {
        let mut span = span;
        span.truncate(c.rows * c.cols * batch.max(1) * size);
        return span;
    }
    let mut out = Vec::with_capacity(c.rows * c.cols * batch * size);
    for b in 0..batch {
        for i in 0..c.rows {
            let start = (b * c.batch_stride + i * c.ld) * size;
            out.extend_from_slice(&span[start..start + c.cols * size]);
        }
    }
    out
}

/// ‖got − want‖ / ‖want‖ over two outputs stored as little-endian `d` elements (∞ if `got`
/// has a non-finite element), summed in f64 on all host cores.
fn rel_error_bytes(got: &[u8], want: &[u8], d: DType) -> f64 {
    fn decode(d: DType) -> fn(&[u8]) -> f64 {
        match d {
            DType::F32 => |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F16 => |c| f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => |c| bf16::from_le_bytes([c[0], c[1]]).to_f64(),
        }
    }
    let (size, value) = (d.size_bytes(), decode(d));
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    // at least 64 Ki elements per thread: a small C is summed on one
    let chunk = (got.len() / size).div_ceil(threads).max(1 << 16) * size;
    let parts: Vec<(f64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = got
            .chunks(chunk)
            .zip(want.chunks(chunk))
            .map(|(g, w)| {
                s.spawn(move || {
                    let (mut diff, mut norm) = (0.0f64, 0.0f64);
                    for (g, w) in g.chunks_exact(size).zip(w.chunks_exact(size)) {
                        let (g, w) = (value(g), value(w));
                        diff += if g.is_finite() { (g - w) * (g - w) } else { f64::INFINITY };
                        norm += w * w;
                    }
                    (diff, norm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("error summation thread")).collect()
    });
    let (diff, norm) = parts.iter().fold((0.0, 0.0), |(d, n), (pd, pn)| (d + pd, n + pn));
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// How long the GPU is kept busy with the first candidate before the timed rounds, ms: long
/// enough to reach the sustained clock a real workload runs at under the power limit, so that
/// no candidate is timed on a cooler, faster-clocked GPU than another.
const HEAT_MS: f64 = 300.0;

/// A problem whose first candidate takes less than this per call (ms, the fastest of three
/// samples of ~1 ms of back-to-back calls between CUDA events) is timed in graph replay:
/// eager back-to-back calls of it are bound by the host's launch cost (6–11 µs per call on the
/// H200 hosts, docs/PERFORMANCE.md §3), which would hide every difference between the
/// kernels, while in a graph — and behind any caller that keeps the GPU busy — the kernel's
/// own duration is what counts.
const GRAPH_BELOW_MS: f64 = 0.02;

/// Calls captured per graph, and graph launches per timed sample, in graph replay.
const GRAPH_CALLS: usize = 64;
const GRAPH_LAUNCHES: usize = 4;

/// Captures [`GRAPH_CALLS`] calls of `f` on `stream` into a graph (thread-local capture, which
/// leaves other threads' CUDA calls alone; docs/PERFORMANCE.md §6). `None` when the stream
/// cannot be captured at all (the legacy default stream cannot) or the capture failed: the
/// caller times eagerly.
fn capture(stream: &Arc<CudaStream>, f: &dyn Fn() -> Result<()>) -> Option<CudaGraph> {
    if stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).is_err() {
        return None;
    }
    let launched = (0..GRAPH_CALLS).try_for_each(|_| f());
    // the capture is ended even when a launch failed, so the stream is usable again
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    match (launched, graph) {
        (Ok(()), Ok(g)) => g,
        (launched, graph) => {
            // e.g. invalidated by another thread's first launch of a kernel (lazy module
            // loading synchronises the device; device calls 22–23): time eagerly instead
            tracing::debug!(?launched, graph_error = ?graph.err(), "capture for graph timing failed; timing eagerly");
            None
        }
    }
}

/// What [`time_interleaved`] measured.
struct Timed {
    /// Median ms per call of each function.
    medians: Vec<f64>,
    /// Whether samples were graph replays.
    in_graph: bool,
    /// Graph replay was called for (a problem under [`GRAPH_BELOW_MS`]) but capturing failed
    /// twice. Nothing was then sampled: every median is the first function's eager time per
    /// call (host launch cost, not kernel time).
    graph_failed: bool,
}

/// Median ms per call of each of `fs` on `stream`, timed as the benchmark times (warm-up,
/// samples of ~1 ms of back-to-back calls between CUDA events), but interleaved: after
/// [`HEAT_MS`] of the first function, each of `reps` rounds takes one sample of every
/// function, starting one further along each round and running every other round backwards,
/// so that all see the same clock and temperature drift. Problems below [`GRAPH_BELOW_MS`] per
/// call are sampled as replays of a captured graph of [`GRAPH_CALLS`] calls (see [`Timed`]).
fn time_interleaved(stream: &Arc<CudaStream>, reps: usize, fs: &[Box<dyn Fn() -> Result<()> + '_>]) -> Result<Timed> {
    let drv = status::driver;
    let raw_stream = stream.cu_stream();
    let ev = Events(
        event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?,
        event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?,
    );
    let timed = |n: usize, body: &dyn Fn() -> Result<()>| -> Result<f64> {
        // SAFETY: live events and stream of the current context.
        unsafe {
            event::record(ev.0, raw_stream).map_err(drv("cuEventRecord"))?;
            body()?;
            event::record(ev.1, raw_stream).map_err(drv("cuEventRecord"))?;
            event::synchronize(ev.1).map_err(drv("cuEventSynchronize"))?;
            Ok(event::elapsed(ev.0, ev.1).map_err(drv("cuEventElapsedTime"))? as f64 / n as f64)
        }
    };
    let eager = |f: &dyn Fn() -> Result<()>, n: usize| timed(n, &|| (0..n).try_for_each(|_| f()));
    let mut inner = Vec::with_capacity(fs.len());
    for f in fs {
        for _ in 0..3 {
            f()?;
        }
        let once = eager(f.as_ref(), 1)?;
        inner.push(((1.0 / once.max(1e-3)) as usize).clamp(1, 1000));
    }
    // one call alone includes its launch latency: judge by ~1 ms of back-to-back calls, the
    // fastest of three such samples (one preempted host thread made device call 19 time a
    // 6 µs problem eagerly)
    let mut per_call = f64::INFINITY;
    for _ in 0..3 {
        per_call = per_call.min(eager(fs[0].as_ref(), inner[0])?);
    }
    let wanted = per_call < GRAPH_BELOW_MS;
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
            Some(g) => timed(GRAPH_CALLS * GRAPH_LAUNCHES, &|| {
                (0..GRAPH_LAUNCHES).try_for_each(|_| g[i].launch().map_err(drv("cuGraphLaunch")))
            }),
            None => eager(fs[i].as_ref(), inner[i]),
        }
    };
    let mut heated = 0.0;
    while heated < HEAT_MS {
        heated += sample(0)? * if graphs.is_some() { GRAPH_CALLS * GRAPH_LAUNCHES } else { inner[0] } as f64;
    }
    let mut times = vec![Vec::with_capacity(reps.max(1)); fs.len()];
    let n = fs.len();
    for round in 0..reps.max(1) {
        for j in 0..n {
            // every other round runs backwards, so no candidate always follows the same one
            let i = (round + if round % 2 == 0 { j } else { n - 1 - j }) % n;
            times[i].push(sample(i)?);
        }
    }
    let medians = times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect();
    Ok(Timed { medians, in_graph: graphs.is_some(), graph_failed: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn rel_error_bytes_matches_the_f64_reference() {
        let want: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin() + 0.5).collect();
        let got: Vec<f32> = want.iter().enumerate().map(|(i, v)| v + if i % 7 == 0 { 1e-3 } else { 0.0 }).collect();
        let expect = crate::reference::rel_error(
            &got.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &want.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        );
        let e = rel_error_bytes(&bytes_f32(&got), &bytes_f32(&want), DType::F32);
        assert!(expect > 0.0 && (e - expect).abs() <= 1e-12 * expect, "{e} vs {expect}");
        assert_eq!(rel_error_bytes(&bytes_f32(&want), &bytes_f32(&want), DType::F32), 0.0);
    }

    #[test]
    fn padding_never_enters_the_comparison() {
        // 2 batch entries of 2×3 with ld 4 and batch stride 10: NaN in every padding slot
        let nan = f32::NAN;
        let span = [1.0, 2.0, 3.0, nan, 4.0, 5.0, 6.0, nan, nan, nan, 7.0, 8.0, 9.0, nan, 10.0, 11.0, 12.0, nan];
        let c = MatrixLayout { rows: 2, cols: 3, ld: 4, batch_stride: 10 };
        let got = logical_elements(bytes_f32(&span), c, 2, 4);
        let want: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        assert_eq!(got, bytes_f32(&want));
        assert_eq!(rel_error_bytes(&got, &got, DType::F32), 0.0);
        let dense = MatrixLayout::row_major(2, 3);
        assert_eq!(logical_elements(bytes_f32(&want[..6]), dense, 1, 4), bytes_f32(&want[..6]));
    }

    #[test]
    fn rel_error_bytes_never_passes_nan_or_inf() {
        let want = bytes_f32(&[1.0, 2.0, 3.0]);
        for bad in [f32::NAN, f32::INFINITY] {
            let e = rel_error_bytes(&bytes_f32(&[1.0, bad, 3.0]), &want, DType::F32);
            assert!(e.is_nan() || e > 1.0, "{bad} gave {e}");
        }
        let h = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect() };
        let e = rel_error_bytes(&h(&[1.0, f32::NAN]), &h(&[1.0, 1.0]), DType::F16);
        assert!(e.is_nan() || e > 1.0, "f16 NaN gave {e}");
        let b = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect() };
        let e = rel_error_bytes(&b(&[1.0, 2.0]), &b(&[1.0, 2.0]), DType::BF16);
        assert_eq!(e, 0.0);
    }
}
