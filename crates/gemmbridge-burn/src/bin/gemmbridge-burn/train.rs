//! `train`: an MLP on the handwritten digits (8×8 images, 10 classes) trained for the same steps
//! from the same initial weights on the same batches, once per mode (adapter off, on, on with
//! tf32), on burn's CUDA backend under `Autodiff`; per-step wall times and losses.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context};
use burn::backend::cuda::CudaDevice;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use gemmbridge_burn::{Activation, GemmLinear, GemmLinearConfig, GemmOps};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// The backend trained on: burn's CUDA backend (with fusion) under `Autodiff`.
type TrainBackend = burn::backend::Autodiff<burn::backend::Cuda>;
/// The model trained.
type Model = Mlp<TrainBackend>;

/// Pixels per image (8×8), the model's input width.
const PIXELS: usize = 64;
/// Classes (digits 0–9), the model's output width.
const CLASSES: usize = 10;
/// Rows held out at the end of the file as the test split.
const TEST_ROWS: usize = 297;

/// Options of `gemmbridge-burn train`.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// The digits: gzip CSV, no header, 64 pixel counts (0..16) then the label (0–9) per row.
    #[arg(long)]
    data: PathBuf,
    /// Width of the hidden layers.
    #[arg(long, default_value_t = 4096)]
    hidden: usize,
    /// Number of hidden layers (64 → hidden → … → hidden → 10).
    #[arg(long, default_value_t = 3)]
    layers: usize,
    /// Rows per batch, sampled with replacement from the training split.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Timed steps per mode.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Untimed steps per mode first, on a throwaway copy of the model.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Seed of the initial weights and of the batch sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Modes, in order: `off` (burn's matmul), `on` (gemmbridge), `on-tf32` (gemmbridge, tf32),
    /// `on-tf32-unfused-bgrad` (gemmbridge, tf32, bias gradients by burn's reduction after the
    /// weight-gradient GEMM instead of in its epilogue: the adapter's earlier backward),
    /// `on-host-wait` and `on-tf32-host-wait` (as `on` and `on-tf32`, ordered by host waits
    /// instead of on the device).
    #[arg(long, value_delimiter = ',', default_value = "off,on")]
    modes: Vec<Mode>,
    /// JSON lines out: one per step, one summary per mode, one comparison.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl TrainArgs {
    fn modes_names(&self) -> Vec<&'static str> {
        self.modes.iter().map(|m| m.name()).collect()
    }
}

/// How the model's matmuls run.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// burn's own matmul (adapter disabled).
    Off,
    /// gemmbridge, strict f32.
    On,
    /// gemmbridge, f32 through tf32 tensor cores.
    OnTf32,
    /// gemmbridge, tf32, bias gradients by burn's own reduction (the adapter before its fused
    /// backward).
    OnTf32UnfusedBgrad,
    /// gemmbridge, strict f32, host-wait ordering.
    OnHostWait,
    /// gemmbridge, tf32, host-wait ordering.
    OnTf32HostWait,
}

impl Mode {
    /// The mode as written in `--modes` and in the JSON lines.
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "on",
            Mode::OnTf32 => "on-tf32",
            Mode::OnTf32UnfusedBgrad => "on-tf32-unfused-bgrad",
            Mode::OnHostWait => "on-host-wait",
            Mode::OnTf32HostWait => "on-tf32-host-wait",
        }
    }

    /// Sets gemmbridge-burn's global switches for this mode.
    fn apply(self) {
        use gemmbridge_burn::GemmOrdering;
        gemmbridge_burn::set_ordering(match self {
            Mode::Off => GemmOrdering::Burn,
            Mode::OnHostWait | Mode::OnTf32HostWait => GemmOrdering::HostWait,
            _ => GemmOrdering::Device,
        });
        gemmbridge_burn::set_tf32(matches!(self, Mode::OnTf32 | Mode::OnTf32UnfusedBgrad | Mode::OnTf32HostWait));
        gemmbridge_burn::set_fused_bias_grad(self != Mode::OnTf32UnfusedBgrad);
    }
}

