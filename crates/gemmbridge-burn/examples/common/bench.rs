//! What the timing examples share (`train_bench`, `op_bench`): the sampling flags and their
//! checks, the device's name, and the JSON lines written to stdout and `--out` — an `"op":
//! "env"` line first, then rows in `gemmbridge bench`'s fields, so that `gemmbridge compare`
//! judges alternated runs of the two sides.

use std::io::Write;
use std::time::Duration;

use anyhow::{ensure, Context};

/// The sampling flags of a timing example.
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Calls per timed sample (1..=100000).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Timed samples, the median reported (1..=100000).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Untimed calls before a row's samples (at most 100000).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Idle GPU time before each row's warm-up, ms (0..=60000).
    #[arg(long, default_value_t = 0.0)]
    pub gap_ms: f64,
    /// Also write the lines here (JSON lines).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// burn's NdArray backend at small sizes, f32: a check of the harness, not a measurement.
    #[arg(long)]
    pub cpu: bool,
}

/// How each row is sampled.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub steps: usize,
    pub reps: usize,
    pub warmup: usize,
    pub gap: Duration,
}

impl SamplingArgs {
    /// The sampling, every flag within its range.
    pub fn sampling(&self) -> anyhow::Result<Sampling> {
        let bounded = |n: usize| (1..=100_000).contains(&n);
        ensure!(
            bounded(self.steps) && bounded(self.reps) && self.warmup <= 100_000,
            "--steps and --reps must be within 1..=100000 and --warmup at most 100000, not {}, {} and {}",
            self.steps,
            self.reps,
            self.warmup
        );
        ensure!((0.0..=60_000.0).contains(&self.gap_ms), "--gap-ms must be within 0..=60000, not {}", self.gap_ms);
        let gap = Duration::from_secs_f64(self.gap_ms / 1e3);
        Ok(Sampling { steps: self.steps, reps: self.reps, warmup: self.warmup, gap })
    }

    /// The device's name: the CUDA GPU's (an error without one), or the CPU's with `--cpu`.
    pub fn device(&self) -> anyhow::Result<String> {
        if self.cpu {
            return Ok("cpu (burn NdArray)".to_string());
        }
        let gpu = gemmbridge::cuda::Gpu::new(0).context("no CUDA GPU: run with --cpu for a check on NdArray")?;
        Ok(gpu.info().context("reading the device's name")?.name)
    }

    /// The `"op": "env"` line: the side, the device, the sampling, and `extra`'s fields.
    pub fn env_line(&self, backend: &str, device: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut line = serde_json::json!({"op": "env", "backend": backend, "device": device, "burn": "0.21",
            "steps": self.steps, "reps": self.reps, "warmup": self.warmup, "heat_ms": 0.0, "gap_ms": self.gap_ms});
        if let (Some(l), serde_json::Value::Object(e)) = (line.as_object_mut(), extra) {
            l.extend(e);
        }
        line
    }
}

/// Where the lines go: stdout, and the `--out` file where one was given.
pub struct Lines(Option<std::fs::File>);

impl Lines {
    /// Creates (truncates) `out`, if given.
    pub fn create(out: Option<&std::path::Path>) -> anyhow::Result<Lines> {
        let file = out.map(|p| std::fs::File::create(p).with_context(|| format!("creating {}", p.display())));
        Ok(Lines(file.transpose()?))
    }

    /// Writes one line.
    pub fn emit(&mut self, line: serde_json::Value) -> anyhow::Result<()> {
        println!("{line}");
        if let Some(f) = self.0.as_mut() {
            writeln!(f, "{line}").context("writing --out")?;
        }
        Ok(())
    }
}

/// The median and the smallest of `samples` (not empty).
pub fn median_min(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0])
}
