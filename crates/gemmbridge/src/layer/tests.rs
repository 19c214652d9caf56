//! The layer's rules, and its float64 reference against finite differences and facts of its
//! wiring.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::reference::{backward, forward, Weights};
use super::*;

/// A tiny layer: GQA (4 query heads over 2), odd sizes where they may be.
fn tiny() -> (DecoderLayer, Tokens) {
    (
        DecoderLayer::new(12, (4, 2), 8, 10, DType::BF16).with_rope(10_000.0, RopeStyle::RotateHalf),
        Tokens { b: 2, s: 5 },
    )
}

pub(super) fn rng() -> (StdRng, u64) {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    (StdRng::seed_from_u64(seed), seed)
}

pub(super) fn normal(r: &mut StdRng, n: usize, scale: f64) -> Vec<f64> {
    (0..n).map(|_| scale * r.sample::<f64, _>(StandardNormal)).collect()
}

/// Weights scaled as a trained layer's roughly are (norms near 1, projections ~1/√in).
pub(super) fn weights(l: &DecoderLayer, r: &mut StdRng) -> Weights {
    let mut w = Weights::default();
    for which in LayerWeight::ALL {
        let [rows, cols] = l.weight_shape(which);
        *w.get_mut(which) = match which {
            LayerWeight::Norm1 | LayerWeight::Norm2 => normal(r, cols, 0.2).iter().map(|v| 1.0 + v).collect(),
            _ => normal(r, rows * cols, 1.0 / (cols as f64).sqrt()),
        };
    }
    w
}

/// `L = Σ y∘dy`, whose gradient with respect to `y` is `dy`.
fn loss(l: &DecoderLayer, t: Tokens, w: &Weights, x: &[f64], dy: &[f64]) -> f64 {
    forward(l, t, w, x).unwrap().y.iter().zip(dy).map(|(a, b)| a * b).sum()
}

/// Central difference of `L` along `v` applied by `shift(ε·v)`.
fn directional(eval: impl Fn(f64) -> f64) -> f64 {
    let eps = 1e-5;
    (eval(eps) - eval(-eps)) / (2.0 * eps)
}

fn close(what: &str, fd: f64, analytic: f64, tol: f64) {
    let err = (fd - analytic).abs() / analytic.abs().max(1e-3);
    assert!(err < tol, "{what}: finite difference {fd:.9e}, backward {analytic:.9e} (relative {err:.2e})");
}

#[test]
fn every_gradient_matches_finite_differences() {
    for rope in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        let (l, t) = tiny();
        let l = l.with_rope(l.rope_theta, rope);
        let (mut r, _) = rng();
        let w = weights(&l, &mut r);
        let x = normal(&mut r, t.count() * l.d_model, 1.0);
        let dy = normal(&mut r, t.count() * l.d_model, 1.0);
        let saved = forward(&l, t, &w, &x).unwrap();
        let g = backward(&l, t, &w, &x, &saved, &dy).unwrap();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
        // dx along a random direction, and single elements
        let v = normal(&mut r, x.len(), 1.0);
        let fd = directional(|e| loss(&l, t, &w, &x.iter().zip(&v).map(|(a, b)| a + e * b).collect::<Vec<_>>(), &dy));
        close(&format!("{} dx·v", rope.name()), fd, dot(&g.dx, &v), 1e-6);
        for which in LayerWeight::ALL {
            let v = normal(&mut r, l.weight_len(which), 1.0);
            let shifted = |e: f64| {
                let mut w2 = w.clone();
                w2.get_mut(which).iter_mut().zip(&v).for_each(|(a, b)| *a += e * b);
                loss(&l, t, &w2, &x, &dy)
            };
            close(
                &format!("{} d_{}·v", rope.name(), which.name()),
                directional(shifted),
                dot(g.dw.get(which), &v),
                1e-6,
            );
            for _ in 0..3 {
                let i = r.random_range(0..l.weight_len(which));
                let one = |e: f64| {
                    let mut w2 = w.clone();
                    w2.get_mut(which)[i] += e;
                    loss(&l, t, &w2, &x, &dy)
                };
                close(&format!("{} d_{}[{i}]", rope.name(), which.name()), directional(one), g.dw.get(which)[i], 1e-5);
            }
        }
    }
}

/// The reference's wiring, by facts that hold whatever the pieces compute: the first token of
/// each sequence sits at position 0, so RoPE leaves its q and k as the projection made them
/// (`h1·w_qkvᵀ`, recomputed here by plain dot products), and under the causal mask it sees only
/// itself, so each query head's output is its group's v head of that token.
#[test]
fn the_first_token_is_unrotated_and_attends_to_itself() {
    let (l, t) = tiny();
    let (mut r, _) = rng();
    let w = weights(&l, &mut r);
    let x = normal(&mut r, t.count() * l.d_model, 1.0);
    let s = forward(&l, t, &w, &x).unwrap();
    let (d, width, hd) = (l.d_model, l.qkv_width(), l.head_dim);
    let [_, _, ov] = l.qkv_offsets();
    for n in 0..t.b {
        let row = n * t.s;
        for c in 0..width {
            let direct: f64 = (0..d).map(|i| s.h1[row * d + i] * w.w_qkv[c * d + i]).sum();
            let got = s.qkv[row * width + c];
            assert!((got - direct).abs() <= 1e-12 * direct.abs().max(1.0), "seq {n} qkv[{c}]: {got} vs {direct}");
        }
        for h in 0..l.heads_q {
            let kh = h / (l.heads_q / l.heads_kv);
            for e in 0..hd {
                let (o, v) = (s.o[(row * l.heads_q + h) * hd + e], s.qkv[row * width + ov + kh * hd + e]);
                assert!((o - v).abs() <= 1e-12 * v.abs().max(1.0), "seq {n} head {h} o[{e}]: {o} vs v {v}");
            }
        }
    }
}

