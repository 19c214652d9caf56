//! GPU tests of RMSNorm on cuDNN's norm graph ([`Gpu::rms_norm_forward`],
//! [`Gpu::rms_norm_backward`]) against the float64 definitions
//! ([`gemmbridge::norm::reference`]): rows 1, 7, 129, 4099 × features 64, 1000, 4096, 5120, bf16
//! and f16 within 1e-2 (the inverse RMS in f32 within 1e-5 relative per row), forward in the
//! inference and the training phase, then the backward; every output poisoned with NaN first.
//! What the loaded cuDNN may or may not take — f32 I/O, an f32 `dw` beside bf16, strided rows,
//! odd feature counts, the pre-norm residual add, the FP8 E4M3 output — is checked as "served
//! and right, or refused by name with nothing written" (each test prints which). Bad input is
//! named before anything is written; a planned call captured into a CUDA graph gives the eager
//! call's bits.

mod common;

use std::sync::{Arc, RwLock};

use common::{gpu, gpu_with, normal, poison, rng};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use gemmbridge::cuda::{Fp8Out, Gpu, GpuOptions, NormServed, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
use gemmbridge::fp8::{fp8_to_f32, Fp8Format};
use gemmbridge::half::{bf16, f16};
use gemmbridge::norm::{reference, GradType, NormTensor, RmsNorm};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error, Which};
use rand::rngs::StdRng;

use NormTensor::{Dx, Dy, Residual, Sum, X, Y};

/// The inverse RMS's band: the largest relative error of a row.
const INV_RMS_BAND: f64 = 1e-5;

/// The capture test takes this exclusively, the others share it (another thread's first launch
/// or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

fn band(d: DType) -> f64 {
    if d == DType::F32 {
        1e-5
    } else {
        1e-2
    }
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn up<T: DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).unwrap()
}

fn down<T: DeviceRepr + Default + Clone>(s: &Arc<CudaStream>, v: &CudaSlice<T>) -> Vec<T> {
    s.clone_dtoh(v).unwrap()
}

/// Whether every element is still NaN (nothing was written).
fn untouched<T: Element + DeviceRepr>(s: &Arc<CudaStream>, v: &CudaSlice<T>) -> bool {
    down(s, v).iter().all(|x| x.to_f64().is_nan())
}

/// A host buffer of tensor `t`: normal values at its elements, NaN between rows (a read of
/// the gaps would show).
fn rows<T: Element>(p: &RmsNorm, t: NormTensor, r: &mut StdRng) -> Vec<T> {
    let mut buf = poison::<T>(p.required_elems(t));
    let vals: Vec<T> = normal(r, p.rows * p.features);
    for (i, row) in vals.chunks_exact(p.features).enumerate() {
        let at = p.index(t, i, 0);
        buf[at..at + p.features].copy_from_slice(row);
    }
    buf
}

/// Tensor `t` of `got` within `band` of `want` (dense float64), every element between its
/// rows still NaN.
fn check_rows<T: Element>(p: &RmsNorm, t: NormTensor, got: &[T], want: &[f64], band: f64, what: &str) {
    let e = rel_error(&wide(&p.gather(t, got).unwrap()), want);
    assert!(e <= band, "{} {what}: rel error {e:e} > {band:e}", p.describe());
    for (at, v) in got.iter().enumerate() {
        if at % p.ld(t) >= p.features {
            assert!(v.to_f64().is_nan(), "{} {what}: element {at} between rows was written", p.describe());
        }
    }
}

/// The largest relative error of a row's inverse RMS.
fn inv_rms_error(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(&g, w)| (f64::from(g) - w).abs() / w).fold(0.0, |a, e| {
        if e.is_nan() {
            f64::INFINITY
        } else {
            a.max(e)
        }
    })
}

/// The device inputs of one problem and their float64 values.
struct Inputs<T> {
    x: CudaSlice<T>,
    w: CudaSlice<T>,
    dy: CudaSlice<T>,
    x64: Vec<f64>,
    w64: Vec<f64>,
    dy64: Vec<f64>,
}

fn inputs<T: Element + DeviceRepr>(s: &Arc<CudaStream>, p: &RmsNorm, r: &mut StdRng) -> Inputs<T> {
    let (x, w, dy) = (rows::<T>(p, X, r), normal::<T>(r, p.features), rows::<T>(p, Dy, r));
    let (x64, w64, dy64) = (wide(&p.gather(X, &x).unwrap()), wide(&w), wide(&p.gather(Dy, &dy).unwrap()));
    Inputs { x: up(s, &x), w: up(s, &w), dy: up(s, &dy), x64, w64, dy64 }
}

