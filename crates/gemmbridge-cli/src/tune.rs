//! `gemmbridge tune`: fills a tactic database for a suite (cuBLASLt GEMMs) and, with
//! `--ops conv_…`, for the convolution suite (cuDNN plans, `tune_conv.rs`).

use std::path::Path;

use anyhow::{bail, Context};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::tactics::{Tactic, TacticDb};
use gemmbridge::cuda::{Gpu, RawBuffer, RawExtras, TuneOptions};
use gemmbridge::{DType, Element, Epilogue, Precision};

use crate::bench::conv;
use crate::db::identity;
use crate::ops::{op_applies, precision_of, problem, OPS};
use crate::random::normal;
use crate::suites;
use crate::tune_conv;

#[derive(clap::Args)]
pub struct Args {
    /// Shape suite (as `bench`): default, square, llm, small, misaligned, deepgemm, cpu.
    #[arg(long, default_value = "default")]
    suite: String,
    /// Comma-separated dtypes: f32, tf32, f16, bf16, fp8_e4m3 (FP8 `scaled_mm` problems,
    /// one per --scalings recipe, bf16 output; --ops does not apply to them).
    #[arg(long, default_value = "f32,tf32,f16,bf16")]
    dtypes: String,
    /// FP8 recipes to tune for fp8_e4m3 (as `bench --scalings`).
    #[arg(long, default_value = "tensorwise,rowwise,block")]
    scalings: String,
    /// Comma-separated ops: matmul, linear, linear_bias, linear_bias_gelu, bmm (a strided batch
    /// of 4 matmuls, as `bench --ops bmm`; not tuned by default). Convolutions (cuDNN's measured
    /// search on ResNet-50's 11 convolutions per dtype, --conv-layouts and --conv-batches, as
    /// `bench` times them; not tuned by default; --suite does not apply to them): conv_fwd,
    /// conv_bias_relu, conv_bias_relu_unfused, conv_dgrad, conv_wgrad, or conv for all five.
    #[arg(long, default_value = "matmul,linear,linear_bias,linear_bias_gelu")]
    ops: String,
    /// Convolutions: the layouts, nhwc and/or nchw.
    #[arg(long, default_value = "nhwc,nchw")]
    conv_layouts: String,
    /// Convolutions: the batch sizes N.
    #[arg(long, default_value = "32,1")]
    conv_batches: String,
    /// Convolutions: which cuDNN API's plans to tune, "graph" (the library's default) or
    /// "legacy".
    #[arg(long, default_value = "graph")]
    conv_api: String,
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

pub fn run(args: Args) -> anyhow::Result<i32> {
    let shapes = suites::shapes(&args.suite)?;
    let mut jobs: Vec<(&str, Precision, &str)> = Vec::new();
    let mut fp8_scalings: Vec<String> = Vec::new();
    let mut conv_ops: Vec<String> = Vec::new();
    let mut conv_dtypes: Vec<(String, Precision)> = Vec::new();
    // the GEMM ops, in --ops order (checked here, once, whatever --dtypes holds)
    let mut gemm_ops: Vec<&str> = Vec::new();
    for op in args.ops.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        if OPS.contains(&op) {
            gemm_ops.push(op);
            continue;
        }
        if op != "conv" && !conv::OPS.contains(&op) {
            bail!("unknown op {op:?}; choose from {}, {}, conv", OPS.join(", "), conv::OPS.join(", "));
        }
        let named: &[&str] = if op == "conv" { &conv::OPS } else { std::slice::from_ref(&op) };
        for &o in named.iter().filter(|o| conv::OPS.contains(o)) {
            if !conv_ops.iter().any(|c| c == o) {
                conv_ops.push(o.to_string());
            }
        }
    }
    for d in args.dtypes.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if d == "fp8_e4m3" {
            fp8_scalings = crate::bench::fp8::parse_scalings(&args.scalings)?;
            continue;
        }
        let Some(prec) = precision_of(d) else {
            bail!("unknown dtype {d:?}; choose from f32, tf32, f16, bf16, fp8_e4m3")
        };
        if !conv_dtypes.iter().any(|(n, _)| n == d) {
            conv_dtypes.push((d.to_string(), prec));
        }
        for &op in &gemm_ops {
            if op_applies(op, d) {
                jobs.push((d, prec, op));
            }
        }
    }
    if !conv_ops.is_empty() && conv_dtypes.is_empty() {
        bail!(
            "--ops names convolutions but --dtypes names none of f32, tf32, f16, bf16 (fp8_e4m3 has no convolutions)"
        );
    }
    if conv_ops.is_empty() {
        conv_dtypes.clear();
    }
    if jobs.is_empty() && fp8_scalings.is_empty() && conv_dtypes.is_empty() {
        bail!("nothing to tune: --dtypes and --ops select no problem");
    }
    let conv_plan = tune_conv::Plan {
        ops: &conv_ops,
        dtypes: &conv_dtypes,
        layouts: conv::parse_layouts(&args.conv_layouts)?,
        batches: conv::parse_batches(&args.conv_batches)?,
        api: conv::parse_api(&args.conv_api)?,
    };
    if args.candidates == 0 || args.candidates > 32 || args.reps == 0 {
        bail!("--candidates must be 1..=32 and --reps at least 1");
    }
    let db_path = Path::new(&args.db);
    if let Err(e) = TacticDb::check_path(db_path) {
        bail!("--db: {e}");
    }
    let gpu = Gpu::new(0).context("tune needs a CUDA GPU")?;
    if let Some(n) = args.sm_count_target {
        gpu.set_sm_count_target(Some(n)).context("--sm-count-target")?;
    }
    let gemms = !jobs.is_empty() || !fp8_scalings.is_empty();
    if gemms && !gpu.has_lt() {
        bail!("tuning GEMMs needs cuBLASLt (libcublasLt), which was not found");
    }
    // SAFETY: every buffer tune allocates is used only on gpu.stream().
    unsafe { gpu.context().disable_event_tracking() };
    let opts = TuneOptions { candidates: args.candidates, reps: args.reps, ..TuneOptions::default() };
    let mut db = TacticDb::new(identity(&gpu)?);
    // checked before any GPU time is spent: a file that save() would refuse to overwrite
    // (entries of another cuBLASLt version are no reason: save keeps them)
    if let Err(e) = TacticDb::check_writable(db_path, &db.identity) {
        bail!("--db {}: {e}", args.db);
    }
    let mut problems: Vec<(String, &str, suites::Shape, Option<Precision>)> = Vec::new();
    for &(d, prec, op) in &jobs {
        problems.extend(shapes.iter().map(|&s| (op.to_string(), d, s, Some(prec))));
    }
    for sc in &fp8_scalings {
        problems.extend(shapes.iter().map(|&s| (format!("scaled_mm/{sc}"), "fp8_e4m3", s, None)));
    }
    if !problems.is_empty() {
        println!(
            "{:<16} {:<5} {:>6} {:>6} {:>6} {:>10} {:>10} {:>7} {:>5} {:>5} {:>6} {:>6}",
            "op", "dtype", "m", "n", "k", "heur. ms", "tuned ms", "gain", "cands", "added", "wrong", "kept"
        );
    }
    for (op, d, shape, prec) in &problems {
        let (op, d, shape) = (op.as_str(), *d, *shape);
        let (report, sig, tactic) = match prec.map(|p| (p, p.input())) {
            None => match tune_fp8(&gpu, op.trim_start_matches("scaled_mm/"), shape, opts) {
                Err(e) if e.downcast_ref().is_some_and(crate::bench::fp8::not_offered) => {
                    println!("{op:<16} {d:<5} not offered here: {e}");
                    continue;
                }
                other => other?,
            },
            Some((prec, DType::F32)) => tune_one::<f32>(&gpu, op, shape, prec, opts)?,
            Some((prec, DType::F16)) => tune_one::<half::f16>(&gpu, op, shape, prec, opts)?,
            Some((prec, _)) => tune_one::<half::bf16>(&gpu, op, shape, prec, opts)?,
        };
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
        if report.graph_failed {
            // launch-bound eager time: not a measurement to keep or merge on
            println!("  not stored: graph capture failed twice, so the candidates were not timed");
            continue;
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
            db.save_dropping(db_path, &heuristic_only).with_context(|| format!("writing {}", args.db))?;
            continue;
        }
        db.entries.insert(sig, tactic);
        // saved after every problem, so an interrupted run keeps what it tuned
        db.save(db_path).with_context(|| format!("writing {}", args.db))?;
    }
    if !conv_dtypes.is_empty() {
        let n = tune_conv::run(&gpu, &conv_plan, &mut db, db_path)?;
        println!("{n} convolution plans tuned");
    }
    println!("{} tactics written to {} (merged with what was there)", db.entries.len(), args.db);
    Ok(0)
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
    let extras = RawExtras { bias: (p.epilogue() != Epilogue::None).then(|| r(&bias)), aux: None };
    // f32/tf32 inputs with f32 outputs, half inputs with half outputs: T serves both.
    // SAFETY: live buffers of this context, sized by the problem, used on gpu.stream() only.
    let out = unsafe { gpu.autotune_raw(&p, 1.0, r(&x), r(&w), 0.0, rc, extras, opts) }?;
    Ok(out)
}
