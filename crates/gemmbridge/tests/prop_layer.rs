//! Property tests of the decoder layer ([`DecoderLayer`] with [`Tokens`]: sizes, heads, eps,
//! RoPE θ, element type; its GEMMs, norm, RoPE, SwiGLU and attention problems), its decode step
//! over a paged cache ([`DecodeStep`]) and the CPU layer on every layer small enough to run:
//! nothing panics or overflows, the size helpers are exact for a valid layer, weights are
//! refused before they are allocated, and a forward and backward on finite inputs are finite.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::layer::cpu::CpuDecoderLayer;
use gemmbridge::layer::reference::Weights;
use gemmbridge::layer::{DecodeStep, DecoderLayer, LayerWeight, Proj, RopeStyle, Tokens};
use gemmbridge::norm::GradType;
use gemmbridge::paged::PagedCache;
use gemmbridge::DType;
use proptest::prelude::*;
use shared::{config, size, size_multiple};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=3, 1 => size()]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![4 => Just(None), 1 => prop::option::of(any::<f64>())].prop_map(|x| x.unwrap_or(f64::NAN))
}

prop_compose! {
    fn layer()(d in prop_oneof![2 => 1usize..=8, 1 => size()], heads_kv in dim(), group in prop_oneof![1usize..=2, size()],
               head_dim in prop_oneof![2 => Just(8usize), 1 => size_multiple(2)], ffn in prop_oneof![2 => 1usize..=8, 1 => size()],
               dtype in prop::sample::select(vec![DType::BF16, DType::F16, DType::F32]),
               eps in prop_oneof![3 => Just(1e-5), 1 => any::<f64>(), 1 => float()],
               theta in prop_oneof![3 => Just(10_000.0), 1 => any::<f64>()], interleaved in any::<bool>()) -> DecoderLayer {
        let style = if interleaved { RopeStyle::Interleaved } else { RopeStyle::RotateHalf };
        DecoderLayer::new(d, (heads_kv.saturating_mul(group), heads_kv), head_dim, ffn, dtype).with_eps(eps).with_rope(theta, style)
    }
}

fn tokens() -> impl Strategy<Value = Tokens> {
    (dim(), dim()).prop_map(|(b, s)| Tokens { b, s })
}

/// A layer and tokens the CPU runs in a few milliseconds in a debug build.
fn small(l: &DecoderLayer, t: Tokens) -> bool {
    let weights: usize = LayerWeight::ALL.iter().map(|&w| l.weight_len(w)).fold(0, usize::saturating_add);
    weights <= 1 << 12 && t.count() <= 8 && l.qkv_width().max(2 * l.ffn) <= 64
}

fn run<T: gemmbridge::Element>(l: &DecoderLayer, t: Tokens, seed: u64) {
    let mut i = 0u64;
    let w = Weights::from_fn(l, |_, _| {
        i += 1;
        shared::values(1, seed ^ i)[0] as f64 * 0.2
    })
    .unwrap();
    let mut cpu: CpuDecoderLayer<T> =
        CpuDecoderLayer::new(*l, t, &w).unwrap_or_else(|e| panic!("{}: {e}", l.describe()));
    let x: Vec<T> = shared::buf(t.count() * l.d_model, seed);
    cpu.forward(&x, true).unwrap_or_else(|e| panic!("{}: {e}", l.describe()));
    assert!(shared::finite(cpu.output()), "{}: y", l.describe());
    let dy: Vec<T> = shared::buf(t.count() * l.d_model, seed + 1);
    cpu.backward(&x, &dy).unwrap_or_else(|e| panic!("{}: {e}", l.describe()));
    assert!(shared::finite(cpu.input_grad()), "{}: dx", l.describe());
    let g = cpu.grads();
    for w in LayerWeight::ALL {
        assert!(g.get(w).iter().all(|v| v.is_finite()), "{}: {w:?}", l.describe());
    }
}

#[test]
fn layers_run() {
    let n = shared::runnable((layer(), tokens()), |(l, t)| l.check_tokens(*t).is_ok() && small(l, *t));
    assert!(n >= 10, "{n} of 1000 layers run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decoder_layer(l in layer(), t in tokens(), seed in any::<u64>()) {
        let _ = (l.describe(), l.q_width(), l.kv_width(), l.qkv_width(), l.qkv_offsets(), l.precision(), t.count());
        let _ = (l.flops(t, true), l.attention(t), l.norm_problem(t, GradType::F32), l.rope_problem(t), l.swiglu_problem(t));
        for w in LayerWeight::ALL {
            let _ = (l.weight_shape(w), l.weight_len(w));
        }
        for p in Proj::ALL {
            let _ = l.proj_shape(p);
        }
        let _ = l.gemms(t, l.precision());
        if l.validate().is_err() {
            // refused before a weight is allocated
            prop_assert!(Weights::from_fn(&l, |_, _| 0.0).is_err());
            return Ok(());
        }
        let total = LayerWeight::ALL.iter().try_fold(0usize, |a, &w| a.checked_add(l.weight_len(w)));
        prop_assert!(total.is_some_and(|n| n.checked_mul(l.dtype.size_bytes()).is_some()), "{}", l.describe());
        if l.check_tokens(t).is_err() {
            return Ok(());
        }
        prop_assert!(l.gemms(t, l.precision()).is_ok());
        prop_assert!(l.flops(t, false).is_finite());
        if small(&l, t) {
            match l.dtype {
                DType::BF16 => run::<gemmbridge::half::bf16>(&l, t, seed),
                _ => run::<gemmbridge::half::f16>(&l, t, seed),
            }
        }
    }

    #[test]
    fn decode_step(l in layer(), pages in prop_oneof![1usize..=4, size()], page_size in prop_oneof![Just(16usize), size()],
                   batch in dim(), width in dim(),
                   tables in prop::collection::vec(prop_oneof![0i32..4, any::<i32>()], 0..6),
                   held in prop::collection::vec(prop_oneof![0i32..40, any::<i32>()], 0..3)) {
        let cache = PagedCache::new(pages, page_size, (l.heads_kv, l.head_dim), l.dtype, (batch, width));
        let step = DecodeStep::new(l, cache);
        let _ = (step.describe(), step.tokens(), step.append(), step.attention(), step.weight_bytes(), step.kv_bytes(&held), step.bytes(&held));
        let _ = (step.validate(), step.check_index(&tables, &held));
        if step.validate().is_ok() {
            prop_assert!(step.weight_bytes().is_finite() && step.weight_bytes() > 0.0);
        }
    }
}
