//! The confirmation: a tuned choice against the library's own, timed as `bench` times a row
//! (the GPU idle for a gap, then a short burst: 5 warm-up calls and 30 samples of ~1 ms, the
//! median kept), the two sides alternated round by round (A B, B A, …) on two `Gpu`s of the
//! same device — one without the choice (the baseline: cuBLASLt's heuristic plan, or for a
//! convolution the measured search `bench` runs by default) and one with it.
//!
//! The search before it times candidates at the sustained clock; calls in short bursts after
//! idle time run at another, and choices that won there lost 1–8 % in bursts. Only what wins
//! here is stored.

use gemmbridge::cuda::Gpu;

use super::items::{Item, Rows};
use crate::timing::Sampling;

/// The protocol's settings (`--confirm-gap-ms`, `--confirm-rounds`).
#[derive(Clone, Copy, Debug)]
pub struct Protocol {
    /// Idle time before each burst, ms (bench's `--gap-ms`).
    pub gap_ms: f64,
    /// Rounds, odd: each times both sides once.
    pub rounds: usize,
}

impl Protocol {
    /// A burst as `bench` times a row, after the gap.
    fn sampling(&self) -> Sampling {
        Sampling { warmup: 5, reps: 30, heat_ms: 0.0, gap_ms: self.gap_ms }
    }
}

/// What the rounds measured.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// Baseline time / candidate time, per round (> 1: the candidate is faster).
    pub ratios: Vec<f64>,
    /// The median of `ratios`.
    pub ratio: f64,
    /// The median of each side's per-round times, ms.
    pub base_ms: f64,
    pub cand_ms: f64,
}

/// The bar a candidate must clear: the median of the rounds' ratios at least `at`. Decided as
/// soon as more than half of all the rounds lie on one side of `at`, which the remaining rounds
/// can no longer change.
#[derive(Clone, Copy, Debug)]
pub struct Bar {
    pub at: f64,
}

impl Verdict {
    fn of(ratios: Vec<f64>, base: &[f64], cand: &[f64]) -> Verdict {
        Verdict { ratio: median(&ratios), base_ms: median(base), cand_ms: median(cand), ratios }
    }
}

/// The median of an odd count (the upper middle of an even one).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Times `item`'s row on `base` and `cand`, alternated, for `proto.rounds` rounds — fewer when
/// `bar` is given and already decided.
pub fn confirm(
    rows: &mut Rows,
    item: &Item,
    (base, cand): (&Gpu, &Gpu),
    proto: Protocol,
    bar: Option<Bar>,
) -> anyhow::Result<Verdict> {
    let sampling = proto.sampling();
    let (mut ratios, mut b_ms, mut c_ms) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..proto.rounds {
        // the baseline first in even rounds (so it makes the shared inputs in round 0)
        let (b, c) = if round.is_multiple_of(2) {
            let b = rows.time(base, item, sampling)?;
            (b, rows.time(cand, item, sampling)?)
        } else {
            let c = rows.time(cand, item, sampling)?;
            (rows.time(base, item, sampling)?, c)
        };
        ratios.push(b / c);
        b_ms.push(b);
        c_ms.push(c);
        if let Some(Bar { at }) = bar {
            let above = ratios.iter().filter(|&&r| r >= at).count();
            let half = proto.rounds / 2;
            if above > half || ratios.len() - above > half {
                break;
            }
        }
    }
    Ok(Verdict::of(ratios, &b_ms, &c_ms))
}

/// The spread of a round's ratio when both sides run the same plan: the standard deviation of
/// ln(ratio) over the rounds, as a fraction.
pub fn spread(ratios: &[f64]) -> f64 {
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / logs.len() as f64;
    let var = logs.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / (logs.len().max(2) - 1) as f64;
    var.sqrt()
}

/// Rounds whose median separates a `gain` (0.02: 2 %) from a round spread of `sigma`: the
/// median of n rounds varies by ≈ 1.2533·σ/√n (normal rounds), and two of those must fit in
/// the gain (a candidate no faster than the baseline then clears a 2 % bar about 2 % of the
/// time). Odd, at least 3.
pub fn rounds_needed(sigma: f64, gain: f64) -> usize {
    let n = (2.0 * 1.2533 * sigma / gain).powi(2).ceil().max(3.0) as usize;
    n | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_grow_with_the_square_of_the_spread() {
        assert_eq!(rounds_needed(0.0, 0.02), 3);
        assert_eq!(rounds_needed(0.01, 0.02), 3); // 1.57
        assert_eq!(rounds_needed(0.02, 0.02), 7); // 6.28
        assert_eq!(rounds_needed(0.03, 0.02), 15); // 14.1
    }

    #[test]
    fn spread_is_the_deviation_of_the_log_ratio() {
        assert_eq!(spread(&[1.0, 1.0, 1.0]), 0.0);
        let s = spread(&[1.01, 1.0 / 1.01, 1.0]);
        assert!(s > 0.009 && s < 0.011, "{s}");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
