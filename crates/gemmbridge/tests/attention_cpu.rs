//! Attention on the CPU ([`cpu::attention_forward`], [`cpu::attention_backward`]) against the
//! float64 reference ([`attention::reference`]): odd sequence lengths (1, 7, 33), head
//! dimensions 64 and 128, multi-head and grouped-query heads, every mask, per-sequence lengths
//! shorter than the tensors, BSHD and BHSD strides, f16 and bf16; the band of the GPU tests
//! (1e-2); rows without keys (the bottom-right mask with fewer keys than queries) as the
//! definition has them (o = 0, lse = −∞). A NaN input gives NaN rows, never zeros. Bad input is
//! a named error with nothing written.

mod common;

use common::rng;
use gemmbridge::attention::reference::{self, rel_error_rows, rel_error_stats, Lengths};
use gemmbridge::attention::{Attention, AttnMask, AttnTensor};
use gemmbridge::half::{bf16, f16};
use gemmbridge::{cpu, DType, Element, Error, Which};
use rand::rngs::StdRng;
use rand::Rng;

/// A buffer of tensor `t`: values in (−1, 1) at its elements, NaN between them (never read).
fn tensor<T: Element>(p: &Attention, t: AttnTensor, r: &mut StdRng) -> Vec<T> {
    let mut x = vec![T::from_f64(f64::NAN); p.required_elems(t)];
    p.elements(t).for_each(|at| x[p.index(t, at)] = T::from_f64(r.random_range(-1.0..1.0)));
    x
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// One problem forward and backward against float64: the worst relative error.
fn case<T: Element>(p: &Attention, lens: Lengths<'_>, r: &mut StdRng) -> f64 {
    use AttnTensor::{K, O, Q, V};
    let (q, k, v) = (tensor::<T>(p, Q, r), tensor::<T>(p, K, r), tensor::<T>(p, V, r));
    let mut o = vec![T::from_f64(f64::NAN); p.required_elems(O)];
    let mut lse = vec![f32::NAN; p.stats_elems()];
    cpu::attention_forward(p, [&q, &k, &v], &mut o, Some(&mut lse), lens)
        .unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    let want = reference::forward(p, &wide(&q), &wide(&k), &wide(&v), lens);
    let lse64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    let forward = [rel_error_rows(p, O, &wide(&o), &want.o, lens), rel_error_stats(p, &lse64, &want.lse, lens)];
    // the backward from the forward's own o and lse
    let d_o = tensor::<T>(p, O, r);
    let (mut dq, mut dk, mut dv) = (
        vec![T::from_f64(f64::NAN); q.len()],
        vec![T::from_f64(f64::NAN); k.len()],
        vec![T::from_f64(f64::NAN); v.len()],
    );
    cpu::attention_backward(p, [&q, &k, &v, &o, &d_o], &lse, [&mut dq, &mut dk, &mut dv], lens).unwrap();
    let (wq, wk, wv) = (wide(&q), wide(&k), wide(&v));
    let g = reference::backward(p, (&wq, &wk, &wv), &wide(&o), &wide(&d_o), &lse64, lens);
    let grads = [(Q, &dq, &g.dq), (K, &dk, &g.dk), (V, &dv, &g.dv)];
    let errs = grads.map(|(t, got, want)| rel_error_rows(p, t, &wide(got), want, lens));
    let all = [forward[0], forward[1], errs[0], errs[1], errs[2]];
    let e = all.iter().copied().fold(0.0, f64::max);
    assert!(e <= 1e-2, "{} lens {lens:?}: o, lse, dq, dk, dv errors {all:?}", p.describe());
    e
}

#[test]
fn forward_and_backward_match_float64_on_every_mask_and_head_grouping() {
    let mut r = rng();
    for (s, d) in [((1, 1), 64), ((7, 7), 64), ((33, 33), 128), ((7, 33), 64), ((33, 7), 128)] {
        for (h_q, h_kv) in [(2, 2), (8, 2), (8, 1)] {
            for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
                let p = Attention::new(2, (h_q, h_kv), s, d, DType::BF16).with_mask(mask);
                case::<bf16>(&p, None, &mut r);
                case::<f16>(&Attention { dtype: DType::F16, ..p }.bhsd(), None, &mut r);
            }
        }
    }
}

