//! What the training examples share (`train_llama`, `train_cnn`; `tests/adapter/train_check.rs`
//! uses it too): initial weights drawn on the host from a seeded `StdRng`, the training step
//! (burn's `AdamW` under `Autodiff`), and the loop that trains burn's model and its gemmbridge
//! conversion side by side on the same batches and prints the two loss curves.
//!
//! Initial weights come from a seeded `StdRng` on the host, not from burn's initializers (which
//! draw from the backend's own generator, process-wide on NdArray): the same seed gives the same
//! weights on every backend, and nothing here touches a generator other code may be seeding.
//! burn's models are built from those tensors; the gemmbridge models are converted from them
//! (`From`, `from_burn`), so both start from exactly the same weights.

// Each example, and the test, uses part of this module.
#![allow(dead_code)]

pub mod bench;
pub mod cnn;
pub mod llama;

use std::time::Instant;

use burn::module::{AutodiffModule, Param};
use burn::nn::Linear;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{activation, ElementConversion, FloatDType, Int, Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::Rng;

/// A model trained by [`compare`]: its loss on a batch.
pub trait Objective<B: Backend> {
    /// One training batch (inputs and targets).
    type Batch;

    /// The mean loss over `batch`, a one-element f32 tensor.
    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1>;
}

/// `shape` values uniform in `[-bound, bound)` from `rng`, on `device`, in `dtype`.
pub fn uniform<B: Backend, const D: usize>(
    rng: &mut StdRng,
    shape: [usize; D],
    bound: f32,
    dtype: FloatDType,
    device: &B::Device,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-bound..bound)).collect();
    Tensor::<B, D>::from_data(TensorData::new(v, shape), device).cast(dtype)
}

/// A trainable parameter of `shape` filled with `value`, in `dtype`.
pub fn constant<B: Backend, const D: usize>(
    shape: [usize; D],
    value: f32,
    dtype: FloatDType,
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::<B, D>::full(shape, value, device).cast(dtype))
}

/// burn's `nn::Linear` `[d_in, d_out]` with burn's default initialisation (Kaiming uniform,
/// bound `1/√d_in`, for the weight and the bias) drawn from `rng`.
pub fn linear<B: Backend>(
    rng: &mut StdRng,
    [d_in, d_out]: [usize; 2],
    bias: bool,
    dtype: FloatDType,
    device: &B::Device,
) -> Linear<B> {
    let bound = 1.0 / (d_in as f32).sqrt();
    let weight = Param::from_tensor(uniform(rng, [d_in, d_out], bound, dtype, device));
    let bias = bias.then(|| Param::from_tensor(uniform(rng, [d_out], bound, dtype, device)));
    Linear { weight, bias }
}

/// Mean cross-entropy of `logits [n, classes]` against `targets [n]`, computed in f32 whatever
/// the logits' dtype (burn's `log_softmax`, then the targets' log-probabilities gathered).
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let log_p = activation::log_softmax(logits.cast(FloatDType::F32), 1);
    log_p.gather(1, targets.reshape([n, 1])).mean().neg()
}

/// One step: the loss on `batch`, its gradients, the optimizer's update. Returns the updated
/// model and the loss (read back, so the step has finished on the device when this returns).
pub fn train_step<B, M, O>(model: M, optim: &mut O, batch: &M::Batch, lr: f64) -> (M, f64)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Objective<B>,
    O: Optimizer<M, B>,
{
    let loss = model.loss(batch);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = optim.step(lr, model, grads);
    (model, loss.into_scalar().elem::<f64>())
}

/// How [`compare`] trains and what it prints.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Optimizer steps (each model takes every step on the same batch).
    pub steps: usize,
    /// AdamW's learning rate (burn's `AdamWConfig` defaults otherwise).
    pub lr: f64,
    /// A row of the table every this many steps (and the first and last steps).
    pub log_every: usize,
    /// Print the table and a progress bar; off, nothing is printed.
    pub verbose: bool,
}

/// The two loss curves of [`compare`] and the steps' wall times.
#[derive(Clone, Debug, Default)]
pub struct Curves {
    /// Per step: burn's model's loss and the gemmbridge model's loss.
    pub losses: Vec<(f64, f64)>,
    /// The steps [`Schedule::log_every`] picks.
    pub logged: Vec<usize>,
    /// Per step, milliseconds: burn's model's step and the gemmbridge model's (each from the
    /// forward to the loss read back after the update).
    pub ms: Vec<(f64, f64)>,
}

/// `|gemm − burn| / |burn|`.
pub fn relative(burn: f64, gemm: f64) -> f64 {
    (gemm - burn).abs() / burn.abs()
}

