//! A churn run: the way a server or a data loader uses a library under its tensor code.
//! Worker threads each create a [`Gpu`], use it — bf16 GEMMs (repeated ones replayed from
//! graphs), an FP8 GEMM, a cuDNN convolution and a training step of a two-layer MLP — and
//! drop it, half of them with the work still in flight, round after round; beside them one
//! thread captures CUDA graphs of GEMMs on its own stream, cycling through the three capture
//! modes (global, thread-local, relaxed), and replays them.
//!
//! It passes when nothing failed: every call returned `Ok`, every capture ended in a graph
//! that ran, and the GEMM each worker checks per round is within bf16's band (‖y − ref‖ /
//! ‖ref‖ ≤ 1e-2 against float64, the output poisoned with NaN first). A teardown or creation
//! race shows as a crash of the process, or as a failure listed in the report.
//! `gemmbridge soak --churn` runs it; so does the GPU test `tests/churn_gpu.rs`. It uses
//! gemmbridge's public API only.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstreamCaptureMode as Mode;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use gemmbridge::conv::Conv2d;
use gemmbridge::cuda::train::Mlp;
use gemmbridge::cuda::{Fp8Options, Gpu, GpuOptions, GraphReplay};
use gemmbridge::fp8::{Fp8Format, Scaling, Source};
use gemmbridge::train::{init_params, Activation, GradMode, LinearSpec};
use gemmbridge::{reference, Error, GemmProblem, Precision, Result};

use crate::relaxed::{driver, relaxed as plumbing, RelaxedDrop};

/// What a churn run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChurnOptions {
    /// The device's ordinal.
    pub ordinal: usize,
    /// Worker threads (1 to 64), each creating and dropping `rounds` [`Gpu`]s in turn.
    pub threads: usize,
    /// `Gpu`s each worker creates, uses and drops (1 to 100000).
    pub rounds: usize,
    /// Whether a thread captures and replays graphs beside the workers.
    pub capture: bool,
    /// Whether the workers' `Gpu`s replay repeated small GEMMs from graphs (the default).
    pub graph_replay: bool,
    /// Only the GEMMs (no FP8 GEMM, convolution or training step).
    pub gemms_only: bool,
    /// Seed of the inputs and of each worker's schedule.
    pub seed: u64,
}

impl Default for ChurnOptions {
    fn default() -> Self {
        ChurnOptions {
            ordinal: 0,
            threads: 6,
            rounds: 12,
            capture: true,
            graph_replay: true,
            gemms_only: false,
            seed: 1,
        }
    }
}

/// What a churn run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChurnReport {
    /// `Gpu`s created and dropped by the workers.
    pub gpus: usize,
    /// Of those, dropped with their work still in flight (not synchronised).
    pub dropped_in_flight: usize,
    /// bf16 GEMMs enqueued by the workers.
    pub gemms: usize,
    /// FP8 GEMMs enqueued by the workers.
    pub fp8_gemms: usize,
    /// Convolutions enqueued by the workers.
    pub convolutions: usize,
    /// Training steps (forward and backward) enqueued by the workers.
    pub train_steps: usize,
    /// The largest relative error of a checked GEMM (one per round), against float64.
    pub worst_error: f64,
    /// Graphs captured, instantiated and replayed by the capturing thread.
    pub captures: usize,
    /// What was skipped because this machine lacks it (FP8 on a GPU before Ada, no libcudnn).
    pub skipped: Vec<String>,
    /// Every failure, with the worker, round and step.
    pub failures: Vec<String>,
}

impl ChurnReport {
    /// Whether the run passed: no failure, and every round ran.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The band of a checked bf16 GEMM.
const BAND: f64 = 1e-2;

/// A small xorshift generator: the schedule and inputs from the seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Values in [-1, 1), rounded to bf16.
    fn bf16s(&mut self, n: usize) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f64((self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0)).collect()
    }
}

