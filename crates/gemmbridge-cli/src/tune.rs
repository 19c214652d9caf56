//! `gemmbridge tune`: fills a tactic database for a suite (cuBLASLt GEMMs) and, with
//! `--ops conv_…`, for the convolution suite (cuDNN plans, `tune_conv.rs`).

use std::path::Path;

use anyhow::{bail, Context};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::tactics::{Tactic, TacticDb};
use gemmbridge::cuda::TuneReport;
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale, TuneOptions};
use gemmbridge::{DType, Element, Epilogue, Precision};

use crate::db::identity;
use crate::ops::{op_applies, problem};
use crate::random::normal;
use crate::suite_args::{parse_ops, ConvSettings, Dtypes, SuiteArgs};
use crate::suites;
use crate::tune_conv;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub shared: SuiteArgs,
    /// Comma-separated ops: matmul, linear, linear_bias, linear_bias_gelu, bmm (a strided batch
    /// of 4 matmuls, as `bench --ops bmm`; not tuned by default). Convolutions (cuDNN's measured
    /// search on ResNet-50's 11 convolutions per dtype, --conv-layouts and --conv-batches, as
    /// `bench` times them; not tuned by default; --suite does not apply to them): conv_fwd,
    /// conv_bias_relu, conv_bias_relu_unfused, conv_dgrad, conv_wgrad, or conv for all five.
    #[arg(long, default_value = "matmul,linear,linear_bias,linear_bias_gelu")]
    ops: String,
    /// The tactic database to fill (created, or merged into).
    #[arg(long)]
    db: String,
    /// Candidates to ask cuBLASLt's heuristic for.
    #[arg(long, default_value_t = 16)]
    candidates: usize,
    /// Timed samples per candidate (the library's `TuneOptions::default()` takes 15).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Tune dense GEMMs planned for this many SMs (`Gpu::set_sm_count_target`): the entries
    /// serve only calls made under the same target, as the burn adapter's device-ordered GEMMs
    /// are (the GPU's SM count less its SM reserve, e.g. 131 on a 132-SM H200). Default: all
    /// SMs, entries for calls without a target.
    #[arg(long)]
    sm_count_target: Option<u32>,
}

/// One GEMM problem to tune: op (`scaled_mm/<recipe>` for FP8), dtype name, shape, and the
/// precision (`None` for FP8).
type Problem<'a> = (String, &'a str, suites::Shape, Option<Precision>);

/// A tune run: the arguments parsed and checked before the GPU is opened.
struct Plan {
    shapes: Vec<suites::Shape>,
    /// The dense dtypes, and the GEMM ops that apply to each, in --dtypes and --ops order.
    jobs: Vec<(String, Precision, String)>,
    /// FP8 recipes to tune (empty: none).
    fp8_scalings: Vec<String>,
    conv_ops: Vec<String>,
    /// The dtypes of the convolutions (empty: no convolution to tune).
    conv_dtypes: Vec<(String, Precision)>,
    conv: ConvSettings,
}

impl Plan {
    fn parse(args: &Args) -> anyhow::Result<Plan> {
        let shapes = args.shared.shapes()?;
        // the ops are checked first, once, whatever --dtypes holds
        let ops = parse_ops(&args.ops, false)?;
        let Dtypes { dense, scalings: fp8_scalings } = args.shared.dtypes()?;
        let mut jobs = Vec::new();
        for (d, prec) in &dense {
            for op in ops.gemm.iter().filter(|op| op_applies(op, d)) {
                jobs.push((d.clone(), *prec, op.clone()));
            }
        }
        if !ops.conv.is_empty() && dense.is_empty() {
            bail!(
                "--ops names convolutions but --dtypes names none of f32, tf32, f16, bf16 (fp8_e4m3 has no convolutions)"
            );
        }
        let conv_dtypes = if ops.conv.is_empty() { Vec::new() } else { dense };
        if jobs.is_empty() && fp8_scalings.is_empty() && conv_dtypes.is_empty() {
            bail!("nothing to tune: --dtypes and --ops select no problem");
        }
        let conv = args.shared.conv()?;
        Ok(Plan { shapes, jobs, fp8_scalings, conv_ops: ops.conv, conv_dtypes, conv })
    }

