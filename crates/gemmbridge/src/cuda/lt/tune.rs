//! Autotuning, one tuner for every cuBLASLt problem ([`Tunable`]: the dense GEMMs and the FP8
//! GEMMs, `jobs.rs`): time the candidate algorithms on the caller's operands and keep one only
//! when it is both right and measurably faster than the heuristic's first choice (the steps
//! are documented on [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::launch::Algorithm;
use super::sys::LtHandle;
use super::LtState;
use crate::cuda::device::{time_interleaved, Call, Timed};
use crate::cuda::status;
use crate::dtype::DType;
use crate::error::Result;
use crate::half::{bf16, f16};
use crate::layout::MatrixLayout;
use crate::tactics::Tactic;

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

/// What tuning found for a problem (see [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)). `#[non_exhaustive]`: fields
/// may be added.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TuneReport {
    /// Time per call of the heuristic's first choice, ms: the smaller of its two medians (it
    /// is sampled twice per round).
    pub heuristic_ms: f64,
    /// Median time of the kept algorithm (the heuristic's if nothing beat it), ms.
    pub best_ms: f64,
    /// Candidates considered (the heuristic's, plus `added`).
    pub candidates: usize,
    /// Of those, how many were added beyond the heuristic's list for the problem and accepted
    /// for it by `cublasLtMatmulAlgoCheck`: from the heuristic's lists for neighbouring
    /// queries (the same GEMM without its epilogue, or with a smaller workspace limit) and,
    /// for problems of at most 256³ multiply-adds, from the configuration search.
    pub added: usize,
    /// Whether the kept algorithm is one of those (neighbouring query or search).
    pub kept_added: bool,
    /// Whether the candidates were timed as replays of a captured CUDA graph (problems whose
    /// first choice takes < 20 µs per call, where eager timing measures the host's launch
    /// cost).
    pub timed_in_graph: bool,
    /// Whether graph timing was called for but capturing failed twice (see
    /// [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw), step 3): nothing was timed, the heuristic's first choice is kept,
    /// and `heuristic_ms` is its eager time per call (launch-bound), `best_ms` the same, and
    /// `threshold` is `TuneOptions::min_gain` (no noise was measured). Such a result is not
    /// worth storing in a tactic database.
    pub graph_failed: bool,
    /// Candidates whose output did not match the first choice's (never kept).
    pub mismatched: usize,
    /// The noise threshold used: max(`TuneOptions::min_gain`, the relative difference of the
    /// first choice timed twice), as a fraction.
    pub threshold: f64,
    /// Whether a candidate other than the heuristic's first choice was kept.
    pub improved: bool,
    /// The kept algorithm.
    pub algorithm: Algorithm,
    /// The candidates that beat the first choice by more than `threshold`, fastest first (at
    /// most 3; the kept algorithm is the first), as tactics to store under the signature
    /// returned with this report. Empty when nothing beat the first choice. Each one's
    /// `heuristic_ms` and `tuned_ms` are this search's times at the sustained clock:
    /// `gemmbridge tune` confirms the finalists in short bursts after idle time before storing
    /// one, with the confirmed times.
    pub finalists: Vec<Tactic>,
}

/// At most this many finalists are reported ([`TuneReport::finalists`] says 3).
pub(crate) const FINALISTS: usize = 3;

/// What the tuner tunes: one cuBLASLt problem on validated operands (a dense GEMM or an FP8
/// GEMM, `jobs.rs`).
pub(crate) trait Tunable {
    /// The problem's plan (descriptors, layouts, the heuristic's candidates).
    type Plan;
    /// The plan, with up to `n` of the heuristic's candidates.
    fn plan(&self, h: &LtHandle, n: usize) -> Result<Self::Plan>;
    /// The candidates to time, the heuristic's first choice first, and how many of them were
    /// added beyond the heuristic's list for the problem (they are at the end).
    fn candidates(&self, h: &LtHandle, plan: &Self::Plan, n: usize) -> (Vec<Algorithm>, usize);
    /// Enqueues one run with `algo` and β = `beta` on the job's stream.
    ///
    /// # Safety
    /// The job's operands are valid for its problem on its stream (validated by the caller).
    unsafe fn run(&self, h: &LtHandle, plan: &Self::Plan, algo: &Algorithm, beta: f32) -> Result<()>;
    /// The output's logical elements as bytes, read once the stream is idle.
    fn output(&self) -> Result<Vec<u8>>;
    /// The output's dtype and the band a candidate's output must be within (relative error
    /// against the first choice's; NaN never passes).
    fn band(&self) -> (DType, f64);
    /// β of the timed runs.
    fn beta(&self) -> f32;
    /// The stream the job runs on.
    fn stream(&self) -> &Arc<CudaStream>;
    /// The problem, for messages.
    fn describe(&self) -> String;
    /// The tactic database's key of the problem.
    fn signature(&self) -> String;
    /// The tactic to store for `algo`, tuned with cuBLASLt `version`.
    fn tactic(&self, algo: &Algorithm, version: usize, base_ms: f64, best_ms: f64) -> Tactic;
    /// Drops `lt`'s cached plans (and graphs) the tuned algorithm replaces.
    fn forget(&self, lt: &mut LtState, signature: &str);
}

