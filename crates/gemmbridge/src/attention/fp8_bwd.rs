//! The CPU emulation of the FP8 attention backward and the fixed bounds its scales come from.
//!
//! The GPU path (cuDNN's FP8 backward graph) stores three things in FP8 whose scale it must
//! choose before it runs: P (E4M3, scale 448 as the forward), `dS = scale·P∘(dP − D)` and the
//! three gradients (all in the output gradient's format). Each scale maps a bound of the
//! tensor's magnitude onto the format's largest value, so nothing can overflow, and each bound
//! is made from the inputs' dequantisation scales alone (a tensor quantised with scale `σ` has
//! magnitude at most `448·σ`, or `57344·σ` in E5M2), so no value comes back to the host. With
//! `a_x` that bound for tensor x, `F` the gradients' largest value and `u` their smallest
//! subnormal:
//! - `|dP_ij − D_i| = |Σ_e do_ie·(v_je − o_ie)| ≤ d·a_do·(a_v + a_o)` =: R;
//! - `|dS_ij| ≤ scale·P_ij·R ≤ B = scale·R·9/8` (P ≤ 1; 9/8 covers P's f32 rounding);
//! - stored `dS` is read back within `|dS|·9/8 + u·B/F` (one rounding: at most 1/16 of the value
//!   in E4M3, 1/8 in E5M2; below the normal range, at most `u` in stored units);
//! - `dq_i = Σ_j dS_ij·k_j`, with `Σ_j |dS_ij| ≤ scale·R·Σ_j P_ij`: `|dq| ≤ (9/8·B + s_kv·u·B/F)·a_k`;
//! - `dk_j` sums `h_q/h_kv · s_q` entries of dS: `|dk| ≤ g·s_q·(9/8·B + u·B/F)·a_q`;
//! - `dv_j = Σ P₈_ij·do_i`, with P₈ within `P·17/16 + 2⁻⁹/448`: `|dv| ≤ g·s_q·(17/16 + 2⁻⁹/448)·a_do`.
//!
//! The bounds hold for any data but are far above typical values (the dot product bound is
//! `d·a·a` where random rows give about `√d·σ·σ`, and the sums assume every probability on one
//! key): typical dS values sit 2¹⁵–2²⁰ below their bound. E5M2 (normal down to 2⁻¹⁴ of its
//! largest value over 2¹⁵) keeps them at full E5M2 precision; in E4M3 (normal range 2¹⁵ from
//! 2⁻⁶) they fall into the subnormals or to zero. The emulation shows either.

use super::fp8::{forward as fp8_forward, quantize_tensor, quantize_tensor_as, round_output};
use super::reference::{expect, scores, visible_rows, Grads, Lengths, VisibleRow};
use super::{Attention, AttnTensor};
use crate::fp8::{fp8_to_f32, quantize_value, Fp8Format};

/// The dequantisation scales of the FP8 backward's stored tensors: `ds` of dS, `dq`, `dk`, `dv`
/// of the gradients (stored value · scale = value). [`backward_scales`] makes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwdScales {
    /// dS's scale (the graph's `descale_dP`).
    pub ds: f32,
    /// dq's scale.
    pub dq: f32,
    /// dk's scale.
    pub dk: f32,
    /// dv's scale.
    pub dv: f32,
}

/// The smallest subnormal of `f`: 2⁻⁹ in E4M3, 2⁻¹⁶ in E5M2.
pub(crate) fn smallest(f: Fp8Format) -> f32 {
    match f {
        Fp8Format::E4M3 => 1.0 / 512.0,
        Fp8Format::E5M2 => 1.0 / 65536.0,
    }
}

/// The backward's scales (module documentation) from the dequantisation scales of q, k, v, o
/// (E4M3) and do (in `grad`, the format of dS and the gradients), computed in f32 in the order
/// the GPU's kernel computes them.
pub fn backward_scales(p: &Attention, [sq, sk, sv, so, sdo]: [f32; 5], grad: Fp8Format) -> BwdScales {
    let (e4, f, u) = (448.0f32, grad.max(), smallest(grad));
    let (a_q, a_k, a_v, a_o, a_do) = (e4 * sq, e4 * sk, e4 * sv, e4 * so, f * sdo);
    let r = p.d as f32 * a_do * (a_v + a_o);
    let b = p.scale * r * 1.125;
    let ds = b / f;
    let rows = (p.group() * p.s_q) as f32;
    let dq = (1.125 * b + p.s_kv as f32 * u * ds) * a_k;
    let dk = rows * (1.125 * b + u * ds) * a_q;
    let dv = rows * (17.0 / 16.0 + u / e4) * a_do;
    BwdScales { ds, dq: dq / f, dk: dk / f, dv: dv / f }
}