    /// Every GEMM problem: the dense jobs over the suite, then the FP8 recipes over it.
    fn problems(&self) -> Vec<Problem<'_>> {
        let mut problems = Vec::new();
        for (d, prec, op) in &self.jobs {
            problems.extend(self.shapes.iter().map(|&s| (op.clone(), d.as_str(), s, Some(*prec))));
        }
        for sc in &self.fp8_scalings {
            problems.extend(self.shapes.iter().map(|&s| (format!("scaled_mm/{sc}"), "fp8_e4m3", s, None)));
        }
        problems
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let plan = Plan::parse(&args)?;
    if args.candidates == 0 || args.candidates > 32 || args.reps == 0 {
        bail!("--candidates must be 1..=32 and --reps at least 1");
    }
    let db_path = Path::new(&args.db);
    if let Err(e) = TacticDb::check_path(db_path) {
        bail!("--db: {e}");
    }
    let gpu = open_gpu(&args, &plan)?;
    let mut db = TacticDb::new(identity(&gpu)?);
    // checked before any GPU time is spent: a file that save() would refuse to overwrite
    // (entries of another cuBLASLt version are no reason: save keeps them)
    if let Err(e) = TacticDb::check_writable(db_path, &db.identity) {
        bail!("--db {}: {e}", args.db);
    }
    let opts = TuneOptions { candidates: args.candidates, reps: args.reps, ..TuneOptions::default() };
    tune_gemms(&gpu, &plan.problems(), opts, &mut db, &args.db)?;
    if !plan.conv_dtypes.is_empty() {
        let conv_plan = tune_conv::Plan {
            ops: &plan.conv_ops,
            dtypes: &plan.conv_dtypes,
            layouts: plan.conv.layouts.clone(),
            batches: plan.conv.batches.clone(),
            api: plan.conv.api,
        };
        let n = tune_conv::run(&gpu, &conv_plan, &mut db, db_path)?;
        println!("{n} convolution plans tuned");
    }
    println!("{} tactics written to {} (merged with what was there)", db.entries.len(), args.db);
    Ok(0)
}

/// GPU 0, with the SM target the arguments give, checked to offer what the plan needs.
fn open_gpu(args: &Args, plan: &Plan) -> anyhow::Result<Gpu> {
    let gpu = Gpu::new(0).context("tune needs a CUDA GPU")?;
    if let Some(n) = args.sm_count_target {
        gpu.set_sm_count_target(Some(n)).context("--sm-count-target")?;
    }
    let gemms = !plan.jobs.is_empty() || !plan.fp8_scalings.is_empty();
    if gemms && !gpu.has_lt() {
        bail!("tuning GEMMs needs cuBLASLt (libcublasLt), which was not found");
    }
    // SAFETY: every buffer tune allocates is used only on gpu.stream().
    unsafe { gpu.context().disable_event_tracking() };
    Ok(gpu)
}