/// The backward refuses a saved forward of other tokens by name instead of indexing past it.
#[test]
fn a_saved_forward_of_other_tokens_is_refused() {
    let (l, t) = tiny();
    let (mut r, _) = rng();
    let w = weights(&l, &mut r);
    let other = Tokens { b: 1, s: t.s };
    let x1 = normal(&mut r, other.count() * l.d_model, 1.0);
    let saved = forward(&l, other, &w, &x1).unwrap();
    let (x, dy) = (normal(&mut r, t.count() * l.d_model, 1.0), normal(&mut r, t.count() * l.d_model, 1.0));
    let e = backward(&l, t, &w, &x, &saved, &dy).unwrap_err().to_string();
    assert!(
        e.contains("the saved forward is not of this layer") && e.contains("y has 60 elements, expected 120"),
        "{e}"
    );
}

/// The one description of the step: the forward's order, the backward its reverse, the steps
/// after attention from the O projection on, each projection's weight.
#[test]
fn the_steps_in_order() {
    assert_eq!(FORWARD[0], Step::Norm1);
    assert_eq!(FORWARD[AFTER_ATTENTION - 1], Step::Attention);
    assert_eq!(FORWARD[AFTER_ATTENTION], Step::Project(Proj::O));
    let reversed: Vec<Step> = FORWARD.iter().rev().copied().collect();
    assert_eq!(BACKWARD.to_vec(), reversed);
    let projections: Vec<Proj> =
        FORWARD.iter().filter_map(|s| if let Step::Project(p) = s { Some(*p) } else { None }).collect();
    assert_eq!(projections, Proj::ALL);
    let weights = Proj::ALL.map(Proj::weight);
    assert_eq!(weights, [LayerWeight::Qkv, LayerWeight::O, LayerWeight::GateUp, LayerWeight::Down]);
}

#[test]
fn the_rules_are_named_errors() {
    let ok = DecoderLayer::llama3_8b();
    ok.validate().unwrap();
    ok.check_tokens(Tokens { b: 2, s: 4096 }).unwrap();
    let what = |l: DecoderLayer| match l.validate() {
        Err(Error::DecoderShape { what, .. }) => what,
        other => panic!("{other:?}"),
    };
    assert_eq!(what(DecoderLayer { heads_kv: 5, ..ok }), "query heads are not a multiple of the key/value heads");
    assert_eq!(
        what(DecoderLayer { head_dim: 127, ..ok }),
        "the head dimension is odd (RoPE rotates pairs of elements)"
    );
    assert_eq!(
        what(DecoderLayer { head_dim: 258, ..ok }),
        "the head dimension exceeds 256 (cuDNN's fused attention engines)"
    );
    assert_eq!(what(DecoderLayer { ffn: 0, ..ok }), "a size is zero");
    assert_eq!(what(ok.with_eps(f64::NAN)), "RMSNorm's eps is not finite and positive");
    assert_eq!(what(ok.with_rope(0.5, RopeStyle::RotateHalf)), "RoPE's theta is not finite and at least 1");
    assert_eq!(what(DecoderLayer { dtype: DType::F32, ..ok }), "the dtype is neither bf16 nor f16");
    let over = "the weights' bytes overflow (more than isize::MAX)";
    assert_eq!(what(DecoderLayer { ffn: usize::MAX / 4, ..ok }), over);
    // sizes whose first doubling overflows: a named error, no arithmetic panic
    assert_eq!(what(DecoderLayer { d_model: 1 << 63, ..ok }), over);
    assert_eq!(what(DecoderLayer::new(8, (1 << 63, 1 << 63), 2, 8, DType::BF16)), over);
    assert_eq!(what(DecoderLayer { ffn: usize::MAX, ..ok }), over);
    // every product fits usize but the bytes pass isize::MAX: refused too
    let e = DecoderLayer { ffn: 1 << 41, d_model: 1 << 20, ..ok }.validate().unwrap_err();
    assert!(e.to_string().contains("elements of 2 bytes"), "{e}");
    // the size helpers saturate instead of panicking or wrapping on a refused layer
    let huge = DecoderLayer { d_model: 1 << 62, ffn: 1 << 62, ..ok };
    assert_eq!(huge.weight_len(LayerWeight::GateUp), usize::MAX);
    let wide = DecoderLayer::new(8, (1 << 63, 1 << 63), 2, 8, DType::BF16);
    assert_eq!((wide.qkv_width(), wide.qkv_offsets()[2]), (usize::MAX, usize::MAX));
    let f = huge.flops(Tokens { b: 1, s: 1 }, true);
    assert!(f.is_finite() && f > 1e37, "{f}");
    let e = ok.check_tokens(Tokens { b: 0, s: 8 }).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { what: "no tokens (b or s is zero)", .. }), "{e}");
    let (l, t) = tiny();
    let w = Weights::from_fn(&l, |_, _| 0.5).unwrap();
    let mut short = w.clone();
    short.w_down.pop();
    let e = forward(&l, t, &short, &vec![0.0; t.count() * l.d_model]).unwrap_err();
    assert!(e.to_string().contains("w_down has 119, expected 120"), "{e}");
    let e = forward(&l, t, &w, &[0.0; 3]).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { what: "x has the wrong length", .. }), "{e}");
}