/// `x` stored in `f` with scale `s` and read back (saturating, as the GPU's conversion).
fn round(x: f64, s: f32, f: Fp8Format) -> f64 {
    fp8_to_f32(quantize_value(x as f32, 1.0 / s, f), f) as f64 * s as f64
}

/// The emulated FP8 backward's gradients (dequantised, in q's, k's, v's strides) and the scales
/// they were stored with.
#[derive(Clone, Debug)]
pub struct Emulated {
    /// dq, dk, dv as read back from FP8.
    pub grads: Grads,
    /// The scales of dS and the gradients.
    pub scales: BwdScales,
}

/// The emulated FP8 backward of the emulated FP8 forward ([`super::fp8::forward`] with P's
/// scale 448, o stored in E4M3 with twice v's scale): q, k, v quantised to E4M3 and do to
/// `grad`, each with its tensor-wise scale; then in float64 on those values `P = exp(score −
/// lse)`, P stored in E4M3 (scale 448) for dv, `dS = scale·P∘(do·vᵀ − rowsum(do∘o))` stored in
/// `grad` with [`backward_scales`]'s scale for dq and dk, and the gradients stored in `grad`
/// with theirs — the GPU's recipe. `do` is shaped and strided as o.
///
/// # Panics
/// As [`super::reference::backward`].
pub fn backward(
    p: &Attention,
    (q, k, v): (&[f64], &[f64], &[f64]),
    d_o: &[f64],
    lens: Lengths<'_>,
    grad: Fp8Format,
) -> Emulated {
    use AttnTensor::{K, O, Q, V};
    expect(p, lens, &[(Q, q.len()), (K, k.len()), (V, v.len()), (O, d_o.len())]);
    let ((qd, sq), (kd, sk), (vd, sv)) = (quantize_tensor(p, Q, q), quantize_tensor(p, K, k), quantize_tensor(p, V, v));
    let (dod, sdo) = quantize_tensor_as(p, O, d_o, grad);
    let so = 2.0 * sv;
    let f = fp8_forward(p, q, k, v, lens, Some(448.0));
    let o = round_output(p, &f.o, so);
    let scales = backward_scales(p, [sq, sk, sv, so, sdo], grad);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let sc = p.scale as f64;
    for VisibleRow { n, hq, hk, i, lse: l, lens: (lq, lkv) } in visible_rows(p, lens, &f.lse) {
        let at = |t: AttnTensor, h: usize, r: usize, e: usize| p.index(t, [n, h, r, e]);
        let dd: f64 = (0..p.d).map(|e| dod[at(O, hq, i, e)] * o[at(O, hq, i, e)]).sum();
        for (j, s) in scores(p, &qd, &kd, (n, hq, i), (lq, lkv)).into_iter().enumerate() {
            let Some(s) = s else { continue };
            let pj = (s - l).exp();
            let p8 = round(pj, 1.0 / 448.0, Fp8Format::E4M3);
            let dp: f64 = (0..p.d).map(|e| dod[at(O, hq, i, e)] * vd[at(V, hk, j, e)]).sum();
            let ds = round(sc * pj * (dp - dd), scales.ds, grad);
            for e in 0..p.d {
                dv[at(V, hk, j, e)] += p8 * dod[at(O, hq, i, e)];
                dq[at(Q, hq, i, e)] += ds * kd[at(K, hk, j, e)];
                dk[at(K, hk, j, e)] += ds * qd[at(Q, hq, i, e)];
            }
        }
    }
    let store = |x: &mut Vec<f64>, t: AttnTensor, s: f32| {
        for at in p.elements(t) {
            let i = p.index(t, at);
            x[i] = round(x[i], s, grad);
        }
    };
    store(&mut dq, Q, scales.dq);
    store(&mut dk, K, scales.dk);
    store(&mut dv, V, scales.dv);
    Emulated { grads: Grads { dq, dk, dv }, scales }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::attention::reference::{self, rel_error_rows};
    use crate::attention::AttnMask;
    use crate::dtype::DType;

    fn data(p: &Attention, seed: u64) -> [Vec<f64>; 4] {
        println!("seed {seed}");
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        [AttnTensor::Q, AttnTensor::K, AttnTensor::V, AttnTensor::O]
            .map(|t| (0..p.required_elems(t)).map(|_| r.random_range(-1.0..1.0)).collect())
    }

    /// The largest stored magnitude of `x` in units of its scale.
    fn stored_max(x: &[f64], s: f32) -> f64 {
        x.iter().fold(0.0f64, |m, v| m.max(v.abs())) / s as f64
    }

    #[test]
    fn the_emulated_fp8_backward_is_close_in_e5m2_and_never_saturates() {
        let seed: u64 = rand::random();
        for (p, mask) in [
            (Attention::new(1, (4, 2), (33, 40), 32, DType::BF16), AttnMask::Causal),
            (Attention::new(2, (2, 2), (7, 7), 16, DType::BF16), AttnMask::None),
        ] {
            let p = p.with_mask(mask);
            let [q, k, v, d_o] = data(&p, seed);
            let f = reference::forward(&p, &q, &k, &v, None);
            let exact = reference::backward(&p, (&q, &k, &v), &f.o, &d_o, &f.lse, None);
            for grad in [Fp8Format::E5M2, Fp8Format::E4M3] {
                let e = backward(&p, (&q, &k, &v), &d_o, None, grad);
                let errs = [
                    rel_error_rows(&p, AttnTensor::Q, &e.grads.dq, &exact.dq, None),
                    rel_error_rows(&p, AttnTensor::K, &e.grads.dk, &exact.dk, None),
                    rel_error_rows(&p, AttnTensor::V, &e.grads.dv, &exact.dv, None),
                ];
                println!("{} {grad:?}: dq dk dv errors {errs:?}, scales {:?}", p.describe(), e.scales);
                for (x, s) in [(&e.grads.dq, e.scales.dq), (&e.grads.dk, e.scales.dk), (&e.grads.dv, e.scales.dv)] {
                    assert!(stored_max(x, s) < grad.max() as f64 / 4.0, "a gradient came near its bound");
                }
                if grad == Fp8Format::E5M2 {
                    assert!(errs.iter().all(|&x| x < 0.3), "{errs:?}");
                }
            }
        }
    }

    #[test]
    fn the_bounds_hold_where_the_data_reaches_them() {
        // every probability on one key, every element at its tensor's largest magnitude
        let p = Attention::new(1, (2, 1), (9, 9), 16, DType::BF16).with_scale(4.0);
        let sign = |i: usize| if i.is_multiple_of(3) { -1.0 } else { 1.0 };
        let q: Vec<f64> = (0..p.required_elems(AttnTensor::Q)).map(|_| 1.0).collect();
        let mut k = vec![-1.0; p.required_elems(AttnTensor::K)];
        k[..p.d].iter_mut().for_each(|x| *x = 1.0);
        let v: Vec<f64> = (0..k.len()).map(sign).collect();
        let d_o = vec![1.0; q.len()];
        for grad in [Fp8Format::E5M2, Fp8Format::E4M3] {
            let e = backward(&p, (&q, &k, &v), &d_o, None, grad);
            for (x, s) in [(&e.grads.dq, e.scales.dq), (&e.grads.dk, e.scales.dk), (&e.grads.dv, e.scales.dv)] {
                let m = stored_max(x, s);
                assert!(m <= grad.max() as f64, "{grad:?}: {m}");
            }
            // dv's bound is reached within the rounding of P: all of one key's weight
            assert!(stored_max(&e.grads.dv, e.scales.dv) > grad.max() as f64 / 2.0);
        }
    }

    #[test]
    fn the_scales_grow_with_each_inputs_scale() {
        let p = Attention::new(2, (8, 2), (64, 128), 128, DType::BF16);
        let base = backward_scales(&p, [1e-3; 5], Fp8Format::E5M2);
        let twice = backward_scales(&p, [2e-3, 1e-3, 1e-3, 1e-3, 1e-3], Fp8Format::E5M2);
        assert_eq!((twice.dq, twice.dv), (base.dq, base.dv));
        assert!((twice.dk / base.dk - 2.0).abs() < 1e-6);
        let longer = backward_scales(&p.with_scale(2.0 * p.scale), [1e-3; 5], Fp8Format::E5M2);
        assert!((longer.ds / base.ds - 2.0).abs() < 1e-6);
    }
}
