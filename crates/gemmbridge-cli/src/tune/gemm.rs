//! The search for GEMMs: cuBLASLt's candidates for a dense or FP8 problem, checked and timed
//! at the sustained clock by the library's tuner (`GpuTuning::gemm_raw`, `GpuTuning::fp8`),
//! which names the finalists the confirmation then judges.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::tactics::Tactic;
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale, TuneOptions, TuneReport};
use gemmbridge::{DType, Element, Epilogue, Precision};

use super::items::Item;
use crate::ops::problem;
use crate::random::normal;
use crate::suites::Shape;

/// What the search found for one problem.
pub enum Found {
    /// The problem's signature, the tuner's report (its finalists included).
    Tuned(String, TuneReport),
    /// The GPU or library does not offer the FP8 recipe (the message says why).
    NotOffered(String),
}

/// Runs the search for a GEMM item on `gpu` (under its SM count target).
pub fn search(gpu: &Gpu, item: &Item, opts: TuneOptions) -> anyhow::Result<Found> {
    let (report, sig, _) = match item {
        Item::Gemm { op, precision, shape, .. } => match precision.input() {
            DType::F32 => dense::<f32>(gpu, op, *shape, *precision, opts)?,
            DType::F16 => dense::<half::f16>(gpu, op, *shape, *precision, opts)?,
            _ => dense::<half::bf16>(gpu, op, *shape, *precision, opts)?,
        },
        Item::Fp8 { scaling, shape } => match fp8(gpu, scaling, *shape, opts) {
            Err(e) if e.downcast_ref().is_some_and(crate::bench::fp8::not_offered) => {
                return Ok(Found::NotOffered(e.to_string()))
            }
            other => other?,
        },
        Item::Conv { .. } | Item::Attn { .. } | Item::Grouped { .. } => {
            anyhow::bail!("{} is not a dense GEMM", item.describe())
        }
    };
    Ok(Found::Tuned(sig, report))
}

/// The search's columns of the table: the heuristic's and the fastest candidate's sustained
/// times, the gain, the candidates (added beyond the heuristic's list), those whose output
/// did not match.
pub fn columns(r: &TuneReport) -> String {
    format!(
        "{:>9.4} {:>9.4} {:>6.1}% {:>3}+{:<3} {:>3}{}",
        r.heuristic_ms,
        r.best_ms,
        (r.heuristic_ms / r.best_ms - 1.0) * 100.0,
        r.candidates - r.added,
        r.added,
        r.mismatched,
        if r.timed_in_graph { " g" } else { "  " }
    )
}

/// Tunes one FP8 problem: E4M3 operands of a recipe quantised from random bf16, bf16 output.
fn fp8(gpu: &Gpu, scaling: &str, (m, n, k): Shape, opts: TuneOptions) -> anyhow::Result<(TuneReport, String, Tactic)> {
    use gemmbridge::fp8::{Fp8Format, Source};
    let (xs, ws) = crate::bench::fp8::recipe(scaling)?;
    let s = gpu.stream();
    let xh: CudaSlice<half::bf16> = s.clone_htod(&normal::<half::bf16>(m * k))?;
    let wh: CudaSlice<half::bf16> = s.clone_htod(&normal::<half::bf16>(n * k))?;
    let x = gpu.fp8().quantize(&xh, m, k, Source::RowMajor, Fp8Format::E4M3, xs)?;
    let w = gpu.fp8().quantize(&wh, n, k, Source::RowMajor, Fp8Format::E4M3, ws)?;
    let mut y: CudaSlice<half::bf16> = s.alloc_zeros(m * n)?;
    Ok(gpu.tune().fp8(&x, &w, &mut y, gemmbridge::cuda::Fp8Options::default(), opts)?)
}

/// Tunes one dense problem on random operands (f32/tf32 inputs with f32 outputs, half inputs
/// with half outputs: `T` serves both).
fn dense<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    op: &str,
    shape: Shape,
    prec: Precision,
    opts: TuneOptions,
) -> anyhow::Result<(TuneReport, String, Tactic)> {
    let (m, n, k) = shape;
    let p = problem(op, shape, prec)?;
    let s = gpu.stream();
    let b = p.batch();
    let x: CudaSlice<T> = s.clone_htod(&normal::<T>(m * k * b))?;
    let w: CudaSlice<T> = s.clone_htod(&normal::<T>(k * n * b))?;
    let bias: CudaSlice<T> = s.clone_htod(&normal::<T>(n))?;
    let mut c: CudaSlice<T> = s.alloc_zeros(m * n * b)?;
    let sz = std::mem::size_of::<T>();
    let r = |b: &CudaSlice<T>| RawBuffer { address: b.device_ptr(s).0, len_bytes: b.len() * sz };
    let rc = RawBuffer { address: c.device_ptr_mut(s).0, len_bytes: m * n * b * sz };
    let bias = (p.epilogue() != Epilogue::None).then(|| r(&bias));
    // SAFETY: live buffers of this context, sized by the problem, used on gpu.stream() only.
    let out = unsafe {
        gpu.tune().gemm_raw(
            &p,
            Scale::PRODUCT,
            RawOperands { a: r(&x), b: r(&w), c: rc, c_in: None, bias, aux: None },
            opts,
        )
    }?;
    Ok(out)
}
