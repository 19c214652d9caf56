//! The problem's rules and the float64 reference, checked against independent facts: one
//! key gives its value, equal scores give the mean, GQA equals multi-head attention on repeated
//! heads, strides change nothing, lengths equal the truncated problem, and the backward equals
//! central finite differences of `Σ o·do`.

use rand::{Rng, SeedableRng};

use super::reference::{backward, forward, rel_error_rows, stats_index, Lengths};
use super::*;

fn rng() -> rand::rngs::StdRng {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A buffer of tensor `t`, random normals-ish in (−1, 1) at its elements, 0 elsewhere.
fn tensor(p: &Attention, t: AttnTensor, r: &mut impl Rng) -> Vec<f64> {
    let mut x = vec![0.0; p.required_elems(t)];
    each(p, t, |i| x[i] = r.random_range(-1.0..1.0));
    x
}

/// Calls `f` with the buffer index of every element of tensor `t`.
fn each(p: &Attention, t: AttnTensor, mut f: impl FnMut(usize)) {
    p.elements(t).for_each(|at| f(p.index(t, at)));
}

fn bf16(b: usize, h: (usize, usize), s: (usize, usize), d: usize) -> Attention {
    Attention::new(b, h, s, d, DType::BF16)
}

#[test]
fn every_rule_is_a_named_error() {
    let ok = bf16(2, (8, 2), (7, 9), 64);
    ok.validate().unwrap();
    let rule = |p: Attention| match p.validate() {
        Err(Error::AttentionShape { what, .. }) => what,
        other => panic!("{}: {other:?}", p.describe()),
    };
    assert_eq!(rule(bf16(0, (8, 2), (7, 9), 64)), "a size is zero");
    assert_eq!(rule(bf16(2, (8, 3), (7, 9), 64)), "query heads are not a multiple of the key/value heads");
    assert_eq!(rule(bf16(2, (8, 2), (7, 9), 60)), "the head dimension is not a multiple of 8 up to 256");
    assert_eq!(rule(bf16(2, (8, 2), (7, 9), 264)), "the head dimension is not a multiple of 8 up to 256");
    assert_eq!(rule(Attention { dtype: DType::F32, ..ok }), "the element type is not f16 or bf16");
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(rule(ok.with_scale(scale)), "the scale is not finite and positive");
    }
    let odd = HeadLayout { batch: 4096, head: 64, seq: 516 };
    assert_eq!(rule(ok.with_layout(AttnTensor::K, odd)), "a stride is not a multiple of 8 elements (16 bytes)");
    let overlap = HeadLayout { batch: 7 * 8 * 64, head: 32, seq: 8 * 64 };
    assert_eq!(rule(ok.with_layout(AttnTensor::Q, overlap)), "two elements of a tensor share an address");
    assert_eq!(rule(bf16(1 << 16, (64, 8), (1 << 10, 1 << 10), 128)), "a tensor spans more than 2³¹ − 1 elements");
    // sizes whose strides overflow are refused, not a panic
    let huge = Attention::new(1, (i32::MAX as usize, 1), (i32::MAX as usize, 1), 256, DType::F16);
    assert_eq!(rule(huge), "a tensor spans more than 2³¹ − 1 elements");
    assert_eq!(rule(Attention::new(1, (1 << 40, 1), (1 << 40, 1), 64, DType::F16).bhsd()), "a size is too large");
    // the message names the values
    let e = bf16(2, (8, 3), (7, 9), 64).validate().unwrap_err().to_string();
    assert!(e.contains("h_q = 8, h_kv = 3"), "{e}");
}

#[test]
fn layouts_bshd_bhsd_and_a_packed_projection_are_accepted_without_overlap() {
    let p = bf16(2, (8, 8), (5, 5), 64);
    assert_eq!(p.required_elems(AttnTensor::Q), 2 * 5 * 8 * 64);
    p.bhsd().validate().unwrap();
    assert_eq!(p.bhsd().index(AttnTensor::Q, [1, 2, 3, 4]), ((8 + 2) * 5 + 3) * 64 + 4);
    assert_eq!(p.index(AttnTensor::Q, [1, 2, 3, 4]), ((5 + 3) * 8 + 2) * 64 + 4);
    // q, k, v as views of one [b, s, 3, h, d] projection output
    let packed = HeadLayout::packed_qkv(5, 8, 64);
    let mut fused = p;
    for t in [AttnTensor::Q, AttnTensor::K, AttnTensor::V] {
        fused = fused.with_layout(t, packed);
    }
    fused.validate().unwrap();
    let buffer = 2 * 5 * 3 * 8 * 64;
    let v_start = HeadLayout::packed_qkv_offset(2, 8, 64);
    assert_eq!(v_start + fused.required_elems(AttnTensor::V), buffer);
}