/// Forward in both phases, then the backward from the training forward's inverse RMS, against
/// float64. `Err` with the first refusal, after checking that the refused call wrote nothing.
fn run_case<T: Element + DeviceRepr>(gpu: &Gpu, p: &RmsNorm, r: &mut StdRng) -> Result<(), Error> {
    let (s, band) = (gpu.stream(), band(p.dtype));
    let inp = inputs::<T>(s, p, r);
    let want = reference::forward(p, &inp.x64, &inp.w64);
    let mut y = up(s, &poison::<T>(p.required_elems(Y)));
    if let Err(e) = gpu.rms_norm_forward(p, RmsNormIn::new(&inp.x, &inp.w), RmsNormOut::new(&mut y)) {
        assert!(untouched(s, &y), "{}: a refused forward wrote y", p.describe());
        return Err(e);
    }
    check_rows(p, Y, &down(s, &y), &want.y, band, "inference y");
    let mut y = up(s, &poison::<T>(p.required_elems(Y)));
    let mut inv = up(s, &vec![f32::NAN; p.rows]);
    if let Err(e) = gpu.rms_norm_forward(p, RmsNormIn::new(&inp.x, &inp.w), RmsNormOut::new(&mut y).training(&mut inv))
    {
        assert!(untouched(s, &y) && untouched(s, &inv), "{}: a refused forward wrote", p.describe());
        return Err(e);
    }
    check_rows(p, Y, &down(s, &y), &want.y, band, "training y");
    let e = inv_rms_error(&down(s, &inv), &want.inv_rms);
    assert!(e <= INV_RMS_BAND, "{} inv_rms: rel error {e:e} > {INV_RMS_BAND:e}", p.describe());
    backward_case(gpu, p, &inp, &inv)
}

/// The backward of one problem from `inv` against float64 (`Err` as [`run_case`]).
fn backward_case<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &RmsNorm,
    inp: &Inputs<T>,
    inv: &CudaSlice<f32>,
) -> Result<(), Error> {
    let (s, band) = (gpu.stream(), band(p.dtype));
    let want = reference::backward(p, &inp.x64, &inp.w64, &inp.dy64);
    let mut dx = up(s, &poison::<T>(p.required_elems(Dx)));
    let saved = RmsNormSaved { x: &inp.x, w: &inp.w, inv_rms: inv, dy: &inp.dy };
    let (r, dw) = match p.dw {
        GradType::Io => {
            let mut dw = up(s, &poison::<T>(p.features));
            let r = gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::Io(&mut dw));
            (r, wide(&down(s, &dw)))
        }
        GradType::F32 => {
            let mut dw = up(s, &vec![f32::NAN; p.features]);
            let r = gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::F32(&mut dw));
            (r, wide(&down(s, &dw)))
        }
    };
    if let Err(e) = r {
        assert!(untouched(s, &dx) && dw.iter().all(|v| v.is_nan()), "{}: a refused backward wrote", p.describe());
        return Err(e);
    }
    check_rows(p, Dx, &down(s, &dx), &want.dx, band, "dx");
    let e = rel_error(&dw, &want.dw);
    assert!(e <= band, "{} dw: rel error {e:e} > {band:e}", p.describe());
    Ok(())
}

/// The sizes every bf16/f16 run must serve.
fn sizes() -> Vec<(usize, usize)> {
    vec![(1, 64), (1, 5120), (7, 4096), (7, 1000), (129, 64), (129, 5120), (129, 1000), (4099, 64), (4099, 4096)]
}

