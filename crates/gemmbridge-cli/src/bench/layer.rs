//! The layer-op rows of `gemmbridge bench` (`--ops rope,swiglu,swiglu_bwd`): gemmbridge's own
//! memory-bound kernels on LLaMA 3 8B's shapes, timed as every row is, reported in ms and in
//! TB/s of the bytes each call must read and write, beside a device-to-device copy's TB/s
//! measured in the same run (its bytes read + written; op `d2d_copy`), the bound such a
//! kernel can approach.
//!
//! - `rope`: RoPE forward in place on the fused QKV projection's output of 8192 tokens
//!   (`b = 4`, `s = 2048`), 32 query and 8 key/value heads of 128, rotate-half, θ = 500 000 with
//!   LLaMA 3.1's scaling; bytes: q and k read and written (`2·8192·40·128·elem`).
//! - `swiglu`: `[8192, 2·14336] → [8192, 14336]`, halves; bytes `3·8192·14336·elem`.
//! - `swiglu_bwd`: its backward, `dy` and `[g | u]` read, `[dg | du]` written; bytes
//!   `5·8192·14336·elem`.
//!
//! JSON rows in bench/peer.py's fields (`m`, `n`, `k`: tokens, rotated heads, rotary dimension
//! for RoPE; rows, `f`, `2·f` for SwiGLU; `tflops` 0) plus `bytes`, `tb_s` and `of_copy` (the
//! row's TB/s over the copy's).

use std::fmt::Write as _;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::Gpu;
use gemmbridge::layer_ops::{GluLayout, Llama3Scaling, Positions, Rope, RopeDirection, SwiGlu};
use gemmbridge::{DType, Element, Precision};
use serde_json::json;

use crate::random::normal;
use crate::timing;

/// The layer ops, as `--ops` names them.
pub const OPS: [&str; 3] = ["rope", "swiglu", "swiglu_bwd"];

/// LLaMA 3 8B: tokens per call, query and key/value heads, head dimension, intermediate size.
const TOKENS: (usize, usize) = (4, 2048);
const HEADS: (usize, usize) = (32, 8);
const HEAD_DIM: usize = 128;
const FFN: usize = 14336;

/// One measured row: its JSON and its line in the table.
struct Measured {
    json: serde_json::Value,
    ms: f64,
    tb_s: f64,
}

/// Every row of `ops` for every dtype of `dtypes` but tf32 (each row's JSON handed to `each` as
/// it is made), after the copy row; returns the table.
pub fn bench(
    gpu: &Gpu,
    ops: &[String],
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&serde_json::Value) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let copy = copy_row(gpu, sampling)?;
    each(&copy.json)?;
    let mut table = format!(
        "\nlayer ops (TB/s of the bytes each call reads and writes; a device-to-device copy: {:.2} TB/s)\n\
         {:<11} {:<5} {:>10} {:>8} {:>8}\n",
        copy.tb_s, "op", "dtype", "ms", "TB/s", "of copy"
    );
    if dtypes.iter().any(|(n, _)| n == "tf32") {
        eprintln!("layer-op rows: tf32 skipped (they run in f32, f16 and bf16: no GEMM inside)");
    }
    for (name, p) in dtypes.iter().filter(|(n, _)| n != "tf32") {
        for op in ops {
            let m = match p.input() {
                DType::F32 => row::<f32>(gpu, op, name, sampling)?,
                DType::F16 => row::<half::f16>(gpu, op, name, sampling)?,
                _ => row::<half::bf16>(gpu, op, name, sampling)?,
            };
            let mut json = m.json;
            json["of_copy"] = json!(m.tb_s / copy.tb_s);
            each(&json)?;
            let _ = writeln!(
                table,
                "{op:<11} {name:<5} {:>10.4} {:>8.2} {:>7.0}%",
                m.ms,
                m.tb_s,
                100.0 * m.tb_s / copy.tb_s
            );
        }
    }
    Ok(table)
}

/// A row's JSON in bench/peer.py's fields plus the bytes and TB/s.
fn row_json(op: &str, dtype: &str, [m, n, k]: [usize; 3], t: timing::Timing, bytes: f64) -> Measured {
    let tb_s = bytes / (t.median_ms * 1e-3) / 1e12;
    let json = json!({"op": op, "dtype": dtype, "m": m, "n": n, "k": k, "batch": 1,
        "median_ms": t.median_ms, "min_ms": t.min_ms, "tflops": 0.0, "layout": "llama3_8b",
        "bytes": bytes, "tb_s": tb_s});
    Measured { json, ms: t.median_ms, tb_s }
}

/// A device-to-device copy of SwiGLU's bf16 input (`8192 × 2·14336`), read + write bytes.
fn copy_row(gpu: &Gpu, sampling: timing::Sampling) -> anyhow::Result<Measured> {
    let s = gpu.stream();
    let n = TOKENS.0 * TOKENS.1 * 2 * FFN;
    let a: CudaSlice<half::bf16> = s.alloc_zeros(n)?;
    let mut b: CudaSlice<half::bf16> = s.alloc_zeros(n)?;
    let t = timing::time_gpu(gpu, sampling, &mut || s.memcpy_dtod(&a, &mut b))?;
    Ok(row_json("d2d_copy", "bf16", [n, 1, 1], t, 2.0 * (n * 2) as f64))
}

/// One timed row of `op` in `T`.
fn row<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    op: &str,
    dtype: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<Measured> {
    let s = gpu.stream();
    let e = T::DTYPE.size_bytes();
    match op {
        "rope" => {
            let r =
                Rope::new(TOKENS.0, TOKENS.1, HEADS, HEAD_DIM).with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1));
            let mut qkv: CudaSlice<T> = s.clone_htod(&normal::<T>(r.qkv_elems()))?;
            let at = Positions::Contiguous { start: 0 };
            let t = timing::time_gpu(gpu, sampling, &mut || gpu.rope(&r, RopeDirection::Forward, &mut qkv, at, None))?;
            Ok(row_json(op, dtype, [r.tokens(), HEADS.0 + HEADS.1, r.rotary_dim], t, r.bytes_moved(e)))
        }
        "swiglu" | "swiglu_bwd" => {
            let g = SwiGlu::new(TOKENS.0 * TOKENS.1, FFN, GluLayout::Halves);
            let gu: CudaSlice<T> = s.clone_htod(&normal::<T>(g.in_elems()))?;
            let dims = [g.rows, g.f, 2 * g.f];
            if op == "swiglu" {
                let mut y: CudaSlice<T> = s.alloc_zeros(g.out_elems())?;
                let t = timing::time_gpu(gpu, sampling, &mut || gpu.swiglu(&g, &gu, &mut y))?;
                return Ok(row_json(op, dtype, dims, t, g.bytes_moved(e, false)));
            }
            let dy: CudaSlice<T> = s.clone_htod(&normal::<T>(g.out_elems()))?;
            let mut dgu: CudaSlice<T> = s.alloc_zeros(g.in_elems())?;
            let t = timing::time_gpu(gpu, sampling, &mut || gpu.swiglu_backward(&g, &dy, &gu, &mut dgu))?;
            Ok(row_json(op, dtype, dims, t, g.bytes_moved(e, true)))
        }
        other => anyhow::bail!("unknown layer op {other:?}; choose from {}", OPS.join(", ")),
    }
}
