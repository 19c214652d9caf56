//! `gemmbridge bench`: the suites, shapes and JSON-lines fields of
//! `bench/peer.py`, timed the same way, with an optional side-by-side ratio.

mod args;
pub mod attn;
mod bare;
pub mod conv;
pub mod decode;
pub mod decode_shapes;
pub mod decode_step;
pub mod decoder;
mod dense;
pub mod fp8;
pub mod grouped;
mod grouped_fp8;
pub mod launch;
mod launch_decode;
pub mod layer;
pub mod moe;
pub mod norm;
pub mod report;

use std::io::Write;

use anyhow::{bail, Context};

use gemmbridge::cuda::{Backend, ConvSearch, Gpu, GpuOptions, Padding};
use gemmbridge::Precision;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::db::{check_readable, load_db};
use crate::ops::{op_applies, OPS};
use crate::row::Row;
use crate::suite_args::{parse_ops, ConvSettings, Dtypes, OpList};
use crate::suites::{self, Shape};
use crate::timing;

pub use args::{parse_backend, parse_padding, Args};
use dense::bench_cpu_dispatch;
pub(crate) use dense::{bench_gpu_dispatch, rotate, Pools};
/// The `shapes` list of a benchmark's JSON suite (`bench/attention.json`, `bench/grouped.json`),
/// `file` naming it in errors.
pub(crate) fn suite_shapes<S: serde::de::DeserializeOwned>(json: &str, file: &str) -> anyhow::Result<Vec<S>> {
    #[derive(serde::Deserialize)]
    struct Suite<S> {
        shapes: Vec<S>,
    }
    let suite: Suite<S> = serde_json::from_str(json).with_context(|| file.to_string())?;
    Ok(suite.shapes)
}

struct Sink {
    json: Option<Box<dyn Write>>,
}

impl Sink {
    /// JSON lines to `out` ("-": stdout), or nowhere.
    fn create(out: Option<&str>) -> anyhow::Result<Sink> {
        let json: Option<Box<dyn Write>> = match out {
            None => None,
            Some("-") => Some(Box::new(std::io::stdout())),
            Some(path) => Some(Box::new(std::io::BufWriter::new(
                std::fs::File::create(path).with_context(|| format!("creating {path}"))?,
            ))),
        };
        Ok(Sink { json })
    }

    fn emit(&mut self, v: &impl Serialize) -> anyhow::Result<()> {
        if let Some(w) = self.json.as_mut() {
            serde_json::to_writer(&mut *w, v)?;
            writeln!(w)?;
            w.flush()?;
        }
        Ok(())
    }
}

/// A bench run: the arguments parsed and checked before anything runs.
struct Plan {
    shapes: Vec<Shape>,
    /// The dense dtypes (bench/peer.py's names) and their precisions.
    dtypes: Vec<(String, Precision)>,
    /// The recipes of the fp8_e4m3 rows (empty: no FP8 rows).
    scalings: Vec<String>,
    /// The dense GEMM ops.
    ops: Vec<String>,
    conv_ops: Vec<String>,
    attn_ops: Vec<String>,
    grouped_ops: Vec<String>,
    norm_ops: Vec<String>,
    /// The decoder-layer ops (`bench/decoder.rs`).
    decoder_ops: Vec<String>,
    /// The paged decode-attention ops (`bench/decode.rs`).
    decode_ops: Vec<String>,
    layer_ops: Vec<String>,
    moe_ops: Vec<String>,
    /// `--moe-layout auto`: pad where the capacity rule says.
    moe_pad: bool,
    /// The recipes of the FP8 grouped rows.
    grouped_scalings: Vec<String>,
    launch: bool,
    reps: usize,
    sampling: timing::Sampling,
    conv: ConvSettings,
    conv_search: ConvSearch,
    backend: Backend,
    padding: Padding,
}

/// What the CPU benchmark leaves out, and that the library's CPU backend has most of it.
const CPU_UNTIMED: &str =
    "the convolution, attention, grouped, MoE, RMSNorm, RoPE/SwiGLU, decoder-layer and decode ops \
     are timed on a GPU only: skipped; gemmbridge::cpu computes attention, grouped GEMMs, RMSNorm, RoPE, SwiGLU and \
     the decoder layer, untimed here";