fn served<T: Element + DeviceRepr>(dtype: DType, extra: &[(usize, usize)]) {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for &(rows, features) in sizes().iter().chain(extra) {
        let p = RmsNorm::new(rows, features, 1e-5, dtype);
        run_case::<T>(&gpu, &p, &mut r).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_and_backward_match_float64_bf16() {
    served::<bf16>(DType::BF16, &[(4099, 5120)]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_and_backward_match_float64_f16() {
    served::<f16>(DType::F16, &[]);
}

/// "Served and right, or refused by name": `Ok(true)` served, `Ok(false)` refused with
/// [`Error::Unsupported`] (printed); any other error fails.
fn served_or_refused(what: &str, r: Result<(), Error>) -> bool {
    match r {
        Ok(()) => {
            eprintln!("{what}: served");
            true
        }
        Err(e @ Error::Unsupported { .. }) => {
            eprintln!("{what}: refused by name: {e}");
            false
        }
        Err(e) => panic!("{what}: neither served nor refused by name: {e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_io_is_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features) in [(7, 4096), (129, 1000), (4099, 64)] {
        let p = RmsNorm::new(rows, features, 1e-6, DType::F32);
        served_or_refused(&p.describe(), run_case::<f32>(&gpu, &p, &mut r));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_f32_weight_gradient_is_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features) in [(7, 4096), (4099, 1000)] {
        let p = RmsNorm::new(rows, features, 1e-5, DType::BF16).with_dw(GradType::F32);
        served_or_refused(&p.describe(), run_case::<bf16>(&gpu, &p, &mut r));
        let p = RmsNorm { dtype: DType::F16, ..p };
        served_or_refused(&p.describe(), run_case::<f16>(&gpu, &p, &mut r));
    }
}

/// x a slice of a fused QKV projection's output (ld 3·features), y, dy and dx with gaps.
#[test]
#[ignore = "needs a CUDA GPU"]
fn strided_rows_are_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features) in [(129, 4096), (7, 1000)] {
        let p = RmsNorm::new(rows, features, 1e-5, DType::BF16)
            .with_ld(X, 3 * features)
            .with_ld(Y, features + 64)
            .with_ld(Dy, 2 * features)
            .with_ld(Dx, features + 8);
        served_or_refused(&p.describe(), run_case::<bf16>(&gpu, &p, &mut r));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn odd_feature_counts_are_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features) in [(7, 77), (129, 4097), (33, 1001)] {
        let p = RmsNorm::new(rows, features, 1e-5, DType::BF16);
        served_or_refused(&p.describe(), run_case::<bf16>(&gpu, &p, &mut r));
    }
}

/// `sum = x + residual` written and normalised, against float64 (the sum within the band, y
/// within the band of the norm of the exact sum).
fn residual_case(gpu: &Gpu, p: &RmsNorm, r: &mut StdRng, training: bool) -> Result<(), Error> {
    residual_served::<bf16>(gpu, p, r, training).map(|_| ())
}

/// [`residual_case`] in the element type `T` (the problem's), returning which way the forward
/// ran; the sum and y within the type's band (f32: the sum 1e-6, y 1e-5).
fn residual_served<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &RmsNorm,
    r: &mut StdRng,
    training: bool,
) -> Result<NormServed, Error> {
    let s = gpu.stream();
    let (xh, rh, wh) = (rows::<T>(p, X, r), rows::<T>(p, Residual, r), normal::<T>(r, p.features));
    let (x, res, w) = (up(s, &xh), up(s, &rh), up(s, &wh));
    let sum64: Vec<f64> = wide(&p.gather(X, &xh).unwrap())
        .iter()
        .zip(wide(&p.gather(Residual, &rh).unwrap()))
        .map(|(a, b)| a + b)
        .collect();
    let want = reference::forward(p, &sum64, &wide(&wh));
    let (mut y, mut sum) = (up(s, &poison::<T>(p.required_elems(Y))), up(s, &poison::<T>(p.required_elems(Sum))));
    let mut inv = up(s, &vec![f32::NAN; p.rows]);
    let input = RmsNormIn { residual: Some(&res), ..RmsNormIn::new(&x, &w) };
    let mut out = RmsNormOut { sum: Some(&mut sum), ..RmsNormOut::new(&mut y) };
    if training {
        out.inv_rms = Some(&mut inv);
    }
    let served = match gpu.rms_norm_forward(p, input, out) {
        Ok(served) => served,
        Err(e) => {
            let clean = untouched(s, &y) && untouched(s, &sum) && untouched(s, &inv);
            assert!(clean, "{}: a refused call wrote", p.describe());
            return Err(e);
        }
    };
    let band = band(p.dtype);
    check_rows(p, Sum, &down(s, &sum), &sum64, band, "sum");
    check_rows(p, Y, &down(s, &y), &want.y, band, "y");
    if training {
        let e = inv_rms_error(&down(s, &inv), &want.inv_rms);
        // the norm may read the sum rounded to the I/O type: that type's band
        assert!(e <= band, "{} inv_rms of the sum: rel error {e:e}", p.describe());
    }
    Ok(served)
}

/// Sizes where cuDNN 9.14 on the H100 refused the graph with the residual add (training
/// phase) while it took the norm alone: the forward runs, as two steps where the fused graph
/// is refused, and says which ran; every size runs wherever the norm alone does, as PyTorch's
/// add-then-norm does.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_residual_add_runs_where_only_the_norm_alone_is_served() {
    let _shared = shared();
    if !gemmbridge::cuda::library::has_cublaslt() {
        eprintln!("skipped: the add runs on cuBLASLt, which is not loaded here");
        return;
    }
    let (gpu, mut r) = (gpu(), rng());
    for features in [4097, 4104, 4096, 1001] {
        for training in [true, false] {
            let p = RmsNorm::new(37, features, 1e-5, DType::BF16);
            let alone = run_case::<bf16>(&gpu, &p, &mut r);
            let with_add = residual_served::<bf16>(&gpu, &p, &mut r, training);
            let what = format!("{} training {training}", p.describe());
            match (alone, with_add) {
                (Ok(()), Ok(served)) => eprintln!("{what}: residual add served {served:?}"),
                (Ok(()), Err(e)) => panic!("{what}: the norm alone runs but the residual add was refused: {e}"),
                (Err(e), _) => eprintln!("{what}: the norm alone is refused here ({e}); nothing to check"),
            }
        }
    }
}

/// With the fusion off, the add then the norm in every I/O type, strided rows included, each
/// saying so and within its type's band of float64 (the fallback's own check, whatever the
/// loaded cuDNN fuses).
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_add_then_the_norm_is_right_in_every_type() {
    let _shared = shared();
    if !gemmbridge::cuda::library::has_cublaslt() {
        eprintln!("skipped: the add runs on cuBLASLt, which is not loaded here");
        return;
    }
    let (gpu, mut r) = (gpu_with(GpuOptions::default().norm_fusion(false)), rng());
    let strided =
        |p: RmsNorm| p.with_ld(X, p.features + 24).with_ld(Residual, 2 * p.features).with_ld(Sum, p.features + 8);
    for p in [RmsNorm::new(37, 4097, 1e-5, DType::BF16), strided(RmsNorm::new(9, 1000, 1e-5, DType::BF16))] {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let p = RmsNorm { dtype, ..p };
            let served = match dtype {
                DType::BF16 => residual_served::<bf16>(&gpu, &p, &mut r, true),
                DType::F16 => residual_served::<f16>(&gpu, &p, &mut r, true),
                _ => residual_served::<f32>(&gpu, &p, &mut r, false),
            };
            match served {
                Ok(s) => assert_eq!(s, NormServed::AddThenNorm, "{}", p.describe()),
                // the norm alone may be refused (f32 I/O, strided rows): named, nothing written
                Err(e @ Error::Unsupported { .. }) => eprintln!("{}: refused by name: {e}", p.describe()),
                Err(e) => panic!("{}: {e}", p.describe()),
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_pre_norm_residual_add_is_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features, training) in [(129, 4096, true), (7, 1000, false), (4099, 5120, true)] {
        let p = RmsNorm::new(rows, features, 1e-5, DType::BF16);
        served_or_refused(
            &format!("{} residual training {training}", p.describe()),
            residual_case(&gpu, &p, &mut r, training),
        );
    }
    // a residual stream slice: x, residual and sum strided
    let p = RmsNorm::new(129, 1000, 1e-5, DType::BF16).with_ld(X, 1024).with_ld(Residual, 2000).with_ld(Sum, 1016);
    served_or_refused(&format!("{} residual", p.describe()), residual_case(&gpu, &p, &mut r, true));
}

/// y in E4M3 with a scale that keeps the largest |y| at 90 % of 448, its amax, against float64.
fn fp8_case(gpu: &Gpu, p: &RmsNorm, r: &mut StdRng) -> Result<(), Error> {
    let s = gpu.stream();
    let (xh, wh) = (rows::<bf16>(p, X, r), normal::<bf16>(r, p.features));
    let (x, w) = (up(s, &xh), up(s, &wh));
    let want = reference::forward(p, &wide(&p.gather(X, &xh).unwrap()), &wide(&wh));
    let amax_want = want.y.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let factor = (0.9 * 448.0 / amax_want) as f32;
    let scale = up(s, &[factor]);
    let mut amax = up(s, &[f32::NAN]);
    let mut y8 = up(s, &vec![0xFFu8; p.required_elems(Y)]);
    let out = RmsNormOut {
        y: RmsNormY::Fp8 { y: &mut y8, out: Fp8Out { d_scale: &scale, amax: &mut amax } },
        inv_rms: None,
        sum: None,
    };
    if let Err(e) = gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), out) {
        assert!(
            down(s, &y8).iter().all(|&b| b == 0xFF) && untouched(s, &amax),
            "{}: a refused call wrote",
            p.describe()
        );
        return Err(e);
    }
    let got: Vec<f64> = p
        .gather(Y, &down(s, &y8))
        .unwrap()
        .iter()
        .map(|&b| f64::from(fp8_to_f32(b, Fp8Format::E4M3)) / f64::from(factor))
        .collect();
    // E4M3 keeps 3 mantissa bits: a relative rounding error of at most 2⁻⁴ per element
    let e = rel_error(&got, &want.y);
    assert!(e <= 0.05, "{} FP8 y: rel error {e:e} > 5e-2", p.describe());
    let a = f64::from(down(s, &amax)[0]);
    assert!((a - amax_want).abs() <= 1e-4 * amax_want, "{} amax {a} vs {amax_want}", p.describe());
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_fp8_output_with_scale_and_amax_is_served_or_refused_by_name() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    for (rows, features) in [(129, 4096), (7, 1024), (4099, 5120)] {
        let p = RmsNorm::new(rows, features, 1e-5, DType::BF16);
        served_or_refused(&format!("{} FP8 E4M3 y", p.describe()), fp8_case(&gpu, &p, &mut r));
    }
}

