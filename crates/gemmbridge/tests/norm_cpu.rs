//! RMSNorm on the CPU ([`cpu::rms_norm_forward`], [`cpu::rms_norm_backward`]) against the
//! float64 reference ([`gemmbridge::norm::reference`]): odd sizes (rows 1, 7, 33, 129;
//! features 1, 77, 1000, 4096), contiguous and strided rows, f32, f16 and bf16, `dw` in the I/O
//! type and in f32; outputs poisoned with NaN first, the elements between strided rows left as
//! they were; the inverse RMS to 1e-5 relative. Bad input is a named error with nothing
//! written.

mod common;

use common::{normal, rng};
use gemmbridge::half::{bf16, f16};
use gemmbridge::norm::{reference, GradType, NormTensor, RmsNorm};
use gemmbridge::reference::rel_error;
use gemmbridge::{cpu, DType, Element, Error, Which};
use rand::rngs::StdRng;

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// A buffer of tensor `t`: normal values at its elements, NaN between rows.
fn tensor<T: Element>(p: &RmsNorm, t: NormTensor, r: &mut StdRng) -> Vec<T> {
    let mut buf = vec![T::from_f64(f64::NAN); p.required_elems(t)];
    let vals: Vec<T> = normal(r, p.rows * p.features);
    for i in 0..p.rows {
        let at = p.index(t, i, 0);
        buf[at..at + p.features].copy_from_slice(&vals[i * p.features..(i + 1) * p.features]);
    }
    buf
}

/// Every element between the rows of tensor `t` still NaN.
fn gaps_untouched<T: Element>(p: &RmsNorm, t: NormTensor, buf: &[T]) {
    for (at, v) in buf.iter().enumerate() {
        if at % p.ld(t) >= p.features {
            assert!(v.to_f64().is_nan(), "{}: {} element {at} between rows was written", p.describe(), t.name());
        }
    }
}

/// Forward (with the inverse RMS) and backward of one problem against float64.
fn check<T: Element>(p: &RmsNorm, r: &mut StdRng) {
    let band = if p.dtype == DType::F32 { 1e-5 } else { 1e-2 };
    let (x, w, dy) = (tensor::<T>(p, NormTensor::X, r), normal::<T>(r, p.features), tensor::<T>(p, NormTensor::Dy, r));
    let mut y = vec![T::from_f64(f64::NAN); p.required_elems(NormTensor::Y)];
    let mut inv = vec![f32::NAN; p.rows];
    cpu::rms_norm_forward(p, &x, &w, &mut y, Some(&mut inv)).unwrap();
    let (x64, w64, dy64) =
        (wide(&p.gather(NormTensor::X, &x).unwrap()), wide(&w), wide(&p.gather(NormTensor::Dy, &dy).unwrap()));
    let want = reference::forward(p, &x64, &w64);
    let e = rel_error(&wide(&p.gather(NormTensor::Y, &y).unwrap()), &want.y);
    assert!(e <= band, "{} y: {e:e} > {band:e}", p.describe());
    for (i, (&got, want)) in inv.iter().zip(&want.inv_rms).enumerate() {
        let rel = (f64::from(got) - want).abs() / want;
        assert!(rel <= 1e-5, "{} inv_rms[{i}] {got} vs {want}: {rel:e}", p.describe());
    }
    gaps_untouched(p, NormTensor::Y, &y);
    let g = reference::backward(p, &x64, &w64, &dy64);
    let mut dx = vec![T::from_f64(f64::NAN); p.required_elems(NormTensor::Dx)];
    let dw = match p.dw {
        GradType::Io => {
            let mut dw = vec![T::from_f64(f64::NAN); p.features];
            cpu::rms_norm_backward(p, &x, &w, &inv, &dy, &mut dx, cpu::DwSlice::Io(&mut dw)).unwrap();
            wide(&dw)
        }
        GradType::F32 => {
            let mut dw = vec![f32::NAN; p.features];
            cpu::rms_norm_backward(p, &x, &w, &inv, &dy, &mut dx, cpu::DwSlice::F32(&mut dw)).unwrap();
            wide(&dw)
        }
    };
    let e = rel_error(&wide(&p.gather(NormTensor::Dx, &dx).unwrap()), &g.dx);
    assert!(e <= band, "{} dx: {e:e} > {band:e}", p.describe());
    let e = rel_error(&dw, &g.dw);
    assert!(e <= band, "{} dw: {e:e} > {band:e}", p.describe());
    gaps_untouched(p, NormTensor::Dx, &dx);
}

