//! `gemmbridge train-bench`: the step time (forward + backward) of the training layers, in the
//! benchmark's JSON-lines schema, beside `bench/train_peer.py` (PyTorch `nn.Linear` + autograd).
//!
//! Rows (`m` = tokens, `n` = the layer's out / the block's hidden width f, `k` = in / d):
//! - `mlp_train`: `Linear(d, f) → GELU-tanh → Linear(f, d)`, both with biases;
//! - `linear_train`: one `Linear(in, out)` with a bias.
//!
//! One step: the training forward, then the backward with the input gradient (the block's input
//! comes from an earlier layer in a real model), gradients overwritten. Timed like every bench
//! row (`timing::time_gpu`). Then, over 10 further steps, CUDA events around each GEMM (the
//! layers' GEMM observer, `gemm_events.rs`) and around the 10 steps: `gemm_ms` (the step's GEMMs alone), `pass_ms` (the step in that pass)
//! and `beyond_ms = pass_ms − gemm_ms`, what the step costs beyond its GEMMs (taken from one
//! pass: the GPU's clock differs between passes by more than the difference). With
//! `--gelu-forward kernel` or `--gelu-backward kernel` the block's GELU kernels are part of
//! `beyond_ms` (in f32 and fp8 rows always); the env row records the placements asked for,
//! which apply to the tf32, f16 and bf16 mlp_train rows.

use anyhow::bail;
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::train::{Mlp, MlpOptions};
use gemmbridge::cuda::Gpu;
use gemmbridge::train::fp8::Fp8Training;
use gemmbridge::train::{init_params, Activation, GeluBiasGrad, GeluPlacement, GradMode, LinearSpec, Placement};
use gemmbridge::{Element, Precision};
use serde::Serialize;

use crate::db::{check_readable, load_db};
use crate::gemm_events::GemmEvents;
use crate::ops::precision_of;
use crate::timing;

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated dtypes: f32, tf32, f16, bf16, and fp8 (FP8 layers, `Mlp::new_fp8`:
    /// bf16 tensors, every GEMM in FP8 with the default recipe; its peer is train_peer.py's fp8,
    /// a `torch._scaled_mm` autograd function with the same recipe).
    #[arg(long, default_value = "bf16,f16")]
    dtypes: String,
    /// Comma-separated ops: mlp_train (d×f = 4096×14336 and 4096×16384), linear_train (4096³
    /// and the llm suite's 8B-class projections, 4096 tokens).
    #[arg(long, default_value = "mlp_train,linear_train")]
    ops: String,
    /// Tokens per step.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Timed samples per row (median reported).
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Idle GPU time before each row's warm-up, ms, as `bench --gap-ms`; give
    /// bench/train_peer.py the same --gap-ms.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    gap_ms: f64,
    /// Tactic database from `gemmbridge tune` to use (a file that cannot be read is an error,
    /// before anything runs).
    #[arg(long)]
    db: Option<String>,
    /// Autotune every GEMM of a step (cuBLASLt's candidates, timed) before timing the row.
    #[arg(long)]
    tune: bool,
    /// Where the MLP block's GELU-tanh forward runs: in the first GEMM's epilogue or in a
    /// kernel after it. The three --gelu-* options apply to mlp_train rows in tf32, f16 and
    /// bf16 only (f32 and fp8 layers always apply the GELU by kernel).
    #[arg(long, value_enum, default_value_t = Place::Epilogue, value_name = "PLACE")]
    gelu_forward: Place,
    /// Where its backward runs: in the second layer's data-gradient GEMM or in a kernel
    /// after it.
    #[arg(long, value_enum, default_value_t = Place::Epilogue, value_name = "PLACE")]
    gelu_backward: Place,
    /// With the backward in an epilogue: which GEMM writes the first layer's bias gradient,
    /// its own weight-gradient GEMM (cuBLASLt's BGRADB) or the second layer's data-gradient
    /// GEMM together with the GELU backward (DGELU_BGRAD).
    #[arg(long, value_enum, default_value_t = BiasGradBy::WeightGrad, value_name = "GEMM")]
    gelu_bias_grad: BiasGradBy,
    /// Print each GEMM's time (layer, role) beside the row.
    #[arg(long)]
    breakdown: bool,
    /// Write JSON lines here ("-": stdout).
    #[arg(long)]
    out: Option<String>,
}

/// A [`Placement`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Place {
    Epilogue,
    Kernel,
}

impl From<Place> for Placement {
    fn from(p: Place) -> Placement {
        match p {
            Place::Epilogue => Placement::Epilogue,
            Place::Kernel => Placement::Kernel,
        }
    }
}

