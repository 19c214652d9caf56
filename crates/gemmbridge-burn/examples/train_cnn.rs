//! Trains a small ResNet-style CNN twice from the same initial weights on the same batches:
//! once built from burn's modules (`nn::conv::Conv2d`, `nn::Linear`), once converted to
//! gemmbridge-burn's (`GemmConv2d`, `GemmLinear`, through their `From` conversions), with
//! burn's AdamW under `Autodiff`; prints both loss curves side by side and their largest
//! relative difference.
//!
//! Default: burn's CUDA backend (with fusion), where the gemmbridge model's convolutions run in
//! cuDNN (bias and the ReLU that follows fused) and its head in cuBLASLt; stages of 32, 64 and
//! 128 channels (32², 16², 8² images), two residual blocks each, batches of 64. `--cpu`: burn's
//! NdArray backend, where both models run burn's own ops, at a stride-4 stem and stages of 4
//! and 8 channels, one block each, batches of 4 (NdArray's convolutions are slow in a debug
//! build).
//!
//! The data: 32×32×3 images of 10 classes, each class two coloured sinusoidal gratings of its
//! own frequencies with random amplitudes and phases, plus uniform noise. The model is in
//! `common/cnn.rs`.
//!
//! ```text
//! cargo run --release -p gemmbridge-burn --example train_cnn -- --dtype bf16
//! cargo run -p gemmbridge-burn --example train_cnn -- --cpu --steps 20
//! ```

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::FloatDType;
use clap::Parser;
use common::cnn::{train_both, CnnSize, CLASSES};
use common::{print_summary, Cli};
use gemmbridge_burn::{ConvOps, GemmOps};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let dtype = cli.float_dtype()?;
    if cli.cpu {
        run::<Autodiff<NdArray<f32>>>(&cli, &CnnSize::CPU, dtype, 1e-2, &Default::default());
    } else {
        cli.check_gpu()?;
        run::<Autodiff<burn::backend::Cuda>>(&cli, &CnnSize::CUDA, dtype, 1e-3, &Default::default());
    }
    Ok(())
}

fn run<B: AutodiffBackend + GemmOps + ConvOps>(
    cli: &Cli,
    size: &CnnSize,
    dtype: FloatDType,
    lr: f64,
    device: &B::Device,
) {
    let schedule = cli.schedule(lr);
    println!(
        "ResNet-style CNN: {side}×{side}×3 images, {CLASSES} classes, widths {:?}, {} block(s) per stage, stem stride {}, batch {}, {dtype:?}, {} steps, AdamW lr {}, seed {}, device {device:?}",
        size.widths, size.blocks, size.stem_stride, size.batch, schedule.steps, schedule.lr, cli.seed, side = size.side
    );
    print_summary(&train_both::<B>(size, dtype, cli.seed, &schedule, device));
}
