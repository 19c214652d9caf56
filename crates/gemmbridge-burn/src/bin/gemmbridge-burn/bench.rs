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

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::{Distribution, FloatDType, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale};
use gemmbridge::Precision;
use serde::Serialize;

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

/// One way of running the GEMM: a call (given the loop index) and the wait that ends a loop.
struct Variant<'a> {
    call: &'a dyn Fn(usize),
    sync: &'a dyn Fn(),
}

impl Variant<'_> {
    /// Wall ms per call over one loop of `iters` calls, ended by the variant's wait.
    fn sample(&self, iters: usize) -> f64 {
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
fn time_rounds(reps: usize, iters: usize, variants: &[Variant]) -> Vec<f64> {
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

/// The cubecl tensor under a burn tensor (plain backend: no fusion queue to drain).
fn cube(t: &Tensor<Plain, 2>) -> CubeTensor<CudaRuntime> {
    match t.clone().into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => unreachable!("the bench creates float tensors"),
    }
}

/// ‖a − b‖ / ‖b‖, computed on the GPU in f32.
fn rel(a: Tensor<Plain, 2>, b: Tensor<Plain, 2>) -> f64 {
    let (a, b) = (a.cast(FloatDType::F32), b.cast(FloatDType::F32));
    let num = (a - b.clone()).powi_scalar(2).sum().into_scalar();
    let den = b.powi_scalar(2).sum().into_scalar();
    f64::from((num / den).sqrt())
}

struct Case<'a> {
    dev: &'a CudaDevice,
    gpu: &'a Gpu,
    shape: (usize, usize, usize),
    dtype: FloatDType,
    precision: Precision,
}