/// A [`GeluBiasGrad`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum BiasGradBy {
    WeightGrad,
    DataGrad,
}

impl From<BiasGradBy> for GeluBiasGrad {
    fn from(b: BiasGradBy) -> GeluBiasGrad {
        match b {
            BiasGradBy::WeightGrad => GeluBiasGrad::WeightGrad,
            BiasGradBy::DataGrad => GeluBiasGrad::DataGrad,
        }
    }
}

/// A row: the bench schema's fields plus the GEMM split.
#[derive(Serialize)]
struct Row {
    op: &'static str,
    dtype: String,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    median_ms: f64,
    min_ms: f64,
    tflops: f64,
    gemm_ms: f64,
    pass_ms: f64,
    beyond_ms: f64,
}

/// (op, n, k): the block's f and d, or the layer's out and in.
const SHAPES: [(&str, usize, usize); 6] = [
    ("mlp_train", 14336, 4096),
    ("mlp_train", 16384, 4096),
    ("linear_train", 4096, 4096),
    ("linear_train", 6144, 4096),
    ("linear_train", 28672, 4096),
    ("linear_train", 4096, 14336),
];

fn layers(op: &str, n: usize, k: usize) -> Vec<LinearSpec> {
    match op {
        "mlp_train" => vec![LinearSpec::new(k, n).with_activation(Activation::GeluTanh), LinearSpec::new(n, k)],
        _ => vec![LinearSpec::new(k, n)],
    }
}

fn row<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    op: &'static str,
    dtype: &str,
    precision: Precision,
    (tokens, n, k): (usize, usize, usize),
    args: &Args,
) -> anyhow::Result<Row> {
    let reps = args.reps;
    let layers = layers(op, n, k);
    let params = init_params(&layers, 1);
    let gelu = GeluPlacement {
        forward: args.gelu_forward.into(),
        backward: args.gelu_backward.into(),
        bias_grad: args.gelu_bias_grad.into(),
    };
    let mut mlp = match dtype {
        "fp8" => Mlp::<T>::new_fp8(gpu, &layers, Fp8Training::default(), &params)?,
        _ => Mlp::<T>::with_options(gpu, &layers, precision, &params, MlpOptions::default().gelu(gelu))?,
    };
    let s = gpu.stream();
    let x: CudaSlice<T> = s.clone_htod(&crate::random::normal::<T>(tokens * k))?;
    let out = layers.last().map_or(0, |l| l.out_features);
    let dy: CudaSlice<T> = s.clone_htod(&crate::random::normal::<T>(tokens * out))?;
    let mut dx: CudaSlice<T> = s.alloc_zeros(tokens * k)?;
    if args.tune {
        let opts = gemmbridge::cuda::TuneOptions::default();
        for (layer, role, r, _, _) in mlp.autotune(gpu, &x, tokens, &dy, Some(&mut dx), opts)? {
            eprintln!(
                "  tuned layer {layer} {role:?}: first choice {:.3} ms, kept {:.3} ms",
                r.heuristic_ms, r.best_ms
            );
        }
    }
    let mut step = |mlp: &mut Mlp<T>| -> gemmbridge::Result<()> {
        mlp.forward(gpu, &x, tokens, true)?;
        mlp.backward(gpu, &x, &dy, Some(&mut dx), GradMode::Overwrite)
    };
    let sampling = timing::Sampling { gap_ms: args.gap_ms, ..timing::Sampling::new(5, reps) };
    let t = timing::time_gpu(gpu, sampling, &mut || step(&mut mlp))?;
    // the split, in one pass: the steps' time and their GEMMs' time from the same steps
    let events = GemmEvents::observe(gpu, &mut mlp);
    const STEPS: usize = 10;
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = s.record_event(flags)?;
    for _ in 0..STEPS {
        step(&mut mlp)?;
    }
    let end = s.record_event(flags)?;
    let each = events.take()?;
    mlp.set_gemm_observer(None);
    let gemm_ms = each.iter().map(|g| g.2).sum::<f64>() / STEPS as f64;
    if args.breakdown {
        let per_step = each.len() / STEPS;
        for (layer, role, _) in each.iter().take(per_step) {
            let ms: f64 =
                each.iter().filter(|g| (g.0, g.1) == (*layer, *role)).map(|g| g.2).sum::<f64>() / STEPS as f64;
            eprintln!("  layer {layer} {role:?}: {ms:.3} ms");
        }
    }
    let pass_ms = f64::from(start.elapsed_ms(&end)?) / STEPS as f64;
    let flops = 6.0 * tokens as f64 * n as f64 * k as f64 * layers.len() as f64;
    Ok(Row {
        op,
        dtype: dtype.into(),
        m: tokens,
        n,
        k,
        batch: 1,
        median_ms: t.median_ms,
        min_ms: t.min_ms,
        tflops: flops / (t.median_ms * 1e-3) / 1e12,
        gemm_ms,
        pass_ms,
        beyond_ms: pass_ms - gemm_ms,
    })
}