#[test]
fn lengths_are_checked_per_sequence() {
    let p = bf16(2, (4, 4), (7, 9), 64).with_var_len(true);
    p.check_lengths(&[7, 1], &[9, 3]).unwrap();
    let rule = |lq: &[i32], lkv: &[i32]| match p.check_lengths(lq, lkv) {
        Err(Error::AttentionShape { what, detail }) => format!("{what}: {detail}"),
        other => panic!("{other:?}"),
    };
    assert!(rule(&[7], &[9, 3]).starts_with("there is not one length per sequence"));
    assert!(rule(&[8, 1], &[9, 3]).contains("len_q[0] = 8, extent 7"));
    assert!(rule(&[7, 1], &[9, 0]).contains("len_kv[1] = 0"));
    assert!(rule(&[7, -1], &[9, 3]).contains("len_q[1] = -1"));
    let fixed = bf16(2, (4, 4), (7, 9), 64);
    assert!(fixed.check_lengths(&[7, 7], &[9, 9]).is_err(), "lengths given to a fixed-length problem");
}

#[test]
fn one_key_gives_its_value_and_equal_scores_give_the_mean() {
    let mut r = rng();
    let p = bf16(1, (2, 1), (3, 1), 8);
    let (q, k, v) =
        (tensor(&p, AttnTensor::Q, &mut r), tensor(&p, AttnTensor::K, &mut r), tensor(&p, AttnTensor::V, &mut r));
    let f = forward(&p, &q, &k, &v, None);
    for hq in 0..2 {
        for i in 0..3 {
            for e in 0..8 {
                let (got, want) = (f.o[p.index(AttnTensor::O, [0, hq, i, e])], v[p.index(AttnTensor::V, [0, 0, 0, e])]);
                assert!((got - want).abs() < 1e-15, "{got} {want}");
            }
        }
    }
    // q = 0: every score 0, o the mean of the visible values, lse = ln(count)
    let p = bf16(1, (1, 1), (4, 4), 8).with_mask(AttnMask::Causal);
    let (q, k, v) = (
        vec![0.0; p.required_elems(AttnTensor::Q)],
        tensor(&p, AttnTensor::K, &mut r),
        tensor(&p, AttnTensor::V, &mut r),
    );
    let f = forward(&p, &q, &k, &v, None);
    for i in 0..4 {
        assert!((f.lse[stats_index(&p, 0, 0, i)] - ((i + 1) as f64).ln()).abs() < 1e-14);
        for e in 0..8 {
            let mean = (0..=i).map(|j| v[p.index(AttnTensor::V, [0, 0, j, e])]).sum::<f64>() / (i + 1) as f64;
            assert!((f.o[p.index(AttnTensor::O, [0, 0, i, e])] - mean).abs() < 1e-14);
        }
    }
}

#[test]
fn masks_see_the_keys_they_name() {
    use reference::visible;
    // top-left: row i sees 0..=i; bottom-right with 2 queries, 5 keys: row 0 sees 0..=3
    assert!(visible(AttnMask::Causal, 0, 0, 2, 5) && !visible(AttnMask::Causal, 0, 1, 2, 5));
    assert!(visible(AttnMask::CausalBottomRight, 0, 3, 2, 5) && !visible(AttnMask::CausalBottomRight, 0, 4, 2, 5));
    assert!(visible(AttnMask::CausalBottomRight, 1, 4, 2, 5));
    // more queries than keys: the first rows of a bottom-right mask see nothing
    assert!(!visible(AttnMask::CausalBottomRight, 0, 0, 5, 2) && visible(AttnMask::CausalBottomRight, 3, 0, 5, 2));
    assert!(!visible(AttnMask::None, 0, 5, 2, 5), "a key past the length is never visible");
    let mut r = rng();
    let p = bf16(1, (1, 1), (5, 2), 8).with_mask(AttnMask::CausalBottomRight);
    let (q, k, v) =
        (tensor(&p, AttnTensor::Q, &mut r), tensor(&p, AttnTensor::K, &mut r), tensor(&p, AttnTensor::V, &mut r));
    let f = forward(&p, &q, &k, &v, None);
    assert_eq!(f.lse[stats_index(&p, 0, 0, 0)], f64::NEG_INFINITY);
    assert!((0..8).all(|e| f.o[p.index(AttnTensor::O, [0, 0, 0, e])] == 0.0), "a row with no key is 0");
    assert!(f.lse[stats_index(&p, 0, 0, 4)].is_finite());
}

