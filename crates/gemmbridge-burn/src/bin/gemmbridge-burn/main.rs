//! `gemmbridge-burn`: measurements of the burn adapter on a CUDA GPU.
//!
//! - `bench`: burn's own matmul vs gemmbridge-burn vs gemmbridge's raw GEMM on the same
//!   buffers, and the adapter's own cost per call (its host waits included);
//! - `train`: an MLP on the handwritten digits, with and without the adapter.

mod bench;
mod train;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "Measure gemmbridge-burn against burn's own matmul on a CUDA GPU")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// burn's matmul vs gemmbridge-burn vs gemmbridge's raw GEMM, and the adapter's cost.
    Bench(bench::BenchArgs),
    /// Train an MLP on digits.csv.gz with and without the adapter; step times and losses.
    Train(train::TrainArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Train(a) => train::run(&a),
    }
}
