//! Timing as `gemmbridge bench` and bench/peer.py do it, so that rows of this binary are timed
//! as the project's other rows are: `gap_ms` of idle GPU (the stream drained, the host asleep),
//! `warmup` calls, one timed call to size a sample, then `reps` samples of `inner`
//! back-to-back calls between two CUDA events on candle's stream, `inner` chosen so that a
//! sample spans about 1 ms (1 to 1000 calls). Reported: the median and the minimum time per
//! call, in ms.

use std::sync::Arc;

use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
use candle_core::cuda::cudarc::driver::CudaStream;
use candle_core::{Error, Result};

/// Median and minimum time per call, in ms.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
}

/// How [`time_gpu`] samples.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Calls before anything is timed.
    pub warmup: usize,
    /// Timed samples (each ~1 ms of back-to-back calls); the median is reported.
    pub reps: usize,
    /// Idle GPU before the warm-up, ms (0: none).
    pub gap_ms: f64,
}

/// Back-to-back calls per sample for a call of `once_ms`: about 1 ms of them, 1 to 1000.
fn inner_count(once_ms: f64) -> usize {
    ((1.0 / once_ms.max(1e-3)) as usize).clamp(1, 1000)
}

/// Times `f`, which enqueues its work on `stream` (candle's stream of the device), with CUDA
/// events on that stream.
pub fn time_gpu(stream: &Arc<CudaStream>, s: Sampling, f: &mut dyn FnMut() -> Result<()>) -> Result<Timing> {
    let ctx = stream.context();
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(Error::wrap);
    let (start, end) = (event()?, event()?);
    if s.gap_ms > 0.0 {
        // whatever the inputs' preparation queued finishes first, then the GPU idles
        stream.synchronize().map_err(Error::wrap)?;
        std::thread::sleep(std::time::Duration::from_secs_f64(s.gap_ms / 1e3));
    }
    for _ in 0..s.warmup {
        f()?;
    }
    stream.synchronize().map_err(Error::wrap)?;
    // GPU ms of `n` back-to-back calls
    let mut burst = |n: usize| -> Result<f64> {
        start.record(stream).map_err(Error::wrap)?;
        for _ in 0..n {
            f()?;
        }
        end.record(stream).map_err(Error::wrap)?;
        Ok(f64::from(start.elapsed_ms(&end).map_err(Error::wrap)?))
    };
    let inner = inner_count(burst(1)?);
    let mut times = Vec::with_capacity(s.reps);
    for _ in 0..s.reps.max(1) {
        times.push(burst(inner)? / inner as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(Timing { median_ms: times[times.len() / 2], min_ms: times[0] })
}

/// Checks a `--gap-ms` value: finite, 0 to 60 000 ms; returns it with −0 as 0 (so that
/// `gemmbridge compare` sees one gap, not two).
pub fn check_gap_ms(ms: f64) -> std::result::Result<f64, String> {
    if !(ms.is_finite() && (0.0..=60_000.0).contains(&ms)) {
        return Err(format!("--gap-ms {ms} is not between 0 and 60000 (milliseconds)"));
    }
    Ok(ms + 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_spans_about_a_millisecond() {
        assert_eq!(inner_count(0.01), 100);
        assert_eq!(inner_count(0.0), 1000);
        assert_eq!(inner_count(5.0), 1);
    }

    #[test]
    fn gaps_outside_the_range_are_refused_and_minus_zero_is_zero() {
        assert!(check_gap_ms(-1.0).is_err() && check_gap_ms(f64::NAN).is_err() && check_gap_ms(6e4 + 1.0).is_err());
        assert_eq!(check_gap_ms(-0.0).unwrap().to_bits(), 0.0f64.to_bits());
        assert_eq!(check_gap_ms(200.0).unwrap(), 200.0);
    }
}
