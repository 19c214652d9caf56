//! `gemmbridge probe`'s RMSNorm table: one line per question about the loaded cuDNN's norm
//! graph, each answered by running it against float64 — "yes" (served, every output within
//! its band), "no" (refused by name: the library's `Error::Unsupported`, with cuDNN's reason),
//! "WRONG" (served outside its band) or "ERROR" (another error). The bf16 and f16 lines must
//! say yes; the others are what this cuDNN offers (f32 I/O, an f32 `dw` beside bf16, strided
//! rows, odd feature counts, the pre-norm residual add, the FP8 E4M3 output with a scale and an
//! amax). Run it once per cuDNN (the system's, and PyTorch's through `LD_LIBRARY_PATH`).

use cudarc::driver::DeviceRepr;
use gemmbridge::cuda::{Fp8Out, Gpu, NormServed, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY};
use gemmbridge::fp8::{fp8_to_f32, Fp8Format};
use gemmbridge::half::{bf16, f16};
use gemmbridge::norm::{reference, GradType, NormTensor, RmsNorm};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error};

use crate::random::normal;

use NormTensor::{Dx, Dy, Residual, Sum, X, Y};

/// What one question measured: (quantity, error, band).
type Checks = Vec<(&'static str, f64, f64)>;

/// `n` NaNs (outputs are poisoned before each call).
fn nan<T: Element>(n: usize) -> Vec<T> {
    vec![T::from_f64(f64::NAN); n]
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// The largest relative error of a row's inverse RMS (∞ for a NaN).
fn inv_rms_error(got: &[f32], want: &[f64]) -> f64 {
    let e = got.iter().zip(want).map(|(&g, w)| (f64::from(g) - w).abs() / w);
    e.fold(0.0, |a, e| if e.is_nan() { f64::INFINITY } else { a.max(e) })
}

/// The training forward and the backward of `p` against float64.
fn plain<T: Element + DeviceRepr>(gpu: &Gpu, p: &RmsNorm) -> anyhow::Result<Checks> {
    let s = gpu.stream();
    let band = if p.dtype == DType::F32 { 1e-5 } else { 1e-2 };
    let (xh, wh, dyh) = (normal::<T>(p.required_elems(X)), normal::<T>(p.features), normal::<T>(p.required_elems(Dy)));
    let (x, w, dy) = (s.clone_htod(&xh)?, s.clone_htod(&wh)?, s.clone_htod(&dyh)?);
    let mut y = s.clone_htod(&nan::<T>(p.required_elems(Y)))?;
    let mut inv = s.clone_htod(&nan::<f32>(p.rows))?;
    let mut dx = s.clone_htod(&nan::<T>(p.required_elems(Dx)))?;
    gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut::new(&mut y).training(&mut inv))?;
    let saved = RmsNormSaved { x: &x, w: &w, inv_rms: &inv, dy: &dy };
    let dw = match p.dw {
        GradType::Io => {
            let mut dw = s.clone_htod(&nan::<T>(p.features))?;
            gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::Io(&mut dw))?;
            wide(&s.clone_dtoh(&dw)?)
        }
        GradType::F32 => {
            let mut dw = s.clone_htod(&nan::<f32>(p.features))?;
            gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::F32(&mut dw))?;
            wide(&s.clone_dtoh(&dw)?)
        }
    };
    let (x64, w64) = (wide(&p.gather(X, &xh)?), wide(&wh));
    let f = reference::forward(p, &x64, &w64);
    let b = reference::backward(p, &x64, &w64, &wide(&p.gather(Dy, &dyh)?));
    let got = |t, v: &cudarc::driver::CudaSlice<T>| -> anyhow::Result<Vec<f64>> {
        Ok(wide(&p.gather(t, &s.clone_dtoh(v)?)?))
    };
    Ok(vec![
        ("y", rel_error(&got(Y, &y)?, &f.y), band),
        ("inv_rms", inv_rms_error(&s.clone_dtoh(&inv)?, &f.inv_rms), 1e-5),
        ("dx", rel_error(&got(Dx, &dx)?, &b.dx), band),
        ("dw", rel_error(&dw, &b.dw), band),
    ])
}

/// The training forward with a residual (bf16): the sum and y against float64, each named with
/// the way it ran (cuDNN's fused graph, or the add and then the norm).
fn residual(gpu: &Gpu, p: &RmsNorm) -> anyhow::Result<Checks> {
    let s = gpu.stream();
    let (xh, rh, wh) =
        (normal::<bf16>(p.required_elems(X)), normal::<bf16>(p.required_elems(Residual)), normal::<bf16>(p.features));
    let (x, r, w) = (s.clone_htod(&xh)?, s.clone_htod(&rh)?, s.clone_htod(&wh)?);
    let mut y = s.clone_htod(&nan::<bf16>(p.required_elems(Y)))?;
    let mut sum = s.clone_htod(&nan::<bf16>(p.required_elems(Sum)))?;
    let mut inv = s.clone_htod(&nan::<f32>(p.rows))?;
    let input = RmsNormIn { residual: Some(&r), ..RmsNormIn::new(&x, &w) };
    let out = RmsNormOut { sum: Some(&mut sum), ..RmsNormOut::new(&mut y).training(&mut inv) };
    let fused = gpu.rms_norm_forward(p, input, out)? == NormServed::Fused;
    let sum64: Vec<f64> =
        wide(&p.gather(X, &xh)?).iter().zip(wide(&p.gather(Residual, &rh)?)).map(|(a, b)| a + b).collect();
    let f = reference::forward(p, &sum64, &wide(&wh));
    let got_sum = wide(&p.gather(Sum, &s.clone_dtoh(&sum)?)?);
    let got_y = wide(&p.gather(Y, &s.clone_dtoh(&y)?)?);
    let (sum_name, y_name) =
        if fused { ("sum (fused)", "y (fused)") } else { ("sum (add, then norm)", "y (add, then norm)") };
    Ok(vec![(sum_name, rel_error(&got_sum, &sum64), 1e-2), (y_name, rel_error(&got_y, &f.y), 1e-2)])
}