#[test]
fn per_sequence_lengths_leave_padding_rows_alone_and_zero_their_gradients() {
    let mut r = rng();
    let p =
        Attention::new(3, (8, 2), (33, 40), 64, DType::BF16).with_var_len(true).with_mask(AttnMask::CausalBottomRight);
    let (lq, lkv) = ([33, 1, 7], [40, 5, 7]);
    let lens: Lengths<'_> = Some((&lq, &lkv));
    case::<bf16>(&p, lens, &mut r);
    // padding rows of o keep their content; the gradients' padding rows are zeros
    let (q, k, v) = (
        tensor::<bf16>(&p, AttnTensor::Q, &mut r),
        tensor::<bf16>(&p, AttnTensor::K, &mut r),
        tensor::<bf16>(&p, AttnTensor::V, &mut r),
    );
    let mut o = vec![bf16::from_f32(7.0); p.required_elems(AttnTensor::O)];
    cpu::attention_forward(&p, [&q, &k, &v], &mut o, None, lens).unwrap();
    assert_eq!(o[p.index(AttnTensor::O, [1, 0, 1, 0])].to_f32(), 7.0, "a padding row was written");
    let mut lse = vec![0f32; p.stats_elems()];
    cpu::attention_forward(&p, [&q, &k, &v], &mut o, Some(&mut lse), lens).unwrap();
    let mut dk = vec![bf16::from_f32(7.0); k.len()];
    let (mut dq, mut dv) = (vec![bf16::from_f32(7.0); q.len()], vec![bf16::from_f32(7.0); v.len()]);
    cpu::attention_backward(&p, [&q, &k, &v, &o, &o], &lse, [&mut dq, &mut dk, &mut dv], lens).unwrap();
    assert_eq!(dk[p.index(AttnTensor::K, [1, 0, 5, 3])].to_f32(), 0.0);
    assert_eq!(dq[p.index(AttnTensor::Q, [2, 5, 7, 3])].to_f32(), 0.0);
}

/// A NaN in one query row makes that row's output and statistics NaN (not a row "without
/// keys"), and leaves the other rows finite.
#[test]
fn a_nan_input_gives_nan_rows() {
    let mut r = rng();
    let p = Attention::new(1, (1, 1), (2, 3), 8, DType::BF16);
    let (mut q, k, v) = (
        tensor::<bf16>(&p, AttnTensor::Q, &mut r),
        tensor::<bf16>(&p, AttnTensor::K, &mut r),
        tensor::<bf16>(&p, AttnTensor::V, &mut r),
    );
    q[p.index(AttnTensor::Q, [0, 0, 0, 3])] = bf16::NAN;
    let mut o = vec![bf16::ZERO; p.required_elems(AttnTensor::O)];
    let mut lse = vec![0f32; p.stats_elems()];
    cpu::attention_forward(&p, [&q, &k, &v], &mut o, Some(&mut lse), None).unwrap();
    assert!(lse[0].is_nan() && lse[1].is_finite(), "{lse:?}");
    assert!((0..8).all(|e| o[p.index(AttnTensor::O, [0, 0, 0, e])].is_nan()));
    assert!((0..8).all(|e| o[p.index(AttnTensor::O, [0, 0, 1, e])].is_finite()));
}

