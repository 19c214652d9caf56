//! `gemmbridge-candle bench`: candle's own bf16 matmul and attention against the adapter's, on
//! a GPU, at the shapes of an LLM's layers. One JSON object a line (JSONL) on stdout, and in
//! `--out` where given.
//!
//! Rows, each timed as the median of 3 rounds of `--iters` calls (after `--warmup` calls), the
//! device synchronised around each round:
//! - `linear`: `x[m, k]·w[n, k]ᵀ` — candle's `x.matmul(&w.t())` (cuBLAS) against
//!   [`gemmbridge_candle::linear`] (cuBLASLt), `(n, k)` the projections of a Llama-3-8B layer.
//! - `linear_bias_gelu`: the same with a bias and GELU — candle's matmul, `broadcast_add` and
//!   `gelu` (three launches) against one GEMM with the bias and GELU in its epilogue.
//! - `sdpa`: causal attention with grouped-query heads (32 query heads, 8 key/value heads,
//!   head dimension 128) — candle's matmul-softmax path as candle-transformers' Llama runs it
//!   (scores in f32, key/value heads repeated, the mask filled with −∞, candle-nn's fused
//!   `softmax_last_dim`; `peer = "candle-f32"`), and the same path kept in bf16
//!   (`peer = "candle-bf16"`), against [`gemmbridge_candle::sdpa`] (cuDNN's flash attention).
//!
//! Each row also gives `rel_diff`, ‖ours − candle's‖/‖candle's‖ over the whole output (in f32),
//! so that a fast wrong answer shows.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use clap::{Args, Parser, Subcommand};
use gemmbridge_candle::{Activation, Served};

#[derive(Parser)]
#[command(name = "gemmbridge-candle", about = "candle's own operations against gemmbridge's under candle, on a GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// bf16 linear layers (plain and bias+GELU) and causal GQA attention: candle's own against
    /// the adapter's, one JSON line per row
    Bench(BenchArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// which rows: matmul (the linear rows), attention or all
    #[arg(long, default_value = "all", value_parser = ["matmul", "attention", "all"])]
    suite: String,
    /// token counts (m) of the linear rows
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,1024,4096")]
    tokens: Vec<usize>,
    /// sequence lengths of the attention rows
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096,8192")]
    seq: Vec<usize>,
    /// batch of the attention rows
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// timed calls per round (3 rounds, the median reported)
    #[arg(long, default_value_t = 50)]
    iters: usize,
    /// untimed calls before the rounds
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// also write the rows to this file (JSONL)
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `(name, n, k)`: the projections of a Llama-3-8B layer (hidden 4096, 8 key/value heads of
/// 128, MLP 14336).
const PROJECTIONS: [(&str, usize, usize); 4] =
    [("qo_proj", 4096, 4096), ("kv_proj", 1024, 4096), ("up_proj", 14336, 4096), ("down_proj", 4096, 14336)];

/// Query heads, key/value heads and the head dimension of the attention rows (Llama-3-8B's).
const HEADS: (usize, usize, usize) = (32, 8, 128);

/// One measured row.
struct Row {
    op: &'static str,
    peer: &'static str,
    shape: String,
    flops: f64,
    candle_us: f64,
    ours_us: f64,
    rel_diff: f64,
    /// which path ran the adapter's call (gemmbridge, or candle's own as a fallback)
    served: Served,
}

impl Row {
    fn json(&self) -> String {
        let tflops = |us: f64| self.flops / us / 1e6;
        format!(
            "{{\"suite\":\"candle\",\"op\":\"{}\",\"dtype\":\"bf16\",\"peer\":\"{}\",{},\"candle_us\":{:.2},\
             \"gemmbridge_us\":{:.2},\"speedup\":{:.3},\"candle_tflops\":{:.2},\"gemmbridge_tflops\":{:.2},\
             \"rel_diff\":{:.3e},\"served\":\"{:?}\"}}",
            self.op,
            self.peer,
            self.shape,
            self.candle_us,
            self.ours_us,
            self.candle_us / self.ours_us,
            tflops(self.candle_us),
            tflops(self.ours_us),
            self.rel_diff,
            self.served
        )
    }
}

/// Where the rows go: stdout, and the `--out` file.
struct Sink(Option<std::fs::File>);

impl Sink {
    fn emit(&mut self, row: &Row) -> Result<()> {
        let line = row.json();
        println!("{line}");
        if let Some(f) = &mut self.0 {
            writeln!(f, "{line}").map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    }
}

/// Microseconds per call of `f`: the median of 3 rounds of `iters` calls, after `warmup`.
fn time_us(dev: &Device, a: &BenchArgs, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    for _ in 0..a.warmup {
        f()?;
    }
    dev.synchronize()?;
    let mut rounds = Vec::with_capacity(3);
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..a.iters.max(1) {
            f()?;
        }
        dev.synchronize()?;
        rounds.push(t.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64);
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[1])
}

/// ‖ours − theirs‖ / ‖theirs‖, in f32 on the device.
fn relative_diff(ours: &Tensor, theirs: &Tensor) -> Result<f64> {
    let (o, t) = (ours.to_dtype(DType::F32)?, theirs.to_dtype(DType::F32)?);
    let num = (o - &t)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let den = t.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok((f64::from(num) / f64::from(den).max(f64::MIN_POSITIVE)).sqrt())
}

/// A bf16 tensor of normal values with standard deviation `std`.
fn randn(dims: &[usize], std: f64, dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, std as f32, dims, dev)?.to_dtype(DType::BF16)
}

/// The linear rows: every projection at every token count, plain and with bias and GELU.
fn matmul_rows(dev: &Device, a: &BenchArgs, sink: &mut Sink) -> Result<()> {
    for &(name, n, k) in &PROJECTIONS {
        for &m in &a.tokens {
            let x = randn(&[m, k], 1.0, dev)?;
            let w = randn(&[n, k], 1.0 / (k as f64).sqrt(), dev)?;
            let b = randn(&[n], 1.0, dev)?;
            let shape = format!("\"layer\":\"{name}\",\"m\":{m},\"n\":{n},\"k\":{k}");
            let flops = 2.0 * (m * n * k) as f64;
            let candle = || x.matmul(&w.t()?);
            let ours = || gemmbridge_candle::linear(&x, &w, None, Activation::None);
            let (first, served) = gemmbridge_candle::linear_served(&x, &w, None, Activation::None)?;
            let rel_diff = relative_diff(&first, &candle()?)?;
            let (candle_us, ours_us) = (time_us(dev, a, candle)?, time_us(dev, a, ours)?);
            let row =
                Row { op: "linear", peer: "candle", shape: shape.clone(), flops, candle_us, ours_us, rel_diff, served };
            sink.emit(&row)?;
            let candle = || gemmbridge_candle::linear_candle(&x, &w, Some(&b), Activation::Gelu);
            let ours = || gemmbridge_candle::linear(&x, &w, Some(&b), Activation::Gelu);
            let (first, served) = gemmbridge_candle::linear_served(&x, &w, Some(&b), Activation::Gelu)?;
            let rel_diff = relative_diff(&first, &candle()?)?;
            let (candle_us, ours_us) = (time_us(dev, a, candle)?, time_us(dev, a, ours)?);
            sink.emit(&Row {
                op: "linear_bias_gelu",
                peer: "candle",
                shape,
                flops,
                candle_us,
                ours_us,
                rel_diff,
                served,
            })?;
        }
    }
    Ok(())
}

/// candle-transformers' `repeat_kv`: each key/value head repeated `g` times, next to itself.
fn repeat_kv(x: &Tensor, g: usize) -> Result<Tensor> {
    if g == 1 {
        return Ok(x.clone());
    }
    let (b, h, s, d) = x.dims4()?;
    Tensor::cat(&vec![x; g], 2)?.reshape((b, h * g, s, d))
}

/// candle's matmul-softmax attention as candle-transformers' Llama runs it, in `dtype` (f32
/// there): scores, the causal mask (`mask[i][j] = 1` where `j > i`) filled with −∞, candle-nn's
/// fused softmax over the last dimension, `·v`, back to q's dtype.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, dtype: DType) -> Result<Tensor> {
    let (h_q, h_kv, d) = (q.dims()[1], k.dims()[1], q.dims()[3]);
    let (q2, k2, v2) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);
    let (k2, v2) = (repeat_kv(&k2, h_q / h_kv)?, repeat_kv(&v2, h_q / h_kv)?);
    let att = (q2.matmul(&k2.t()?)? / (d as f64).sqrt())?;
    let neg = Tensor::new(f32::NEG_INFINITY, q.device())?.to_dtype(dtype)?.broadcast_as(att.shape())?;
    let att = mask.broadcast_as(att.shape())?.where_cond(&neg, &att)?;
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    att.matmul(&v2.contiguous()?)?.to_dtype(q.dtype())
}