/// Tunes `job` (steps 1–4 of [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)), keeps
/// the result for the job's signature in `lt` (the plans it replaces are dropped), and
/// returns the report and the (signature, tactic) pair to store.
///
/// # Safety
/// The job's operands are valid for its problem on its stream (validated by the caller).
pub(crate) unsafe fn autotune<T: Tunable>(
    lt: &mut LtState,
    job: &T,
    opts: TuneOptions,
) -> Result<(TuneReport, String, Tactic)> {
    let plan = job.plan(&lt.handle, opts.candidates)?;
    let (cands, added) = job.candidates(&lt.handle, &plan, opts.candidates);
    let handle = &lt.handle;
    // SAFETY: validated operands (the caller's contract).
    let run = |algo: &Algorithm, beta: f32| unsafe { job.run(handle, &plan, algo, beta) };
    // Correctness first: a candidate is timed only if its output matches the first choice's.
    let mut timed = matching(job, &cands, &run)?;
    let mismatched = cands.len() - timed.len();
    // The first choice is timed twice (first and last in each round) to measure noise.
    timed.push(0);
    let Timed { medians: ms, in_graph, graph_failed } = time_candidates(job, &cands, &run, &mut timed, opts.reps)?;
    if graph_failed {
        // eager timing of a problem this short ranks the host's launch cost, not the
        // kernels: keep the heuristic's choice rather than store a misleading winner
        tracing::warn!(problem = %job.describe(), "graph capture failed twice; keeping the heuristic's algorithm");
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
    // SAFETY: takes no arguments; libcublasLt is loaded (an LtState exists).
    let version = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
    let mut faster: Vec<usize> =
        (1..ms.len() - 1).filter(|&j| !graph_failed && ms[j] < base * (1.0 - threshold)).collect();
    faster.sort_by(|&x, &y| ms[x].total_cmp(&ms[y]));
    let finalists =
        faster.iter().take(FINALISTS).map(|&j| job.tactic(&cands[timed[j]], version, base, ms[j])).collect();
    let sig = job.signature();
    lt.tuned.insert(sig.clone(), algo);
    job.forget(lt, &sig);
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
        finalists,
    };
    let tactic = job.tactic(&algo, version, base, best_ms);
    Ok((report, sig, tactic))
}

/// The indices of the candidates whose output (β = 0) matches the first choice's within the
/// job's band (the first choice included).
fn matching<T: Tunable>(
    job: &T,
    cands: &[Algorithm],
    run: &dyn Fn(&Algorithm, f32) -> Result<()>,
) -> Result<Vec<usize>> {
    let (dtype, band) = job.band();
    let output = |algo: &Algorithm| -> Result<Vec<u8>> {
        run(algo, 0.0)?;
        job.stream().synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        job.output()
    };
    let want = output(&cands[0])?;
    let mut timed: Vec<usize> = vec![0];
    for (i, cand) in cands.iter().enumerate().skip(1) {
        if rel_error_bytes(&output(cand)?, &want, dtype) <= band {
            timed.push(i);
        }
    }
    Ok(timed)
}

/// Times the candidates `timed` names (the first choice first and last), at the job's β. With
/// more than [`PREFILTER_ABOVE`] of them (the search's), a quick pass of [`PREFILTER_REPS`]
/// rounds first keeps the first choice and the [`PREFILTER_KEEP`] fastest in `timed`.
fn time_candidates<T: Tunable>(
    job: &T,
    cands: &[Algorithm],
    run: &dyn Fn(&Algorithm, f32) -> Result<()>,
    timed: &mut Vec<usize>,
    reps: usize,
) -> Result<Timed> {
    let time = |timed: &[usize], reps: usize| {
        let runs: Vec<Call<'_>> =
            timed.iter().map(|&i| Box::new(move || run(&cands[i], job.beta())) as Call<'_>).collect();
        time_interleaved(job.stream(), reps, &runs, true)
    };
    // `timed` holds the first choice twice
    if timed.len() - 1 > PREFILTER_ABOVE {
        let q = time(timed, PREFILTER_REPS)?;
        if q.graph_failed {
            return Ok(q); // eager ranks launch costs: no full rounds, nothing kept
        }
        let mut order: Vec<usize> = (1..timed.len() - 1).collect();
        order.sort_by(|&x, &y| q.medians[x].total_cmp(&q.medians[y]));
        let mut kept: Vec<usize> = vec![0];
        kept.extend(order.iter().take(PREFILTER_KEEP).map(|&j| timed[j]));
        kept.push(0);
        *timed = kept;
    }
    time(timed, reps)
}

/// With more than this many candidates to time, a quick pass of `PREFILTER_REPS` rounds picks
/// the `PREFILTER_KEEP` fastest for the full rounds (the search offers up to 160).
const PREFILTER_ABOVE: usize = 24;
const PREFILTER_REPS: usize = 3;
const PREFILTER_KEEP: usize = 15;

/// The bytes of C's m×n×batch logical elements, in order, out of the bytes of its whole span:
/// the padding between rows (ld > n) and between batch entries is never written by a GEMM and
/// may hold anything (NaN poison, say), so it must not enter the comparison.
pub(super) fn logical_elements(span: Vec<u8>, c: MatrixLayout, batch: usize, size: usize) -> Vec<u8> {
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
