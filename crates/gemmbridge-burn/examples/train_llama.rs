//! Trains a small LLaMA-style decoder twice from the same initial weights on the same batches:
//! once built from burn's modules, once converted to gemmbridge-burn's (`GemmRmsNorm`,
//! `GemmAttention`, `GemmSwiGluMlp`, `GemmLinear`), with burn's AdamW under `Autodiff`; prints
//! both loss curves side by side and their largest relative difference.
//!
//! Default: burn's CUDA backend (with fusion), where the gemmbridge model's GEMMs run in
//! cuBLASLt/cuBLAS, its RMSNorms in cuDNN's norm graph, its SwiGLU in gemmbridge's kernel and
//! (bf16) its attention in cuDNN's flash attention (f32 attention runs burn's ops); 4 layers, d 512, 8 query / 2
//! key-value heads, vocabulary 4096, 8 × 128 tokens per batch. `--cpu`: burn's NdArray
//! backend, where both models run burn's own ops (the comparison checks the conversion and the
//! adapter's plumbing), at 2 layers, d 64, 4/2 heads, vocabulary 256, 4 × 32 tokens.
//!
//! The data: walks of a fixed random Markov chain (4 successors per token), so the loss falls
//! towards the chain's entropy, printed as the floor. The model is in `common/llama.rs`.
//!
//! ```text
//! cargo run --release -p gemmbridge-burn --example train_llama -- --dtype bf16
//! cargo run -p gemmbridge-burn --example train_llama -- --cpu --steps 20
//! ```

mod common;

use burn::backend::{Autodiff, NdArray};
use clap::Parser;
use common::llama::{train_both, LlamaSize};
use common::{print_summary, Cli};
use gemmbridge_burn::{AttentionOps, GemmOps, LayerOps};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let dtype = cli.float_dtype()?;
    if cli.cpu {
        run::<Autodiff<NdArray<f32>>>(&cli, &LlamaSize::CPU, dtype, 3e-3, &Default::default());
    } else {
        cli.check_gpu()?;
        run::<Autodiff<burn::backend::Cuda>>(&cli, &LlamaSize::CUDA, dtype, 1e-3, &Default::default());
    }
    Ok(())
}

fn run<B>(cli: &Cli, size: &LlamaSize, dtype: burn::tensor::FloatDType, lr: f64, device: &B::Device)
where
    B: burn::tensor::backend::AutodiffBackend + GemmOps + LayerOps + AttentionOps,
{
    let schedule = cli.schedule(lr);
    println!(
        "LLaMA-style decoder: {} layers, d {}, {}/{} heads, MLP {}, vocabulary {}, batch {} × {} tokens, {} parameters, {dtype:?}, {} steps, AdamW lr {}, seed {}, device {device:?}",
        size.layers, size.d_model, size.heads, size.kv_heads, size.d_hidden(), size.vocab, size.batch, size.seq, size.params(),
        schedule.steps, schedule.lr, cli.seed
    );
    let (curves, floor) = train_both::<B>(size, dtype, cli.seed, &schedule, device);
    println!("loss floor (the Markov chain's entropy): {floor:.4}");
    print_summary(&curves);
}