pub fn run(mut args: Args) -> anyhow::Result<i32> {
    let ops = crate::lists::entries("--ops", &args.ops)?;
    for o in &ops {
        if *o != "mlp_train" && *o != "linear_train" {
            bail!("unknown op {o:?}; choose from mlp_train, linear_train");
        }
    }
    let mut dtypes = Vec::new();
    for d in crate::lists::entries("--dtypes", &args.dtypes)? {
        match (d, precision_of(d)) {
            ("fp8", _) => dtypes.push((d.to_string(), Precision::BF16)),
            (_, Some(p)) => dtypes.push((d.to_string(), p)),
            (_, None) => bail!("unknown dtype {d:?}; choose from f32, tf32, f16, bf16, fp8"),
        }
    }
    if ops.is_empty() || dtypes.is_empty() {
        bail!("nothing to run: give --ops and --dtypes");
    }
    if !(1..=100_000).contains(&args.reps) {
        bail!("--reps {} is not between 1 and 100000", args.reps);
    }
    if args.tokens == 0 {
        bail!("--tokens 0: a step needs at least one token");
    }
    let placed = (args.gelu_forward, args.gelu_backward, args.gelu_bias_grad)
        != (Place::Epilogue, Place::Epilogue, BiasGradBy::WeightGrad);
    let served =
        ops.contains(&"mlp_train") && dtypes.iter().any(|(d, _)| ["tf32", "f16", "bf16"].contains(&d.as_str()));
    if placed && !served {
        eprintln!("note: --gelu-* apply to mlp_train rows in tf32, f16 and bf16 only; none of those runs here");
    }
    // checked once, and the checked value (-0 as 0) is what the rows and the env row use
    args.gap_ms = timing::check_ms("--gap-ms", args.gap_ms)?;
    if let Some(db) = &args.db {
        check_readable("--db", db)?;
    }
    let gpu = crate::gpu::open("train-bench")?;
    // SAFETY: every buffer here is created, used and dropped on the one stream gpu.stream().
    unsafe { gpu.context().disable_event_tracking() };
    if let Some(db) = &args.db {
        eprintln!("tactic database {db}: {} tuned entries loaded", load_db(&gpu, db)?);
    }
    let mut out: Box<dyn std::io::Write> = match args.out.as_deref() {
        None | Some("-") => Box::new(std::io::stdout()),
        Some(path) => Box::new(std::fs::File::create(path)?),
    };
    let i = gpu.info()?;
    let env = serde_json::json!({"op": "env", "backend": "gemmbridge-train", "device": i.name,
        "cublaslt": i.cublaslt_version, "reps": args.reps, "tokens": args.tokens, "gap_ms": args.gap_ms,
        "gelu_forward": args.gelu_forward, "gelu_backward": args.gelu_backward,
        "gelu_bias_grad": args.gelu_bias_grad});
    writeln!(out, "{env}")?;
    for (dtype, precision) in &dtypes {
        for &(op, n, k) in SHAPES.iter().filter(|(op, _, _)| ops.contains(op)) {
            let shape = (args.tokens, n, k);
            let r = match precision.input() {
                gemmbridge::DType::F16 => row::<gemmbridge::half::f16>(&gpu, op, dtype, *precision, shape, &args),
                gemmbridge::DType::BF16 => row::<gemmbridge::half::bf16>(&gpu, op, dtype, *precision, shape, &args),
                _ => row::<f32>(&gpu, op, dtype, *precision, shape, &args),
            }?;
            eprintln!(
                "{op:<13} {dtype:<5} {:>5}x{:>5}x{:>5}  {:>8.3} ms  {:>6.1} TF/s  GEMMs {:>8.3} of {:>8.3} ms  beyond {:>7.3} ms",
                r.m, r.n, r.k, r.median_ms, r.tflops, r.gemm_ms, r.pass_ms, r.beyond_ms
            );
            writeln!(out, "{}", serde_json::to_string(&r)?)?;
        }
    }
    Ok(0)
}
