//! Property tests of the attention problem ([`Attention`]: sizes, grouped heads, strides,
//! packed QKV views, masks, scales, per-sequence lengths, element types), its FP8 emulation's
//! quantisation, and the CPU backend's forward and backward on every problem small enough to
//! run: nothing panics or overflows, a valid problem's spans fit cuDNN's 32-bit indexing, a
//! call with buffers too small for its problem is refused before anything is allocated, and a
//! run on finite inputs gives finite outputs.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::attention::{self, check_packed, Attention, AttnMask, AttnTensor, HeadLayout, MAX_ELEMS};
use gemmbridge::{cpu, DType, Element};
use proptest::prelude::*;
use shared::{config, dtype, scalar, size, size_multiple, RUN_ELEMS, RUN_WORK};

const TENSORS: [AttnTensor; 4] = [AttnTensor::Q, AttnTensor::K, AttnTensor::V, AttnTensor::O];

fn mask() -> impl Strategy<Value = AttnMask> {
    prop::sample::select(vec![AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight])
}

fn head_layout() -> impl Strategy<Value = HeadLayout> {
    (size_multiple(8), size_multiple(8), size_multiple(8)).prop_map(|(batch, head, seq)| HeadLayout {
        batch,
        head,
        seq,
    })
}

/// A size, half the time a small positive one (so that problems often run).
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=4, size()]
}

prop_compose! {
    fn problem()(b in dim(), hkv in dim(), group in prop_oneof![1usize..=3, size()], s in (dim(), dim()),
                 d in prop_oneof![Just(8usize), Just(16), size_multiple(8)], dtype in dtype(), bhsd in any::<bool>(),
                 relayout in prop::option::of((0usize..4, head_layout())), mask in mask(),
                 scale in prop::option::of(scalar()), var_len in any::<bool>()) -> Attention {
        let hq = hkv.saturating_mul(group);
        let mut p = Attention::new(b, (hq, hkv), s, d, dtype);
        if bhsd {
            p = p.bhsd();
        }
        if let Some((t, l)) = relayout {
            p = p.with_layout(TENSORS[t], l);
        }
        if let Some(scale) = scale {
            p = p.with_scale(scale);
        }
        p.with_mask(mask).with_var_len(var_len)
    }
}

/// Every helper of a problem, valid or not; the invariants of a valid one.
fn check(p: &Attention) -> bool {
    let _ = (p.describe(), p.stats_elems(), p.group(), p.forward_flops());
    let spans = TENSORS.map(|t| p.required_elems(t));
    let Ok(()) = p.validate() else { return false };
    for (t, n) in TENSORS.iter().zip(spans) {
        assert!((1..=MAX_ELEMS).contains(&n), "{}: {} spans {n}", p.describe(), t.name());
        // the last element is inside the span
        let [b, h, s] = p.dims(*t);
        assert!(p.index(*t, [b - 1, h - 1, s - 1, p.d - 1]) < n, "{}", p.describe());
    }
    assert_eq!(p.h_q % p.h_kv, 0);
    assert!(p.forward_flops().is_finite());
    true
}

fn lengths(p: &Attention, seed: u64) -> (Vec<i32>, Vec<i32>) {
    let v = shared::values(2 * p.b, seed);
    let pick = |x: f32, max: usize| 1 + ((x + 2.0) / 4.0 * max as f32) as i32 % max as i32;
    (v[..p.b].iter().map(|&x| pick(x, p.s_q)).collect(), v[p.b..].iter().map(|&x| pick(x, p.s_kv)).collect())
}