impl Curves {
    /// The largest [`relative`] loss difference over the logged steps (NaN propagates).
    pub fn max_logged_relative(&self) -> f64 {
        self.logged.iter().map(|&s| relative(self.losses[s].0, self.losses[s].1)).fold(0.0, |m, r| {
            if r.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(r)
            }
        })
    }

    /// Median step times in ms: (burn, gemmbridge).
    pub fn median_ms(&self) -> (f64, f64) {
        let median = |f: fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = self.ms.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        (median(|t| t.0), median(|t| t.1))
    }
}

/// Trains `burn` and `gemm` (the same weights, one with burn's modules, one with gemmbridge's)
/// for `s.steps` steps, each with its own AdamW, both on `batch(step)`, called once per step.
/// With `s.verbose` prints a table (step, burn loss, gemmbridge loss, relative difference)
/// above a progress bar.
pub fn compare<B, M1, M2, T>(burn: M1, gemm: M2, s: &Schedule, mut batch: impl FnMut(usize) -> T) -> Curves
where
    B: AutodiffBackend,
    M1: AutodiffModule<B> + Objective<B, Batch = T>,
    M2: AutodiffModule<B> + Objective<B, Batch = T>,
{
    let (mut burn, mut gemm) = (burn, gemm);
    let (mut opt_burn, mut opt_gemm) = (AdamWConfig::new().init::<B, M1>(), AdamWConfig::new().init::<B, M2>());
    let bar = if s.verbose { ProgressBar::new(s.steps as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed} elapsed, eta {eta} {msg}")
            .expect("a valid progress template"),
    );
    if s.verbose {
        bar.suspend(|| println!("{:>6}  {:>12}  {:>16}  {:>10}", "step", "burn loss", "gemmbridge loss", "rel diff"));
    }
    let mut curves = Curves::default();
    for step in 0..s.steps {
        let b = batch(step);
        let t0 = Instant::now();
        let (next, lb) = train_step(burn, &mut opt_burn, &b, s.lr);
        let t1 = Instant::now();
        let (next_gemm, lg) = train_step(gemm, &mut opt_gemm, &b, s.lr);
        let t2 = Instant::now();
        (burn, gemm) = (next, next_gemm);
        curves.losses.push((lb, lg));
        curves.ms.push(((t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3));
        if step % s.log_every.max(1) == 0 || step + 1 == s.steps {
            curves.logged.push(step);
            if s.verbose {
                bar.suspend(|| println!("{step:>6}  {lb:>12.6}  {lg:>16.6}  {:>10.3e}", relative(lb, lg)));
            }
        }
        bar.set_message(format!("loss {lb:.4} / {lg:.4}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    curves
}

/// Prints the summary of `curves`: median step times, then the line
/// `max relative loss difference over logged steps: X`.
pub fn print_summary(curves: &Curves) {
    let (mb, mg) = curves.median_ms();
    println!("median step: burn {mb:.2} ms, gemmbridge {mg:.2} ms (first steps included)");
    println!("max relative loss difference over logged steps: {:.3e}", curves.max_logged_relative());
}

/// The examples' command line.
#[derive(clap::Parser, Debug)]
pub struct Cli {
    /// Optimizer steps [default: 300; 100 with --cpu].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Train on the CPU (burn's NdArray backend, f32) at the example's small CPU size, instead
    /// of burn's CUDA backend.
    #[arg(long)]
    pub cpu: bool,
    /// The model's dtype (parameters and activations; the loss is computed in f32). bf16 needs
    /// CUDA.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pub dtype: Dtype,
    /// Seed of the data and of the initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// AdamW's learning rate (default: the example's, per backend).
    #[arg(long)]
    pub lr: Option<f64>,
    /// A table row every this many steps (default: about 20 rows).
    #[arg(long)]
    pub log_every: Option<usize>,
}

/// `--dtype`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Cli {
    /// The model's dtype; bf16 refused on the CPU (NdArray computes in f32/f64 only).
    pub fn float_dtype(&self) -> anyhow::Result<FloatDType> {
        match self.dtype {
            Dtype::F32 => Ok(FloatDType::F32),
            Dtype::Bf16 if self.cpu => anyhow::bail!("--dtype bf16 needs CUDA (NdArray has no bf16); drop --cpu"),
            Dtype::Bf16 => Ok(FloatDType::BF16),
        }
    }

    /// The schedule: `--steps` (300, 100 with `--cpu`), `--lr` or `default_lr`, `--log-every`
    /// or about 20 rows.
    pub fn schedule(&self, default_lr: f64) -> Schedule {
        let steps = self.steps.unwrap_or(if self.cpu { 100 } else { 300 });
        let log_every = self.log_every.unwrap_or((steps / 20).max(1));
        Schedule { steps, lr: self.lr.unwrap_or(default_lr), log_every, verbose: true }
    }

    /// Where there is no `--cpu`: an error unless a CUDA GPU can be opened (before burn's CUDA
    /// runtime starts, which panics without one).
    pub fn check_gpu(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        gemmbridge::cuda::Gpu::new(0)
            .map(drop)
            .context("no CUDA GPU: run with --cpu to train on burn's NdArray backend")
    }
}
