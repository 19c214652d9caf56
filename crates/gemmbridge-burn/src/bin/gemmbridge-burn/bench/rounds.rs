//! Interleaved timing rounds: every way of running a GEMM timed in turns, so that the GPU's
//! clock and temperature drift reach all of them alike.

use std::time::Instant;

/// One way of running the GEMM: a call (given the loop index) and the wait that ends a loop.
pub struct Variant<'a> {
    pub call: &'a dyn Fn(usize),
    pub sync: &'a dyn Fn(),
}

impl Variant<'_> {
    /// Wall ms per call over one loop of `iters` calls, ended by the variant's wait.
    pub fn sample(&self, iters: usize) -> f64 {
        (self.sync)();
        let t = Instant::now();
        for i in 0..iters {
            (self.call)(i);
        }
        (self.sync)();
        t.elapsed().as_secs_f64() * 1e3 / iters as f64
    }
}

/// How long the first variant runs before the timed rounds, ms, so that every variant is timed
/// at the sustained, power-limited clock rather than the first on a cool GPU.
const HEAT_MS: f64 = 300.0;

/// Median ms per call of each variant: after [`HEAT_MS`] of the first, `reps` rounds each time
/// one loop of `iters` calls of every variant, starting one further along each round and
/// running every other round backwards, so that clock and temperature drift reach all of them
/// alike.
pub fn time_rounds(reps: usize, iters: usize, variants: &[Variant]) -> Vec<f64> {
    let mut heated = 0.0;
    while heated < HEAT_MS {
        heated += variants[0].sample(iters) * iters as f64;
    }
    let mut times = vec![Vec::new(); variants.len()];
    let n = variants.len();
    for round in 0..reps.max(1) {
        for j in 0..n {
            // every other round runs backwards, so no variant always follows the same one
            let v = (round + if round % 2 == 0 { j } else { n - 1 - j }) % n;
            times[v].push(variants[v].sample(iters));
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}