/// The attention rows: causal GQA at every sequence length, against both candle paths.
fn attention_rows(dev: &Device, a: &BenchArgs, sink: &mut Sink) -> Result<()> {
    let (h_q, h_kv, d) = HEADS;
    for &s in &a.seq {
        let b = a.batch;
        let q = randn(&[b, h_q, s, d], 1.0, dev)?;
        let k = randn(&[b, h_kv, s, d], 1.0, dev)?;
        let v = randn(&[b, h_kv, s, d], 1.0, dev)?;
        let mask: Vec<u8> = (0..s * s).map(|e| u8::from(e % s > e / s)).collect();
        let mask = Tensor::from_vec(mask, (s, s), dev)?;
        let shape =
            format!("\"batch\":{b},\"heads\":{h_q},\"kv_heads\":{h_kv},\"seq\":{s},\"head_dim\":{d},\"causal\":true");
        // the causal half of QKᵀ and PV
        let flops = 2.0 * 2.0 * (b * h_q * s * s * d) as f64 / 2.0;
        let ours = || gemmbridge_candle::sdpa(&q, &k, &v, true, None);
        let (first, served) = gemmbridge_candle::sdpa_served(&q, &k, &v, true, None)?;
        let ours_us = time_us(dev, a, ours)?;
        for (peer, dtype) in [("candle-f32", DType::F32), ("candle-bf16", DType::BF16)] {
            let candle = || candle_attention(&q, &k, &v, &mask, dtype);
            let rel_diff = relative_diff(&first, &candle()?)?;
            let candle_us = time_us(dev, a, candle)?;
            sink.emit(&Row { op: "sdpa", peer, shape: shape.clone(), flops, candle_us, ours_us, rel_diff, served })?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let Command::Bench(a) = Cli::parse().command;
    let dev = Device::new_cuda(a.device)?;
    let file = a.out.as_ref().map(std::fs::File::create).transpose().map_err(candle_core::Error::wrap)?;
    let mut sink = Sink(file);
    if a.suite != "attention" {
        matmul_rows(&dev, &a, &mut sink)?;
    }
    if a.suite != "matmul" {
        attention_rows(&dev, &a, &mut sink)?;
    }
    Ok(())
}