#[test]
fn bad_input_is_named_and_nothing_is_written() {
    let mut r = rng();
    let p = Attention::new(2, (4, 2), (7, 9), 64, DType::BF16);
    let (q, k, v) = (
        tensor::<bf16>(&p, AttnTensor::Q, &mut r),
        tensor::<bf16>(&p, AttnTensor::K, &mut r),
        tensor::<bf16>(&p, AttnTensor::V, &mut r),
    );
    let mut o = vec![bf16::from_f32(7.0); p.required_elems(AttnTensor::O)];
    let untouched = |o: &[bf16]| o.iter().all(|x| x.to_f32() == 7.0);
    // the element type against the problem's
    let (q16, k16, v16) = (vec![f16::ZERO; q.len()], vec![f16::ZERO; k.len()], vec![f16::ZERO; v.len()]);
    let mut o16 = vec![f16::ZERO; o.len()];
    let e = cpu::attention_forward(&p, [&q16, &k16, &v16], &mut o16, None, None).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::AttnQ, .. }), "{e}");
    // a short key buffer; short statistics
    let e = cpu::attention_forward(&p, [&q, &k[1..], &v], &mut o, None, None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnK, .. }), "{e}");
    let mut short = vec![0f32; p.stats_elems() - 1];
    let e = cpu::attention_forward(&p, [&q, &k, &v], &mut o, Some(&mut short), None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnStats, .. }), "{e}");
    // the backward names the buffer that is short: do, then each gradient
    let lse = vec![0f32; p.stats_elems()];
    let short_do = &o[1..];
    let (mut dq, mut dk, mut dv) = (q.clone(), k.clone(), v.clone());
    let e =
        cpu::attention_backward(&p, [&q, &k, &v, &o, short_do], &lse, [&mut dq, &mut dk, &mut dv], None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnDo, .. }), "{e}");
    let mut short_dk = k[1..].to_vec();
    let e =
        cpu::attention_backward(&p, [&q, &k, &v, &o, &o], &lse, [&mut dq, &mut short_dk, &mut dv], None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnDk, .. }), "{e}");
    assert!(dq.iter().zip(&q).all(|(a, b)| a.to_bits() == b.to_bits()), "dq written before the error");
    // lengths given to a problem without them; missing for one with them; out of range
    let e = cpu::attention_forward(&p, [&q, &k, &v], &mut o, None, Some((&[7, 7], &[9, 9]))).unwrap_err();
    assert!(matches!(e, Error::AttentionShape { .. }), "{e}");
    let var = p.with_var_len(true);
    let e = cpu::attention_forward(&var, [&q, &k, &v], &mut o, None, None).unwrap_err();
    assert!(matches!(e, Error::AttentionShape { .. }), "{e}");
    let e = cpu::attention_forward(&var, [&q, &k, &v], &mut o, None, Some((&[7, 8], &[9, 9]))).unwrap_err();
    assert!(e.to_string().contains("len_q[1] = 8"), "{e}");
    // a problem its rules refuse (d not a multiple of 8)
    let odd = Attention::new(2, (4, 2), (7, 9), 60, DType::BF16);
    assert!(matches!(
        cpu::attention_forward(&odd, [&q, &k, &v], &mut o, None, None),
        Err(Error::AttentionShape { .. })
    ));
    assert!(untouched(&o));
}

/// A problem whose per-head score matrix is past the CPU's limit (2¹⁷ · 2¹⁶ f32 scores, 32 GiB)
/// is refused by name before anything is written, forward and backward, instead of an
/// allocation that aborts the process.
#[test]
fn a_score_matrix_past_the_cpu_limit_is_refused_before_anything_is_written() {
    let p = Attention::new(1, (1, 1), (1 << 17, 1 << 16), 8, DType::BF16);
    assert!(p.s_q * p.s_kv > cpu::MAX_CPU_SCORES);
    let [q, k, v] = [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| vec![bf16::ONE; p.required_elems(t)]);
    let mut o = vec![bf16::NAN; p.required_elems(AttnTensor::O)];
    let refused =
        |e: &Error| matches!(e, Error::DimensionTooLarge { value, max, .. } if *value == 1 << 33 && *max == 1 << 32);
    let e = cpu::attention_forward(&p, [&q, &k, &v], &mut o, None, None).unwrap_err();
    assert!(refused(&e), "{e}");
    assert!(o.iter().all(|x| x.is_nan()), "written before the error");
    let lse = vec![0f32; p.stats_elems()];
    let [mut dq, mut dk, mut dv] = [q.clone(), k.clone(), v.clone()].map(|t| vec![bf16::NAN; t.len()]);
    let e = cpu::attention_backward(&p, [&q, &k, &v, &o, &o], &lse, [&mut dq, &mut dk, &mut dv], None).unwrap_err();
    assert!(refused(&e), "{e}");
    assert!(dq.iter().chain(&dk).chain(&dv).all(|x| x.is_nan()), "written before the error");
}