/// Rows of the digits: `x` row-major `[rows, 64]` in [0, 1], `y` the labels `[rows]`.
struct Split {
    x: Vec<f32>,
    y: Vec<i64>,
}

impl Split {
    /// Number of rows.
    fn rows(&self) -> usize {
        self.y.len()
    }

    /// The rows `idx` on `device`: images `[idx.len(), 64]` and labels `[idx.len()]`.
    fn upload<B: Backend>(&self, idx: &[usize], device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let x: Vec<f32> = idx.iter().flat_map(|&i| &self.x[i * PIXELS..(i + 1) * PIXELS]).copied().collect();
        let y: Vec<i64> = idx.iter().map(|&i| self.y[i]).collect();
        let n = idx.len();
        (Tensor::from_data(TensorData::new(x, [n, PIXELS]), device), Tensor::from_data(TensorData::new(y, [n]), device))
    }
}

/// Reads the gzip CSV at `path` and splits it: (all but the last 297 rows, the last 297 rows).
fn load_digits(path: &Path) -> anyhow::Result<(Split, Split)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (n, line) in BufReader::new(flate2::read::GzDecoder::new(file)).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        let cells: Vec<f32> = line
            .split(',')
            .map(|c| c.trim().parse::<f32>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("{} line {}: not numbers", path.display(), n + 1))?;
        ensure!(cells.len() == PIXELS + 1, "{} line {}: {} columns, not 65", path.display(), n + 1, cells.len());
        x.extend(cells[..PIXELS].iter().map(|p| p / 16.0));
        let label = cells[PIXELS] as i64;
        ensure!((0..CLASSES as i64).contains(&label), "{} line {}: label {label}", path.display(), n + 1);
        y.push(label);
    }
    ensure!(y.len() > TEST_ROWS, "{}: {} rows, need more than {TEST_ROWS}", path.display(), y.len());
    let cut = y.len() - TEST_ROWS;
    let test = Split { x: x.split_off(cut * PIXELS), y: y.split_off(cut) };
    Ok((Split { x, y }, test))
}

/// `64 → hidden × layers → 10`, ReLU between (fused into the GEMM's epilogue where served).
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    layers: Vec<GemmLinear<B>>,
}

impl<B: GemmOps> Mlp<B> {
    /// A new model on `device`, its parameters initialised (burn's `Linear` initialisation).
    fn new(hidden: usize, layers: usize, device: &B::Device) -> Self {
        let widths: Vec<usize> = [PIXELS].into_iter().chain(vec![hidden; layers]).chain([CLASSES]).collect();
        let mlp = Mlp { layers: widths.windows(2).map(|w| GemmLinearConfig::new(w[0], w[1]).init(device)).collect() };
        // burn initialises parameters lazily, and each clone of an uninitialised parameter draws its
        // own values: materialise them now, so that every clone of this model starts from these.
        for layer in &mlp.layers {
            let _ = (layer.weight.val(), layer.bias.as_ref().map(|b| b.val()));
        }
        mlp
    }

    /// Images `[n, 64]` → logits `[n, 10]`.
    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (last, hidden) = self.layers.split_last().expect("the MLP has an output layer");
        for layer in hidden {
            x = layer.forward_activation(x, Activation::Relu);
        }
        last.forward(x)
    }
}

/// One mode's run: per-step losses and wall times (ms), held-out accuracy, adapter calls.
struct ModeRun {
    losses: Vec<f64>,
    ms: Vec<f64>,
    accuracy: f64,
    served: usize,
    fell_back: usize,
    /// Served calls ordered on the device / by host waits.
    device_ordered: usize,
    host_waited: usize,
}