/// Every bad input is a named error before anything is written (the outputs keep their
/// poison), and the engine runs a good call afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    let s = gpu.stream().clone();
    let p = RmsNorm::new(129, 1024, 1e-5, DType::BF16);
    let inp = inputs::<bf16>(&s, &p, &mut r);
    let (x, w) = (&inp.x, &inp.w);
    let n = p.required_elems(Y);
    let (mut y, mut inv) = (up(&s, &poison::<bf16>(n)), up(&s, &vec![f32::NAN; p.rows]));
    let shape = |e: Error| match e {
        Error::NormShape { what, .. } => what,
        other => panic!("{other:?}"),
    };
    let e =
        gpu.rms_norm_forward(&RmsNorm { eps: -1.0, ..p }, RmsNormIn::new(x, w), RmsNormOut::new(&mut y)).unwrap_err();
    assert_eq!(shape(e), "epsilon is not finite and positive");
    let e = gpu.rms_norm_forward(&p.with_ld(X, 1000), RmsNormIn::new(x, w), RmsNormOut::new(&mut y)).unwrap_err();
    assert_eq!(shape(e), "a leading dimension is smaller than the features");
    let input = RmsNormIn { residual: Some(x), ..RmsNormIn::new(x, w) };
    let e = gpu.rms_norm_forward(&p, input, RmsNormOut::new(&mut y)).unwrap_err();
    assert_eq!(shape(e), "a residual was given without the sum output (x + residual)");
    let e = gpu.rms_norm_forward(&RmsNorm { dtype: DType::F16, ..p }, RmsNormIn::new(x, w), RmsNormOut::new(&mut y));
    assert!(matches!(e, Err(Error::DTypeMismatch { operand: Which::Norm("x"), .. })), "{e:?}");
    let short = up(&s, &normal::<bf16>(&mut r, n - 1));
    let e = gpu.rms_norm_forward(&p, RmsNormIn::new(&short, w), RmsNormOut::new(&mut y)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("x"), .. }), "{e:?}");
    let e = gpu.rms_norm_forward(&p, RmsNormIn::new(x, &short.slice(..1023)), RmsNormOut::new(&mut y)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("w"), .. }), "{e:?}");
    let mut inv_short = up(&s, &vec![f32::NAN; p.rows - 1]);
    let e =
        gpu.rms_norm_forward(&p, RmsNormIn::new(x, w), RmsNormOut::new(&mut y).training(&mut inv_short)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("inv_rms"), .. }), "{e:?}");
    // SAFETY: the aliases are only passed to calls refused before launch, and forgotten (never
    // freed twice).
    let x_addr = x.device_ptr(&s).0;
    let mut odd = unsafe { s.upgrade_device_ptr::<bf16>(x_addr + 1, n) };
    let e = gpu.rms_norm_forward(&p, RmsNormIn::new(x, w), RmsNormOut::new(&mut odd)).unwrap_err();
    let _ = odd.leak();
    assert!(matches!(e, Error::Misaligned { operand: Which::Norm("y"), align: 2, .. }), "{e:?}");
    let mut alias = unsafe { s.upgrade_device_ptr::<bf16>(x_addr, n) };
    let e = gpu.rms_norm_forward(&p, RmsNormIn::new(x, w), RmsNormOut::new(&mut alias).training(&mut inv)).unwrap_err();
    let _ = alias.leak();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::Norm("y"), input: Which::Norm("x"), .. }), "{e:?}");
    assert!(untouched(&s, &y) && untouched(&s, &inv), "a refused forward wrote");
    // the backward: dw of the other type than the problem's
    let (mut dx, mut dw) = (up(&s, &poison::<bf16>(n)), up(&s, &vec![f32::NAN; p.features]));
    let saved = RmsNormSaved { x, w, inv_rms: &inv, dy: &inp.dy };
    let e = gpu.rms_norm_backward(&p, saved, &mut dx, RmsNormDw::F32(&mut dw)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Norm("dw"), .. }), "{e:?}");
    assert!(untouched(&s, &dx) && untouched(&s, &dw), "a refused backward wrote");
    // the engine runs good calls afterwards (dw in f32 where the loaded cuDNN takes it)
    gpu.rms_norm_forward(&p, RmsNormIn::new(x, w), RmsNormOut::new(&mut y).training(&mut inv)).unwrap();
    let saved = RmsNormSaved { x, w, inv_rms: &inv, dy: &inp.dy };
    match gpu.rms_norm_backward(&p.with_dw(GradType::F32), saved, &mut dx, RmsNormDw::F32(&mut dw)) {
        Err(Error::Unsupported { .. }) => {
            let mut dwb = up(&s, &poison::<bf16>(p.features));
            gpu.rms_norm_backward(&p, saved, &mut dx, RmsNormDw::Io(&mut dwb)).unwrap();
        }
        other => other.unwrap(),
    }
    assert!(down(&s, &y).iter().chain(&down(&s, &dx)).all(|v| v.is_finite()));
}

