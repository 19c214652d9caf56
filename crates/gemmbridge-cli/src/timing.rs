//! Timing as bench/peer.py's `time_fn` does it, so the two sides measure the same thing.
//!
//! Warm-up calls, then one timed call to size a sample: each of `reps` samples times `inner`
//! back-to-back calls between two CUDA events, with `inner` chosen so a sample spans about
//! 1 ms (1 to 1000 calls). Reported: median and minimum time per call, in ms.
//!
//! One option on the GPU: before the samples, [`Sampling::heat_ms`] of back-to-back calls
//! (GPU time), so that a row is timed at the sustained, power-limited clock rather than in a
//! short burst as bench/peer.py times it. Off in `bench` by default: the clock of a burst and
//! the sustained clock differ (a fused row took 1.37× as long with heat; docs/DESIGN.md, Design rationale), so only rows timed the same way may be compared.
//!
//! Another: [`Sampling::gap_ms`] of idle GPU before the warm-up (the stream drained, the host
//! asleep), so that every row starts from the same idle state instead of from whatever the row
//! before it left (a short burst's clock depends on what ran just before it, §2.3 again).
//! bench/peer.py's `--gap-ms` does the same before its warm-up.

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use gemmbridge::cuda::Gpu;

/// Median and minimum time per call, in ms.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
}

fn summarise(mut times: Vec<f64>) -> Timing {
    times.sort_by(f64::total_cmp);
    Timing { median_ms: times[times.len() / 2], min_ms: times[0] }
}

fn inner_count(once_ms: f64) -> usize {
    ((1.0 / once_ms.max(1e-3)) as usize).clamp(1, 1000)
}

/// How [`time_gpu`] samples.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Calls before anything is timed.
    pub warmup: usize,
    /// Timed samples (each ~1 ms of back-to-back calls); the median is reported.
    pub reps: usize,
    /// GPU time of back-to-back calls after the warm-up and before the samples, ms (0: none).
    pub heat_ms: f64,
    /// Idle time before the warm-up, ms (0: none): the stream is drained, then the host
    /// sleeps, so the GPU runs nothing of ours for that long.
    pub gap_ms: f64,
}

impl Sampling {
    /// `warmup` calls, `reps` samples, no heat, no gap.
    pub fn new(warmup: usize, reps: usize) -> Self {
        Sampling { warmup, reps, heat_ms: 0.0, gap_ms: 0.0 }
    }
}

/// Checks a `--heat-ms` / `--gap-ms` value: finite, 0 to 60 000 ms; returns it with -0 as 0
/// (so that `compare` sees one gap, not two).
pub fn check_ms(flag: &str, ms: f64) -> anyhow::Result<f64> {
    if !(ms.is_finite() && (0.0..=60_000.0).contains(&ms)) {
        anyhow::bail!("{flag} {ms} is not between 0 and 60000 (milliseconds)");
    }
    Ok(ms + 0.0)
}

/// Times `f` (which enqueues work on `gpu.stream()`) with CUDA events.
pub fn time_gpu<E>(gpu: &Gpu, sampling: Sampling, f: &mut dyn FnMut() -> Result<(), E>) -> anyhow::Result<Timing>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let Sampling { warmup, reps, heat_ms, gap_ms } = sampling;
    let s = gpu.stream();
    let ctx = gpu.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    if gap_ms > 0.0 {
        // whatever the inputs' preparation queued finishes first, then the GPU idles
        s.synchronize()?;
        std::thread::sleep(std::time::Duration::from_secs_f64(gap_ms / 1e3));
    }
    for _ in 0..warmup {
        f()?;
    }
    s.synchronize()?;
    // GPU ms of `n` back-to-back calls
    let mut burst = |n: usize| -> anyhow::Result<f64> {
        start.record(s)?;
        for _ in 0..n {
            f()?;
        }
        end.record(s)?;
        Ok(start.elapsed_ms(&end)? as f64)
    };
    let once = burst(1)?;
    let inner = inner_count(once);
    let mut heated = once;
    while heated < heat_ms {
        heated += burst(inner)?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        times.push(burst(inner)? / inner as f64);
    }
    Ok(summarise(times))
}

/// Times `f` on the host clock (the CPU backend, which runs synchronously).
pub fn time_cpu<E>(warmup: usize, reps: usize, f: &mut dyn FnMut() -> Result<(), E>) -> anyhow::Result<Timing>
where
    E: std::error::Error + Send + Sync + 'static,
{
    for _ in 0..warmup {
        f()?;
    }
    let t = Instant::now();
    f()?;
    let inner = inner_count(t.elapsed().as_secs_f64() * 1e3);
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..inner {
            f()?;
        }
        times.push(t.elapsed().as_secs_f64() * 1e3 / inner as f64);
    }
    Ok(summarise(times))
}