fn problems(dtype: DType) -> Vec<RmsNorm> {
    let mut v = Vec::new();
    for (rows, features) in [(1, 64), (7, 1000), (33, 77), (129, 4096), (7, 3)] {
        v.push(RmsNorm::new(rows, features, 1e-5, dtype));
    }
    let strided = RmsNorm::new(129, 77, 1e-6, dtype)
        .with_ld(NormTensor::X, 3 * 77)
        .with_ld(NormTensor::Y, 80)
        .with_ld(NormTensor::Dy, 100)
        .with_ld(NormTensor::Dx, 78);
    v.push(strided);
    v.push(strided.with_dw(GradType::F32));
    v.push(RmsNorm::new(33, 1000, 1e-5, dtype).with_dw(GradType::F32));
    v
}

#[test]
fn forward_and_backward_match_float64_at_odd_sizes() {
    let mut r = rng();
    for p in problems(DType::F32) {
        check::<f32>(&p, &mut r);
    }
    for p in problems(DType::F16) {
        check::<f16>(&p, &mut r);
    }
    for p in problems(DType::BF16) {
        check::<bf16>(&p, &mut r);
    }
}

#[test]
fn bad_input_is_named_and_nothing_is_written() {
    let mut r = rng();
    let p = RmsNorm::new(7, 64, 1e-5, DType::BF16);
    let (x, w) = (tensor::<bf16>(&p, NormTensor::X, &mut r), normal::<bf16>(&mut r, 64));
    let mut y = vec![bf16::NAN; 7 * 64];
    let mut inv = vec![f32::NAN; 7];
    let nothing = |y: &[bf16], inv: &[f32]| y.iter().all(|v| v.is_nan()) && inv.iter().all(|v| v.is_nan());
    let e = cpu::rms_norm_forward(&RmsNorm { eps: 0.0, ..p }, &x, &w, &mut y, Some(&mut inv)).unwrap_err();
    assert!(matches!(e, Error::NormShape { what: "epsilon is not finite and positive", .. }), "{e}");
    let e = cpu::rms_norm_forward(&p, &x[1..], &w, &mut y, Some(&mut inv)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("x"), .. }), "{e}");
    let e = cpu::rms_norm_forward(&p, &x, &w[1..], &mut y, Some(&mut inv)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("w"), .. }), "{e}");
    let e = cpu::rms_norm_forward(&p, &x, &w, &mut y, Some(&mut inv[1..])).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Norm("inv_rms"), .. }), "{e}");
    let e = cpu::rms_norm_forward(&RmsNorm { dtype: DType::F16, ..p }, &x, &w, &mut y, None).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Norm("x"), .. }), "{e}");
    assert!(nothing(&y, &inv), "a refused forward wrote");
    let (dy, mut dx, mut dw) = (x.clone(), vec![bf16::NAN; 7 * 64], vec![f32::NAN; 64]);
    let e = cpu::rms_norm_backward(&p, &x, &w, &[1.0; 7], &dy, &mut dx, cpu::DwSlice::F32(&mut dw)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Norm("dw"), .. }), "{e}");
    assert!(dx.iter().all(|v| v.is_nan()) && dw.iter().all(|v| v.is_nan()), "a refused backward wrote");
    cpu::rms_norm_forward(&p, &x, &w, &mut y, Some(&mut inv)).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
}