/// A first call inside a capture is a named error; planned calls (the training forward and the
/// backward), captured into a graph and launched, give the eager calls' bits. cudarc's event
/// tracking is off on this context, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn planned_norm_is_capturable() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut r) = (gpu.stream().clone(), rng());
    let p = RmsNorm::new(4099, 4096, 1e-5, DType::BF16);
    let inp = inputs::<bf16>(&s, &p, &mut r);
    let n = p.required_elems(Y);
    let fresh = || {
        (
            up(&s, &poison::<bf16>(n)),
            up(&s, &vec![f32::NAN; p.rows]),
            up(&s, &poison::<bf16>(n)),
            up(&s, &poison::<bf16>(p.features)),
        )
    };
    let (mut y, mut inv, mut dx, mut dw) = fresh();
    s.begin_capture(mode).unwrap();
    let e = gpu.rms_norm_forward(&p, RmsNormIn::new(&inp.x, &inp.w), RmsNormOut::new(&mut y).training(&mut inv));
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Err(Error::NotCapturable { .. })), "{e:?}");

    let run =
        |y: &mut CudaSlice<bf16>, inv: &mut CudaSlice<f32>, dx: &mut CudaSlice<bf16>, dw: &mut CudaSlice<bf16>| {
            gpu.rms_norm_forward(&p, RmsNormIn::new(&inp.x, &inp.w), RmsNormOut::new(y).training(inv))?;
            let saved = RmsNormSaved { x: &inp.x, w: &inp.w, inv_rms: &*inv, dy: &inp.dy };
            gpu.rms_norm_backward(&p, saved, dx, RmsNormDw::Io(dw))
        };
    run(&mut y, &mut inv, &mut dx, &mut dw).unwrap();
    let eager = (down(&s, &y), down(&s, &inv), down(&s, &dx), down(&s, &dw));
    let (mut yc, mut invc, mut dxc, mut dwc) = fresh();
    s.synchronize().unwrap();
    s.begin_capture(mode).unwrap();
    let captured = run(&mut yc, &mut invc, &mut dxc, &mut dwc);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    captured.unwrap();
    assert!(untouched(&s, &yc), "capturing ran the forward");
    graph.unwrap().expect("a graph").launch().unwrap();
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&down(&s, &yc)), bits(&eager.0), "captured y");
    assert_eq!(
        down(&s, &invc).iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        eager.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "captured inv_rms"
    );
    assert_eq!(bits(&down(&s, &dxc)), bits(&eager.2), "captured dx");
    assert_eq!(bits(&down(&s, &dwc)), bits(&eager.3), "captured dw");
}