impl Plan {
    fn parse(args: &Args) -> anyhow::Result<Plan> {
        let shapes = args.shared.shapes()?;
        let Dtypes { dense: dtypes, scalings } = args.shared.dtypes()?;
        if dtypes.is_empty() && scalings.is_empty() {
            bail!("no dtype to run: give --dtypes with at least one of f32, tf32, f16, bf16, fp8_e4m3");
        }
        let OpList {
            gemm: ops,
            conv: conv_ops,
            attn: attn_ops,
            grouped: grouped_ops,
            norm: norm_ops,
            layer: layer_ops,
            decoder: decoder_ops,
            decode: decode_ops,
            moe: moe_ops,
            launch,
        } = parse_ops(&args.ops, true)?;
        decoder::parse_shapes(&args.layer_shapes)?;
        // checked whatever --ops holds, as the convolution flags are
        attn::parse_shapes(&args.shared.attn_shapes)?;
        grouped::parse_backend(&args.grouped_backend)?;
        let grouped_scalings = fp8::parse_scalings("--grouped-scalings", &args.grouped_scalings)?;
        gemmbridge::grouped::streams::GroupedSettings::check_streams(args.grouped_streams)?;
        let reps = args.reps.unwrap_or(30);
        if !(1..=100_000).contains(&reps) {
            bail!("--reps {reps} is not between 1 and 100000");
        }
        let sampling = timing::Sampling {
            warmup: 5,
            reps,
            heat_ms: timing::check_ms("--heat-ms", args.heat_ms)?,
            gap_ms: timing::check_ms("--gap-ms", args.gap_ms)?,
        };
        let conv = args.shared.conv()?;
        let conv_search = conv::parse_search(&args.conv_search)?;
        let lists =
            [&ops, &conv_ops, &attn_ops, &grouped_ops, &norm_ops, &decoder_ops, &decode_ops, &layer_ops, &moe_ops];
        if !launch && scalings.is_empty() && lists.iter().all(|o| o.is_empty()) {
            bail!("no op to run: give --ops with at least one of {}, launch", OPS.join(", "));
        }
        let half = dtypes.iter().any(|(_, p)| matches!(p.input(), gemmbridge::DType::F16 | gemmbridge::DType::BF16));
        let halves = [&attn_ops, &norm_ops, &decode_ops, &moe_ops].iter().any(|o| !o.is_empty());
        if (halves || grouped_ops.iter().any(|o| !grouped::is_fp8(o))) && !half {
            bail!("--ops names attention, RMSNorm, decode or grouped GEMM rows but --dtypes names neither f16 nor bf16 (their input types)");
        }
        if !layer_ops.is_empty() && dtypes.iter().all(|(n, _)| n == "tf32") {
            bail!("--ops names rope or swiglu rows but --dtypes names none of f32, f16, bf16 (their element types)");
        }
        let backend = parse_backend(&args.backend)?;
        let padding = parse_padding(&args.padding)?;
        Ok(Plan {
            shapes,
            dtypes,
            scalings,
            ops,
            conv_ops,
            attn_ops,
            grouped_ops,
            norm_ops,
            decoder_ops,
            decode_ops,
            layer_ops,
            moe_ops,
            moe_pad: match args.moe_layout.as_str() {
                "auto" => true,
                "sorted" => false,
                other => bail!("unknown MoE layout {other:?}; choose auto or sorted"),
            },
            grouped_scalings,
            launch,
            reps,
            sampling,
            conv,
            conv_search,
            backend,
            padding,
        })
    }

