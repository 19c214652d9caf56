//! The RMSNorm rows of `gemmbridge bench` (`--ops rmsnorm,rmsnorm_fwd_bwd`), f16 and bf16, on
//! cuDNN's norm graph ([`Gpu::rms_norm_forward`], [`Gpu::rms_norm_backward`]): `rmsnorm` times
//! the inference forward (y only; the peer's `F.rms_norm` under `torch.no_grad()`),
//! `rmsnorm_fwd_bwd` the training forward (y and the inverse RMS) followed by the backward (dx
//! and dw in the I/O type, as PyTorch's autograd gives them). Rows of [`ROWS`] tokens ×
//! [`FEATURES`] features (a LLaMA-7B hidden size), ε = [`EPS`]. A row's m is the rows, n the
//! features, k and batch 1, its layout `d4096`; its rate is TB/s of the bytes a call must move
//! ([`RmsNorm::forward_bytes`], plus [`RmsNorm::backward_bytes`] for `rmsnorm_fwd_bwd`: x and w
//! read, y written, the inverse RMS written; x, dy, w and the inverse RMS read, dx and dw
//! written), the count `bench/norm_peer.py` uses too.

use cudarc::driver::DeviceRepr;
use gemmbridge::cuda::{Gpu, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved};
use gemmbridge::norm::RmsNorm;
use gemmbridge::{DType, Element, Precision};

use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The RMSNorm ops: the inference forward; the training forward and the backward.
pub const OPS: [&str; 2] = ["rmsnorm", "rmsnorm_fwd_bwd"];

/// The rows (tokens) of the RMSNorm rows.
pub const ROWS: [usize; 4] = [2048, 8192, 16384, 32768];

/// The features of the RMSNorm rows.
pub const FEATURES: usize = 4096;

/// ε of the RMSNorm rows (LLaMA's).
pub const EPS: f32 = 1e-5;

/// Every row: per f16/bf16 dtype of `dtypes`, per row count, per op of `ops`; `each` is called
/// with every row as it is made. A row the loaded cuDNN does not serve is skipped, named.
pub fn bench(
    gpu: &Gpu,
    ops: &[String],
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (name, _) in dtypes.iter().filter(|(_, p)| !matches!(p.input(), DType::F16 | DType::BF16)) {
        eprintln!("RMSNorm rows: {name} skipped (they run in f16 and bf16, bench/norm_peer.py's dtypes)");
    }
    for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
        for &r in &ROWS {
            let p = RmsNorm::new(r, FEATURES, EPS, precision.input());
            let new = match p.dtype {
                DType::F16 => problem_rows::<half::f16>(gpu, &p, name, ops, sampling)?,
                _ => problem_rows::<half::bf16>(gpu, &p, name, ops, sampling)?,
            };
            for row in new {
                each(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn problem_rows<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &RmsNorm,
    dtype: &str,
    ops: &[String],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let s = gpu.stream();
    let n = p.rows * p.features;
    let (x, w, dy) =
        (s.clone_htod(&normal::<T>(n))?, s.clone_htod(&normal::<T>(p.features))?, s.clone_htod(&normal::<T>(n))?);
    let (mut y, mut dx, mut dw) =
        (s.clone_htod(&normal::<T>(n))?, s.clone_htod(&normal::<T>(n))?, s.clone_htod(&normal::<T>(p.features))?);
    let mut inv = s.clone_htod(&vec![0f32; p.rows])?;
    s.synchronize()?;
    let mut rows = Vec::new();
    for op in ops {
        let timed = match op.as_str() {
            "rmsnorm" => timing::time_gpu(gpu, sampling, &mut || {
                gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut::new(&mut y)).map(|_| ())
            }),
            "rmsnorm_fwd_bwd" => timing::time_gpu(gpu, sampling, &mut || {
                gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut::new(&mut y).training(&mut inv))?;
                let saved = RmsNormSaved { x: &x, w: &w, inv_rms: &inv, dy: &dy };
                gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::Io(&mut dw))
            }),
            other => anyhow::bail!("unknown RMSNorm op {other:?}"),
        };
        let t = match timed {
            Err(e) if super::attn::unsupported(&e) => {
                eprintln!("{op} {}: skipped: {e}", p.describe());
                continue;
            }
            other => other?,
        };
        let bytes = if op == "rmsnorm" { p.forward_bytes(false) } else { p.forward_bytes(true) + p.backward_bytes() };
        let layout = format!("d{}", p.features);
        rows.push(Row::bandwidth(op, dtype, [p.rows, p.features, 1, 1], &t, bytes, layout));
    }
    Ok(rows)
}