/// Runs the churn (see the module documentation).
///
/// # Errors
/// [`Error::OutOfRange`] for threads or rounds out of range; errors of the first `Gpu::new`
/// (no GPU, no library). Failures after that are in the report, not errors.
pub fn run(opts: &ChurnOptions) -> Result<ChurnReport> {
    for (what, v, max) in [("churn threads", opts.threads, 64), ("churn rounds", opts.rounds, 100_000)] {
        if !(1..=max).contains(&v) {
            return Err(Error::OutOfRange { what, value: v as u64, expected: format!("1 to {max}") });
        }
    }
    let report = Arc::new(Mutex::new(ChurnReport::default()));
    // One Gpu first, on this thread: a machine without a GPU fails here, with the reason.
    let probe = Gpu::new(opts.ordinal)?;
    let fp8 = probe.info().is_ok_and(|i| i.check_fp8(Scaling::Tensor).is_ok());
    let dnn = gemmbridge::cuda::library::ensure_cudnn().is_ok();
    drop(probe);
    {
        let mut r = report.lock().expect("not poisoned");
        if !opts.gemms_only && !fp8 {
            r.skipped.push("FP8 GEMMs (this GPU or cuBLASLt does not offer tensor-wise FP8)".into());
        }
        if !opts.gemms_only && !dnn {
            r.skipped.push("convolutions (libcudnn not found)".into());
        }
    }
    let done = Arc::new(AtomicBool::new(false));
    let captures = Arc::new(AtomicUsize::new(0));
    let capturer = opts.capture.then(|| {
        let (done, captures, report, ordinal) = (done.clone(), captures.clone(), report.clone(), opts.ordinal);
        std::thread::spawn(move || {
            if let Err(e) = capture_loop(ordinal, &done, &captures) {
                report.lock().expect("not poisoned").failures.push(format!("capturing thread: {e}"));
            }
        })
    });
    let workers: Vec<_> = (0..opts.threads)
        .map(|t| {
            let (opts, report) = (opts.clone(), report.clone());
            let use_ = Uses { fp8: fp8 && !opts.gemms_only, conv: dnn && !opts.gemms_only, train: !opts.gemms_only };
            std::thread::spawn(move || worker(&opts, t, use_, &report))
        })
        .collect();
    for w in workers {
        if w.join().is_err() {
            report.lock().expect("not poisoned").failures.push("a worker panicked".into());
        }
    }
    done.store(true, Ordering::Relaxed);
    if let Some(c) = capturer {
        if c.join().is_err() {
            report.lock().expect("not poisoned").failures.push("the capturing thread panicked".into());
        }
    }
    let mut r = Arc::try_unwrap(report).map_err(|_| ()).expect("threads joined").into_inner().expect("not poisoned");
    r.captures = captures.load(Ordering::Relaxed);
    if opts.capture && r.captures == 0 {
        r.failures.push("the capturing thread captured no graph while the workers ran".into());
    }
    Ok(r)
}

/// Which of the optional steps a worker runs.
#[derive(Clone, Copy)]
struct Uses {
    fp8: bool,
    conv: bool,
    train: bool,
}