    /// Without a GPU (`reason`, one line): the CPU backend's share of the plan (the small "cpu"
    /// suite, matmul and linear), with a note for each option ignored and each op skipped.
    fn cut_to_cpu(&mut self, args: &Args, reason: &str) -> anyhow::Result<()> {
        let suite = &args.shared.suite;
        if suite != "default" && suite != "cpu" {
            bail!("suite {suite:?} needs a CUDA GPU ({reason}); without one use --suite cpu");
        }
        eprintln!("no CUDA GPU: {reason}");
        eprintln!("running the CPU backend (matrixmultiply crate) on the small 'cpu' suite");
        eprintln!("  (f32 accumulation; tf32 runs as f32; fused ops and launch rows need a GPU)");
        if args.backend != "auto"
            || args.db.is_some()
            || args.heat_ms > 0.0
            || args.gap_ms > 0.0
            || args.padding != "on"
        {
            eprintln!(
                "  (--backend, --db, --heat-ms, --gap-ms and --padding apply to the GPU only and are ignored here)"
            );
        }
        if let Some(r) = args.reps.filter(|&r| r > 10) {
            eprintln!("  (--reps {r} is capped at 10 on the CPU backend)");
        }
        self.shapes = suites::CPU.to_vec();
        self.ops.retain(|o| o == "matmul" || o == "linear");
        self.launch = false;
        if !self.scalings.is_empty() {
            eprintln!("  (fp8_e4m3 needs a GPU with FP8 tensor cores: skipped)");
            self.scalings.clear();
        }
        let gpu_only = [
            &mut self.conv_ops,
            &mut self.attn_ops,
            &mut self.grouped_ops,
            &mut self.norm_ops,
            &mut self.layer_ops,
            &mut self.decoder_ops,
            &mut self.decode_ops,
            &mut self.moe_ops,
        ];
        if gpu_only.iter().any(|o| !o.is_empty()) {
            eprintln!("  ({CPU_UNTIMED})");
            gpu_only.into_iter().for_each(Vec::clear);
        }
        if self.dtypes.is_empty() {
            bail!("nothing to run on the CPU backend: it runs f32, tf32, f16 and bf16, and --dtypes gave none of them");
        }
        if self.ops.is_empty() {
            bail!("nothing to run: without a GPU `bench` times only the matmul and linear ops ({CPU_UNTIMED})");
        }
        Ok(())
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let mut plan = Plan::parse(&args)?;
    // the files the run reads are read before a GPU is opened or anything is timed
    if let Some(db) = &args.db {
        check_readable("--db", db)?;
    }
    let peer = match &args.peer {
        Some(path) => Some(report::read_peer(path).with_context(|| format!("reading peer file {path}"))?),
        None => None,
    };
    let gpu = open_gpu(&args, &mut plan)?;
    let env = env_line(&args, &plan, gpu.as_ref())?;
    let device = env.get("device").and_then(|d| d.as_str()).unwrap_or("cpu").to_string();
    let our_gap = env.get("gap_ms").and_then(|g| g.as_f64()).unwrap_or(0.0);
    let peer = peer.map(|(theirs, rows)| {
        report::warn_unlike(&theirs, &device, our_gap);
        rows
    });
    // the output file is created only once everything that can fail early has been read
    let mut sink = Sink::create(args.out.as_deref())?;
    sink.emit(&env)?;
    let mut rows = gemm_rows(gpu.as_ref(), &plan, &mut sink)?;
    if let (false, Some(g)) = (plan.conv_ops.is_empty(), &gpu) {
        rows.extend(conv_rows(g, &plan, &mut sink)?);
    }
    if let (false, Some(g)) = (plan.attn_ops.is_empty(), &gpu) {
        let names = attn::parse_shapes(&args.shared.attn_shapes)?;
        rows.extend(attn::bench(g, (&plan.attn_ops, &names), &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (false, Some(g)) = (plan.grouped_ops.is_empty(), &gpu) {
        rows.extend(grouped::bench(g, &plan.grouped_ops, &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
        let scalings = &plan.grouped_scalings;
        rows.extend(grouped_fp8::bench(g, &plan.grouped_ops, scalings, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (false, Some(g)) = (plan.norm_ops.is_empty(), &gpu) {
        rows.extend(norm::bench(g, &plan.norm_ops, &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (false, Some(g)) = (plan.decode_ops.is_empty(), &gpu) {
        rows.extend(decode::bench(g, &plan.decode_ops, &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (false, Some(g)) = (plan.moe_ops.is_empty(), &gpu) {
        rows.extend(moe::bench(g, (&plan.moe_ops, plan.moe_pad), &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (false, Some(g)) = (plan.decoder_ops.is_empty(), &gpu) {
        let shapes = decoder::parse_shapes(&args.layer_shapes)?;
        let ops = (&plan.decoder_ops[..], &shapes[..], &plan.scalings[..]);
        rows.extend(decoder::bench(g, ops, &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    let mut table = match &gpu {
        Some(_) => format!("device: {device}\n{}", report::table(&rows, peer.as_deref(), false)),
        None => format!(
            "device: CPU (gemmbridge's CPU backend, the matrixmultiply crate; no CUDA GPU found)\n{}",
            report::table(&rows, peer.as_deref(), true)
        ),
    };
    if let (false, Some(g)) = (plan.layer_ops.is_empty(), &gpu) {
        table.push_str(&layer::bench(g, &plan.layer_ops, &plan.dtypes, plan.sampling, &mut |r| sink.emit(r))?);
    }
    if let (true, Some(g)) = (plan.launch, &gpu) {
        table.push_str(&launch_rows(g, &plan, &args, &mut sink)?);
    }
    if args.out.as_deref() == Some("-") {
        eprint!("{table}");
    } else {
        print!("{table}");
    }
    Ok(0)
}

/// GPU 0 set up as the arguments say, or `None` without one (the plan then cut to the CPU
/// backend's share).
fn open_gpu(args: &Args, plan: &mut Plan) -> anyhow::Result<Option<Gpu>> {
    let options = GpuOptions::default()
        .backend(plan.backend)
        .padding(plan.padding)
        .grouped_backend(grouped::parse_backend(&args.grouped_backend)?)
        .grouped_streams(args.grouped_streams);
    match Gpu::with_options(0, options) {
        Ok(g) => {
            // SAFETY: every buffer the benchmark allocates is created, used and dropped on
            // the one stream g.stream(), so cudarc's cross-stream events (which would add
            // driver calls to every timed GEMM) have nothing to order.
            unsafe { g.context().disable_event_tracking() };
            if let Some(db) = &args.db {
                let n = load_db(&g, db)?;
                eprintln!("tactic database {db}: {n} tuned entries loaded");
            }
            Ok(Some(g))
        }
        Err(e @ gemmbridge::Error::OutOfRange { .. }) => Err(anyhow::Error::new(e).context("--grouped-streams")),
        Err(e) => {
            plan.cut_to_cpu(args, &crate::gpu::why_not(&e))?;
            Ok(None)
        }
    }
}

/// The run's first JSON line (`"op": "env"`): the device, libraries and settings.
fn env_line(args: &Args, plan: &Plan, gpu: Option<&Gpu>) -> anyhow::Result<serde_json::Value> {
    Ok(match gpu {
        Some(g) => {
            let i = g.info()?;
            serde_json::json!({"op": "env", "backend": format!("gemmbridge-{}", args.backend), "device": i.name,
                "cublas": format!("{}.{}.{}", i.cublas_version.0, i.cublas_version.1, i.cublas_version.2),
                "cublaslt": i.cublaslt_version,
                "driver_cuda": gemmbridge::cuda::cuda_version_string(i.driver_cuda_version),
                "reps": plan.reps, "heat_ms": plan.sampling.heat_ms, "gap_ms": plan.sampling.gap_ms,
                "padding": args.padding, "cudnn": gemmbridge::cuda::cudnn_version(),
                "conv_api": args.shared.conv_api, "conv_search": args.conv_search,
                "grouped_backend": args.grouped_backend, "grouped_streams": args.grouped_streams})
        }
        None => serde_json::json!({"op": "env", "backend": "gemmbridge-cpu", "device": "cpu",
            "reps": plan.reps.min(10), "heat_ms": 0.0, "gap_ms": 0.0}),
    })
}

/// The dense GEMM rows, then the FP8 rows, under one progress bar.
fn gemm_rows(gpu: Option<&Gpu>, plan: &Plan, sink: &mut Sink) -> anyhow::Result<Vec<Row>> {
    let per_shape: u64 =
        plan.dtypes.iter().map(|(d, _)| plan.ops.iter().filter(|o| op_applies(o, d)).count() as u64).sum::<u64>()
            + plan.scalings.len() as u64;
    let bar = ProgressBar::new(per_shape * plan.shapes.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut pools = Pools::default();
    let mut rows = dense_rows(gpu, plan, &mut pools, &bar, sink)?;
    if let (false, Some(g)) = (plan.scalings.is_empty(), gpu) {
        for &shape in &plan.shapes {
            bar.set_message(format!("fp8_e4m3 {shape:?}"));
            for r in fp8::bench(g, &mut pools, shape, &plan.scalings, plan.sampling)? {
                sink.emit(&r)?;
                rows.push(r);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// The dense GEMM rows: per dtype and shape, every op that applies.
fn dense_rows(
    gpu: Option<&Gpu>,
    plan: &Plan,
    pools: &mut Pools,
    bar: &ProgressBar,
    sink: &mut Sink,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (name, precision) in &plan.dtypes {
        let ops: Vec<&str> = plan.ops.iter().map(String::as_str).filter(|o| op_applies(o, name)).collect();
        for &shape in &plan.shapes {
            bar.set_message(format!("{name} {shape:?}"));
            let new = match gpu {
                Some(g) => bench_gpu_dispatch(g, pools, name, *precision, shape, &ops, plan.sampling)?,
                None => bench_cpu_dispatch(name, *precision, shape, &ops, plan.reps.min(10))?,
            };
            for r in new {
                sink.emit(&r)?;
                rows.push(r);
                bar.inc(1);
            }
        }
    }
    Ok(rows)
}

/// The convolution rows (cuDNN, ResNet-50's convolutions).
fn conv_rows(gpu: &Gpu, plan: &Plan, sink: &mut Sink) -> anyhow::Result<Vec<Row>> {
    let conv_plan = conv::Plan {
        ops: &plan.conv_ops,
        dtypes: &plan.dtypes,
        layouts: plan.conv.layouts.clone(),
        batches: plan.conv.batches.clone(),
        search: plan.conv_search,
        api: plan.conv.api,
    };
    conv::bench(gpu, &conv_plan, plan.sampling, &mut |r| sink.emit(r))
}

/// The launch row of every dtype but tf32; returns their table.
fn launch_rows(gpu: &Gpu, plan: &Plan, args: &Args, sink: &mut Sink) -> anyhow::Result<String> {
    let mut launches = Vec::new();
    for (name, _) in plan.dtypes.iter().filter(|(n, _)| n != "tf32") {
        let row = launch::measure(gpu, name, args.db.as_deref())?;
        sink.emit(&row)?;
        launches.push(row);
    }
    let peer_launch = match &args.peer {
        Some(path) => report::read_peer_launch(path)?,
        None => Vec::new(),
    };
    Ok(report::launch_table(&launches, &peer_launch))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// Without a GPU, ops the CPU benchmark does not time are named as such, not as ops the
    /// CPU backend lacks.
    #[test]
    fn the_cpu_cut_says_what_it_times_and_what_the_cpu_backend_has() {
        let cli = crate::Cli::try_parse_from(["gemmbridge", "bench", "--ops", "rmsnorm"]).expect("parses");
        let crate::Command::Bench(args) = cli.command else { unreachable!("bench") };
        let mut plan = super::Plan::parse(&args).expect("a plan");
        let e = plan.cut_to_cpu(&args, "no driver").unwrap_err().to_string();
        assert!(e.contains("without a GPU `bench` times only the matmul and linear ops"), "{e}");
        assert!(e.contains("gemmbridge::cpu computes attention, grouped GEMMs, RMSNorm"), "{e}");
        assert!(!e.contains("it runs only"), "{e}");
        let cli = crate::Cli::try_parse_from(["gemmbridge", "bench", "--ops", "matmul,rmsnorm"]).expect("parses");
        let crate::Command::Bench(args) = cli.command else { unreachable!("bench") };
        let mut plan = super::Plan::parse(&args).expect("a plan");
        plan.cut_to_cpu(&args, "no driver").unwrap();
        assert_eq!(plan.ops, ["matmul"]);
        assert!(plan.norm_ops.is_empty());
    }
}
