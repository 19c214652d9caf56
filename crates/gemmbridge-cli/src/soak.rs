//! `gemmbridge soak`: a stress run of the engine. Several threads, each on its own stream of
//! one context, issue mixed GEMMs (1×1×1 to 4096³, batched, padded, transposed, six
//! precisions, plain and with fused epilogues, β = 0 and β ≠ 0) through one shared `Gpu`
//! (`Backend::Auto`) and two more on the same context (`Backend::Lt`, `Backend::Blas`), with
//! graph replay on; a sample of calls is checked against float64. It reports the calls, the
//! checks, the caches and the host and device memory at the start, halfway and the end.
//!
//! - [`cases`]: the problem set; [`data`]: host operands from the seed;
//! - [`worker`]: one thread's buffers, warm-up and call loop;
//! - [`check`]: which rows are compared and their reference;
//! - [`report`]: counters, snapshots, the report and its JSON.

pub mod cases;
pub mod check;
pub mod data;
pub mod report;
pub mod worker;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cudarc::driver::CudaStream;
use gemmbridge::cuda::{library, Backend, Gpu, GpuOptions};

use report::{Counters, Snapshot, Summary};
use worker::Shared;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Threads, each on its own CUDA stream (1 to 64).
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Duration of the mixed calls after the warm-up, in seconds (1 to 604800).
    #[arg(long, default_value_t = 180)]
    seconds: u64,
    /// Seed of the inputs and of each thread's schedule (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Check every N-th call of each thread against float64 (1 to 1000000).
    #[arg(long, default_value_t = 50)]
    check_every: u64,
    /// Also write the report as one JSON object to this file.
    #[arg(long)]
    json: Option<String>,
    /// Churn instead of the mixed-call soak: each thread creates a Gpu, runs GEMMs, an FP8
    /// GEMM, a convolution and a training step, and drops it (every other one with its work
    /// in flight), --rounds times, while one more thread captures and replays graphs on its
    /// own stream in every capture mode. --seconds and --check-every do not apply.
    #[arg(long)]
    churn: bool,
    /// With --churn: the Gpus each thread creates and drops (1 to 100000).
    #[arg(long, default_value_t = 12)]
    rounds: usize,
    /// With --churn: no capturing thread.
    #[arg(long)]
    no_capture: bool,
    /// With --churn: graph replay off in the workers' Gpus.
    #[arg(long)]
    no_replay: bool,
    /// With --churn: GEMMs only (no FP8 GEMM, convolution or training step).
    #[arg(long)]
    gemms_only: bool,
}

/// Seconds between progress lines.
const PROGRESS_S: f64 = 15.0;

/// The arguments, checked; the seed chosen.
#[derive(Debug, PartialEq)]
pub struct Settings {
    pub threads: usize,
    pub seconds: u64,
    pub seed: u64,
    pub check_every: u64,
    pub json: Option<String>,
}

/// Checks the arguments (before any GPU work), each failure naming its option.
pub fn validate(args: &Args) -> anyhow::Result<Settings> {
    if !(1..=64).contains(&args.threads) {
        bail!("--threads {} is not between 1 and 64", args.threads);
    }
    if !(1..=604_800).contains(&args.seconds) {
        bail!("--seconds {} is not between 1 and 604800 (a week)", args.seconds);
    }
    if args.churn && !(1..=100_000).contains(&args.rounds) {
        bail!("--rounds {} is not between 1 and 100000", args.rounds);
    }
    if !(1..=1_000_000).contains(&args.check_every) {
        bail!("--check-every {} is not between 1 and 1000000", args.check_every);
    }
    if let Some(path) = &args.json {
        let dir = Path::new(path).parent().filter(|d| !d.as_os_str().is_empty());
        if path.is_empty() || Path::new(path).is_dir() {
            bail!("--json {path:?} is not a file name");
        }
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            let what = if dir.exists() { "is not a directory" } else { "does not exist" };
            bail!("--json {path}: the directory {} {what}", dir.display());
        }
    }
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64
    });
    Ok(Settings {
        threads: args.threads,
        seconds: args.seconds,
        seed,
        check_every: args.check_every,
        json: args.json.clone(),
    })
}