/// Trains a copy of `init` on the batches `plan` (row indices into `train`) with a fresh Adam;
/// returns the trained model, each step's loss and each step's wall time in ms (batch upload
/// through the device sync after the optimizer step; the loss is read after the timer stops).
fn train(
    init: &Model,
    plan: &[Vec<usize>],
    train: &Split,
    lr: f64,
    device: &CudaDevice,
) -> anyhow::Result<(Model, Vec<f64>, Vec<f64>)> {
    let (mut model, mut optim) = (init.clone(), AdamConfig::new().init());
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut losses, mut ms) = (Vec::with_capacity(plan.len()), Vec::with_capacity(plan.len()));
    for idx in plan {
        let t0 = Instant::now();
        let (x, y) = train.upload::<TrainBackend>(idx, device);
        let loss = loss_fn.forward(model.forward(x), y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
        TrainBackend::sync(device).context("device sync after a step")?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        losses.push(f64::from(loss.into_scalar()));
    }
    Ok((model, losses, ms))
}

/// Fraction of `test`'s rows whose argmax logit is the label (no autodiff graph).
fn accuracy(model: &Model, test: &Split, device: &CudaDevice) -> f64 {
    let idx: Vec<usize> = (0..test.rows()).collect();
    let (x, _) = test.upload(&idx, device);
    let pred = model.valid().forward(x).argmax(1).into_data();
    let hits = pred.iter::<i64>().zip(&test.y).filter(|(p, l)| p == *l).count();
    hits as f64 / test.rows() as f64
}

/// Warmup on a throwaway copy, then the timed run from `init`, then the test accuracy.
fn run_mode(
    a: &TrainArgs,
    mode: Mode,
    init: &Model,
    plan: &[Vec<usize>],
    data: &(Split, Split),
) -> anyhow::Result<ModeRun> {
    let device = CudaDevice::default();
    mode.apply();
    let warm: Vec<Vec<usize>> = plan.iter().cycle().take(a.warmup).cloned().collect();
    train(init, &warm, &data.0, a.lr, &device)?;
    let (before, ordered) = (gemmbridge_burn::counts(), gemmbridge_burn::ordering_counts());
    let (model, losses, ms) = train(init, plan, &data.0, a.lr, &device)?;
    let (after, ordered_after) = (gemmbridge_burn::counts(), gemmbridge_burn::ordering_counts());
    let accuracy = accuracy(&model, &data.1, &device);
    Ok(ModeRun {
        losses,
        ms,
        accuracy,
        served: after.0 - before.0,
        fell_back: after.1 - before.1,
        device_ordered: ordered_after.0 - ordered.0,
        host_waited: ordered_after.1 - ordered.1,
    })
}

/// Median of `v` (not empty).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len().is_multiple_of(2) {
        (s[m - 1] + s[m]) / 2.0
    } else {
        s[m]
    }
}

/// The JSON lines of one mode: one per step, then its summary.
fn mode_lines(mode: Mode, r: &ModeRun) -> Vec<Value> {
    let name = mode.name();
    let mut lines: Vec<Value> = (r.losses.iter().zip(&r.ms).enumerate())
        .map(|(step, (loss, ms))| json!({"mode": name, "step": step, "loss": loss, "ms": ms}))
        .collect();
    lines.push(json!({"mode": name, "summary": true, "median_step_ms": median(&r.ms),
        "mean_step_ms": r.ms.iter().sum::<f64>() / r.ms.len() as f64, "final_loss": r.losses.last(),
        "test_accuracy": r.accuracy, "nan_losses": r.losses.iter().filter(|l| !l.is_finite()).count(),
        "served": r.served, "fell_back": r.fell_back, "device_ordered": r.device_ordered,
        "host_waited": r.host_waited, "burn_autotune": cfg!(feature = "burn-autotune")}));
    lines
}