/// The same logical tensor in another problem's strides.
fn restride(from: &Attention, to: &Attention, t: AttnTensor, x: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; to.required_elems(t)];
    from.elements(t).for_each(|at| y[to.index(t, at)] = x[from.index(t, at)]);
    y
}

#[test]
fn gqa_equals_multi_head_attention_on_repeated_heads_and_strides_change_nothing() {
    let mut r = rng();
    let gqa = bf16(2, (4, 2), (6, 7), 8).with_mask(AttnMask::Causal);
    let (q, k, v) =
        (tensor(&gqa, AttnTensor::Q, &mut r), tensor(&gqa, AttnTensor::K, &mut r), tensor(&gqa, AttnTensor::V, &mut r));
    let d_o = tensor(&gqa, AttnTensor::O, &mut r);
    let mha = bf16(2, (4, 4), (6, 7), 8).with_mask(AttnMask::Causal);
    let repeat = |x: &[f64]| {
        let mut y = vec![0.0; mha.required_elems(AttnTensor::K)];
        for n in 0..2 {
            for h in 0..4 {
                for j in 0..7 {
                    for e in 0..8 {
                        y[mha.index(AttnTensor::K, [n, h, j, e])] = x[gqa.index(AttnTensor::K, [n, h / 2, j, e])];
                    }
                }
            }
        }
        y
    };
    let (fg, fm) = (forward(&gqa, &q, &k, &v, None), forward(&mha, &q, &repeat(&k), &repeat(&v), None));
    assert!(rel_error_rows(&gqa, AttnTensor::O, &fg.o, &fm.o, None) < 1e-15);
    let gg = backward(&gqa, (&q, &k, &v), &fg.o, &d_o, &fg.lse, None);
    let gm = backward(&mha, (&q, &repeat(&k), &repeat(&v)), &fm.o, &d_o, &fm.lse, None);
    assert!(rel_error_rows(&gqa, AttnTensor::Q, &gg.dq, &gm.dq, None) < 1e-14);
    // dk of a shared head: the sum over the query heads that read it
    for n in 0..2 {
        for j in 0..7 {
            for e in 0..8 {
                let want =
                    gm.dk[mha.index(AttnTensor::K, [n, 2, j, e])] + gm.dk[mha.index(AttnTensor::K, [n, 3, j, e])];
                assert!((gg.dk[gqa.index(AttnTensor::K, [n, 1, j, e])] - want).abs() < 1e-13);
            }
        }
    }
    // BHSD: the same logical values in other strides give the same logical results
    let bh = gqa.bhsd();
    let re = |t, x: &[f64]| restride(&gqa, &bh, t, x);
    let fb = forward(&bh, &re(AttnTensor::Q, &q), &re(AttnTensor::K, &k), &re(AttnTensor::V, &v), None);
    assert!(rel_error_rows(&bh, AttnTensor::O, &fb.o, &re(AttnTensor::O, &fg.o), None) < 1e-15);
    assert_eq!(fb.lse, fg.lse);
}

