//! Autotuning: time cuBLASLt's candidate algorithms on the caller's operands and keep one only
//! when it is both right and measurably faster than the heuristic's first choice.

use cudarc::driver::result::event;
use cudarc::driver::sys::{CUevent, CUevent_flags, CUstream};

use super::gpu::{check_all, raw_descs, Gpu, RawBuffer, RawExtras, TuneReport};
use super::lt::{Algorithm, Plan};
use super::status;
use super::tactics::{signature, Tactic};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::half::{bf16, f16};
use crate::problem::GemmProblem;
use crate::reference::rel_error;

/// How hard to tune.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TuneOptions {
    /// Candidates to ask the heuristic for (values outside 1..=32 are clamped to it).
    pub candidates: usize,
    /// Timed samples per candidate (each ~1 ms of back-to-back calls); the median counts.
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
        // SAFETY: created in time_algo, destroyed once.
        unsafe {
            let _ = event::destroy(self.0);
            let _ = event::destroy(self.1);
        }
    }
}

fn to_f64(bytes: &[u8], d: DType) -> Vec<f64> {
    match d {
        DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        DType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
    }
}

impl Gpu {
    /// Tunes the cuBLASLt algorithm for `p` on the given operands (on [`Gpu::stream`]): asks
    /// the heuristic for `opts.candidates` algorithms, runs each once with β = 0 and compares
    /// its C with the first choice's (‖·‖ within the precision's band, else it is never
    /// kept), times each (CUDA events, warm-up, `opts.reps` samples, median), times the first
    /// choice a second time to measure noise, and keeps the fastest matching candidate only
    /// if it beats the first choice by more than max(`opts.min_gain`, noise). The result
    /// serves every M in the same bucket ([`super::tactics`]); cached plans are rebuilt.
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
        let ws = *self.workspace(&mut st, stream, &|| p.describe())?;
        let key = Gpu::plan_key(p, (a.address, b.address, c.address), extras.bias.map(|v| v.address), ws.matmul_bytes);
        let lt = st.lt.as_ref().expect("checked above");
        let plan = Plan::build(lt, &key, opts.candidates)?;
        let cands: Vec<Algorithm> =
            plan.candidates.iter().copied().filter(|c| c.workspace <= ws.matmul_bytes).collect();
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
        let sync = || {
            // SAFETY: a live stream of this context.
            unsafe { cudarc::driver::result::stream::synchronize(stream) }
                .map_err(status::driver("cuStreamSynchronize"))
        };
        let output = |algo: &Algorithm| -> Result<Vec<f64>> {
            run(algo, 0.0)?;
            sync()?;
            let mut host = vec![0u8; c_bytes];
            // SAFETY: C holds c_bytes (checked); the stream is idle.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, c.address) }
                .map_err(status::driver("cuMemcpyDtoH"))?;
            Ok(to_f64(&host, prec.output()))
        };
        let time = |algo: &Algorithm| -> Result<f64> { time_algo(stream, opts.reps, &|| run(algo, beta)) };

        let want = output(&cands[0])?;
        let heuristic_ms = time(&cands[0])?;
        let mut best = (0usize, heuristic_ms);
        let mut mismatched = 0;
        for (i, cand) in cands.iter().enumerate().skip(1) {
            let got = output(cand)?;
            if rel_error(&got, &want) > prec.tolerance() {
                mismatched += 1;
                continue;
            }
            let t = time(cand)?;
            if t < best.1 {
                best = (i, t);
            }
        }
        let again = time(&cands[0])?;
        let noise = (heuristic_ms - again).abs() / heuristic_ms.min(again);
        let threshold = opts.min_gain.max(noise);
        let base = heuristic_ms.min(again);
        let improved = best.0 != 0 && best.1 < base * (1.0 - threshold);
        let (algo, best_ms) = if improved { (cands[best.0], best.1) } else { (cands[0], base) };
        let sig = signature(&key);
        st.tuned.insert(sig.clone(), algo);
        st.plans.retain(|k, _| signature(k) != sig);
        let report = TuneReport {
            heuristic_ms: base,
            best_ms,
            candidates: cands.len(),
            mismatched,
            threshold,
            improved,
            algorithm: algo,
        };
        let tactic = Tactic { algo: algo.data, workspace: algo.workspace, heuristic_ms: base, tuned_ms: best_ms };
        Ok((report, sig, tactic))
    }
}

/// Median ms per call of `f` on `stream`, timed as the benchmark times (warm-up, ~1 ms samples).
fn time_algo(stream: CUstream, reps: usize, f: &dyn Fn() -> Result<()>) -> Result<f64> {
    let drv = status::driver;
    let ev = Events(
        event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?,
        event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?,
    );
    let sample = |n: usize| -> Result<f64> {
        // SAFETY: live events and stream of the current context.
        unsafe {
            event::record(ev.0, stream).map_err(drv("cuEventRecord"))?;
            for _ in 0..n {
                f()?;
            }
            event::record(ev.1, stream).map_err(drv("cuEventRecord"))?;
            event::synchronize(ev.1).map_err(drv("cuEventSynchronize"))?;
            Ok(event::elapsed(ev.0, ev.1).map_err(drv("cuEventElapsedTime"))? as f64 / n as f64)
        }
    };
    for _ in 0..3 {
        f()?;
    }
    let once = sample(1)?;
    let inner = ((1.0 / once.max(1e-3)) as usize).clamp(1, 1000);
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        times.push(sample(inner)?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
