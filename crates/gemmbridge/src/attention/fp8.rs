//! The CPU emulation of FP8 attention, the reference an FP8 attention path is judged by: q, k
//! and v quantised to E4M3 with one scale per tensor from its current amax (tensor-wise current
//! scaling, [`crate::fp8`]'s quantisation exactly: `s = amax/448`, `q = fp8(x·448/amax)`), the
//! softmax probabilities optionally quantised too (as cuDNN's FP8 graph stores P in FP8 before
//! `P·V`, with a scale the caller gives), and float64 attention on the dequantised values.
//! Its error against the float64 attention of the unquantised inputs is the recipe's own
//! error; an FP8 path may be no worse than 1.5× of it. The backward's emulation, with its
//! gradient scales, is [`backward`].
//!
//! # Panics
//! As [`super::reference`]'s functions.

use super::reference::{expect, expect_sizes, scores, visible_rows, Forward, Lengths, VisibleRow};
use super::{Attention, AttnTensor};
use crate::fp8::{fp8_to_f32, quantize_value, scale_of, Fp8Format};

pub(crate) use super::fp8_bwd::smallest;
pub use super::fp8_bwd::{backward, backward_scales, BwdScales, Emulated};

/// A tensor of the problem quantised to E4M3 with one scale, and dequantised again (in its
/// strides, elements outside the tensor 0), with the scale `s` (dequantised = `fp8 · s`). As
/// the GPU's quantisation, an infinite element (or one past f32's range) makes the amax
/// infinite and every element NaN.
///
/// # Panics
/// On a problem [`Attention::validate`] refuses or an `x` of another length than the tensor's.
pub fn quantize_tensor(p: &Attention, t: AttnTensor, x: &[f64]) -> (Vec<f64>, f32) {
    quantize_tensor_as(p, t, x, Fp8Format::E4M3)
}

/// [`quantize_tensor`] into `format` (`s = amax/format.max()`), as the GPU quantises an output
/// gradient for the FP8 backward.
///
/// # Panics
/// As [`quantize_tensor`].
pub fn quantize_tensor_as(p: &Attention, t: AttnTensor, x: &[f64], format: Fp8Format) -> (Vec<f64>, f32) {
    if let Err(e) = p.validate() {
        panic!("attention::fp8::quantize_tensor on an invalid problem: {e}");
    }
    let want = p.required_elems(t);
    assert_eq!(
        x.len(),
        want,
        "attention::fp8::quantize_tensor: {} has {} elements, the problem's is {want}",
        t.name(),
        x.len()
    );
    let idx: Vec<usize> = p.elements(t).map(|at| p.index(t, at)).collect();
    let amax = idx.iter().map(|&i| (x[i] as f32).abs()).fold(0.0f32, f32::max);
    let (scale, inv) = scale_of(amax, format);
    let mut out = vec![0.0; x.len()];
    for i in idx {
        let bits = quantize_value(x[i] as f32, inv, format);
        out[i] = fp8_to_f32(bits, format) as f64 * scale as f64;
    }
    (out, scale)
}

/// The emulated FP8 forward: `o` and `lse` of attention on the dequantised q, k, v; with
/// `p_scale`, each probability `P = exp(score − lse)` is also stored as `fp8(P·p_scale)` and
/// used as that over `p_scale` (P ≤ 1, so `p_scale` = 448 uses E4M3's whole range).
///
/// # Panics
/// As [`super::reference::forward`], and for a `p_scale` that is not finite and positive.
pub fn forward(p: &Attention, q: &[f64], k: &[f64], v: &[f64], lens: Lengths<'_>, p_scale: Option<f32>) -> Forward {
    expect(p, lens, &[(AttnTensor::Q, q.len()), (AttnTensor::K, k.len()), (AttnTensor::V, v.len())]);
    if let Some(ps) = p_scale {
        assert!(ps.is_finite() && ps > 0.0, "attention::fp8::forward: p_scale {ps} is not finite and positive");
    }
    let (qd, kd, vd) = (
        quantize_tensor(p, AttnTensor::Q, q).0,
        quantize_tensor(p, AttnTensor::K, k).0,
        quantize_tensor(p, AttnTensor::V, v).0,
    );
    let mut f = super::reference::forward(p, &qd, &kd, &vd, lens);
    let Some(ps) = p_scale else { return f };
    // o again, with P rounded through FP8 (lse is unchanged: it is computed before P)
    for VisibleRow { n, hq, hk, i, lse: l, lens: (lq, lkv) } in visible_rows(p, lens, &f.lse) {
        let probs: Vec<(usize, f64)> = scores(p, &qd, &kd, (n, hq, i), (lq, lkv))
            .into_iter()
            .enumerate()
            .filter_map(|(j, s)| {
                let pr = (s? - l).exp() as f32;
                Some((j, fp8_to_f32(quantize_value(pr, ps, Fp8Format::E4M3), Fp8Format::E4M3) as f64 / ps as f64))
            })
            .collect();
        for e in 0..p.d {
            f.o[p.index(AttnTensor::O, [n, hq, i, e])] =
                probs.iter().map(|&(j, pr)| pr * vd[p.index(AttnTensor::V, [n, hk, j, e])]).sum();
        }
    }
    f
}

/// `o` (in o's strides) stored in E4M3 with the dequantisation scale `scale` and read back:
/// each element `fp8(x/scale)·scale` ([`crate::fp8`]'s rounding), as an FP8 output is.
///
/// # Panics
/// On a problem [`Attention::validate`] refuses, an `o` of another length than the problem's
/// output, or a `scale` that is not finite and positive.
pub fn round_output(p: &Attention, o: &[f64], scale: f32) -> Vec<f64> {
    // every element is rounded, inside the lengths or not: no lengths needed
    expect_sizes(p, &[(AttnTensor::O, o.len())]);
    assert!(scale.is_finite() && scale > 0.0, "attention::fp8::round_output: scale {scale} is not finite and positive");
    let mut out = o.to_vec();
    for at in p.elements(AttnTensor::O) {
        let i = p.index(AttnTensor::O, at);
        let bits = quantize_value(o[i] as f32, 1.0 / scale, Fp8Format::E4M3);
        out[i] = fp8_to_f32(bits, Fp8Format::E4M3) as f64 * scale as f64;
    }
    out
}