/// One worker: `rounds` Gpus created, used and dropped; failures into the report.
fn worker(opts: &ChurnOptions, t: usize, uses: Uses, report: &Mutex<ChurnReport>) {
    let mut rng = Rng::new(opts.seed ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    for round in 0..opts.rounds {
        let in_flight = (t + round) % 2 == 1;
        let outcome = round_of(opts, uses, &mut rng, in_flight);
        let mut r = report.lock().expect("not poisoned");
        match outcome {
            Ok(done) => {
                r.gpus += 1;
                r.dropped_in_flight += usize::from(in_flight);
                r.gemms += done.gemms;
                r.fp8_gemms += done.fp8;
                r.convolutions += done.conv;
                r.train_steps += done.train;
                r.worst_error = r.worst_error.max(done.error);
                if done.error.is_nan() || done.error > BAND {
                    r.failures.push(format!("worker {t}, round {round}: GEMM error {:.3e} > {BAND:.0e}", done.error));
                }
            }
            Err((step, e)) => r.failures.push(format!("worker {t}, round {round}, {step}: {e}")),
        }
    }
}

/// What one round enqueued, and its checked GEMM's error.
#[derive(Default)]
struct Done {
    gemms: usize,
    fp8: usize,
    conv: usize,
    train: usize,
    error: f64,
}

type Step<T> = std::result::Result<T, (&'static str, Error)>;

fn at(step: &'static str) -> impl Fn(Error) -> (&'static str, Error) {
    move |e| (step, e)
}

/// One Gpu: created, used, dropped (synchronised first unless `in_flight`).
fn round_of(opts: &ChurnOptions, uses: Uses, rng: &mut Rng, in_flight: bool) -> Step<Done> {
    let replay = if opts.graph_replay { GraphReplay::default() } else { GraphReplay::off() };
    let gpu = Gpu::with_options(opts.ordinal, GpuOptions::default().graph_replay(replay)).map_err(at("Gpu::new"))?;
    let s = gpu.stream().clone();
    let mut done = Done::default();
    // Three shapes, each with its own operands; a shape drawn twice is a repeated call (graph
    // replay from its second call).
    let shapes = [(64, 96, 128), (256, 128, 64), (128, 512, 256)];
    let mut sets = Vec::new();
    for &(m, n, k) in &shapes {
        let p = GemmProblem::linear(m, n, k, Precision::BF16).map_err(at("problem"))?;
        let (x, w) = (rng.bf16s(m * k), rng.bf16s(n * k));
        let dx = upload(&s, &x).map_err(at("upload"))?;
        let dw = upload(&s, &w).map_err(at("upload"))?;
        let dy = upload(&s, &vec![bf16::NAN; m * n]).map_err(at("upload"))?;
        sets.push((p, x, w, dx, dw, dy));
    }
    let count = 20 + rng.below(36);
    for _ in 0..count {
        let (p, _, _, x, w, y) = &mut sets[rng.below(shapes.len())];
        gpu.gemm(p, 1.0, &**x, &**w, 0.0, &mut **y).map_err(at("bf16 GEMM"))?;
        done.gemms += 1;
    }
    // The check: shape 0 once more, into a freshly poisoned output.
    let (p, x, w, dx, dw, _) = &sets[0];
    let mut y = upload(&s, &vec![bf16::NAN; p.m() * p.n()]).map_err(at("upload"))?;
    gpu.gemm(p, 1.0, &**dx, &**dw, 0.0, &mut *y).map_err(at("bf16 GEMM"))?;
    done.gemms += 1;
    if uses.fp8 {
        fp8_step(&gpu, &s, dx, dw, p).map_err(at("FP8 GEMM"))?;
        done.fp8 += 1;
    }
    if uses.conv {
        conv_step(&gpu, &s, rng).map_err(at("convolution"))?;
        done.conv += 1;
    }
    if uses.train {
        train_step(&gpu, &s, rng).map_err(at("training step"))?;
        done.train += 1;
    }
    // The checked GEMM's result (a stream-ordered copy: it waits for that GEMM only as far as
    // the stream does).
    let got = download(&s, &y).map_err(at("download"))?;
    let wide = |v: &[bf16]| v.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let mut want = vec![0.0; p.m() * p.n()];
    reference::gemm_rowmajor(p, 1.0, &wide(x), &wide(w), 0.0, &mut want);
    done.error = reference::rel_error(&wide(&got), &want);
    // More work after the check, so that an in-flight drop has something in flight.
    for _ in 0..4 {
        let (p, _, _, x, w, y) = &mut sets[2];
        gpu.gemm(p, 1.0, &**x, &**w, 0.0, &mut **y).map_err(at("bf16 GEMM"))?;
        done.gemms += 1;
    }
    if !in_flight {
        plumbing(|| s.synchronize()).map_err(|e| ("synchronize", driver("cuStreamSynchronize")(e)))?;
    }
    drop(gpu); // before its buffers: the Gpu's teardown runs with their work in flight
    Ok(done)
}

/// A device buffer of the churn's own (freed with the capture mode relaxed).
type Buf = RelaxedDrop<CudaSlice<bf16>>;

fn upload(s: &Arc<CudaStream>, v: &[bf16]) -> Result<Buf> {
    plumbing(|| s.clone_htod(v).map(RelaxedDrop::new).map_err(driver("cuMemcpyHtoDAsync")))
}

fn download(s: &Arc<CudaStream>, v: &CudaSlice<bf16>) -> Result<Vec<bf16>> {
    plumbing(|| s.clone_dtoh(v).map_err(driver("cuMemcpyDtoHAsync")))
}

/// x·wᵀ in FP8 (E4M3, tensor-wise scales) into bf16; the output must be finite.
fn fp8_step(gpu: &Gpu, s: &Arc<CudaStream>, x: &Buf, w: &Buf, p: &GemmProblem) -> Result<()> {
    let (m, n, k) = (p.m(), p.n(), p.k());
    let qx = gpu.fp8().quantize(&**x, m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor)?;
    let qw = gpu.fp8().quantize(&**w, n, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor)?;
    let mut y = upload(s, &vec![bf16::NAN; m * n])?;
    gpu.fp8().gemm(&qx, &qw, &mut *y, None, Fp8Options::default())?;
    finite(s, &y, "the FP8 GEMM's output")
}

/// A 3×3 convolution (bf16, NHWC, padding 1); the output must be finite.
fn conv_step(gpu: &Gpu, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    let p = Conv2d::new([2, 8, 9, 9], [16, 3, 3], Precision::BF16).with_pad(1, 1);
    let [xl, wl, yl] = p.lens();
    let (x, w) = (upload(s, &rng.bf16s(xl))?, upload(s, &rng.bf16s(wl))?);
    let mut y = upload(s, &vec![bf16::NAN; yl])?;
    gpu.conv().forward(&p, &*x, &*w, &mut *y)?;
    finite(s, &y, "the convolution's output")
}

/// One forward and backward step of a bf16 MLP (64 → 128 GELU → 64, 32 tokens); the output
/// must be finite.
fn train_step(gpu: &Gpu, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    let layers = [LinearSpec::new(64, 128).with_activation(Activation::GeluTanh), LinearSpec::new(128, 64)];
    let params = init_params(&layers, rng.next());
    let mut mlp = Mlp::<bf16>::new(gpu, &layers, Precision::BF16, &params)?;
    let tokens = 32;
    let (x, dy) = (upload(s, &rng.bf16s(tokens * 64))?, upload(s, &rng.bf16s(tokens * 64))?);
    mlp.forward(gpu, &*x, tokens, true)?;
    mlp.backward(gpu, &*x, &*dy, None::<&mut CudaSlice<bf16>>, GradMode::Overwrite)?;
    let y: Vec<bf16> = plumbing(|| s.clone_dtoh(&mlp.output()?).map_err(driver("cuMemcpyDtoHAsync")))?;
    if y.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(Error::Unsupported { backend: "churn", what: "the training step's output holds a non-finite value".into() })
    }
}

fn finite(s: &Arc<CudaStream>, y: &CudaSlice<bf16>, what: &str) -> Result<()> {
    let v = download(s, y)?;
    if v.iter().all(|e| e.is_finite()) {
        Ok(())
    } else {
        Err(Error::Unsupported { backend: "churn", what: format!("{what} holds a non-finite value") })
    }
}

/// The capturing thread: its own Gpu, graphs of three GEMMs captured on its stream in each
/// capture mode in turn, instantiated, replayed and checked for completion, until `done`.
fn capture_loop(ordinal: usize, done: &AtomicBool, captures: &AtomicUsize) -> Result<()> {
    let gpu = Gpu::new(ordinal)?;
    // Buffers made from here on carry no cudarc events: a capture refuses a wait on an event
    // recorded before it (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
    // SAFETY: this thread's buffers are used on this Gpu's stream alone.
    unsafe { gpu.context().disable_event_tracking() };
    let s = gpu.stream().clone();
    let p = GemmProblem::linear(128, 256, 64, Precision::BF16)?;
    let mut rng = Rng::new(7);
    let (x, w) = (upload(&s, &rng.bf16s(128 * 64))?, upload(&s, &rng.bf16s(256 * 64))?);
    let mut y = upload(&s, &vec![bf16::NAN; 128 * 256])?;
    gpu.prewarm(&[p])?;
    gpu.gemm(&p, 1.0, &*x, &*w, 0.0, &mut *y)?; // the stream's workspace exists before capturing
    let modes = [
        Mode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        Mode::CU_STREAM_CAPTURE_MODE_RELAXED,
    ];
    let drv = driver;
    let mut i = 0;
    while !done.load(Ordering::Relaxed) {
        let mode = modes[i % modes.len()];
        s.begin_capture(mode).map_err(drv("cuStreamBeginCapture"))?;
        let enqueued = (0..3).try_for_each(|_| gpu.gemm(&p, 1.0, &*x, &*w, 0.0, &mut *y));
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = graph.map_err(drv("cuStreamEndCapture"))?.ok_or(Error::Unsupported {
            backend: "churn",
            what: format!("capture {i} ({mode:?}) produced no graph"),
        })?;
        graph.launch().map_err(drv("cuGraphLaunch"))?;
        plumbing(|| s.synchronize()).map_err(drv("cuStreamSynchronize"))?;
        plumbing(|| drop(graph));
        captures.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    Ok(())
}