/// Each mode against `off`: median step ratio (off / mode) and the loss curves' distance: the
/// largest absolute difference, and the largest relative one over the steps where `off`'s loss
/// is still ≥ 0.1 (the model memorises the 1500 training rows and the loss falls to ~1e-6,
/// where relative differences mean nothing).
fn comparison(runs: &[(Mode, ModeRun)]) -> Option<Value> {
    let off = &runs.iter().find(|(m, _)| *m == Mode::Off)?.1;
    let mut cmp = json!({"comparison": true});
    for (mode, r) in runs.iter().filter(|(m, _)| *m != Mode::Off) {
        let ratio = median(&off.ms) / median(&r.ms);
        let pairs = || r.losses.iter().zip(&off.losses);
        let abs = pairs().map(|(l, o)| (l - o).abs()).fold(0.0, f64::max);
        let rel = pairs().filter(|(_, o)| **o >= 0.1).map(|(l, o)| (l - o).abs() / o).fold(0.0, f64::max);
        println!(
            "off/{}: median step ratio {ratio:.3}; loss curves: max |Δ| {abs:.3e}, max |Δ|/loss while loss ≥ 0.1 {rel:.3e}",
            mode.name()
        );
        cmp[format!("ratio_median_step_off_over_{}", mode.name())] = json!(ratio);
        cmp[format!("max_abs_loss_diff_vs_off_{}", mode.name())] = json!(abs);
        cmp[format!("max_rel_loss_diff_vs_off_{}_while_loss_ge_0.1", mode.name())] = json!(rel);
    }
    Some(cmp)
}

/// Runs `gemmbridge-burn train`.
pub fn run(a: &TrainArgs) -> anyhow::Result<()> {
    ensure!(
        a.steps > 0 && a.batch > 0 && a.layers > 0 && a.hidden > 0,
        "--steps, --batch, --layers and --hidden must be positive"
    );
    ensure!(a.lr.is_finite() && a.lr > 0.0, "--lr must be a positive number, not {}", a.lr);
    let mut seen = std::collections::HashSet::new();
    ensure!(a.modes.iter().all(|m| seen.insert(m.name())), "--modes names a mode twice: {:?}", a.modes_names());
    if let Some(dir) = a.out.as_ref().and_then(|p| p.parent()).filter(|d| !d.as_os_str().is_empty()) {
        ensure!(dir.is_dir(), "--out: {} is not a directory", dir.display());
    }
    let data = load_digits(&a.data)?;
    // a clear error where there is no GPU, before cubecl's device thread (which panics) starts
    gemmbridge::cuda::Gpu::new(0).context("gemmbridge-burn train needs a CUDA GPU")?;
    let device = CudaDevice::default();
    println!(
        "train: hidden {} × {} layers, batch {}, {} steps (+{} warmup), lr {}, {} train / {} test rows, device {device:?}, burn autotuned: {}",
        a.hidden, a.layers, a.batch, a.steps, a.warmup, a.lr, data.0.rows(), data.1.rows(), cfg!(feature = "burn-autotune")
    );
    TrainBackend::seed(&device, a.seed);
    let init = Model::new(a.hidden, a.layers, &device);
    let mut rng = StdRng::seed_from_u64(a.seed);
    let plan: Vec<Vec<usize>> =
        (0..a.steps).map(|_| (0..a.batch).map(|_| rng.random_range(0..data.0.rows())).collect()).collect();
    let mut lines = Vec::new();
    let mut runs = Vec::new();
    for &mode in &a.modes {
        let r = run_mode(a, mode, &init, &plan, &data)?;
        println!(
            "{:>8}: median step {:.3} ms, final loss {:.3e}, test accuracy {:.3}, gemmbridge served {} / fell back {} (ordered on the device {}, by host waits {})",
            mode.name(),
            median(&r.ms),
            r.losses[r.losses.len() - 1],
            r.accuracy,
            r.served,
            r.fell_back,
            r.device_ordered,
            r.host_waited
        );
        lines.extend(mode_lines(mode, &r));
        runs.push((mode, r));
    }
    lines.extend(comparison(&runs));
    if let Some(path) = &a.out {
        write_lines(path, &lines)?;
    }
    Ok(())
}

/// Writes `lines` to `path`, one JSON object per line.
fn write_lines(path: &Path, lines: &[Value]) -> anyhow::Result<()> {
    let mut w = BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    for v in lines {
        writeln!(w, "{v}").with_context(|| format!("writing {}", path.display()))?;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))
}
