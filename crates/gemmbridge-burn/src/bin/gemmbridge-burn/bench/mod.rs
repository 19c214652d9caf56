//! `gemmbridge-burn bench`: on the same burn CUDA buffers, per shape and dtype,
//!
//! - **burn**: burn's own `matmul` (burn 0.21, autotuned);
//! - **adapter**: `gemmbridge_burn::matmul` with device ordering (the default: no host wait);
//! - **adapter, host wait**: the same with host-wait ordering (a wait for cubecl's stream before
//!   each GEMM and for gemmbridge's after it);
//! - **raw**: gemmbridge's `gemm_raw` on the same addresses, calls enqueued back to back
//!   (stream-ordered: what the adapter would cost with a native-stream hook in cubecl);
//! - **raw+wait**: `gemm_raw` followed by a host wait on the stream, per call (the waits alone,
//!   measured in gemmbridge itself);
//! - **raw+edges**: `gemm_raw` between the device ordering's two edges (its three one-thread
//!   kernels and the flag write), per call, without the adapter's allocation and lookups:
//!   the edges' cost on the GPU;
//! - **raw+spin**: `gemm_raw` back to back while the device ordering's wait kernel spins on
//!   cubecl's stream (what sharing an SM with it costs the GEMM);
//! - **host floor**: the host's own time per device-ordered adapter call (output allocation,
//!   address lookups, the two flag kernels, the enqueue), timed over a short loop of calls
//!   without any wait, before the GPU is waited for.
//!
//! Times are wall clock over a loop of calls ended by a device sync, divided by the calls (ms
//! per call), median over `--reps` loops after a warm-up (which also runs burn's autotuner).
//! burn is timed first, in its own block; then adapter, raw and raw+wait in interleaved rounds
//! (one loop of each per round) after ~300 ms of the adapter, so that the GPU's clock drift
//! under its power limit reaches the three alike.
//! Inputs rotate over enough pairs to exceed 256 MiB, so L2 does not flatter small shapes.

mod case;
mod rounds;

use std::io::Write;

use anyhow::Context;
use burn::tensor::FloatDType;
use burn_cubecl::CubeBackend;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use gemmbridge::cuda::Gpu;
use gemmbridge::Precision;
use serde::Serialize;

