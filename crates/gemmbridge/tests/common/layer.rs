//! The decoder-layer tests' shared parts: weights of a trained layer's scale, the float64
//! reference of a step (optionally with FP8-rounded forward projections), and the check of a
//! result against it.

use gemmbridge::fp8::{dequantize, quantize, Fp8Format, Scaling, Source};
use gemmbridge::layer::reference::{backward, forward, forward_with, Grads, Saved, Weights};
use gemmbridge::layer::{DecoderLayer, LayerWeight, Proj, Tokens};
use gemmbridge::reference::rel_error;
use gemmbridge::Element;
use rand::rngs::StdRng;

use super::normal;

/// The f16/bf16 band.
pub const BAND: f64 = 1e-2;

/// A layer with FP8 forward projections against the float64 layer whose projections take the
/// same recipe's rounded operands ([`reference`] with `fp8`): E4M3 keeps 3 mantissa bits, so an
/// activation element that bf16's rounding moves across an FP8 rounding boundary (about 1 in
/// 64) changes by a step of 2⁻³ of its value, and the steps compound through the layer —
/// measured on the CPU layer (d 72, b 2, s 19, 20 seeds) up to 3.3e-2 row-wise and 4.8e-2
/// tensor-wise (9.3e-2 against the unquantised layer). A wrong operand, scale or residual
/// gives errors of order 1. [`fp8_is_what_ran`] checks the recipe itself.
pub const FP8_BAND: f64 = 1e-1;

/// `v` widened to f64.
pub fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Weights of a trained layer's scale (norms near 1, projections ~1/√in), rounded to `T` so
/// that both sides start from the same values.
pub fn weights<T: Element>(l: &DecoderLayer, r: &mut StdRng) -> Weights {
    let mut w = Weights::default();
    for which in LayerWeight::ALL {
        let [rows, cols] = l.weight_shape(which);
        let v = wide(&normal::<f32>(r, rows * cols));
        let v: Vec<f64> = match which {
            LayerWeight::Norm1 | LayerWeight::Norm2 => v.iter().map(|x| 1.0 + 0.1 * x).collect(),
            _ => v.iter().map(|x| x / (cols as f64).sqrt()).collect(),
        };
        *w.get_mut(which) = v.iter().map(|&x| T::from_f64(x).to_f64()).collect();
    }
    w
}

/// `v[rows, cols]` rounded to `T` (as a layer stores an activation), quantised to E4M3 with
/// `scaling` as gemmbridge's kernels do, and dequantised.
fn fp8_round<T: Element>(v: &[f64], (rows, cols): (usize, usize), scaling: Scaling) -> Vec<f64> {
    let stored: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    let q = quantize(&stored, rows, cols, Source::RowMajor, Fp8Format::E4M3, scaling).unwrap();
    dequantize(&q).unwrap()
}

/// The float64 step on `x` and `dy`: the forward's saved tensors and the gradients. With
/// `fp8`, every forward projection's operands are first rounded as that recipe rounds them in
/// `T` ([`fp8_round`]); the backward is exact on the saved activations.
pub fn reference<T: Element>(
    (l, t): (&DecoderLayer, Tokens),
    w: &Weights,
    (x, dy): (&[f64], &[f64]),
    fp8: Option<Scaling>,
) -> (Saved, Grads) {
    let saved = match fp8 {
        None => forward(l, t, w, x).unwrap(),
        Some(s) => {
            let proj = |_: Proj, a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)| {
                let (a, b) = (fp8_round::<T>(a, (m, k), s), fp8_round::<T>(b, (n, k), s));
                let mut out = vec![0.0; m * n];
                for i in 0..m {
                    for j in 0..n {
                        out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
                    }
                }
                out
            };
            forward_with(l, t, w, x, &proj).unwrap()
        }
    };
    let grads = backward(l, t, w, x, &saved, dy).unwrap();
    (saved, grads)
}

/// The FP8 layer's output `y` is closer to the float64 layer with the recipe's rounding
/// (`emulated`) than to the unquantised one (`exact`): the recipe is what ran.
pub fn fp8_is_what_ran(y: &[f64], emulated: &Saved, exact: &Saved) {
    let (e, x) = (rel_error(y, &emulated.y), rel_error(y, &exact.y));
    eprintln!("y against the FP8 emulation {e:.2e}, against the unquantised layer {x:.2e}");
    assert!(e < x, "y is closer to the unquantised layer ({x:.2e}) than to the FP8 emulation ({e:.2e})");
}

/// `got` within `band` of `want` (relative error, printed).
pub fn check(name: &str, got: &[f64], want: &[f64], band: f64) {
    let e = rel_error(got, want);
    eprintln!("{name}: {e:.2e}");
    assert!(e <= band, "{name}: {e:.2e} above {band:e}");
}

/// y, dx and every weight gradient of a step (`y`, `dx`, `dw`) against the reference's.
pub fn check_step(y: &[f64], got: &Grads, (saved, want): &(Saved, Grads), band: f64) {
    check("y", y, &saved.y, band);
    check("dx", &got.dx, &want.dx, band);
    for which in LayerWeight::ALL {
        check(&format!("d_{}", which.name()), got.dw.get(which), want.dw.get(which), band);
    }
}