#[test]
fn shapes_names_and_flops() {
    let l = DecoderLayer::llama3_8b();
    assert_eq!(l.weight_shape(LayerWeight::Qkv), [6144, 4096]);
    assert_eq!(l.weight_shape(LayerWeight::O), [4096, 4096]);
    assert_eq!(l.weight_shape(LayerWeight::GateUp), [28672, 4096]);
    assert_eq!(l.weight_shape(LayerWeight::Down), [4096, 14336]);
    assert_eq!(l.qkv_offsets(), [0, 4096, 5120]);
    let names = check_names();
    assert_eq!(names[..3], ["y", "dx", "d_w_qkv"]);
    assert_eq!(names.len(), 8);
    // (2, 4096): 2·T·(6144 + 4096 + 28672 + 14336)·4096 GEMM flops plus causal attention
    let t = Tokens { b: 2, s: 4096 };
    let gemm = 2.0 * 8192.0 * (6144.0 + 4096.0 + 28672.0 + 14336.0) * 4096.0;
    let attn = 4.0 * 2.0 * 32.0 * 4096.0 * 4096.0 * 128.0 / 2.0;
    assert_eq!(l.flops(t, false), gemm + attn);
    assert_eq!(l.flops(t, true), 3.0 * gemm + 3.5 * attn);
    let p = l.attention(t);
    assert_eq!((p.layouts[0].seq, p.layouts[3].seq), (6144, 4096));
}

/// The problems of a step: the projections' GEMMs and their gradients, RoPE on the fused
/// `qkv` (row stride the fused width, q and k heads, position within the sequence), SwiGLU
/// with the gate first, RMSNorm with the layer's ε; the options' rule.
#[test]
fn the_problems_of_a_step() {
    use crate::fp8::Scaling;
    use crate::layer_ops::GluLayout;
    use crate::norm::GradType;
    let (l, t) = (DecoderLayer::llama3_8b(), Tokens { b: 2, s: 4096 });
    let g = l.gemms(t, l.precision()).unwrap();
    let qkv = &g.fwd[Proj::Qkv as usize];
    assert_eq!((qkv.m(), qkv.n(), qkv.k()), (8192, 6144, 4096));
    let dx = &g.dx[Proj::Down as usize];
    assert_eq!((dx.m(), dx.n(), dx.k()), (8192, 14336, 4096));
    let dw = &g.dw[Proj::GateUp as usize];
    assert_eq!((dw.m(), dw.n(), dw.k()), (28672, 4096, 8192));
    let r = l.rope_problem(t);
    assert_eq!((r.batch, r.seq, r.heads_q, r.heads_kv, r.head_dim, r.rotary_dim), (2, 4096, 32, 8, 128, 128));
    assert_eq!((r.ld, r.style), (l.qkv_width(), RopeStyle::RotateHalf));
    let sw = l.swiglu_problem(t);
    assert_eq!((sw.rows, sw.f, sw.layout), (8192, 14336, GluLayout::Halves));
    assert_eq!(sw.gate_up_index(1, 2), (28672 + 2, 28672 + 14336 + 2), "gate first, then up");
    let n = l.norm_problem(t, GradType::F32);
    assert_eq!((n.rows, n.features, n.eps, n.dw), (8192, 4096, 1e-5, GradType::F32));
    LayerOptions { fp8_forward: Some(Scaling::Row) }.validate().unwrap();
    let e = LayerOptions { fp8_forward: Some(Scaling::Block1x128) }.validate().unwrap_err();
    assert!(matches!(e, Error::Fp8 { .. }), "{e}");
}

/// A gate/up width past usize (ffn > usize::MAX / 2) saturates in the shape, and the GEMMs are
/// refused by name instead of overflowing.
#[test]
fn proj_shape_of_a_huge_ffn_saturates() {
    let l = DecoderLayer::new(1, (1, 1), 2, usize::MAX, DType::BF16);
    assert_eq!(l.proj_shape(Proj::GateUp), (usize::MAX, 1));
    let e = l.gemms(Tokens { b: 1, s: 1 }, l.precision()).unwrap_err();
    assert!(matches!(e, Error::DimensionTooLarge { .. }), "{e}");
}