#[test]
fn lengths_equal_the_truncated_problem() {
    let mut r = rng();
    for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
        let p = bf16(2, (2, 1), (6, 7), 8).with_mask(mask).with_var_len(true);
        let (q, k, v) =
            (tensor(&p, AttnTensor::Q, &mut r), tensor(&p, AttnTensor::K, &mut r), tensor(&p, AttnTensor::V, &mut r));
        let d_o = tensor(&p, AttnTensor::O, &mut r);
        let (lq, lkv) = ([6, 3], [7, 4]);
        let lens: Lengths<'_> = Some((&lq, &lkv));
        let f = forward(&p, &q, &k, &v, lens);
        let g = backward(&p, (&q, &k, &v), &f.o, &d_o, &f.lse, lens);
        // sequence 1 alone, as a fixed-length problem of its lengths
        let t = bf16(1, (2, 1), (3, 4), 8).with_mask(mask);
        let cut = |tt: AttnTensor, x: &[f64]| {
            let mut y = vec![0.0; t.required_elems(tt)];
            let [_, h, s] = t.dims(tt);
            for hh in 0..h {
                for rr in 0..s {
                    (0..8).for_each(|e| y[t.index(tt, [0, hh, rr, e])] = x[p.index(tt, [1, hh, rr, e])]);
                }
            }
            y
        };
        let ft = forward(&t, &cut(AttnTensor::Q, &q), &cut(AttnTensor::K, &k), &cut(AttnTensor::V, &v), None);
        assert!(rel_error_rows(&t, AttnTensor::O, &cut(AttnTensor::O, &f.o), &ft.o, None) < 1e-15, "{mask:?}");
        let gt = backward(
            &t,
            (&cut(AttnTensor::Q, &q), &cut(AttnTensor::K, &k), &cut(AttnTensor::V, &v)),
            &ft.o,
            &cut(AttnTensor::O, &d_o),
            &ft.lse,
            None,
        );
        assert!(rel_error_rows(&t, AttnTensor::K, &cut(AttnTensor::K, &g.dk), &gt.dk, None) < 1e-14, "{mask:?}");
        // padding rows: o undefined (NaN), key rows past the length get no gradient
        assert!(f.o[p.index(AttnTensor::O, [1, 0, 3, 0])].is_nan());
        assert!((4..7).all(|j| g.dv[p.index(AttnTensor::V, [1, 0, j, 5])] == 0.0));
        assert!(rel_error_rows(&p, AttnTensor::O, &f.o, &f.o, lens) == 0.0, "padding rows are skipped");
    }
}

#[test]
fn the_backward_equals_finite_differences_of_the_loss() {
    let mut r = rng();
    for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
        let p = bf16(1, (4, 2), (3, 5), 8).with_mask(mask).with_scale(0.7);
        let (q, k, v) =
            (tensor(&p, AttnTensor::Q, &mut r), tensor(&p, AttnTensor::K, &mut r), tensor(&p, AttnTensor::V, &mut r));
        let d_o = tensor(&p, AttnTensor::O, &mut r);
        let f = forward(&p, &q, &k, &v, None);
        let g = backward(&p, (&q, &k, &v), &f.o, &d_o, &f.lse, None);
        // L = Σ o·do; dL/dx by central differences, every element of q, k and v
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let o = forward(&p, q, k, v, None).o;
            let mut l = 0.0;
            each(&p, AttnTensor::O, |i| l += o[i] * d_o[i]);
            l
        };
        let h = 1e-6;
        let mut worst = 0.0f64;
        for (t, grad) in [(AttnTensor::Q, &g.dq), (AttnTensor::K, &g.dk), (AttnTensor::V, &g.dv)] {
            each(&p, t, |i| {
                let mut plus = [q.clone(), k.clone(), v.clone()];
                let mut minus = plus.clone();
                plus[t as usize][i] += h;
                minus[t as usize][i] -= h;
                let fd = (loss(&plus[0], &plus[1], &plus[2]) - loss(&minus[0], &minus[1], &minus[2])) / (2.0 * h);
                worst = worst.max((fd - grad[i]).abs());
            });
        }
        assert!(worst < 1e-8, "{mask:?}: largest difference {worst}");
    }
}

