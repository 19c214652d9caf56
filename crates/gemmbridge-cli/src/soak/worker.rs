//! One soak thread: its own stream and device buffers for every case, a warm-up pass that
//! runs (and checks) every case on every backend that takes it, then mixed calls until told
//! to stop, every `check_every`-th of them checked against float64.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale};

/// The epilogue operands of a case by address.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawExtras {
    pub bias: Option<RawBuffer>,
    pub aux: Option<RawBuffer>,
}
use gemmbridge::{DType, Epilogue, MatrixLayout};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::cases::Case;
use super::check::{self, Inputs, RowId};
use super::data::{encode, normals, View};
use super::report::{Counters, BACKENDS};

/// α, β pairs that repeat (so that graph replay serves them): β = 0 and β ≠ 0, |β| < 1 so
/// that C stays bounded when a call is repeated on its own output.
const PAIRS: [(f32, f32); 4] = [(1.0, 0.0), (1.0, 0.5), (-1.5, 0.0), (0.5, -0.25)];

/// Indices of the Lt and Blas backends in [`BACKENDS`].
const LT: usize = 1;
const BLAS: usize = 2;

/// The host copies of a case's inputs, shared by every thread (each uploads its own copy).
pub struct HostCase {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
    /// C before a checked call with β ≠ 0.
    pub c0: Vec<u8>,
    /// Empty when the epilogue reads no bias.
    pub bias: Vec<u8>,
}

/// Draws every case's inputs from `seed` (case i, operand j: its own stream of normals).
pub fn host_data(cases: &[Case], seed: u64) -> Vec<HostCase> {
    cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let [na, nb, nc, nbias, _] = c.elems();
            let prec = c.problem.precision();
            let draw = |j: u64, len: usize, d: DType| encode(d, &normals(len, seed ^ ((i as u64) << 8 | j)));
            HostCase {
                a: draw(1, na, prec.input()),
                b: draw(2, nb, prec.input()),
                c0: draw(3, nc, prec.output()),
                bias: draw(4, nbias, prec.output()),
            }
        })
        .collect()
}

/// What every thread shares.
pub struct Shared<'a> {
    /// Backends auto, lt, blas (the order of [`BACKENDS`]).
    pub gpus: [&'a Gpu; 3],
    pub cases: &'a [Case],
    pub host: &'a [HostCase],
    pub counters: &'a Counters,
    /// Set by the main thread at the deadline, or by any thread on an error.
    pub stop: &'a AtomicBool,
    /// Set by the main thread once every thread is warm (after the start snapshot).
    pub go: &'a AtomicBool,
    /// Threads done with their warm-up (or failed, or panicked).
    pub ready: &'a AtomicUsize,
    pub check_every: u64,
}

/// Counts the thread as ready once: when told, or when dropped (an error or a panic), so that
/// the main thread never waits for a thread that will not arrive.
struct Arrival<'a>(&'a AtomicUsize, bool);

impl Arrival<'_> {
    fn arrive(&mut self) {
        if !self.1 {
            self.1 = true;
            self.0.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.arrive();
    }
}

/// A case's device buffers (bytes of its element types) and their addresses.
struct DevCase {
    /// Kept alive for `raw[0]`, `raw[1]` and `extras.bias`.
    _inputs: [CudaSlice<u8>; 2],
    _bias: Option<CudaSlice<u8>>,
    c: CudaSlice<u8>,
    aux: Option<CudaSlice<u8>>,
    raw: [RawBuffer; 3],
    extras: RawExtras,
}

/// One thread's state. Returned to the main thread at the end, buffers still allocated, so the
/// end snapshot sees the same allocations as the start one.
pub struct Worker {
    id: usize,
    stream: Arc<CudaStream>,
    dev: Vec<DevCase>,
    rng: SmallRng,
    /// Cases cuBLASLt refused in the warm-up (never sent to the Lt backend again).
    no_lt: Vec<bool>,
    calls: u64,
    fresh: u32,
}