fn run<T: Element>(p: &Attention, seed: u64) {
    let lens = p.var_len.then(|| lengths(p, seed));
    let lens_ref = lens.as_ref().map(|(a, b)| (&a[..], &b[..]));
    if let Some((lq, lkv)) = lens_ref {
        p.check_lengths(lq, lkv).unwrap();
    }
    let [q, k, v, o]: [Vec<T>; 4] = TENSORS.map(|t| shared::buf(p.required_elems(t), seed ^ t as u64));
    let mut out = o.clone();
    let mut lse = vec![0f32; p.stats_elems()];
    cpu::attention_forward(p, [&q, &k, &v], &mut out, Some(&mut lse), lens_ref)
        .unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    // scores past f32's range overflow, as documented (and as on the GPU): finiteness is
    // promised only while scale·q·k stays inside it (|q|, |k| ≤ 2, d ≤ 256)
    let in_range = p.scale <= 1e30;
    assert!(!in_range || shared::finite(&out), "{}: o not finite", p.describe());
    // lse: finite, or −∞ for a row that sees no key; never NaN or +∞
    assert!(!in_range || lse.iter().all(|l| !l.is_nan() && *l != f32::INFINITY), "{}: lse {lse:?}", p.describe());
    let d_o: Vec<T> = shared::buf(p.required_elems(AttnTensor::O), seed + 7);
    let [mut dq, mut dk, mut dv]: [Vec<T>; 3] =
        [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| vec![T::from_f32(0.0); p.required_elems(t)]);
    if in_range && lse.iter().all(|l| l.is_finite()) {
        cpu::attention_backward(p, [&q, &k, &v, &out, &d_o], &lse, [&mut dq, &mut dk, &mut dv], lens_ref)
            .unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
        for (name, g) in [("dq", &dq), ("dk", &dk), ("dv", &dv)] {
            assert!(shared::finite(g), "{}: {name} not finite", p.describe());
        }
    }
    // the FP8 emulation's quantisation of a finite tensor is finite
    let qf: Vec<f64> = q.iter().map(|x| x.to_f64()).collect();
    let (qd, scale) = attention::fp8::quantize_tensor(p, AttnTensor::Q, &qf);
    assert!(scale.is_finite() && scale > 0.0 && qd.iter().all(|x| x.is_finite()), "{}", p.describe());
}

fn small(p: &Attention) -> bool {
    TENSORS.iter().all(|&t| p.required_elems(t) <= RUN_ELEMS)
        && [p.b, p.h_q, p.s_q, p.s_kv, p.d]
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .is_some_and(|w| w <= RUN_WORK)
}

#[test]
fn problems_run() {
    let n = shared::runnable(problem(), |p| p.validate().is_ok() && small(p));
    assert!(n >= 10, "{n} of 1000 problems run on the CPU");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn attention_problem(p in problem(), seed in any::<u64>()) {
        let valid = check(&p);
        // buffers too small for the problem (here: none) are refused before anything is allocated
        with_elem!(p.dtype, T => {
            let lens = p.var_len.then(|| (vec![1; p.b.min(4)], vec![1; p.b.min(4)]));
            let lens = lens.as_ref().map(|(a, b)| (&a[..], &b[..]));
            let mut o: Vec<T> = Vec::new();
            let r = cpu::attention_forward::<T>(&p, [&[], &[], &[]], &mut o, None, lens);
            prop_assert!(r.is_err(), "{}: an empty output was accepted", p.describe());
        });
        if valid && small(&p) {
            with_elem!(p.dtype, T => { run::<T>(&p, seed) });
        }
    }

    #[test]
    fn lengths_and_packed_views(p in problem(), lq in prop::collection::vec(any::<i32>(), 0..4),
                                lkv in prop::collection::vec(prop_oneof![any::<i32>(), 0i32..10], 0..4),
                                offsets in (size(), size(), size())) {
        if let Ok(()) = p.check_lengths(&lq, &lkv) {
            prop_assert!(p.var_len && lq.len() == p.b && lkv.len() == p.b);
            prop_assert!(lq.iter().all(|&l| l >= 1 && l as usize <= p.s_q));
            let _ = p.forward_flops_with(Some((&lq, &lkv)));
        }
        let (a, b, c) = offsets;
        let _ = check_packed(&p, [a, b, c]);
        // a packed QKV of heads side by side: q at 0, k at h_q·d, v after k
        let w = HeadLayout::packed_qkv(p.s_q, p.h_q, p.d);
        let mut packed = p;
        packed.layouts[..3].copy_from_slice(&[w; 3]);
        let offs = [0, 1, 2].map(|i| HeadLayout::packed_qkv_offset(i, p.h_q, p.d));
        let _ = (check_packed(&packed, offs), packed.validate(), check(&packed));
    }
}

#[test]
fn empty_buffers_are_refused_for_a_valid_problem() {
    let p = Attention::new(1, (1, 1), (1, 1), 8, DType::BF16);
    p.validate().unwrap();
    let mut o: Vec<gemmbridge::half::bf16> = Vec::new();
    assert!(cpu::attention_forward(&p, [&[], &[], &[]], &mut o, None, None).is_err());
}
