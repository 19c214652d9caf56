//! The "launch" row: what one tiny (64³) GEMM costs on the host and on the GPU, eagerly and
//! replayed from a CUDA graph, beside the bare library calls gemmbridge wraps.
//!
//! Fields as bench/peer.py's launch row (`host_us`, `wall_us`, `graph_us`), plus
//! `bare_lt_us` (bare `cublasLtMatmul` with a plan made once: cuBLASLt's first heuristic
//! choice, also with a tactic database) and `bare_blas_us` (bare `cublasGemmEx`), both on
//! handles of this command's own (`bare.rs`), `host_raw_us` (gemmbridge's raw-pointer path), and `host_direct_us` /
//! `wall_direct_us` / `host_raw_direct_us` (the same two paths with graph replay off, so
//! every call goes through `cublasLtMatmul`: gemmbridge's own cost above the bare call), all
//! measured in the same run; `host_fresh_out_us` (the safe path as an adapter calls it, a new
//! output buffer every call: no replay applies), `decode_host_us` and `decode_host_fresh_out_us`
//! (a tiny bf16 paged decode's, `launch_decode.rs`); `host_raw_checked_us` (the raw path with
//! `GpuOptions::check_raw_addresses` on: one `cuPointerGetAttributes` per operand) and
//! `host_raw_other_stream_us` (the raw path on a stream other than the Gpu's own, which
//! records that stream's last-use event per call); `host_plan_raw_us` (a held plan's raw run,
//! `GemmPlan::run_raw`, on the same buffers: no replay, no lookup) and
//! `host_plan_fresh_out_us` (a held plan's safe run, `GemmPlan::run`, a new output buffer
//! every call, timed on the same buffers as `host_fresh_out_us`). `host_us` and `host_raw_us` use the default settings, where the
//! repeated call is replayed from a cached graph (`GraphReplay`); `host_fresh_us` is the safe
//! path with those settings on calls that never repeat (α differs in every call, so no call is
//! ever replayed): every call goes through `cublasLtMatmul` and also pays replay's
//! bookkeeping, which is what a program whose operands change each call gets. Host times are
//! medians over 40 batches of 256 calls (below the launch-queue depth, so the GPU does not
//! throttle the host); `wall_us` includes waiting for the GPU; `graph_us` is GPU time per GEMM
//! when 256 calls captured into one graph are replayed (median of 20).

use std::time::Instant;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstream, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::{Extras, GemmPlan, Gpu, GraphReplay, RawBuffer, RawOperands, Scale};
use gemmbridge::{DType, Element, GemmProblem};

use super::bare::{Bare, Library};
use crate::db::load_db;
use crate::ops::precision_of;
use crate::random::normal;

const BATCH: usize = 256;
const BATCHES: usize = 40;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `db`: the tactic database `gpu` was given, loaded into the replay-off `Gpu` too, so that both
/// paths run the same algorithm (its host cost depends on the algorithm); the bare cuBLASLt
/// call keeps the heuristic's.
pub fn measure(gpu: &Gpu, dtype: &str, db: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let p = precision_of(dtype).ok_or_else(|| anyhow::anyhow!("no precision {dtype}"))?;
    match p.input() {
        DType::F32 => measure_typed::<f32>(gpu, dtype, db),
        DType::F16 => measure_typed::<half::f16>(gpu, dtype, db),
        _ => measure_typed::<half::bf16>(gpu, dtype, db),
    }
}