use case::Case;

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Arguments of `gemmbridge-burn bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Suites of the peer's (bench/peer.py) shapes, comma-separated (square, llm, small, default).
    #[arg(long, default_value = "square,llm")]
    suite: String,
    /// Extra shapes `MxNxK`, comma-separated (e.g. the GEMMs of a training step), measured after
    /// the suites'; `--suite ""` leaves only these.
    #[arg(long, default_value = "")]
    shapes: String,
    /// Precisions, comma-separated: f32 (strict), tf32 (f32 tensors, the adapter's opt-in tf32
    /// mode), f16, bf16.
    #[arg(long, default_value = "f32,tf32,f16,bf16")]
    dtypes: String,
    /// Timed loops per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Target wall time of one timed loop, in ms.
    #[arg(long, default_value_t = 60.0)]
    loop_ms: f64,
    /// JSON lines, one per (shape, dtype).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// SMs the adapter's device-ordered GEMMs leave to the ordering's wait kernel
    /// (`gemmbridge_burn::set_sm_reserve`; 0: none). The raw columns use every SM.
    #[arg(long, default_value_t = 1)]
    sm_reserve: u32,
    /// A tactic database (`gemmbridge tune`) for the adapter's GEMMs and the raw ones alike:
    /// entries tuned on the whole GPU serve host-wait and raw calls, entries tuned with
    /// `--sm-count-target` (the SM count less --sm-reserve) the device-ordered ones.
    #[arg(long)]
    db: Option<std::path::PathBuf>,
    /// Also time, per call, each step the adapter takes (output allocation, address lookups,
    /// cubecl sync, GEMM enqueue, GEMM wait, device-thread round trip, output drop) by running
    /// the same steps here with host timestamps: where the adapter's cost goes.
    #[arg(long)]
    steps: bool,
}

/// Median host time per call of each step of the adapter's path (`--steps`), µs.
#[derive(Serialize, Clone, Copy, Debug)]
struct Steps {
    /// Allocating the output from cubecl's pool (`empty_device_contiguous_dtype`).
    alloc: f64,
    /// The three `get_resource` lookups, on cubecl's device thread.
    lookups: f64,
    /// `client.sync()`: waiting for the caller's cubecl stream.
    cubecl_sync: f64,
    /// Enqueueing the GEMM (`gemm_raw`).
    enqueue: f64,
    /// Waiting for the GEMM (stream synchronize).
    gemm_wait: f64,
    /// `client.exclusive` wall time minus the task's own time: the device-thread round trip.
    round_trip: f64,
    /// Dropping the output tensor.
    drop: f64,
}

/// One (shape, dtype) result; times in ms per call, costs in µs per call.
#[derive(Serialize)]
struct Row {
    m: usize,
    n: usize,
    k: usize,
    dtype: String,
    burn_ms: f64,
    /// The adapter, device ordering.
    adapter_ms: f64,
    /// The adapter, host-wait ordering.
    adapter_host_wait_ms: f64,
    raw_ms: f64,
    raw_wait_ms: f64,
    /// The raw GEMM with the device ordering's wait kernel spinning beside it.
    raw_spin_ms: f64,
    /// The raw GEMM between the device ordering's edges, per call.
    raw_edges_ms: f64,
    /// Host time per device-ordered adapter call with no wait, µs.
    host_floor_us: f64,
    burn_tflops: f64,
    adapter_tflops: f64,
    raw_tflops: f64,
    /// burn_ms / adapter_ms.
    speedup_vs_burn: f64,
    /// adapter_ms / raw_ms.
    adapter_over_raw: f64,
    /// adapter_host_wait_ms / raw_ms.
    host_wait_over_raw: f64,
    /// raw_spin_ms / raw_ms.
    spin_over_raw: f64,
    /// raw_edges_ms / raw_ms.
    edges_over_raw: f64,
    /// burn_ms / adapter_host_wait_ms.
    host_wait_speedup_vs_burn: f64,
    /// (adapter_ms − raw_ms) in µs: everything the adapter adds to a stream-ordered GEMM.
    adapter_cost_us: f64,
    /// (raw_wait_ms − raw_ms) in µs: the host wait per call alone.
    wait_cost_us: f64,
    /// ‖adapter − burn‖ / ‖burn‖ on the first input pair.
    rel_vs_burn: f64,
    /// SMs the device-ordered adapter GEMMs left free (`--sm-reserve`).
    sm_reserve: u32,
    /// Input pairs rotated through.
    pairs: usize,
    /// Per-step times of the adapter's path (only with `--steps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    steps_us: Option<Steps>,
    /// Whether burn's matmul was autotuned (built with the `burn-autotune` feature).
    burn_autotune: bool,
}

fn dtype_of(name: &str) -> anyhow::Result<(FloatDType, Precision)> {
    Ok(match name {
        "f32" => (FloatDType::F32, Precision::F32),
        "tf32" => (FloatDType::F32, Precision::TF32),
        "f16" => (FloatDType::F16, Precision::F16),
        "bf16" => (FloatDType::BF16, Precision::BF16),
        _ => anyhow::bail!("unknown dtype {name:?}; choose f32, tf32, f16 or bf16"),
    })
}

/// The dtypes of `--dtypes` (name, burn's dtype, gemmbridge's precision) and the shapes of
/// `--suite` and `--shapes`.
type Cases<'a> = (Vec<(&'a str, FloatDType, Precision)>, Vec<(usize, usize, usize)>);

/// `--dtypes`, `--suite` and `--shapes` parsed, each refused when it names nothing.
fn cases(args: &BenchArgs) -> anyhow::Result<Cases<'_>> {
    let dtypes: Vec<(&str, FloatDType, Precision)> = args
        .dtypes
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| dtype_of(d).map(|(t, p)| (d, t, p)))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!dtypes.is_empty(), "--dtypes names no dtype");
    let mut shapes = Vec::new();
    for s in args.suite.split(',').filter(|s| !s.is_empty()) {
        shapes.extend(gemmbridge_lab::suites::shapes(s).with_context(|| format!("unknown suite {s:?}"))?);
    }
    for s in args.shapes.split(',').filter(|s| !s.is_empty()) {
        let dims: Vec<usize> =
            s.split('x').map(str::parse).collect::<Result<_, _>>().with_context(|| format!("shape {s:?}"))?;
        anyhow::ensure!(dims.len() == 3, "shape {s:?}: expected MxNxK");
        anyhow::ensure!(dims.iter().all(|&d| d > 0), "shape {s:?}: every dimension must be at least 1");
        shapes.push((dims[0], dims[1], dims[2]));
    }
    anyhow::ensure!(!shapes.is_empty(), "--suite and --shapes name no shape");
    Ok((dtypes, shapes))
}

