//! `gemmbridge`: device info, a correctness probe, and the benchmark that stands beside
//! PyTorch's (`bench/peer.py`).
//!
//! `bench` and `tune` take their shared flags (suite, dtypes, FP8 recipes, convolution
//! settings) from one argument struct, `suite_args::SuiteArgs`, and parse `--dtypes` and
//! `--ops` the same way. Each `run` reads: parse the arguments into a plan, then one runner per
//! kind of row. No function here is longer than 80 lines (`tests/function_length.rs`).

// Doc comments here are also `--help` text, where shapes such as x[m,k] read as written.
#![allow(rustdoc::broken_intra_doc_links)]

mod bench;
mod compare;
mod db;
mod firstcall;
mod fp8cmd;
mod gemm_events;
mod gpu;
mod info;
mod layer_check;
mod lists;
mod ops;
mod probe;
mod probe_conv;
mod probe_fp8;
mod probe_norm;
mod random;
mod report;
mod row;
mod runs;
mod soak;
mod suite_args;
mod suites;
mod timing;
mod train_bench;
mod tune;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gemmbridge",
    version,
    about = "Row-major GEMM (dense, FP8 and grouped for mixture-of-experts) on cuBLAS/cuBLASLt, convolutions, attention and RMSNorm on cuDNN, RoPE and SwiGLU kernels, a LLaMA-style decoder layer: info, probe, bench, tune, firstcall, compare, soak, fp8, train-bench, layer-check, report (the burn adapter's bench is the gemmbridge-burn binary)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Device name, SM count, memory, driver, CUDA runtime, cuBLAS/cuBLASLt versions
    /// (or, without a GPU, which CPU backend serves).
    Info,
    /// Checks this machine: the row-major→column-major convention table (16 direct cuBLAS
    /// calls, exactly one must match), every offered precision against float64, every FP8
    /// recipe the GPU offers, a cuDNN convolution per precision and what cuDNN's RMSNorm graph
    /// takes (where libcudnn loads). Exits non-zero if anything is wrong.
    Probe(probe::Args),
    /// Times GEMMs (and, with --ops conv_…, attn_…, grouped…, rmsnorm…, rope, swiglu… or
    /// layer_…, cuDNN convolutions, attention, grouped GEMMs, RMSNorm, the RoPE and SwiGLU
    /// kernels and the decoder layer) on the suites of the PyTorch peers in bench/ and writes
    /// JSON lines in their schema. Without a CUDA GPU it runs
    /// gemmbridge's CPU backend instead (the matrixmultiply crate) on the small "cpu" suite,
    /// matmul and linear only, rates in GFLOP/s; GPU-only options are then ignored with a note.
    Bench(bench::Args),
    /// Autotunes cuBLASLt algorithms for a suite (and, with --ops conv_…, attn_… or grouped…,
    /// cuDNN's convolution or attention plans and the way each grouped GEMM runs) and stores
    /// the winners in a tactic database (a GEMM whose heuristic choice nothing beat gets no
    /// entry).
    Tune(tune::Args),
    /// Measures the first GEMM of this (fresh) process, with or without prewarm.
    Firstcall(firstcall::Args),
    /// Summarises several alternated `bench --out` / bench/peer.py runs row by row: each
    /// row's median ratio over the pairs, and per dtype and op the geometric mean and the
    /// rows below a bound (no GPU needed).
    Compare(compare::Args),
    /// Regenerates every table (printed, Markdown) and SVG plot of docs/PERFORMANCE.md from
    /// the runs a manifest lists (default docs/results/report.json); `--check
    /// docs/PERFORMANCE.md` fails unless the page holds every table, links every plot and has
    /// no table of its own. No GPU needed.
    Report(report::Args),
    /// Stress run: N threads (default 8), each on its own stream, issue mixed GEMMs (1×1×1 to
    /// 4096³, batched, padded, transposed, every precision, plain and fused epilogues, β = 0
    /// and β ≠ 0) for --seconds (default 180) through one shared Gpu (Auto) and two more on
    /// the same context (Lt, Blas), with graph replay on; every 50th call per thread, and
    /// every problem once in the warm-up, is compared with float64. Reports calls, checks,
    /// cached plans and graphs, and host RSS and device memory at start, halfway and end.
    /// Passes (exit 0) when every checked call is within its precision's band and no call
    /// failed; exit 1 otherwise, 2 without a CUDA GPU or on bad arguments.
    Soak(soak::Args),
    /// FP8: accuracy of every recipe beside PyTorch's (`accuracy`), bandwidth of the
    /// quantisation kernels (`quantize`).
    #[command(subcommand)]
    Fp8(fp8cmd::Action),
    /// Step time (forward + backward) of the training layers — an MLP block and single bias
    /// Linears — with the share spent in GEMMs, as JSON lines beside bench/train_peer.py.
    TrainBench(train_bench::Args),
    /// Writes layer_check.safetensors into --out: a small decoder layer's (d 320, 5/1 heads
    /// of 64, ffn 864, b 2, s 37) bf16 inputs and weights, its float64 reference's output and
    /// every gradient, and the GPU layer's where it runs — the file bench/layer_peer.py
    /// --check DIR compares with PyTorch. Exit 0 once the file is written (it says whether
    /// the GPU layer's results are in it).
    LayerCheck(layer_check::Args),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info::run(),
        Command::Probe(args) => probe::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Firstcall(args) => firstcall::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Report(args) => report::run(args),
        Command::Soak(args) => soak::run(args),
        Command::Fp8(action) => fp8cmd::run(action),
        Command::TrainBench(args) => train_bench::run(args),
        Command::LayerCheck(args) => layer_check::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `bench` and `tune` take the same suite, dtype, recipe and convolution flags, with the
    /// same defaults.
    #[test]
    fn bench_and_tune_share_the_suite_flags() {
        let shared = [
            "--suite=small",
            "--dtypes=bf16,fp8_e4m3",
            "--scalings=rowwise",
            "--conv-layouts=nchw",
            "--conv-batches=8",
            "--conv-api=legacy",
        ];
        let parse = |cmd: &[&str], extra: &[&str]| {
            let argv = ["gemmbridge"].iter().chain(cmd).chain(extra);
            match Cli::try_parse_from(argv).expect("parses").command {
                Command::Bench(a) => a.shared,
                Command::Tune(a) => a.shared,
                _ => unreachable!("bench or tune"),
            }
        };
        for cmd in [&["bench"][..], &["tune", "--db", "t.json"]] {
            let s = parse(cmd, &shared);
            assert_eq!(
                [&s.suite, &s.dtypes, &s.scalings, &s.conv_layouts, &s.conv_batches, &s.conv_api],
                ["small", "bf16,fp8_e4m3", "rowwise", "nchw", "8", "legacy"]
            );
            let d = parse(cmd, &[]);
            assert_eq!(
                [&d.suite, &d.dtypes, &d.scalings, &d.conv_layouts, &d.conv_batches, &d.conv_api],
                ["default", "f32,tf32,f16,bf16", "tensorwise,rowwise,block", "nhwc,nchw", "32,1", "graph"]
            );
        }
        // what only one of them takes stays its own
        assert!(Cli::try_parse_from(["gemmbridge", "tune", "--db", "t.json", "--gap-ms", "1"]).is_err());
        assert!(Cli::try_parse_from(["gemmbridge", "bench", "--candidates", "4"]).is_err());
        assert!(Cli::try_parse_from(["gemmbridge", "tune"]).is_err(), "tune needs --db");
    }
}