/// The three `Gpu`s (auto, lt, blas) on device 0's primary context.
fn open() -> anyhow::Result<(Gpu, Gpu, Gpu)> {
    let auto = crate::gpu::open("soak")?;
    if !library::has_cublaslt() {
        bail!("soak needs cuBLASLt (libcublasLt), which was not found");
    }
    // SAFETY: every buffer the soak allocates is created, used, read back and freed on one
    // stream (its thread's), and the Gpus' own stream is never used; so cudarc's cross-stream
    // events have nothing to order.
    unsafe { auto.context().disable_event_tracking() };
    let on = |backend| Gpu::with_stream(auto.stream().clone(), GpuOptions::default().backend(backend));
    let lt = on(Backend::Lt).context("a second Gpu (Backend::Lt) on the same context")?;
    let blas = on(Backend::Blas).context("a third Gpu (Backend::Blas) on the same context")?;
    Ok((auto, lt, blas))
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.churn {
        return churn(&args);
    }
    let cfg = validate(&args)?;
    if let Some(path) = &cfg.json {
        // created now, so that a path that cannot be written fails before the run, not after
        std::fs::File::create(path).with_context(|| format!("--json {path}: cannot create the file"))?;
    }
    let cases = cases::all()?;
    let (auto, lt, blas) = open()?;
    let info = auto.info()?;
    let per_thread: usize = cases.iter().map(cases::Case::bytes).sum();
    println!(
        "soak on {}: {} threads × {} s, seed {} (repeat with --seed {}), {} cases, {:.0} MiB of buffers per thread, check every {} calls",
        info.name,
        cfg.threads,
        cfg.seconds,
        cfg.seed,
        cfg.seed,
        cases.len(),
        per_thread as f64 / (1 << 20) as f64,
        cfg.check_every
    );
    let host = worker::host_data(&cases, cfg.seed);
    let streams: Vec<Arc<CudaStream>> = (0..cfg.threads)
        .map(|i| auto.context().new_stream().with_context(|| format!("creating the stream of thread {i}")))
        .collect::<anyhow::Result<_>>()?;
    let gpus = [&auto, &lt, &blas];
    let (counters, stop, go, ready) =
        (Counters::default(), AtomicBool::new(false), AtomicBool::new(false), AtomicUsize::new(0));
    let shared = Shared {
        gpus,
        cases: &cases,
        host: &host,
        counters: &counters,
        stop: &stop,
        go: &go,
        ready: &ready,
        check_every: cfg.check_every,
    };
    let (snaps, elapsed, workers) = drive(&cfg, &shared, &streams)?;
    // a failed snapshot (e.g. the context is broken after a faulting call) must not hide the
    // failures already counted: it is reported as an error and the report still printed
    let end = report::snapshot(&gpus, &counters, elapsed).unwrap_or_else(|e| {
        counters.error(format!("end snapshot: {e:#}"));
        Snapshot::default()
    });
    let summary = summarise(&cfg, &counters, cases.len(), elapsed, snaps, end);
    print!("{}", report::table(&summary));
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {path}"))?;
    }
    // buffers first (freed on their streams), then the Gpus (they synchronise the context),
    // the streams last
    drop(workers);
    drop((auto, lt, blas));
    drop(streams);
    Ok(if summary.pass { 0 } else { 1 })
}

/// Starts the threads, waits for their warm-up, takes the start snapshot, lets them run for
/// the duration (progress lines, the halfway snapshot), stops and joins them.
#[allow(clippy::type_complexity)]
fn drive(
    cfg: &Settings,
    sh: &Shared<'_>,
    streams: &[Arc<CudaStream>],
) -> anyhow::Result<((Snapshot, Option<Snapshot>), f64, Vec<worker::Worker>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(id, st)| s.spawn(move || worker::run(sh, id, st.clone(), cfg.seed)))
            .collect();
        let t = Instant::now();
        while sh.ready.load(Relaxed) < cfg.threads {
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("warm-up: every case on every backend, {:.1} s", t.elapsed().as_secs_f64());
        let start = report::snapshot(&sh.gpus, sh.counters, 0.0);
        let t0 = Instant::now();
        sh.go.store(true, Relaxed);
        let total = cfg.seconds as f64;
        let (mut half, mut next) = (None, PROGRESS_S);
        while !sh.stop.load(Relaxed) && start.is_ok() {
            let at = t0.elapsed().as_secs_f64();
            if at >= total {
                break;
            }
            if half.is_none() && at >= total / 2.0 {
                half =
                    report::snapshot(&sh.gpus, sh.counters, at).map_err(|e| eprintln!("halfway snapshot: {e:#}")).ok();
            }
            if at >= next {
                println!("{}", report::progress(sh.counters, at, total));
                next += PROGRESS_S;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        sh.stop.store(true, Relaxed);
        let elapsed = t0.elapsed().as_secs_f64();
        let mut workers = Vec::new();
        for h in handles {
            match h.join() {
                Ok(w) => workers.extend(w),
                Err(_) => sh.counters.error("a soak thread panicked".into()),
            }
        }
        Ok(((start?, half), elapsed, workers))
    })
}