/// The engine for the default CUDA device, with `--db`'s tactics loaded into it and into the
/// adapter, and `--sm-reserve` checked against its SMs.
fn engine(args: &BenchArgs, dev: &CudaDevice) -> anyhow::Result<Gpu> {
    let gpu = Gpu::new(dev.index).context("gemmbridge GPU")?;
    let sms = gpu.info().context("device query")?.sm_count as u32;
    if let Some(path) = &args.db {
        anyhow::ensure!(path.exists(), "--db {}: no such file", path.display());
        let (db, warnings) = gemmbridge::cuda::tactics::TacticDb::load(path, &gpu.info()?.tactic_identity());
        for w in warnings {
            eprintln!("warning: {w}");
        }
        println!("tactic database {}: {} entries", path.display(), db.entries.len());
        gpu.plans().load_tactics(&db);
        gemmbridge_burn::load_tactics(&db);
    }
    anyhow::ensure!(
        args.sm_reserve < sms,
        "--sm-reserve {} must be below the GPU's {sms} SMs (0 reserves none)",
        args.sm_reserve
    );
    Ok(gpu)
}

/// The table's header.
fn print_header() {
    println!("burn's matmul autotuned: {}", cfg!(feature = "burn-autotune"));
    println!(
        "{:>24} {:>5} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "m×n×k",
        "dtype",
        "burn TF/s",
        "adpt TF/s",
        "raw TF/s",
        "×burn",
        "adpt/raw",
        "host/raw",
        "spin/raw",
        "floor µs",
        "wait µs",
        "rel"
    );
}

/// One row of the table (and its steps, when measured).
fn print_row(r: &Row) {
    println!(
        "{:>24} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.1} {:>8.1} {:>9.1e}",
        format!("{}×{}×{}", r.m, r.n, r.k),
        r.dtype,
        r.burn_tflops,
        r.adapter_tflops,
        r.raw_tflops,
        r.speedup_vs_burn,
        r.adapter_over_raw,
        r.host_wait_over_raw,
        r.spin_over_raw,
        r.edges_over_raw,
        r.host_floor_us,
        r.wait_cost_us,
        r.rel_vs_burn
    );
    if let Some(st) = r.steps_us {
        println!(
            "{:>24} steps µs: alloc {:.1}  lookups {:.1}  cubecl sync {:.1}  enqueue {:.1}  GEMM wait {:.1}  round trip {:.1}  drop {:.1}",
            "", st.alloc, st.lookups, st.cubecl_sync, st.enqueue, st.gemm_wait, st.round_trip, st.drop
        );
    }
}

/// Runs the benchmark; prints a table and writes JSON lines.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    gemmbridge_burn::set_sm_reserve(args.sm_reserve);
    anyhow::ensure!(
        args.loop_ms.is_finite() && args.loop_ms > 0.0,
        "--loop-ms must be a positive number of ms, not {}",
        args.loop_ms
    );
    let (dtypes, shapes) = cases(args)?;
    let dev = CudaDevice::default();
    let gpu = engine(args, &dev)?;
    let mut out = match &args.out {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => None,
    };
    print_header();
    for &(name, dtype, precision) in &dtypes {
        for &shape in &shapes {
            let r = Case { dev: &dev, gpu: &gpu, shape, dtype, precision }.measure(args, name)?;
            print_row(&r);
            if let Some(f) = out.as_mut() {
                writeln!(f, "{}", serde_json::to_string(&r)?)?;
            }
        }
    }
    gemmbridge_burn::set_tf32(false);
    Ok(())
}
