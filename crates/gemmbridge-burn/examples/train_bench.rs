//! Times one model's training step (forward, backward, AdamW's update, the loss read back) on
//! burn's CUDA backend under `Autodiff`: the model built from burn's own modules
//! (`--impl burn`) or converted to gemmbridge-burn's (`--impl ours`) from the same weights.
//! One side per process: run the two alternately, then `gemmbridge compare --ours OURS --peer
//! BURN` judges the pairs row by row.
//!
//! Models (`--model`):
//! - `layer`: the LLaMA-style decoder of `train_llama` with one layer at LLaMA-3-8B's width
//!   (d 4096, 32/8 heads, MLP 10 944, vocabulary 4096), 2 sequences of 2048 tokens;
//! - `cnn`: the ResNet-style CNN of `train_cnn` at ResNet-50's 3×3 convolution shapes (64
//!   channels at 56² to 512 at 7²), 32 images of 112×112.
//!
//! Output: an `"op": "env"` line (the device, the side, the sampling), then one row in
//! `gemmbridge bench`'s fields (stdout, and `--out`): `op` `train_step`, `layout` the model,
//! `m` tokens or images per step, `n` the sequence or the image side, `k` the width, `batch`,
//! `median_ms` (the median over `--reps` samples of `--steps` steps each, per step), `min_ms`
//! (the fastest sample's), `tflops` (3× the forward's multiply-adds ×2 over the median step).
//! Before the timed samples: `--gap-ms` of idle GPU, then `--warmup` steps (burn's autotuning
//! and the plans of both are made there). `--cpu` runs the models' small CPU sizes on burn's
//! NdArray backend instead, in f32: a check of the harness, not a measurement.
//!
//! ```text
//! cargo run --release -p gemmbridge-burn --example train_bench -- --impl ours --model layer --out ours.jsonl
//! cargo run --release -p gemmbridge-burn --example train_bench -- --impl burn --model layer --out burn.jsonl
//! ```

mod common;

use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::FloatDType;
use clap::Parser;
use common::bench::{median_min, Lines, Sampling, SamplingArgs};
use common::cnn::{BurnCnn, CnnSize, Gratings};
use common::llama::{BurnLlama, LlamaSize, MarkovChain};
use common::{train_step, Objective};
use gemmbridge_burn::{AttentionOps, ConvOps, GemmOps, LayerOps};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    about = "Times a model's training step on burn, with burn's modules or gemmbridge-burn's",
    allow_negative_numbers = true
)]
struct Args {
    /// Whose modules: ours (gemmbridge-burn's, converted) or burn (burn's own).
    #[arg(long = "impl", value_parser = ["ours", "burn"])]
    side: String,
    /// The model: layer (a LLaMA-style layer at d 4096) or cnn (ResNet-50's 3×3 shapes).
    #[arg(long, value_parser = ["layer", "cnn"])]
    model: String,
    /// The dtype of parameters and activations (the loss is f32): bf16 or f32 [default: bf16;
    /// f32 with --cpu].
    #[arg(long, value_parser = ["bf16", "f32"])]
    dtype: Option<String>,
    /// Seed of the weights and the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let s = a.sampling.sampling()?;
    let cpu = a.sampling.cpu;
    let dtype = match (a.dtype.as_deref(), cpu) {
        (Some("bf16"), true) => anyhow::bail!("--dtype bf16 needs CUDA (NdArray has no bf16): drop --cpu"),
        (Some("f32"), _) | (None, true) => FloatDType::F32,
        _ => FloatDType::BF16,
    };
    let device = a.sampling.device()?;
    let mut lines = Lines::create(a.sampling.out.as_deref())?;
    let backend = if a.side == "ours" { "gemmbridge-burn" } else { "burn" };
    lines.emit(a.sampling.env_line(backend, &device, json!({"model": a.model})))?;
    let row = if cpu {
        run::<Autodiff<NdArray<f32>>>(&a, &s, dtype, &Default::default())?
    } else {
        run::<Autodiff<burn::backend::Cuda>>(&a, &s, dtype, &Default::default())?
    };
    lines.emit(row)
}

/// Builds the model and its batches, times its step, returns the row.
fn run<B>(a: &Args, s: &Sampling, dtype: FloatDType, device: &B::Device) -> anyhow::Result<serde_json::Value>
where
    B: AutodiffBackend + GemmOps + LayerOps + AttentionOps + ConvOps,
{
    let mut rng = StdRng::seed_from_u64(a.seed);
    let ours = a.side == "ours";
    let (shape, layout, flops, (med, min)) = if a.model == "layer" {
        let size = if a.sampling.cpu { LlamaSize::CPU } else { LlamaSize::LAYER_4096 };
        let chain = MarkovChain::new(size.vocab, &mut rng);
        let burn = BurnLlama::<B>::new(&size, &mut rng, dtype, device);
        let batches: Vec<_> = (0..2).map(|_| chain.batch(&mut rng, size.batch, size.seq, device)).collect();
        let t = if ours { time(burn.to_gemm(), &batches, s) } else { time(burn, &batches, s) };
        let shape = (size.batch * size.seq, size.seq, size.d_model, size.batch);
        let layout = if a.sampling.cpu { "llama-cpu".to_string() } else { format!("llama-layer-d{}", size.d_model) };
        (shape, layout, size.forward_flops(), t)
    } else {
        let size = if a.sampling.cpu { CnnSize::CPU } else { CnnSize::RESNET50_3X3 };
        let data = Gratings::new(&mut rng);
        let burn = BurnCnn::<B>::new(&size, &mut rng, dtype, device);
        let batches: Vec<_> = (0..2).map(|_| data.batch(&mut rng, (size.batch, size.side), dtype, device)).collect();
        let t = if ours { time(burn.to_gemm(), &batches, s) } else { time(burn, &batches, s) };
        let shape = (size.batch, size.side, size.widths[0], size.batch);
        (
            shape,
            if a.sampling.cpu { "cnn-cpu".to_string() } else { "resnet50-3x3".to_string() },
            size.forward_flops(),
            t,
        )
    };
    let dtype = if dtype == FloatDType::BF16 { "bf16" } else { "f32" };
    let (m, n, k, batch) = shape;
    Ok(json!({"op": "train_step", "dtype": dtype, "m": m, "n": n, "k": k, "batch": batch,
        "median_ms": med, "min_ms": min, "tflops": 3.0 * flops / (med * 1e-3) / 1e12, "layout": layout}))
}

/// `s.warmup` steps after `s.gap` idle, then `s.reps` samples of `s.steps` steps on `batches`
/// in turn, each step ending with the loss read back: (median, fastest) ms per step.
fn time<B, M>(model: M, batches: &[M::Batch], s: &Sampling) -> (f64, f64)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Objective<B>,
{
    let mut optim = AdamWConfig::new().init::<B, M>();
    let mut model = model;
    let mut step = 0;
    let mut one = |model: M| {
        step += 1;
        train_step(model, &mut optim, &batches[step % batches.len()], 1e-4).0
    };
    std::thread::sleep(s.gap);
    for _ in 0..s.warmup {
        model = one(model);
    }
    let mut samples = Vec::with_capacity(s.reps);
    for _ in 0..s.reps {
        let t0 = Instant::now();
        for _ in 0..s.steps {
            model = one(model);
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e3 / s.steps as f64);
    }
    median_min(samples)
}
