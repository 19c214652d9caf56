use super::reference::{backward, forward, inv_rms};
use super::*;

fn what(r: Result<()>) -> &'static str {
    match r {
        Err(Error::NormShape { what, .. }) => what,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_rule_is_a_named_error() {
    let p = RmsNorm::new(7, 64, 1e-5, DType::BF16);
    p.validate().unwrap();
    assert_eq!(what(RmsNorm { rows: 0, ..p }.validate()), "a size is zero");
    assert_eq!(what(RmsNorm::new(7, 0, 1e-5, DType::BF16).validate()), "a size is zero");
    assert_eq!(what(RmsNorm { rows: MAX_ELEMS + 1, ..p }.validate()), "a size is too large");
    for eps in [0.0, -1e-6, f32::NAN, f32::INFINITY] {
        assert_eq!(what(RmsNorm { eps, ..p }.validate()), "epsilon is not finite and positive", "{eps}");
    }
    for t in NormTensor::ALL {
        let e = what(p.with_ld(t, 63).validate());
        assert_eq!(e, "a leading dimension is smaller than the features", "{t:?}");
        p.with_ld(t, 65).validate().unwrap();
    }
    let big = RmsNorm::new(1 << 16, 1 << 15, 1e-5, DType::F16);
    assert_eq!(what(big.validate()), "a tensor spans more than 2³¹ − 1 elements");
    assert_eq!(what(p.with_ld(NormTensor::Sum, MAX_ELEMS + 1).validate()), "a tensor spans more than 2³¹ − 1 elements");
    // the detail names the values
    let Err(Error::NormShape { detail, .. }) = p.with_ld(NormTensor::Dy, 10).validate() else { panic!() };
    assert!(detail.contains("ld of dy = 10 < features = 64"), "{detail}");
}

#[test]
fn layouts_and_byte_counts() {
    let p = RmsNorm::new(3, 4, 1e-6, DType::BF16).with_ld(NormTensor::X, 10);
    assert_eq!(p.required_elems(NormTensor::X), 24);
    assert_eq!(p.required_elems(NormTensor::Y), 12);
    assert_eq!(p.index(NormTensor::X, 2, 1), 21);
    assert!(p.strided(NormTensor::X) && !p.strided(NormTensor::Y));
    let buf: Vec<usize> = (0..24).collect();
    assert_eq!(p.gather(NormTensor::X, &buf).unwrap(), [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]);
    // x, y: 3·4·2 bytes each, w 8 bytes, inv_rms 12 bytes
    assert_eq!(p.forward_bytes(false), 56.0);
    assert_eq!(p.forward_bytes(true), 68.0);
    // x, dy, dx 24 each, w 8, inv_rms 12, dw 8 (bf16) or 16 (f32)
    assert_eq!(p.backward_bytes(), 100.0);
    assert_eq!(p.with_dw(GradType::F32).backward_bytes(), 108.0);
    assert_eq!(p.with_dw(GradType::F32).dw_dtype(), DType::F32);
    assert!(p.describe().contains("ld x10,y4"), "{}", p.describe());
}

#[test]
fn the_forward_normalises_each_row_to_unit_rms() {
    let p = RmsNorm::new(2, 4, 1e-12, DType::F32);
    let x = [1.0, -1.0, 1.0, -1.0, 2.0, 0.0, 0.0, 0.0];
    let f = forward(&p, &x, &[1.0, 2.0, 3.0, 4.0]);
    assert!((f.inv_rms[0] - 1.0).abs() < 1e-9);
    assert!((f.inv_rms[1] - 1.0).abs() < 1e-9); // mean square 1
    let want = [1.0, -2.0, 3.0, -4.0, 2.0, 0.0, 0.0, 0.0];
    assert!(f.y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-9), "{:?}", f.y);
    assert_eq!(inv_rms(&p, &x), f.inv_rms);
}

/// The backward's definition against central differences of `L = Σ y·dy`.
#[test]
fn the_backward_is_the_gradient_of_the_forward() {
    let p = RmsNorm::new(3, 5, 1e-3, DType::F32);
    let x: Vec<f64> = (0..15).map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0).collect();
    let w: Vec<f64> = (0..5).map(|i| 0.5 + i as f64 / 4.0).collect();
    let dy: Vec<f64> = (0..15).map(|i| ((i * 5 % 7) as f64 - 3.0) / 2.0).collect();
    let loss = |x: &[f64], w: &[f64]| forward(&p, x, w).y.iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>();
    let b = backward(&p, &x, &w, &dy);
    let h = 1e-6;
    for i in 0..x.len() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += h;
        down[i] -= h;
        let num = (loss(&up, &w) - loss(&down, &w)) / (2.0 * h);
        assert!((num - b.dx[i]).abs() < 1e-6, "dx[{i}]: {num} vs {}", b.dx[i]);
    }
    for j in 0..w.len() {
        let (mut up, mut down) = (w.clone(), w.clone());
        up[j] += h;
        down[j] -= h;
        let num = (loss(&x, &up) - loss(&x, &down)) / (2.0 * h);
        assert!((num - b.dw[j]).abs() < 1e-6, "dw[{j}]: {num} vs {}", b.dw[j]);
    }
}