fn measure_typed<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    dtype: &str,
    db: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let p = GemmProblem::matmul(64, 64, 64, precision_of(dtype).expect("checked"))?;
    let s = gpu.stream().clone();
    let x: CudaSlice<T> = s.clone_htod(&normal::<T>(64 * 64))?;
    let w: CudaSlice<T> = s.clone_htod(&normal::<T>(64 * 64))?;
    let mut o: CudaSlice<T> = s.alloc_zeros(64 * 64)?;
    let bytes = 64 * 64 * std::mem::size_of::<T>();
    let (rx, rw) = (
        RawBuffer { address: x.device_ptr(&s).0, len_bytes: bytes },
        RawBuffer { address: w.device_ptr(&s).0, len_bytes: bytes },
    );
    let ro = RawBuffer { address: o.device_ptr_mut(&s).0, len_bytes: bytes };
    let raw = Raw { rx, rw, ro, cs: s.cu_stream() };
    // The same stream and buffers through a second Gpu with the same settings but replay off:
    // every call goes through cublasLtMatmul (its own handles, plan cache and workspace).
    let direct = Gpu::with_stream(s.clone(), gpu.options().graph_replay(GraphReplay::off()))?;
    if let Some(db) = db {
        load_db(&direct, db)?;
    }
    for _ in 0..200 {
        gpu.gemm(&p, 1.0, &x, &w, 0.0, &mut o)?;
        direct.gemm(&p, 1.0, &x, &w, 0.0, &mut o)?;
    }
    s.synchronize()?;
    let e = eager(gpu, &direct, p, (&x, &w, &mut o), raw)?;
    let (host_raw_checked_us, host_raw_other_stream_us) = raw_costs(gpu, p, raw)?;
    let graph_us = graph_us(gpu, p, raw)?;
    let (host_fresh_out_us, host_plan_fresh_out_us) = fresh_outputs(gpu, p, (&x, &w))?;
    let (decode_host_us, decode_host_fresh_out_us) = super::launch_decode::measure(gpu)?.unzip();
    Ok(serde_json::json!({"op": "launch", "dtype": dtype, "m": 64, "n": 64, "k": 64, "host_us": e.host_us,
        "wall_us": e.wall_us, "graph_us": graph_us, "host_raw_us": e.host_raw_us, "bare_lt_us": e.bare_lt_us,
        "bare_blas_us": e.bare_blas_us, "host_direct_us": e.host_direct_us, "wall_direct_us": e.wall_direct_us,
        "host_raw_direct_us": e.host_raw_direct_us, "host_fresh_us": e.host_fresh_us,
        "host_fresh_out_us": host_fresh_out_us, "host_plan_fresh_out_us": host_plan_fresh_out_us,
        "host_plan_raw_us": e.host_plan_raw_us, "decode_host_us": decode_host_us,
        "decode_host_fresh_out_us": decode_host_fresh_out_us, "host_raw_checked_us": host_raw_checked_us, "host_raw_other_stream_us": host_raw_other_stream_us,
        "replay_graphs": gpu.plans().graphs()}))
}

/// The raw path's optional costs, µs per call (medians over the batches): with the address
/// check on (one `cuPointerGetAttributes` per operand), and on a stream other than the Gpu's
/// own (a last-use event recorded per call).
fn raw_costs(gpu: &Gpu, p: GemmProblem, Raw { rx, rw, ro, cs }: Raw) -> anyhow::Result<(f64, f64)> {
    let s = gpu.stream();
    let s2 = s.fork()?;
    let batch_on = |on: &CudaStream, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        on.synchronize()?;
        let t = Instant::now();
        for _ in 0..BATCH {
            f()?;
        }
        let host = t.elapsed().as_secs_f64() * 1e6 / BATCH as f64;
        on.synchronize()?;
        Ok(host)
    };
    let ops = RawOperands::new(rx, rw, ro);
    let (mut checked, mut other) = (vec![], vec![]);
    let checking = gpu.options().check_raw_addresses;
    for _ in 0..BATCHES {
        gpu.update_options(|o| o.check_raw_addresses = true)?;
        // SAFETY: the three buffers are live allocations of this context used only on `s`.
        checked.push(batch_on(s, &mut || Ok(unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, ops, cs) }?))?);
        gpu.update_options(|o| o.check_raw_addresses = checking)?;
        // SAFETY: as above, on the second stream, which waits for `s` (fork) and is waited for
        // by the batch; the buffers are used on one stream at a time.
        other.push(batch_on(&s2, &mut || Ok(unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, ops, s2.cu_stream()) }?))?);
    }
    Ok((median(checked), median(other)))
}

