//! The dense GEMM rows of `gemmbridge bench`: each op of a shape timed on the GPU through the
//! engine (up to 8 input sets, rotated so that repeated calls do not all hit L2) or on the CPU
//! backend, and the random pools inputs are copied from (at a random offset).

use std::sync::Arc;

use anyhow::bail;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::{Extras, Gpu, Scale};
use gemmbridge::{cpu, DType, Element, Epilogue, GemmProblem, Precision};

use crate::ops::problem;
use crate::random::normal;
use crate::row::Row;
use crate::suites::Shape;
use crate::timing;

/// Input sets to rotate through, as bench/peer.py's `rotation`: as many as fit 512 MiB,
/// between 1 and 8, so repeated calls do not all hit L2.
fn rotation_count((m, n, k): Shape, elem_bytes: usize) -> usize {
    let per = (m * k + k * n) * elem_bytes;
    ((512usize << 20) / per.max(1)).clamp(1, 8)
}

pub(crate) fn bench_gpu_dispatch(
    gpu: &Gpu,
    pools: &mut Pools,
    name: &str,
    p: Precision,
    shape: Shape,
    ops: &[&str],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    match p.input() {
        DType::F32 => bench_gpu::<f32, f32>(gpu, pools, name, p, shape, ops, sampling),
        DType::F16 => bench_gpu::<half::f16, half::f16>(gpu, pools, name, p, shape, ops, sampling),
        DType::BF16 => bench_gpu::<half::bf16, half::bf16>(gpu, pools, name, p, shape, ops, sampling),
        other => bail!("no benchmark for dtype {other}"),
    }
}

pub(super) fn bench_cpu_dispatch(
    name: &str,
    p: Precision,
    shape: Shape,
    ops: &[&str],
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    match p.input() {
        DType::F32 => bench_cpu::<f32, f32>(name, p, shape, ops, reps),
        DType::F16 => bench_cpu::<half::f16, half::f16>(name, p, shape, ops, reps),
        DType::BF16 => bench_cpu::<half::bf16, half::bf16>(name, p, shape, ops, reps),
        other => bail!("no benchmark for dtype {other}"),
    }
}

fn row(op: &str, name: &str, p: &GemmProblem, t: timing::Timing) -> Row {
    Row {
        op: op.to_string(),
        dtype: name.to_string(),
        m: p.m(),
        n: p.n(),
        k: p.k(),
        batch: p.batch(),
        median_ms: t.median_ms,
        min_ms: t.min_ms,
        tflops: p.flops() / (t.median_ms * 1e-3) / 1e12,
        scaling: None,
        layout: None,
        tbps: None,
    }
}

fn bench_gpu<TI: Element + DeviceRepr, TO: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    pools: &mut Pools,
    name: &str,
    precision: Precision,
    shape: Shape,
    ops: &[&str],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let (m, n, k) = shape;
    let s = gpu.stream();
    // sized for the largest batch among the ops (bmm's)
    let mut batch = 1;
    for &op in ops {
        batch = batch.max(problem(op, shape, precision)?.batch());
    }
    let count = rotation_count(shape, precision.input().size_bytes() * batch);
    // As bench/peer.py, every op gets its own rotation of random buffers and bias, made on the
    // GPU just before it is timed (the peer draws them with torch.randn on the GPU) and
    // dropped after: the GPU sees the same short, memory-bound pause before every row as the
    // peer's. A row's clock depends on what ran just before it (docs/DESIGN.md, Design rationale).
    let pool = pools.get::<TI>(s)?;
    let mut c: CudaSlice<TO> = s.alloc_zeros(m * n * batch)?;
    let mut out = Vec::new();
    for &op in ops {
        let p = problem(op, shape, precision)?;
        let mut xs: Vec<CudaSlice<TI>> = Vec::with_capacity(count);
        let mut ws: Vec<CudaSlice<TI>> = Vec::with_capacity(count);
        for _ in 0..count {
            xs.push(rotate(s, pool, m * k * p.batch())?);
            ws.push(rotate(s, pool, k * n * p.batch())?);
        }
        let bias: CudaSlice<TO> = s.clone_htod(&normal::<TO>(n))?;
        let mut i = 0;
        let t = timing::time_gpu(gpu, sampling, &mut || {
            i = (i + 1) % count;
            let extras = Extras { bias: (p.epilogue() != Epilogue::None).then_some(&bias as _), ..Extras::default() };
            gpu.gemm_fused(&p, Scale::PRODUCT, &xs[i], &ws[i], &mut c, extras)
        })?;
        out.push(row(op, name, &p, t));
    }
    Ok(out)
}

/// Elements in each device pool of random normals (64 MiB in f32).
const POOL_ELEMS: usize = 1 << 24;

/// Random normals on the device, one pool per element type, drawn on the host once per run;
/// the GPU benchmark copies its inputs from them on the GPU.
#[derive(Default)]
pub struct Pools(std::collections::HashMap<std::any::TypeId, Box<dyn std::any::Any>>);

impl Pools {
    /// The pool of `T` (drawn and uploaded on first use).
    pub(crate) fn get<T: Element + DeviceRepr>(&mut self, s: &Arc<CudaStream>) -> anyhow::Result<&CudaSlice<T>> {
        let pool = match self.0.entry(std::any::TypeId::of::<T>()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Box::new(s.clone_htod(&normal::<T>(POOL_ELEMS))?) as Box<dyn std::any::Any>)
            }
        };
        Ok(pool.downcast_ref::<CudaSlice<T>>().expect("stored under its own TypeId"))
    }
}

/// A new device buffer of `len` elements copied on the GPU from `pool`, starting at a random
/// offset (wrapping around, so a buffer longer than the pool repeats it).
pub(crate) fn rotate<T: DeviceRepr>(
    s: &Arc<CudaStream>,
    pool: &CudaSlice<T>,
    len: usize,
) -> anyhow::Result<CudaSlice<T>> {
    // SAFETY: every element is written by the copies below (stream-ordered) before use.
    let mut buf = unsafe { s.alloc::<T>(len) }?;
    let (mut done, mut from) = (0, rand::random_range(0..pool.len()));
    while done < len {
        let take = (len - done).min(pool.len() - from);
        s.memcpy_dtod(&pool.slice(from..from + take), &mut buf.slice_mut(done..done + take))?;
        done += take;
        from = 0;
    }
    Ok(buf)
}

fn bench_cpu<TI: Element, TO: Element>(
    name: &str,
    precision: Precision,
    shape: Shape,
    ops: &[&str],
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let (m, n, k) = shape;
    let count = rotation_count(shape, precision.input().size_bytes()).min(2);
    let xs: Vec<Vec<TI>> = (0..count).map(|_| normal(m * k)).collect();
    let ws: Vec<Vec<TI>> = (0..count).map(|_| normal(k * n)).collect();
    let mut c = vec![TO::default(); m * n];
    let mut out = Vec::new();
    for &op in ops {
        let p = problem(op, shape, precision)?;
        let mut i = 0;
        let t = timing::time_cpu(1, reps.min(10), &mut || {
            i = (i + 1) % count;
            cpu::gemm(&p, 1.0, &xs[i], &ws[i], 0.0, &mut c)
        })?;
        out.push(row(op, name, &p, t));
    }
    Ok(out)
}