/// The thread's whole life; `None` when set-up failed (recorded in the counters).
pub fn run(sh: &Shared<'_>, id: usize, stream: Arc<CudaStream>, seed: u64) -> Option<Worker> {
    let mut arrival = Arrival(sh.ready, false);
    let setup = Worker::new(sh, id, stream, seed).and_then(|mut w| w.warm_up(sh).map(|()| w));
    arrival.arrive();
    let mut w = match setup {
        Ok(w) => w,
        Err(e) => {
            sh.counters.error(format!("thread {id}, set-up and warm-up: {e:#}"));
            sh.stop.store(true, Relaxed);
            return None;
        }
    };
    while !sh.go.load(Relaxed) && !sh.stop.load(Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    if let Err(e) = w.soak(sh).and_then(|()| Ok(w.stream.synchronize()?)) {
        sh.counters.error(format!("thread {id}: {e:#}"));
        sh.stop.store(true, Relaxed);
    }
    Some(w)
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> anyhow::Result<CudaSlice<u8>> {
    Ok(stream.clone_htod(bytes)?)
}

fn raw(stream: &Arc<CudaStream>, buf: &CudaSlice<u8>) -> RawBuffer {
    RawBuffer { address: buf.device_ptr(stream).0, len_bytes: buf.len() }
}

impl Worker {
    fn new(sh: &Shared<'_>, id: usize, stream: Arc<CudaStream>, seed: u64) -> anyhow::Result<Worker> {
        sh.gpus[0].context().bind_to_thread()?;
        let mut dev = Vec::with_capacity(sh.cases.len());
        for (case, h) in sh.cases.iter().zip(sh.host) {
            let (a, b, c) = (upload(&stream, &h.a)?, upload(&stream, &h.b)?, upload(&stream, &h.c0)?);
            let bias = if h.bias.is_empty() { None } else { Some(upload(&stream, &h.bias)?) };
            let aux_bytes = case.elems()[4] * case.problem.precision().output().size_bytes();
            let aux = if aux_bytes == 0 { None } else { Some(stream.alloc_zeros::<u8>(aux_bytes)?) };
            let extras =
                RawExtras { bias: bias.as_ref().map(|x| raw(&stream, x)), aux: aux.as_ref().map(|x| raw(&stream, x)) };
            let raws = [raw(&stream, &a), raw(&stream, &b), raw(&stream, &c)];
            dev.push(DevCase { _inputs: [a, b], _bias: bias, c, aux, raw: raws, extras });
        }
        stream.synchronize()?;
        let rng = SmallRng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
        Ok(Worker { id, stream, no_lt: vec![false; dev.len()], dev, rng, calls: 0, fresh: 0 })
    }

    /// The backends case `ci` may go to: epilogues never to cuBLAS, nothing cuBLASLt refused
    /// to it again.
    fn backends(&self, sh: &Shared<'_>, ci: usize) -> Vec<usize> {
        let fused = sh.cases[ci].problem.epilogue() != Epilogue::None;
        let refused = |b: usize| (fused && b == BLAS) || (b == LT && self.no_lt[ci]);
        (0..BACKENDS.len()).filter(|&b| !refused(b)).collect()
    }

    /// Every case once on every backend that takes it, each case checked on one of them
    /// (thread `id` checks backend `(ci + id) mod count`, so the threads together check all).
    fn warm_up(&mut self, sh: &Shared<'_>) -> anyhow::Result<()> {
        for ci in 0..sh.cases.len() {
            let backends = self.backends(sh, ci);
            let (alpha, beta) = PAIRS[(ci + self.id) % PAIRS.len()];
            for (pos, &bk) in backends.iter().enumerate() {
                let checked = (ci + self.id) % backends.len() == pos;
                let r = if checked {
                    self.checked_call(sh, ci, bk, alpha, beta)
                } else {
                    self.call(sh, ci, bk, alpha, beta)
                };
                match r {
                    Err(e) if bk == LT && not_supported(&e) && sh.cases[ci].problem.epilogue() == Epilogue::None => {
                        self.no_lt[ci] = true;
                        sh.counters.exclude(sh.cases[ci].label.clone());
                    }
                    r => r.with_context(|| self.what(sh, ci, bk, alpha, beta))?,
                }
            }
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// Mixed calls until `stop`: a random case, backend and α, β (a repeating pair, or one
    /// used once), called 1 to 4 times in a row so that replay captures and serves it.
    fn soak(&mut self, sh: &Shared<'_>) -> anyhow::Result<()> {
        while !sh.stop.load(Relaxed) {
            let ci = self.rng.random_range(0..sh.cases.len());
            let backends = self.backends(sh, ci);
            let bk = backends[self.rng.random_range(0..backends.len())];
            let (alpha, beta) = if self.rng.random_ratio(1, 5) {
                self.fresh_scalars()
            } else {
                PAIRS[self.rng.random_range(0..PAIRS.len())]
            };
            for _ in 0..self.rng.random_range(1..=4) {
                if sh.stop.load(Relaxed) {
                    break;
                }
                let r = if (self.calls + 1).is_multiple_of(sh.check_every) {
                    self.checked_call(sh, ci, bk, alpha, beta)
                } else {
                    self.call(sh, ci, bk, alpha, beta)
                };
                r.with_context(|| self.what(sh, ci, bk, alpha, beta))?;
            }
        }
        Ok(())
    }

    /// α = 1 + i ulp (never repeated by this thread, so never replayed), β = 0 or 0.5 + i ulp.
    fn fresh_scalars(&mut self) -> (f32, f32) {
        self.fresh = (self.fresh + 1) % (1 << 20);
        let alpha = f32::from_bits(1.0f32.to_bits() + self.fresh);
        let beta = if self.fresh.is_multiple_of(2) { 0.0 } else { f32::from_bits(0.5f32.to_bits() + self.fresh) };
        (alpha, beta)
    }

    fn what(&self, sh: &Shared<'_>, ci: usize, bk: usize, alpha: f32, beta: f32) -> String {
        let p = &sh.cases[ci].problem;
        format!(
            "thread {} call {} on {}: {} α={alpha} β={beta} ({})",
            self.id,
            self.calls,
            BACKENDS[bk],
            sh.cases[ci].label,
            p.describe()
        )
    }

    /// One call on this thread's stream, counted.
    fn call(&mut self, sh: &Shared<'_>, ci: usize, bk: usize, alpha: f32, beta: f32) -> anyhow::Result<()> {
        let d = &self.dev[ci];
        self.calls += 1;
        sh.counters.calls.fetch_add(1, Relaxed);
        sh.counters.by_backend[bk].fetch_add(1, Relaxed);
        // SAFETY: the buffers are live allocations of this context, sized by the case's
        // problem, used only on this thread's stream (in stream order) and kept until the
        // stream is synchronised at the end; the stream is a live stream of the context.
        let r = unsafe {
            sh.gpus[bk].gemm_raw(
                &sh.cases[ci].problem,
                Scale::new(alpha, beta),
                RawOperands {
                    a: d.raw[0],
                    b: d.raw[1],
                    c: d.raw[2],
                    bias: d.extras.bias,
                    aux: d.extras.aux,
                    c_in: None,
                },
                self.stream.cu_stream(),
            )
        };
        Ok(r?)
    }

    /// One call checked: C (and aux) reset or poisoned first, the stream synchronised after,
    /// the sampled rows read back and compared with float64.
    fn checked_call(&mut self, sh: &Shared<'_>, ci: usize, bk: usize, alpha: f32, beta: f32) -> anyhow::Result<()> {
        let (case, h) = (&sh.cases[ci], &sh.host[ci]);
        let p = case.problem;
        {
            let d = &mut self.dev[ci];
            if beta != 0.0 {
                self.stream.memcpy_htod(&h.c0[..], &mut d.c)?;
            } else {
                // β = 0: C must not be read, and every element must be written
                poison(&self.stream, d.raw[2])?;
            }
            if let Some(x) = d.extras.aux {
                poison(&self.stream, x)?;
            }
        }
        self.call(sh, ci, bk, alpha, beta)?;
        self.stream.synchronize()?;
        let rows = check::sample_rows(&p, &mut self.rng);
        let out = p.precision().output();
        let whole = p.macs() <= check::FULL_CHECK_MACS;
        let d = &self.dev[ci];
        let got_c = fetch(&self.stream, &d.c, p.c(), out, &rows, p.n(), whole)?;
        let got_aux = match &d.aux {
            Some(x) => Some(fetch(&self.stream, x, p.aux(), out, &rows, p.n(), whole)?),
            None => None,
        };
        let input = p.precision().input();
        let x = Inputs {
            alpha,
            beta,
            a: View::new(input, &h.a),
            b: View::new(input, &h.b),
            c0: View::new(out, &h.c0),
            bias: (!h.bias.is_empty()).then(|| View::new(out, &h.bias)),
        };
        let want = check::reference_rows(&p, x, &rows);
        let err = check::error(&want, &got_c, got_aux.as_deref());
        sh.counters.checked.fetch_add(1, Relaxed);
        let tol = p.precision().tolerance();
        if !check::passes(err, tol) {
            let what = self.what(sh, ci, bk, alpha, beta);
            sh.counters.mismatch(format!("{what}: rel error {err:e} > {tol:e} over {} rows", rows.len()));
        }
        Ok(())
    }
}

/// Whether a call failed because cuBLASLt has no algorithm for the problem.
fn not_supported(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<gemmbridge::Error>(),
        Some(gemmbridge::Error::Cublas { status, .. }) if status == "CUBLAS_STATUS_NOT_SUPPORTED")
}

/// Fills a buffer with all-ones bytes (NaN in f32, f16 and bf16), in stream order.
fn poison(stream: &Arc<CudaStream>, buf: RawBuffer) -> anyhow::Result<()> {
    // SAFETY: `buf` is a live allocation of this context of `len_bytes` bytes, used only on
    // `stream`; the memset is ordered with its other uses there.
    unsafe { cudarc::driver::result::memset_d8_async(buf.address, 0xFF, buf.len_bytes, stream.cu_stream()) }
        .context("cuMemsetD8Async (poisoning an output before a checked call)")
}

/// The sampled rows of an `[m, n]` output in `layout`, widened to f64: the whole buffer read
/// back once (`whole`), or each row on its own.
fn fetch(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<u8>,
    layout: MatrixLayout,
    dtype: DType,
    rows: &[RowId],
    n: usize,
    whole: bool,
) -> anyhow::Result<Vec<f64>> {
    let esz = dtype.size_bytes();
    let mut out = Vec::with_capacity(rows.len() * n);
    if whole {
        let host = stream.clone_dtoh(buf)?;
        let v = View::new(dtype, &host);
        for &(bt, i) in rows {
            out.extend(v.range(layout.offset(bt, i, 0), n));
        }
    } else {
        for &(bt, i) in rows {
            let start = layout.offset(bt, i, 0) * esz;
            let host = stream.clone_dtoh(&buf.slice(start..start + n * esz))?;
            out.extend(View::new(dtype, &host).range(0, n));
        }
    }
    Ok(out)
}