/// The inference forward (bf16) into E4M3 with a scale keeping the largest |y| at 90 % of 448:
/// the dequantised y (E4M3's 3 mantissa bits: band 5e-2) and the amax against float64.
fn fp8(gpu: &Gpu, p: &RmsNorm) -> anyhow::Result<Checks> {
    let s = gpu.stream();
    let (xh, wh) = (normal::<bf16>(p.required_elems(X)), normal::<bf16>(p.features));
    let (x, w) = (s.clone_htod(&xh)?, s.clone_htod(&wh)?);
    let f = reference::forward(p, &wide(&p.gather(X, &xh)?), &wide(&wh));
    let amax_want = f.y.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let factor = (0.9 * 448.0 / amax_want) as f32;
    let scale = s.clone_htod(&[factor])?;
    let mut amax = s.clone_htod(&[f32::NAN])?;
    let mut y8 = s.clone_htod(&vec![0x7Fu8; p.required_elems(Y)])?;
    let y = RmsNormY::Fp8 { y: &mut y8, out: Fp8Out { d_scale: &scale, amax: &mut amax } };
    gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut { y, inv_rms: None, sum: None })?;
    let bytes = p.gather(Y, &s.clone_dtoh(&y8)?)?;
    let got: Vec<f64> = bytes.iter().map(|&b| f64::from(fp8_to_f32(b, Fp8Format::E4M3)) / f64::from(factor)).collect();
    let a = f64::from(s.clone_dtoh(&amax)?[0]);
    Ok(vec![("y", rel_error(&got, &f.y), 5e-2), ("amax", (a - amax_want).abs() / amax_want, 1e-4)])
}

/// An error within its band (a NaN is not).
fn within(e: f64, band: f64) -> bool {
    e <= band
}

/// The answer's text and whether it is acceptable (`required`: only "yes" is).
fn answer(r: anyhow::Result<Checks>, required: bool) -> (String, bool) {
    let show = |c: &Checks| c.iter().map(|(n, e, _)| format!("{n} {e:.1e}")).collect::<Vec<_>>().join(", ");
    match r {
        Ok(c) if c.iter().all(|(_, e, b)| within(*e, *b)) => (format!("yes ({})", show(&c)), true),
        Ok(c) => {
            let bad = c.iter().filter(|(_, e, b)| !within(*e, *b)).map(|(n, e, b)| format!("{n} {e:.1e} > {b:.0e}"));
            (format!("WRONG ({})", bad.collect::<Vec<_>>().join(", ")), false)
        }
        Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::Unsupported { .. })) => {
            (format!("no ({e})"), !required)
        }
        Err(e) => (format!("ERROR ({e:#})"), false),
    }
}

/// Prints the table; whether every answer is acceptable.
pub fn table(gpu: &Gpu) -> anyhow::Result<bool> {
    let Some(version) = gemmbridge::cuda::cudnn_version() else {
        println!("RMSNorm table: libcudnn cannot be loaded here; skipped (install cuDNN 9 to run it)");
        return Ok(true);
    };
    println!(
        "RMSNorm table (cuDNN {version}): each question run against float64 — yes (served, within its band), \
         no (refused by name), WRONG, ERROR"
    );
    let base = RmsNorm::new(4099, 4096, 1e-5, DType::BF16);
    let strided = RmsNorm::new(129, 4096, 1e-5, DType::BF16)
        .with_ld(X, 3 * 4096)
        .with_ld(Y, 4096 + 64)
        .with_ld(Dy, 2 * 4096)
        .with_ld(Dx, 4096 + 8);
    let questions: [(&str, bool, anyhow::Result<Checks>); 9] = [
        ("bf16 training forward + backward, 4099×4096", true, plain::<bf16>(gpu, &base)),
        ("f16 training forward + backward, 4099×4096", true, plain::<f16>(gpu, &RmsNorm { dtype: DType::F16, ..base })),
        ("f32 I/O", false, plain::<f32>(gpu, &RmsNorm { dtype: DType::F32, ..base })),
        ("an f32 dw with bf16 x", false, plain::<bf16>(gpu, &base.with_dw(GradType::F32))),
        ("strided rows (x in a fused QKV output, ld 3·C; y, dy, dx with gaps)", false, plain::<bf16>(gpu, &strided)),
        ("odd features (129×4097)", false, plain::<bf16>(gpu, &RmsNorm::new(129, 4097, 1e-5, DType::BF16))),
        ("pre-norm residual add (x + r → norm, the sum written)", false, residual(gpu, &base)),
        (
            "pre-norm residual add at odd features (129×4097)",
            false,
            residual(gpu, &RmsNorm::new(129, 4097, 1e-5, DType::BF16)),
        ),
        ("FP8 E4M3 output with a scale and an amax", false, fp8(gpu, &base)),
    ];
    let mut ok = true;
    for (question, required, r) in questions {
        let (line, good) = answer(r, required);
        ok &= good;
        println!("  {question:<70} {line}");
    }
    Ok(ok)
}