fn summarise(
    cfg: &Settings,
    c: &Counters,
    cases: usize,
    elapsed_s: f64,
    (start, half): (Snapshot, Option<Snapshot>),
    end: Snapshot,
) -> Summary {
    let (failures, lt_unsupported) = c.lists();
    let (mismatches, errors, checked) = (c.mismatches.load(Relaxed), c.errors.load(Relaxed), c.checked.load(Relaxed));
    Summary {
        pass: mismatches == 0 && errors == 0 && checked > 0,
        seed: cfg.seed,
        threads: cfg.threads,
        seconds: cfg.seconds,
        elapsed_s,
        cases,
        calls: c.calls.load(Relaxed),
        calls_by_backend: [0, 1, 2].map(|i| c.by_backend[i].load(Relaxed)),
        checked,
        mismatches,
        errors,
        failures,
        lt_unsupported,
        start,
        half,
        end,
        rss_growth_bytes: end.rss_bytes as i64 - start.rss_bytes as i64,
        device_growth_bytes: end.device_used_bytes as i64 - start.device_used_bytes as i64,
    }
}

/// `soak --churn`: [`gemmbridge_lab::churn`], its report printed; exit 1 on a failure.
fn churn(args: &Args) -> anyhow::Result<i32> {
    use gemmbridge_lab::churn::{self, ChurnOptions};
    let seed = validate(args)?.seed;
    let opts = ChurnOptions {
        threads: args.threads,
        rounds: args.rounds,
        capture: !args.no_capture,
        graph_replay: !args.no_replay,
        gemms_only: args.gemms_only,
        seed,
        ..ChurnOptions::default()
    };
    let mut off: Vec<&str> = Vec::new();
    off.extend(args.no_capture.then_some("no capturing thread"));
    off.extend(args.no_replay.then_some("graph replay off"));
    off.extend(args.gemms_only.then_some("GEMMs only"));
    let off = if off.is_empty() { String::new() } else { format!(" ({})", off.join(", ")) };
    println!("churn: {} threads × {} rounds{off}, seed {seed} (repeat with --seed {seed})", opts.threads, opts.rounds);
    let t = Instant::now();
    let r = churn::run(&opts).map_err(|e| anyhow::anyhow!("churn: {e}"))?;
    println!(
        "{} Gpus created and dropped ({} with work in flight), {} GEMMs, {} FP8 GEMMs, {} convolutions, {} training steps, {} graphs captured beside them, worst GEMM error {:.2e}, {:.1} s",
        r.gpus, r.dropped_in_flight, r.gemms, r.fp8_gemms, r.convolutions, r.train_steps, r.captures, r.worst_error, t.elapsed().as_secs_f64()
    );
    for s in &r.skipped {
        println!("skipped: {s}");
    }
    for f in &r.failures {
        println!("FAILED: {f}");
    }
    println!("churn {}", if r.passed() { "passed" } else { "FAILED" });
    Ok(if r.passed() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(threads: usize, seconds: u64, check_every: u64, json: Option<&str>) -> Args {
        Args {
            threads,
            seconds,
            seed: Some(7),
            check_every,
            json: json.map(String::from),
            churn: false,
            rounds: 12,
            no_capture: false,
            no_replay: false,
            gemms_only: false,
        }
    }

    #[test]
    fn arguments_are_validated_by_name() {
        let err = |a: Args| validate(&a).unwrap_err().to_string();
        assert_eq!(err(args(0, 180, 50, None)), "--threads 0 is not between 1 and 64");
        assert_eq!(err(args(65, 180, 50, None)), "--threads 65 is not between 1 and 64");
        assert_eq!(err(args(8, 0, 50, None)), "--seconds 0 is not between 1 and 604800 (a week)");
        assert_eq!(err(args(8, 180, 0, None)), "--check-every 0 is not between 1 and 1000000");
        assert_eq!(
            err(args(8, 180, 50, Some("/no/such/dir/soak.json"))),
            "--json /no/such/dir/soak.json: the directory /no/such/dir does not exist"
        );
        assert_eq!(err(args(8, 180, 50, Some("/tmp"))), "--json \"/tmp\" is not a file name");
        let ok = validate(&args(8, 180, 50, Some("soak.json"))).unwrap();
        assert_eq!(ok, Settings { threads: 8, seconds: 180, seed: 7, check_every: 50, json: Some("soak.json".into()) });
        let churn = |rounds| Args { churn: true, rounds, ..args(8, 180, 50, None) };
        assert_eq!(err(churn(0)), "--rounds 0 is not between 1 and 100000");
        assert_eq!(err(churn(100_001)), "--rounds 100001 is not between 1 and 100000");
        assert!(validate(&churn(12)).is_ok());
        let clock = validate(&Args { seed: None, ..args(1, 1, 1, None) }).unwrap();
        assert!(clock.seed > 0);
    }
}