#[test]
fn the_fp8_emulation_is_the_recipes_own_error() {
    let mut r = rng();
    let p = bf16(2, (4, 2), (33, 40), 64).with_mask(AttnMask::Causal);
    let (q, k, v) =
        (tensor(&p, AttnTensor::Q, &mut r), tensor(&p, AttnTensor::K, &mut r), tensor(&p, AttnTensor::V, &mut r));
    let exact = forward(&p, &q, &k, &v, None);
    let e_qkv = fp8::forward(&p, &q, &k, &v, None, None);
    let e_all = fp8::forward(&p, &q, &k, &v, None, Some(448.0));
    let err = |f: &reference::Forward| rel_error_rows(&p, AttnTensor::O, &f.o, &exact.o, None);
    // E4M3 keeps 3 mantissa bits: each value within 2⁻⁴ relative; the output's error is a few %
    let (a, b) = (err(&e_qkv), err(&e_all));
    println!("FP8 emulation error: q, k, v {a:.4}; and P {b:.4}");
    assert!(a > 1e-3 && a < 0.06, "{a}");
    assert!(b > a * 0.5 && b < 0.08, "{b}");
    // values FP8 holds exactly, with amax 448 (scale 1), quantise to themselves
    let exact_vals: Vec<f64> = (0..p.required_elems(AttnTensor::Q)).map(|i| [448.0, -1.5, 0.25, 0.0][i % 4]).collect();
    let (back, s) = fp8::quantize_tensor(&p, AttnTensor::Q, &exact_vals);
    assert_eq!((back, s), (exact_vals, 1.0));
}

#[test]
#[should_panic(expected = "q has 639 elements, the problem's is 640")]
fn the_fp8_emulation_checks_its_inputs_first() {
    let p = bf16(1, (1, 1), (10, 10), 64);
    let x = vec![0.5; 640];
    fp8::forward(&p, &x[1..], &x, &x, None, None);
}

#[test]
#[should_panic(expected = "p_scale 0 is not finite and positive")]
fn the_fp8_emulation_refuses_a_useless_p_scale() {
    let p = bf16(1, (1, 1), (10, 10), 64);
    let x = vec![0.5; 640];
    fp8::forward(&p, &x, &x, &x, None, Some(0.0));
}

#[test]
fn an_fp8_output_is_rounded_through_e4m3_with_its_scale() {
    let p = bf16(1, (1, 1), (1, 1), 16);
    let scale = 0.25f32;
    // 1.5·0.25 is exact in E4M3 (1.5 = 1.1₂); 1.0625 is not (three mantissa bits): it rounds to 1.0
    let mut o = vec![0.0; p.required_elems(AttnTensor::O)];
    o[0] = 1.5 * 0.25;
    o[1] = 1.0625 * 0.25;
    o[2] = -448.0 * 0.25;
    let r = fp8::round_output(&p, &o, scale);
    assert_eq!((r[0], r[1], r[2]), (0.375, 0.25, -112.0));
    assert!(r[3..].iter().all(|&x| x == 0.0));
    // a problem with per-sequence lengths rounds the same (every element; no lengths needed)
    let r = fp8::round_output(&p.with_var_len(true), &o, scale);
    assert_eq!((r[0], r[1], r[2]), (0.375, 0.25, -112.0));
}

#[test]
fn flops_count_each_sequences_own_lengths() {
    let p = bf16(2, (8, 2), (100, 300), 64).with_mask(AttnMask::Causal);
    assert_eq!(p.forward_flops(), 4.0 * 8.0 * 64.0 * 2.0 * 100.0 * 300.0 / 2.0);
    assert_eq!(p.forward_flops(), p.forward_flops_with(Some((&[100, 100], &[300, 300]))));
    let lens: (&[i32], &[i32]) = (&[10, 100], &[30, 200]);
    assert_eq!(p.forward_flops_with(Some(lens)), 4.0 * 8.0 * 64.0 * (10.0 * 30.0 + 100.0 * 200.0) / 2.0);
}

#[test]
fn the_statistics_error_skips_padding_rows_and_never_passes_nan() {
    let p = bf16(2, (2, 1), (3, 3), 8).with_var_len(true);
    let lens: (&[i32], &[i32]) = (&[3, 1], &[3, 3]);
    let want: Vec<f64> = (0..p.stats_elems()).map(|i| 1.0 + i as f64).collect();
    let mut got = want.clone();
    got[stats_index(&p, 1, 0, 2)] = f64::NAN; // a padding row: not judged
    assert_eq!(reference::rel_error_stats(&p, &got, &want, Some(lens)), 0.0);
    got[stats_index(&p, 0, 1, 2)] = f64::NAN;
    assert_eq!(reference::rel_error_stats(&p, &got, &want, Some(lens)), f64::INFINITY);
}