/// The launch GEMM's operands as raw buffers, and the stream they are used on.
#[derive(Clone, Copy)]
struct Raw {
    rx: RawBuffer,
    rw: RawBuffer,
    ro: RawBuffer,
    cs: CUstream,
}

/// The eager (not captured) measurements, µs per call (medians over the batches).
struct Eager {
    host_us: f64,
    wall_us: f64,
    host_raw_us: f64,
    host_direct_us: f64,
    wall_direct_us: f64,
    host_raw_direct_us: f64,
    host_fresh_us: f64,
    host_plan_raw_us: f64,
    bare_lt_us: Option<f64>,
    bare_blas_us: f64,
}

/// Every eager way of making the call, `gpu` (replay on) beside `direct` (replay off) and the
/// bare library calls, on the operands `(x, w, o)` (and `raw`, the same buffers).
fn eager<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    direct: &Gpu,
    p: GemmProblem,
    (x, w, o): (&CudaSlice<T>, &CudaSlice<T>, &mut CudaSlice<T>),
    Raw { rx, rw, ro, cs }: Raw,
) -> anyhow::Result<Eager> {
    let s = gpu.stream();
    // One batch of BATCH calls: (host µs per call, wall µs per call).
    let batch = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<(f64, f64)> {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..BATCH {
            f()?;
        }
        let host = t.elapsed().as_secs_f64() * 1e6 / BATCH as f64;
        s.synchronize()?;
        Ok((host, t.elapsed().as_secs_f64() * 1e6 / BATCH as f64))
    };
    let bare = bare_calls(gpu, &p, RawOperands::new(rx, rw, ro))?;
    let plan = GemmPlan::new(gpu, &p)?;
    // The ways are interleaved batch by batch, so that clock and cache drift over the
    // measurement falls on all of them alike.
    let (mut hosts, mut walls, mut raws, mut bare_lt, mut bare_blas) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut hosts_d, mut walls_d, mut raws_d, mut fresh, mut planned) = (vec![], vec![], vec![], vec![], vec![]);
    // α = 1 + i ulp: a new replay key in every call of the run (2²⁰ distinct values)
    let mut call = 0u32;
    let mut fresh_alpha = move || {
        call = (call + 1) % (1 << 20);
        f32::from_bits(1.0f32.to_bits() + call)
    };
    for _ in 0..BATCHES {
        let (host, wall) = batch(&mut || Ok(gpu.gemm(&p, 1.0, x, w, 0.0, o)?))?;
        hosts.push(host);
        walls.push(wall);
        let (host, wall) = batch(&mut || Ok(direct.gemm(&p, 1.0, x, w, 0.0, o)?))?;
        hosts_d.push(host);
        walls_d.push(wall);
        fresh.push(batch(&mut || Ok(gpu.gemm(&p, fresh_alpha(), x, w, 0.0, o)?))?.0);
        // SAFETY: the three buffers are live allocations of this context used only on `s`.
        raws.push(batch(&mut || Ok(unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(rx, rw, ro), cs) }?))?.0);
        // SAFETY: as above.
        raws_d.push(
            batch(&mut || Ok(unsafe { direct.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(rx, rw, ro), cs) }?))?.0,
        );
        // SAFETY: as above.
        planned.push(
            batch(&mut || Ok(unsafe { plan.run_raw(gpu, Scale::PRODUCT, RawOperands::new(rx, rw, ro), cs) }?))?.0,
        );
        if bare.has_lt() {
            // SAFETY: as above.
            bare_lt.push(unsafe { bare.host_us(Library::Lt, RawOperands::new(rx, rw, ro), BATCH) }?);
        }
        // SAFETY: as above.
        bare_blas.push(unsafe { bare.host_us(Library::Blas, RawOperands::new(rx, rw, ro), BATCH) }?);
    }
    Ok(Eager {
        host_us: median(hosts),
        wall_us: median(walls),
        host_raw_us: median(raws),
        host_direct_us: median(hosts_d),
        wall_direct_us: median(walls_d),
        host_raw_direct_us: median(raws_d),
        host_fresh_us: median(fresh),
        host_plan_raw_us: median(planned),
        bare_lt_us: (!bare_lt.is_empty()).then(|| median(bare_lt)),
        bare_blas_us: median(bare_blas),
    })
}