/// Tunes every GEMM problem, one table row each, saving `db` to `path` after every problem.
fn tune_gemms(
    gpu: &Gpu,
    problems: &[Problem<'_>],
    opts: TuneOptions,
    db: &mut TacticDb,
    path: &str,
) -> anyhow::Result<()> {
    if !problems.is_empty() {
        println!(
            "{:<16} {:<5} {:>6} {:>6} {:>6} {:>10} {:>10} {:>7} {:>5} {:>5} {:>6} {:>6}",
            "op", "dtype", "m", "n", "k", "heur. ms", "tuned ms", "gain", "cands", "added", "wrong", "kept"
        );
    }
    for (op, d, shape, prec) in problems {
        let (op, d, shape) = (op.as_str(), *d, *shape);
        let (report, sig, tactic) = match prec.map(|p| (p, p.input())) {
            None => match tune_fp8(gpu, op.trim_start_matches("scaled_mm/"), shape, opts) {
                Err(e) if e.downcast_ref().is_some_and(crate::bench::fp8::not_offered) => {
                    println!("{op:<16} {d:<5} not offered here: {e}");
                    continue;
                }
                other => other?,
            },
            Some((prec, DType::F32)) => tune_one::<f32>(gpu, op, shape, prec, opts)?,
            Some((prec, DType::F16)) => tune_one::<half::f16>(gpu, op, shape, prec, opts)?,
            Some((prec, _)) => tune_one::<half::bf16>(gpu, op, shape, prec, opts)?,
        };
        print_row(op, d, shape, &report);
        store(db, path, report, sig, tactic)?;
    }
    Ok(())
}

/// One row of the GEMM table.
fn print_row(op: &str, d: &str, shape: suites::Shape, report: &TuneReport) {
    println!(
        "{:<16} {:<5} {:>6} {:>6} {:>6} {:>10.4} {:>10.4} {:>6.1}% {:>5} {:>5} {:>6} {:>6}",
        op,
        d,
        shape.0,
        shape.1,
        shape.2,
        report.heuristic_ms,
        report.best_ms,
        (report.heuristic_ms / report.best_ms - 1.0) * 100.0,
        report.candidates,
        report.added,
        report.mismatched,
        format!(
            "{}{}",
            match (report.improved, report.kept_added) {
                (false, _) => "no",
                (true, false) => "yes",
                (true, true) => "added",
            },
            if report.timed_in_graph { " (graph)" } else { "" }
        )
    );
}

/// Stores one tuned problem in `db` and saves it to `path` (so an interrupted run keeps what
/// it tuned), or drops the entry where the heuristic's choice was not beaten.
fn store(db: &mut TacticDb, path: &str, report: TuneReport, sig: String, tactic: Tactic) -> anyhow::Result<()> {
    if report.graph_failed {
        // launch-bound eager time: not a measurement to keep or merge on
        println!("  not stored: graph capture failed twice, so the candidates were not timed");
        return Ok(());
    }
    if !report.improved {
        // Nothing beat the heuristic's first choice: an entry would only pin that choice,
        // and where such entries were applied (bf16 matmul 3537×12288×2048, the llm suite)
        // they ran ~5 % slower than plans the heuristic made afresh. Such a problem gets no
        // entry, and the file's entry for it goes if it too only held the heuristic's
        // choice; one that beat the heuristic in an earlier run stays (this run's
        // "nothing better" may be noise).
        db.entries.remove(&sig);
        let heuristic_only = |s: &str, t: &Tactic| s == sig && t.tuned_ms == t.heuristic_ms;
        db.save_dropping(Path::new(path), &heuristic_only).with_context(|| format!("writing {path}"))?;
        return Ok(());
    }
    db.entries.insert(sig, tactic);
    db.save(Path::new(path)).with_context(|| format!("writing {path}"))?;
    Ok(())
}

/// Tunes one FP8 problem: E4M3 operands of a recipe quantised from random bf16, bf16 output.
fn tune_fp8(
    gpu: &Gpu,
    scaling: &str,
    (m, n, k): suites::Shape,
    opts: TuneOptions,
) -> anyhow::Result<(gemmbridge::cuda::TuneReport, String, gemmbridge::cuda::tactics::Tactic)> {
    use gemmbridge::fp8::{Fp8Format, Source};
    let (xs, ws) = crate::bench::fp8::recipe(scaling)?;
    let s = gpu.stream();
    let xh: CudaSlice<half::bf16> = s.clone_htod(&normal::<half::bf16>(m * k))?;
    let wh: CudaSlice<half::bf16> = s.clone_htod(&normal::<half::bf16>(n * k))?;
    let x = gpu.quantize(&xh, m, k, Source::RowMajor, Fp8Format::E4M3, xs)?;
    let w = gpu.quantize(&wh, n, k, Source::RowMajor, Fp8Format::E4M3, ws)?;
    let mut y: CudaSlice<half::bf16> = s.alloc_zeros(m * n)?;
    Ok(gpu.autotune_fp8(&x, &w, &mut y, gemmbridge::cuda::Fp8Options::default(), opts)?)
}

fn tune_one<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    op: &str,
    shape: suites::Shape,
    prec: Precision,
    opts: TuneOptions,
) -> anyhow::Result<(gemmbridge::cuda::TuneReport, String, gemmbridge::cuda::tactics::Tactic)> {
    let (m, n, k) = shape;
    let p = problem(op, shape, prec)?;
    let s = gpu.stream();
    let b = p.batch();
    let x: CudaSlice<T> = s.clone_htod(&normal::<T>(m * k * b))?;
    let w: CudaSlice<T> = s.clone_htod(&normal::<T>(k * n * b))?;
    let bias: CudaSlice<T> = s.clone_htod(&normal::<T>(n))?;
    let mut c: CudaSlice<T> = s.alloc_zeros(m * n * b)?;
    let sz = std::mem::size_of::<T>();
    let r = |b: &CudaSlice<T>| RawBuffer { address: b.device_ptr(s).0, len_bytes: b.len() * sz };
    let rc = RawBuffer { address: c.device_ptr_mut(s).0, len_bytes: m * n * b * sz };
    let bias = (p.epilogue() != Epilogue::None).then(|| r(&bias));
    // f32/tf32 inputs with f32 outputs, half inputs with half outputs: T serves both.
    // SAFETY: live buffers of this context, sized by the problem, used on gpu.stream() only.
    let out = unsafe {
        gpu.autotune_raw(&p, Scale::PRODUCT, RawOperands { a: r(&x), b: r(&w), c: rc, bias, aux: None }, opts)
    }?;
    Ok(out)
}
