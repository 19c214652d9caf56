//! `gemmbridge`: device info, a correctness probe, and the benchmark that stands beside
//! PyTorch's (`shared/bench/torch_peer.py`).

mod bench;
mod compare;
mod db;
mod firstcall;
mod info;
mod ops;
mod probe;
mod random;
mod row;
mod suites;
mod timing;
mod tune;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gemmbridge",
    version,
    about = "Row-major GEMM on cuBLAS/cuBLASLt: info, probe, bench, tune, firstcall, compare"
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
    /// calls, exactly one must match) and every offered precision against float64. Exits
    /// non-zero if anything is wrong.
    Probe,
    /// Times GEMMs on the torch_peer.py suites and writes JSON lines in its schema.
    Bench(bench::Args),
    /// Autotunes cuBLASLt algorithms for a suite and stores the winners in a tactic database.
    Tune(tune::Args),
    /// Measures the first GEMM of this (fresh) process, with or without prewarm.
    Firstcall(firstcall::Args),
    /// Summarises several alternated `bench --out` / torch_peer.py runs row by row: each
    /// row's median ratio over the pairs, and per dtype and op the geometric mean and the
    /// rows below a bound (no GPU needed).
    Compare(compare::Args),
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
        Command::Probe => probe::run(),
        Command::Bench(args) => bench::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Firstcall(args) => firstcall::run(args),
        Command::Compare(args) => compare::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