impl Case<'_> {
    fn measure(&self, args: &BenchArgs, name: &str) -> anyhow::Result<Row> {
        let (m, n, k) = self.shape;
        let sync = || <Plain as burn::tensor::backend::Backend>::sync(self.dev).expect("cubecl sync");
        let esize = if self.dtype == FloatDType::F32 { 4 } else { 2 };
        let pair_bytes = (m * k + k * n) * esize;
        let pairs = (256usize << 20).div_ceil(pair_bytes).clamp(1, 16);
        let rand =
            |r, c| Tensor::<Plain, 2>::random([r, c], Distribution::Uniform(-1.0, 1.0), self.dev).cast(self.dtype);
        let inputs: Vec<(Tensor<Plain, 2>, Tensor<Plain, 2>)> = (0..pairs).map(|_| (rand(m, k), rand(k, n))).collect();
        gemmbridge_burn::set_enabled(true);
        gemmbridge_burn::set_tf32(self.precision == Precision::TF32);
        let burn_call = |i: usize| drop(inputs[i % pairs].0.clone().matmul(inputs[i % pairs].1.clone()));
        let adapter_call =
            |i: usize| drop(gemmbridge_burn::matmul(inputs[i % pairs].0.clone(), inputs[i % pairs].1.clone()));
        // warm-up: burn's autotuner, gemmbridge's plan cache (Tensor::matmul is always burn's)
        (0..3).for_each(burn_call);
        (0..3).for_each(adapter_call);
        let burn_out = inputs[0].0.clone().matmul(inputs[0].1.clone());
        let rel_vs_burn = rel(gemmbridge_burn::matmul(inputs[0].0.clone(), inputs[0].1.clone()), burn_out);
        let probe = Variant { call: &adapter_call, sync: &sync }.sample(3);
        let iters = ((args.loop_ms / probe.max(1e-3)) as usize).clamp(3, 2000);
        let host_floor_us = {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
            let calls = iters.min(200);
            sync();
            let t = Instant::now();
            (0..calls).for_each(adapter_call);
            let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
            sync();
            us
        };
        let [adapter_ms, adapter_host_wait_ms, burn_ms, raw_ms, raw_wait_ms, raw_spin_ms, raw_edges_ms] =
            self.time_all(&inputs, args.reps, iters, &adapter_call, &burn_call)?;
        let steps_us = if args.steps { Some(self.steps(&inputs, iters)?) } else { None };
        let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
        Ok(Row {
            m,
            n,
            k,
            dtype: name.into(),
            burn_ms,
            adapter_ms,
            adapter_host_wait_ms,
            raw_ms,
            raw_wait_ms,
            raw_spin_ms,
            raw_edges_ms,
            host_floor_us,
            burn_tflops: tflops(burn_ms),
            adapter_tflops: tflops(adapter_ms),
            raw_tflops: tflops(raw_ms),
            speedup_vs_burn: burn_ms / adapter_ms,
            adapter_over_raw: adapter_ms / raw_ms,
            host_wait_over_raw: adapter_host_wait_ms / raw_ms,
            spin_over_raw: raw_spin_ms / raw_ms,
            edges_over_raw: raw_edges_ms / raw_ms,
            host_wait_speedup_vs_burn: burn_ms / adapter_host_wait_ms,
            adapter_cost_us: (adapter_ms - raw_ms) * 1e3,
            wait_cost_us: (raw_wait_ms - raw_ms) * 1e3,
            rel_vs_burn,
            sm_reserve: gemmbridge_burn::sm_reserve(),
            pairs,
            steps_us,
            burn_autotune: cfg!(feature = "burn-autotune"),
        })
    }

    /// The adapter's GEMM plan for `a·b` in this case's precision (the raw variants' problem).
    fn plan(
        &self,
        a: &CubeTensor<CudaRuntime>,
        b: &CubeTensor<CudaRuntime>,
    ) -> anyhow::Result<gemmbridge_burn::layout::MatmulPlan> {
        gemmbridge_burn::layout::plan(
            a.meta.shape(),
            a.meta.strides(),
            b.meta.shape(),
            b.meta.strides(),
            self.precision,
        )
        .map_err(|f| anyhow::anyhow!("no plan: {f:?}"))
    }

    /// The adapter's path (`cube.rs`'s `run`) step by step, with host timestamps around each
    /// step, over `iters` calls: the median of each step, µs.
    fn steps(&self, inputs: &[(Tensor<Plain, 2>, Tensor<Plain, 2>)], iters: usize) -> anyhow::Result<Steps> {
        let (m, n, _) = self.shape;
        let first = cube(&inputs[0].0);
        let client = first.client.clone();
        let plan = self.plan(&first, &cube(&inputs[0].1))?;
        let s = self.gpu.stream().clone();
        let us = |t: Instant| t.elapsed().as_secs_f64() * 1e6;
        let mut all: Vec<[f64; 7]> = Vec::with_capacity(iters);
        for i in 0..iters.max(3) {
            let (a, b) = (cube(&inputs[i % inputs.len()].0), cube(&inputs[i % inputs.len()].1));
            let t = Instant::now();
            let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
                client.clone(),
                a.device.clone(),
                [m, n].into(),
                a.dtype,
            );
            let alloc = us(t);
            let t = Instant::now();
            let inner = client
                .exclusive(|| -> anyhow::Result<[f64; 5]> {
                    let t = Instant::now();
                    let res = |x: &CubeTensor<CudaRuntime>| {
                        client.get_resource(x.handle.clone()).map_err(|e| anyhow::anyhow!("{e:?}"))
                    };
                    let (ra, rb, rc) = (res(&a)?, res(&b)?, res(&out)?);
                    let lookups = us(t);
                    let t = Instant::now();
                    cubecl::future::block_on(client.sync()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    let cubecl_sync = us(t);
                    let raw = |r: u64, size: u64| RawBuffer { address: r, len_bytes: size as usize };
                    let t = Instant::now();
                    // SAFETY: as in the adapter (cube.rs run): live cubecl allocations held by
                    // the bindings until after the synchronize below, cubecl's stream drained
                    // and its device thread held by this task.
                    unsafe {
                        self.gpu.gemm_raw(
                            &plan.problem,
                            Scale::PRODUCT,
                            RawOperands::new(
                                raw(ra.resource().ptr, ra.resource().size),
                                raw(rb.resource().ptr, rb.resource().size),
                                raw(rc.resource().ptr, rc.resource().size),
                            ),
                            s.cu_stream(),
                        )
                    }?;
                    let enqueue = us(t);
                    let t = Instant::now();
                    s.synchronize()?;
                    let gemm_wait = us(t);
                    drop((ra, rb, rc));
                    Ok([lookups, cubecl_sync, enqueue, gemm_wait, 0.0])
                })
                .map_err(|e| anyhow::anyhow!("cubecl device thread: {e:?}"))??;
            let exclusive = us(t);
            let t = Instant::now();
            drop(out);
            let dropped = us(t);
            let task: f64 = inner[..4].iter().sum();
            all.push([alloc, inner[0], inner[1], inner[2], inner[3], exclusive - task, dropped]);
        }
        let median = |j: usize| {
            let mut v: Vec<f64> = all.iter().map(|r| r[j]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok(Steps {
            alloc: median(0),
            lookups: median(1),
            cubecl_sync: median(2),
            enqueue: median(3),
            gemm_wait: median(4),
            round_trip: median(5),
            drop: median(6),
        })
    }

    /// Times the variants in interleaved rounds ([`time_rounds`]), ms per call: [adapter
    /// (device ordering), adapter (host-wait ordering), burn, raw (gemmbridge's raw GEMM on the
    /// inputs' own addresses, stream-ordered), raw with a host wait after each call, raw with
    /// the device ordering's wait kernel spinning on cubecl's stream meanwhile].
    fn time_all(
        &self,
        inputs: &[(Tensor<Plain, 2>, Tensor<Plain, 2>)],
        reps: usize,
        iters: usize,
        adapter_call: &dyn Fn(usize),
        burn_call: &dyn Fn(usize),
    ) -> anyhow::Result<[f64; 7]> {
        let (m, n, _) = self.shape;
        let first = cube(&inputs[0].0);
        let client = first.client.clone();
        let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
            client.clone(),
            first.device.clone(),
            [m, n].into(),
            first.dtype,
        );
        let tensors: Vec<[CubeTensor<CudaRuntime>; 2]> = inputs.iter().map(|(a, b)| [cube(a), cube(b)]).collect();
        let plan = self.plan(&first, &tensors[0][1])?;
        let resource =
            |t: &CubeTensor<CudaRuntime>| client.get_resource(t.handle.clone()).map_err(|e| anyhow::anyhow!("{e:?}"));
        let held: Vec<_> =
            tensors.iter().map(|[a, b]| Ok((resource(a)?, resource(b)?))).collect::<anyhow::Result<_>>()?;
        let rc = resource(&out)?;
        let raw = |ptr: u64, size: u64| RawBuffer { address: ptr, len_bytes: size as usize };
        let bufs: Vec<(RawBuffer, RawBuffer)> = held
            .iter()
            .map(|(a, b)| (raw(a.resource().ptr, a.resource().size), raw(b.resource().ptr, b.resource().size)))
            .collect();
        let c = raw(rc.resource().ptr, rc.resource().size);
        <Plain as burn::tensor::backend::Backend>::sync(self.dev).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let s = self.gpu.stream().clone();
        let gemm = |i: usize| {
            let (a, b) = bufs[i % bufs.len()];
            // SAFETY: the buffers are live cubecl allocations held by `held`/`rc` until after the
            // last round below; cubecl's stream is idle whenever a raw loop runs (synced above,
            // and every adapter/burn loop ends with a device sync), and nothing else writes
            // them (adapter and burn outputs are their own allocations); gemmbridge checks their
            // lengths against the plan.
            unsafe { self.gpu.gemm_raw(&plan.problem, Scale::PRODUCT, RawOperands::new(a, b, c), s.cu_stream()) }
                .expect("raw GEMM");
        };
        let sync = || s.synchronize().expect("stream synchronize");
        let gemm_wait = |i: usize| {
            gemm(i);
            sync();
        };
        let cubecl_sync = || <Plain as burn::tensor::backend::Backend>::sync(self.dev).expect("cubecl sync");
        let device_call = |i: usize| {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
            adapter_call(i)
        };
        let host_wait_call = |i: usize| {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::HostWait);
            adapter_call(i)
        };
        // raw+spin: the first call of a loop starts the wait kernel, the loop's end releases it
        let stream_id = cubecl::stream_id::StreamId::current().value;
        let spinner = std::cell::RefCell::new(None::<gemmbridge_burn::Spinner>);
        let spin_call = |i: usize| {
            if spinner.borrow().is_none() {
                let started = gemmbridge_burn::Spinner::start(&client, first.device.index, stream_id);
                *spinner.borrow_mut() = Some(started.expect("spin kernel"));
            }
            gemm(i)
        };
        let spin_sync = || {
            if let Some(sp) = spinner.borrow_mut().take() {
                s.context().bind_to_thread().expect("bind gemmbridge's context");
                // SAFETY: gemmbridge's stream is of the context the flags live in, bound above.
                unsafe { sp.release(s.cu_stream()) }.expect("release the spin kernel");
            }
            sync();
            cubecl_sync();
        };
        let edges_call = |i: usize| {
            gemmbridge_burn::with_device_edges(&client, first.device.index, stream_id, &s, || gemm(i))
                .expect("device edges")
        };
        (0..3).for_each(gemm);
        // burn's kernels run at a different speed and power than the three gemmbridge variants:
        // interleaved with them, burn would lend the variant after it a cooler, faster-clocked
        // GPU. It is timed in its own block first.
        let burn = time_rounds(reps, iters, &[Variant { call: burn_call, sync: &cubecl_sync }])[0];
        let ms = time_rounds(
            reps,
            iters,
            &[
                Variant { call: &device_call, sync: &cubecl_sync },
                Variant { call: &host_wait_call, sync: &cubecl_sync },
                Variant { call: &gemm, sync: &sync },
                Variant { call: &gemm_wait, sync: &sync },
                Variant { call: &spin_call, sync: &spin_sync },
                Variant { call: &edges_call, sync: &cubecl_sync },
            ],
        );
        gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
        drop((held, rc));
        Ok([ms[0], ms[1], burn, ms[2], ms[3], ms[4], ms[5]])
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
        shapes.extend(gemmbridge::suites::shapes(s).with_context(|| format!("unknown suite {s:?}"))?);
    }
    for s in args.shapes.split(',').filter(|s| !s.is_empty()) {
        let dims: Vec<usize> =
            s.split('x').map(str::parse).collect::<Result<_, _>>().with_context(|| format!("shape {s:?}"))?;
        anyhow::ensure!(dims.len() == 3, "shape {s:?}: expected MxNxK");
        anyhow::ensure!(dims.iter().all(|&d| d > 0), "shape {s:?}: every dimension must be at least 1");
        shapes.push((dims[0], dims[1], dims[2]));
    }
    anyhow::ensure!(!shapes.is_empty(), "--suite and --shapes name no shape");
    let dev = CudaDevice::default();
    let gpu = Gpu::new(dev.index).context("gemmbridge GPU")?;
    let sms = gpu.info().context("device query")?.sm_count as u32;
    if let Some(path) = &args.db {
        anyhow::ensure!(path.exists(), "--db {}: no such file", path.display());
        let (db, warnings) = gemmbridge::cuda::tactics::TacticDb::load(path, &gpu.tactic_identity()?);
        for w in warnings {
            eprintln!("warning: {w}");
        }
        println!("tactic database {}: {} entries", path.display(), db.entries.len());
        gpu.load_tactics(&db);
        gemmbridge_burn::load_tactics(&db);
    }
    anyhow::ensure!(
        args.sm_reserve < sms,
        "--sm-reserve {} must be below the GPU's {sms} SMs (0 reserves none)",
        args.sm_reserve
    );
    let mut out = match &args.out {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => None,
    };
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
    for &(name, dtype, precision) in &dtypes {
        for &shape in &shapes {
            let r = Case { dev: &dev, gpu: &gpu, shape, dtype, precision }.measure(args, name)?;
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
            if let Some(f) = out.as_mut() {
                writeln!(f, "{}", serde_json::to_string(&r)?)?;
            }
        }
    }
    gemmbridge_burn::set_tf32(false);
    Ok(())
}
