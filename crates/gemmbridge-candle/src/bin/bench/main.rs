//! `gemmbridge-candle bench`: candle's own bf16 operations against the adapter's, on a GPU, at
//! the shapes of a Llama-3-8B layer, in the protocol of `gemmbridge bench` and its PyTorch
//! peers. One process times one side (`--impl ours` or `--impl candle`) and writes JSON lines
//! (stdout, and `--out` where given): an `"op": "env"` row (device, samples, idle gap), then
//! one row per problem in `gemmbridge bench`'s fields (`op`, `dtype`, `m`, `n`, `k`, `batch`,
//! `median_ms`, `min_ms`, `tflops`, `layout`, `tbps` for bandwidth-bound rows), so that
//! `gemmbridge compare --ours OURS… --peer CANDLE…` judges alternated runs of the two sides
//! row by row on the median of the pairs. Our rows also carry `rel_diff`,
//! ‖ours − candle's‖/‖candle's‖ over the whole output in f32 (so that a fast wrong answer
//! shows; `--no-check` leaves it out), and `served`, the path the adapter's call took; every
//! row carries `impl`. `compare` reads the rows' own fields and ignores those.
//!
//! Timing as `gemmbridge bench`: `--gap-ms` of idle GPU before each row, 5 warm-up calls
//! (`--warmup`), then `--reps` samples of ~1 ms of back-to-back calls between CUDA events on
//! candle's stream; the median and the minimum per call are reported. A row that fails (say
//! candle's f32 scores of a long sequence not fitting in memory) is written with an `error`
//! field, which `compare` skips, and the run goes on.
//!
//! Rows (`--ops`, all by default), bf16:
//! - `linear`: `x[m, k]·w[n, k]ᵀ` — candle's `x.matmul(&w.t())` (cuBLAS) against
//!   [`gemmbridge_candle::linear`] (cuBLASLt); `(n, k)` the four projections of a Llama-3-8B
//!   layer (labels `qo_proj`, `kv_proj`, `up_proj`, `down_proj`), m every `--tokens` count.
//! - `linear_bias_gelu`: the same with a bias and GELU — candle's matmul, `broadcast_add` and
//!   `gelu` (three launches) against one GEMM with the bias and GELU in its epilogue.
//! - `sdpa`: causal attention with grouped-query heads (32 query heads, 8 key/value heads,
//!   head dimension 128, label `h32:8-causal`; m = n = every `--seq` length, k = 128, batch
//!   `--batch`) — candle's matmul-softmax path as candle-transformers' Llama runs it (scores in
//!   f32, key/value heads repeated, the mask filled with −∞, candle-nn's fused
//!   `softmax_last_dim`), and the same path kept in bf16 (label `h32:8-causal+bf16_scores`,
//!   set beside our one row), against [`gemmbridge_candle::sdpa`] (cuDNN's flash attention).
//! - `sdpa_bwd`: the same attention forward and backward (`Tensor::backward` to q, k and v),
//!   timed together; candle's softmax is candle-nn's differentiable `softmax`; TFLOP/s count
//!   3.5× the forward's operations.
//! - `rms_norm`, `rope`, `swiglu`: candle-nn's fused `ops::rms_norm`, `rotary_emb::rope` and
//!   `ops::swiglu` against the adapter's, m every `--tokens` count, rates in TB/s.
//! - `fp8_linear`: candle's bf16 matmul against the adapter's FP8 linear (row-wise and block
//!   scales, the activations quantised inside each call), the linear rows' shapes.
//! - `conv2d`: ResNet-50's 3×3 convolutions at batch 32 with bias and ReLU, candle's three
//!   operations against one fused cuDNN graph.
//!
//! Alternate the two sides on one warm machine (ours, candle, ours, candle, …, three pairs or
//! more; `tools/gpu/candle-bench-pairs` does it) and give both the same flags.

mod attention;
mod fp8_conv;
mod layer_ops;
mod linear;
mod rows;
mod timing;

use std::path::PathBuf;

use candle_core::Result;
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::rows::{Bench, Side};
use crate::timing::{check_gap_ms, Sampling};

#[derive(Parser)]
#[command(name = "gemmbridge-candle", about = "candle's own operations against gemmbridge's under candle, on a GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One side (--impl) of bf16 linear layers, attention and layer operations, one JSON line
    /// per row in `gemmbridge bench`'s fields, for `gemmbridge compare`
    Bench(BenchArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    /// which side this process times: ours (the adapter) or candle (candle's own operations)
    #[arg(long = "impl", value_enum)]
    side: Side,
    /// which rows (comma-separated): linear, linear_bias_gelu, sdpa, sdpa_bwd, rms_norm, rope,
    /// swiglu, or all
    #[arg(long, value_delimiter = ',', default_value = "all")]
    ops: Vec<String>,
    /// token counts (m) of the linear, rms_norm, rope and swiglu rows
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,1024,4096")]
    pub tokens: Vec<usize>,
    /// sequence lengths of the attention rows
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096,8192")]
    pub seq: Vec<usize>,
    /// batch of the attention rows
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// timed samples per row (each ~1 ms of back-to-back calls), the median reported
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// untimed calls before each row's samples
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// idle GPU before each row's warm-up, ms (give both sides, and any run compared with
    /// these, the same value)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    gap_ms: f64,
    /// leave out our rows' rel_diff (one call of candle's way beside ours per row)
    #[arg(long)]
    no_check: bool,
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// also write the rows to this file (JSON lines)
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A family of rows: its op name for `--ops`, and the function that measures its rows.
struct Family {
    op: &'static str,
    run: fn(&mut Bench, &BenchArgs) -> Result<()>,
}

/// Every family, in the order they run.
const FAMILIES: [Family; 9] = [
    Family { op: "linear", run: linear::plain },
    Family { op: "linear_bias_gelu", run: linear::bias_gelu },
    Family { op: "sdpa", run: attention::forward },
    Family { op: "sdpa_bwd", run: attention::forward_backward },
    Family { op: "rms_norm", run: layer_ops::rms_norm },
    Family { op: "rope", run: layer_ops::rope },
    Family { op: "swiglu", run: layer_ops::swiglu },
    Family { op: "fp8_linear", run: fp8_conv::fp8_linear },
    Family { op: "conv2d", run: fp8_conv::conv2d },
];

fn main() -> Result<()> {
    let Command::Bench(a) = Cli::parse().command;
    let usage = |msg: String| -> ! {
        let mut cmd = Cli::command();
        cmd.build();
        let bench = cmd.find_subcommand("bench").cloned();
        bench.unwrap_or(cmd).error(ErrorKind::InvalidValue, msg).exit()
    };
    let all = a.ops.iter().any(|o| o == "all");
    if let Some(bad) = a.ops.iter().find(|o| *o != "all" && !FAMILIES.iter().any(|f| f.op == *o)) {
        let known: Vec<&str> = FAMILIES.iter().map(|f| f.op).collect();
        usage(format!("--ops: unknown op {bad:?} (known: {}, all)", known.join(", ")));
    }
    let gap_ms = check_gap_ms(a.gap_ms).unwrap_or_else(|e| usage(e));
    let sampling = Sampling { warmup: a.warmup, reps: a.reps as usize, gap_ms };
    let out = a.out.as_ref().map(std::fs::File::create).transpose().map_err(candle_core::Error::wrap)?;
    let mut bench = Bench::new(a.device, a.side, sampling, !a.no_check, out)?;
    bench.env()?;
    for family in FAMILIES.iter().filter(|f| all || a.ops.iter().any(|o| o == f.op)) {
        (family.run)(&mut bench, &a)?;
    }
    Ok(())
}