/// For an f32 problem both forms of `dw` hold f32: either is taken, with the same result; for
/// bf16 I/O the f32 form is refused under `GradType::Io`, naming the element types.
#[test]
fn an_f32_problem_takes_either_form_of_dw() {
    let mut r = rng();
    let p = RmsNorm::new(3, 7, 1e-6, DType::F32);
    let (x, w, dy) = (normal::<f32>(&mut r, 21), normal::<f32>(&mut r, 7), normal::<f32>(&mut r, 21));
    let mut inv = vec![f32::NAN; 3];
    cpu::rms_norm_forward(&p, &x, &w, &mut [f32::NAN; 21], Some(&mut inv)).unwrap();
    let mut grads = Vec::new();
    for (q, as_f32) in [(p, false), (p, true), (p.with_dw(GradType::F32), false), (p.with_dw(GradType::F32), true)] {
        let (mut dx, mut dw) = (vec![f32::NAN; 21], vec![f32::NAN; 7]);
        let d = if as_f32 { cpu::DwSlice::F32(&mut dw) } else { cpu::DwSlice::Io(&mut dw) };
        cpu::rms_norm_backward(&q, &x, &w, &inv, &dy, &mut dx, d).unwrap();
        assert!(dw.iter().chain(&dx).all(|v| v.is_finite()), "{} as_f32 {as_f32}", q.describe());
        grads.push((dx, dw));
    }
    assert!(grads.windows(2).all(|g| g[0] == g[1]), "the forms of dw disagree");
    let p = RmsNorm::new(3, 7, 1e-6, DType::BF16);
    let (x, dy) = (vec![bf16::ONE; 21], vec![bf16::ONE; 21]);
    let (mut dx, mut dw) = (vec![bf16::NAN; 21], vec![f32::NAN; 7]);
    let e = cpu::rms_norm_backward(&p, &x, &[bf16::ONE; 7], &inv, &dy, &mut dx, cpu::DwSlice::F32(&mut dw));
    match e {
        Err(e @ Error::DTypeMismatch { operand: Which::Norm("dw"), expected: DType::BF16, got: DType::F32 }) => {
            assert_eq!(e.to_string(), "RMSNorm's dw holds f32 elements but the problem needs bf16")
        }
        r => panic!("{r:?}"),
    }
}

/// The CPU calls check the leading dimensions of the tensors they use only; `gather` refuses
/// a short buffer by name.
#[test]
fn the_cpu_calls_check_only_the_tensors_they_use() {
    let p = RmsNorm::new(2, 4, 1e-6, DType::F32);
    let (x, w) = ([1.0f32; 8], [1.0f32; 4]);
    let q = p.with_ld(NormTensor::Sum, 3).with_ld(NormTensor::Residual, 1).with_ld(NormTensor::Dx, 2);
    assert!(q.validate().is_err(), "validate checks every tensor");
    let (mut y, mut y_ref) = ([f32::NAN; 8], [f32::NAN; 8]);
    cpu::rms_norm_forward(&q, &x, &w, &mut y, None).unwrap();
    cpu::rms_norm_forward(&p, &x, &w, &mut y_ref, None).unwrap();
    assert_eq!(y, y_ref);
    let e = cpu::rms_norm_forward(&p.with_ld(NormTensor::Y, 3), &x, &w, &mut y, None).unwrap_err();
    assert!(matches!(e, Error::NormShape { what: "a leading dimension is smaller than the features", .. }), "{e}");
    let e = cpu::rms_norm_backward(&q, &x, &w, &[1.0; 2], &x, &mut [0.0; 8], cpu::DwSlice::Io(&mut [0.0; 4]));
    assert!(matches!(e, Err(Error::NormShape { .. })), "the backward writes dx: {e:?}");
    let mut dx = [f32::NAN; 8];
    let q = p.with_ld(NormTensor::Y, 1).with_ld(NormTensor::Sum, 1);
    cpu::rms_norm_backward(&q, &x, &w, &[1.0; 2], &x, &mut dx, cpu::DwSlice::Io(&mut [0.0; 4])).unwrap();
    assert!(dx.iter().all(|v| v.is_finite()));
    match p.gather(NormTensor::X, &x[..5]) {
        Err(Error::BufferTooSmall { operand: Which::Norm("x"), .. }) => {}
        r => panic!("{r:?}"),
    }
    assert_eq!(p.gather(NormTensor::X, &x).unwrap().len(), 8);
}