/// Host µs per call (medians over the batches) as an adapter calls: a new output buffer every
/// call (all BATCH·BATCHES of them allocated before, so the allocation is not timed). First the
/// safe path with the default settings — no call repeats a replay key, so every call goes
/// through `cublasLtMatmul` and replay's bookkeeping — then a held plan's safe run on the same
/// chunk of outputs, chunk by chunk.
fn fresh_outputs<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    p: GemmProblem,
    (x, w): (&CudaSlice<T>, &CudaSlice<T>),
) -> anyhow::Result<(f64, f64)> {
    let s = gpu.stream();
    let plan = GemmPlan::new(gpu, &p)?;
    let mut outs = (0..BATCH * BATCHES).map(|_| s.alloc_zeros::<T>(64 * 64)).collect::<Result<Vec<_>, _>>()?;
    let (mut eager, mut planned) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    for chunk in outs.chunks_mut(BATCH) {
        let mut timed = |run: &mut dyn FnMut(&mut CudaSlice<T>) -> gemmbridge::Result<()>| -> anyhow::Result<f64> {
            s.synchronize()?;
            let t = Instant::now();
            for o in chunk.iter_mut() {
                run(o)?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64)
        };
        eager.push(timed(&mut |o| gpu.gemm(&p, 1.0, x, w, 0.0, o))?);
        planned.push(timed(&mut |o| plan.run(gpu, Scale::PRODUCT, x, w, o, Extras::default()))?);
    }
    s.synchronize()?;
    Ok((median(eager), median(planned)))
}

/// The bare library calls of `p` on `gpu`'s stream, warmed up on `ops` (their first calls load
/// kernels).
fn bare_calls(gpu: &Gpu, p: &GemmProblem, ops: RawOperands) -> anyhow::Result<Bare> {
    let bare = Bare::new(gpu, p)?;
    for _ in 0..4 {
        if bare.has_lt() {
            // SAFETY: `ops` are the launch GEMM's live buffers, used only on the Gpu's stream.
            unsafe { bare.host_us(Library::Lt, ops, 50) }?;
        }
        // SAFETY: as above.
        unsafe { bare.host_us(Library::Blas, ops, 50) }?;
    }
    Ok(bare)
}

/// GPU time per GEMM when BATCH raw calls captured into one graph are replayed (median of 20).
fn graph_us(gpu: &Gpu, p: GemmProblem, Raw { rx, rw, ro, cs }: Raw) -> anyhow::Result<f64> {
    let s = gpu.stream();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    for _ in 0..BATCH {
        // SAFETY: the three buffers are live allocations of this context used only on `s`.
        unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(rx, rw, ro), cs) }?;
    }
    let graph = s.end_capture(CUgraphInstantiate_flags(0))?.ok_or_else(|| anyhow::anyhow!("empty graph"))?;
    for _ in 0..5 {
        graph.launch()?;
    }
    s.synchronize()?;
    let ctx = gpu.context();
    let (e0, e1) =
        (ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?, ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
    let mut reps = Vec::new();
    for _ in 0..20 {
        e0.record(s)?;
        graph.launch()?;
        e1.record(s)?;
        reps.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / BATCH as f64);
    }
    Ok(median(reps))
}
