//! On burn's NdArray backend (CPU, runs in CI): no call reaches cuDNN here, so these check the
//! adapter's own definitions — burn's attention op with the masks and grouped heads mapped onto
//! it, the composed forward with statistics and the composed backward that run under
//! `Autodiff` wherever cuDNN does not serve, the entry checks, and `GemmAttention`.
//!
//! In f32 only: burn keeps one default float dtype per device type, which `NdArray<f32>` and
//! `NdArray<f64>` share, so an f64 test in this executable would change the dtype the other
//! tests' tensors are made in. The reference is float64; the bands are f32's.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, FloatDType, Tensor, TensorData, TensorPrimitive};
use gemmbridge_burn::{
    attention, attention_with_scale, AttentionOps, AttnMask, GemmAttention, GemmAttentionConfig, GemmLinear,
    MhaConversionError,
};

use super::{cases, rel, tensor, values, Case};

type F32 = NdArray<f32>;

/// NdArray's random generator is global and the tests run on parallel threads: the tests that
/// seed it hold this lock.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|p| p.into_inner())
}

/// q, k, v of a case on `B`, f32.
fn inputs<B: Backend>(c: &Case, seed: u64) -> [Tensor<B, 4>; 3] {
    let (dev, dt) = (Default::default(), FloatDType::F32);
    let (q, kv) = (c.q_shape(), c.kv_shape());
    [tensor::<B, 4>(q, seed, dt, &dev), tensor(kv, seed + 1, dt, &dev), tensor(kv, seed + 2, dt, &dev)]
}

#[test]
fn forward_matches_float64_for_every_mask_and_grouping() {
    for c in cases() {
        let [q, k, v] = inputs::<F32>(&c, 10);
        let (want, _) = c.forward(&values(q.clone()), &values(k.clone()), &values(v.clone()));
        let e = rel(&values(attention(q, k, v, c.mask.clone())), &want);
        assert!(e <= 1e-5, "{c:?}: vs float64: {e:e}");
    }
}

/// The composed forward (what `Autodiff` runs where cuDNN does not serve) gives the output and
/// the softmax statistics of the definition.
#[test]
fn statistics_match_float64() {
    for c in cases() {
        let [q, k, v] = inputs::<F32>(&c, 20);
        let (want_o, want_lse) = c.forward(&values(q.clone()), &values(k.clone()), &values(v.clone()));
        let prim = |t: Tensor<F32, 4>| t.into_primitive().tensor();
        let (o, lse) = F32::gemm_attention_stats(prim(q), prim(k), prim(v), &c.mask, 0.125);
        let o = Tensor::<F32, 4>::from_primitive(TensorPrimitive::Float(o));
        let lse = Tensor::<F32, 3>::from_primitive(TensorPrimitive::Float(lse));
        assert_eq!(lse.dims(), [c.b, c.h.0, c.s.0], "{c:?}: statistics' shape");
        let (eo, el) = (rel(&values(o), &want_o), rel(&values(lse), &want_lse));
        assert!(eo <= 1e-5 && el <= 1e-6, "{c:?}: o {eo:e}, lse {el:e}");
    }
}

/// `[dq, dk, dv]` of `sum(attention(q, k, v) ⊙ g)` under `Autodiff<B>`, and `g`.
fn grads<B: AutodiffBackend + AttentionOps>(c: &Case, seed: u64) -> ([Vec<f64>; 3], Vec<f64>) {
    let [q, k, v] = inputs::<B>(c, seed).map(|t| t.require_grad());
    let g = tensor::<B, 4>(c.q_shape(), seed + 3, FloatDType::F32, &Default::default());
    let o = attention(q.clone(), k.clone(), v.clone(), c.mask.clone());
    let grads = (o * g.clone()).sum().backward();
    let d = |t: &Tensor<B, 4>| values(t.grad(&grads).expect("a gradient"));
    ([d(&q), d(&k), d(&v)], values(g))
}

#[test]
fn gradients_match_float64_for_every_mask_and_grouping() {
    for c in cases() {
        let [q, k, v] = inputs::<F32>(&c, 30);
        let (q, k, v) = (values(q), values(k), values(v));
        let (got, g) = grads::<Autodiff<F32>>(&c, 30);
        let want = c.grads(&q, &k, &v, &g);
        for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let e = rel(&got[i], &want[i]);
            assert!(e <= 1e-5, "{c:?} {name}: vs float64: {e:e}");
        }
    }
}

/// Only the inputs that track a gradient get one; an untracked call under `Autodiff` gives the
/// plain forward.
#[test]
fn gradients_only_where_tracked_and_untracked_forward() {
    let c = &cases()[2];
    let [q, k, v] = inputs::<Autodiff<F32>>(c, 40);
    let plain = attention(q.clone(), k.clone(), v.clone(), c.mask.clone());
    let k = k.require_grad();
    let o = attention(q.clone(), k.clone(), v.clone(), c.mask.clone());
    assert!(rel(&values(o.clone()), &values(plain)) <= 1e-6, "tracked and untracked forwards agree");
    let grads = o.sum().backward();
    assert!(q.grad(&grads).is_none() && v.grad(&grads).is_none(), "untracked inputs get no gradient");
    assert_eq!(k.grad(&grads).expect("k tracks a gradient").dims(), c.kv_shape());
}

/// A `[b, s, h, d]` projection seen as `[b, h, s, d]` (a strided view) gives what its
/// contiguous copy gives, forward and backward (gradients of the `[b, s, h, d]` tensors).
#[test]
fn strided_views_equal_contiguous_inputs() {
    type B = Autodiff<F32>;
    let c = &cases()[2];
    let dev = Default::default();
    let bshd =
        |[b, h, s, d]: [usize; 4], seed| tensor::<B, 4>([b, s, h, d], seed, FloatDType::F32, &dev).require_grad();
    let (q, k, v) = (bshd(c.q_shape(), 50), bshd(c.kv_shape(), 51), bshd(c.kv_shape(), 52));
    let view = |t: &Tensor<B, 4>| t.clone().swap_dims(1, 2);
    let o = attention(view(&q), view(&k), view(&v), c.mask.clone());
    let grads = o.clone().sum().backward();
    let dense = |t: &Tensor<B, 4>| Tensor::<B, 4>::from_data(view(t).into_data(), &dev).require_grad();
    let (q2, k2, v2) = (dense(&q), dense(&k), dense(&v));
    let o2 = attention(q2.clone(), k2.clone(), v2.clone(), c.mask.clone());
    let grads2 = o2.clone().sum().backward();
    assert!(rel(&values(o), &values(o2)) <= 1e-6);
    for (t, t2) in [(&q, &q2), (&k, &k2), (&v, &v2)] {
        let (g, g2) = (t.grad(&grads).unwrap().swap_dims(1, 2), t2.grad(&grads2).unwrap());
        assert!(rel(&values(g), &values(g2)) <= 1e-6, "gradient through the view");
    }
}

#[test]
fn a_given_scale_is_used() {
    let c = Case { mask: AttnMask::Causal, ..cases()[0].clone() };
    let [q, k, v] = inputs::<F32>(&c, 60);
    // scale s on q·kᵀ is the default scale (1/8) on 8s·q (s and 8s exact in f32 and f64)
    let want = attention(q.clone().mul_scalar(2.5), k.clone(), v.clone(), AttnMask::Causal);
    let got = attention_with_scale(q, k, v, AttnMask::Causal, 0.3125);
    assert!(rel(&values(got), &values(want)) <= 1e-6);
}

fn shaped(q: [usize; 4], kv: [usize; 4]) -> [Tensor<F32, 4>; 3] {
    let dev = Default::default();
    [tensor(q, 1, FloatDType::F32, &dev), tensor(kv, 2, FloatDType::F32, &dev), tensor(kv, 3, FloatDType::F32, &dev)]
}

#[test]
#[should_panic(expected = "5 query heads are not a multiple of 2 key/value heads")]
fn query_heads_must_be_a_multiple_of_key_value_heads() {
    let [q, k, v] = shaped([1, 5, 8, 16], [1, 2, 8, 16]);
    let _ = attention(q, k, v, AttnMask::None);
}

#[test]
#[should_panic(expected = "k and v differ in shape")]
fn keys_and_values_must_agree() {
    let [q, k, _] = shaped([1, 4, 8, 16], [1, 2, 8, 16]);
    let v = tensor([1, 2, 9, 16], 4, FloatDType::F32, &Default::default());
    let _ = attention(q, k, v, AttnMask::None);
}

#[test]
#[should_panic(expected = "k's batch or head dimension differs from q's")]
fn head_dimensions_must_agree() {
    let [q, k, v] = shaped([1, 4, 8, 16], [1, 2, 8, 8]);
    let _ = attention(q, k, v, AttnMask::None);
}

#[test]
#[should_panic(expected = "1 key length(s) for a batch of 2")]
fn one_length_per_sequence() {
    let [q, k, v] = shaped([2, 4, 8, 16], [2, 2, 8, 16]);
    let _ = attention(q, k, v, AttnMask::Lengths(vec![8]));
}

#[test]
#[should_panic(expected = "key length 9 of sequence 1 is outside 1..=8")]
fn lengths_within_the_keys() {
    let [q, k, v] = shaped([2, 4, 8, 16], [2, 2, 8, 16]);
    let _ = attention(q, k, v, AttnMask::CausalLengths(vec![8, 9]));
}

#[test]
#[should_panic(expected = "key length 0 of sequence 0")]
fn lengths_not_zero() {
    let [q, k, v] = shaped([2, 4, 8, 16], [2, 2, 8, 16]);
    let _ = attention(q, k, v, AttnMask::Lengths(vec![0, 3]));
}

#[test]
#[should_panic(expected = "the bottom-right causal mask leaves query rows without keys (s_kv = 6 < s_q = 8)")]
fn bottom_right_needs_as_many_keys_as_queries() {
    let [q, k, v] = shaped([1, 4, 8, 16], [1, 2, 6, 16]);
    let _ = attention(q, k, v, AttnMask::CausalBottomRight);
}

#[test]
#[should_panic(expected = "scale = 0 is not finite and positive")]
fn the_scale_must_be_positive() {
    let [q, k, v] = shaped([1, 4, 8, 16], [1, 2, 8, 16]);
    let _ = attention_with_scale(q, k, v, AttnMask::None, 0.0);
}

#[test]
fn masks_say_what_is_visible() {
    let (l, cl) = (AttnMask::Lengths(vec![3, 5]), AttnMask::CausalLengths(vec![3, 5]));
    assert!(AttnMask::None.visible(0, 0, 7, 4, 8));
    assert!(AttnMask::Causal.visible(0, 2, 2, 4, 8) && !AttnMask::Causal.visible(0, 2, 3, 4, 8));
    // 4 queries over 8 keys: row 0 sees keys 0..=4
    assert!(AttnMask::CausalBottomRight.visible(0, 0, 4, 4, 8) && !AttnMask::CausalBottomRight.visible(0, 0, 5, 4, 8));
    assert!(l.visible(0, 0, 2, 4, 8) && !l.visible(0, 0, 3, 4, 8) && l.visible(1, 0, 4, 4, 8));
    assert!(!cl.visible(1, 2, 3, 4, 8) && cl.visible(1, 3, 3, 4, 8) && !cl.visible(0, 3, 3, 4, 8));
    assert_eq!((l.lengths(), AttnMask::Causal.lengths()), (Some(&[3usize, 5][..]), None));
}

/// The module with its parameters drawn (burn initialises them lazily, in the order first
/// used: query, key, value, output, as `MultiHeadAttention`'s are drawn in [`mha`]).
fn materialised<B: Backend>(m: GemmAttention<B>) -> GemmAttention<B> {
    for l in [&m.query, &m.key, &m.value, &m.output] {
        let _ = (l.weight.val(), l.bias.as_ref().map(|b| b.val()));
    }
    m
}

fn mha<B: Backend>(d_model: usize, heads: usize, seed: u64) -> MultiHeadAttention<B> {
    let dev = Default::default();
    B::seed(&dev, seed);
    let m: MultiHeadAttention<B> = MultiHeadAttentionConfig::new(d_model, heads).with_dropout(0.0).init(&dev);
    // burn initialises parameters lazily: materialise them before the module is cloned
    for l in [&m.query, &m.key, &m.value, &m.output] {
        let _ = (l.weight.val(), l.bias.as_ref().map(|b| b.val()));
    }
    m
}

/// burn's `MultiHeadAttention` and the converted `GemmAttention` give the same context, without
/// a mask and with a padding mask (`mask_pad` over a suffix = `AttnMask::Lengths`).
#[test]
fn gemm_attention_equals_burns_multi_head_attention() {
    let _rng = rng_lock();
    let dev = Default::default();
    let theirs = mha::<F32>(64, 4, 7);
    let ours = GemmAttention::try_from(theirs.clone()).expect("converts");
    assert_eq!((ours.n_heads, ours.n_kv_heads(), ours.d_k()), (4, 4, 16));
    let x = tensor::<F32, 3>([2, 37, 64], 70, FloatDType::F32, &dev);
    let want = theirs.forward(MhaInput::self_attn(x.clone())).context;
    let e = rel(&values(ours.self_attention(x.clone(), AttnMask::None)), &values(want));
    assert!(e <= 1e-5, "no mask: {e:e}");
    let lens = [37usize, 12];
    let pad: Vec<bool> = lens.iter().flat_map(|&l| (0..37).map(move |j| j >= l)).collect();
    let pad = Tensor::<F32, 2, Bool>::from_data(TensorData::new(pad, [2, 37]), &dev);
    let want = theirs.forward(MhaInput::self_attn(x.clone()).mask_pad(pad)).context;
    let e = rel(&values(ours.self_attention(x, AttnMask::Lengths(lens.to_vec()))), &values(want));
    assert!(e <= 1e-5, "padding: {e:e}");
}

#[test]
fn config_init_matches_burns_and_conversions_refuse_what_they_cannot_express() {
    let _rng = rng_lock();
    let dev = Default::default();
    F32::seed(&dev, 11);
    let ours = materialised(GemmAttentionConfig::new(32, 4).init::<F32>(&dev));
    let theirs = mha::<F32>(32, 4, 11);
    for (a, b) in [(&ours.query, &theirs.query), (&ours.key, &theirs.key), (&ours.output, &theirs.output)] {
        assert_eq!(values(a.weight.val()), values(b.weight.val()));
        assert_eq!(values(a.bias.as_ref().unwrap().val()), values(b.bias.as_ref().unwrap().val()));
    }
    let mut quiet = theirs.clone();
    quiet.quiet_softmax = true;
    assert_eq!(GemmAttention::try_from(quiet).unwrap_err(), MhaConversionError::QuietSoftmax);
    let back = MultiHeadAttention::try_from(ours).expect("no grouped heads");
    assert_eq!((back.n_heads, back.d_k, back.d_model), (4, 8, 32));
    let gqa: GemmAttention<F32> = GemmAttentionConfig::new(32, 4).with_n_kv_heads(Some(2)).init(&dev);
    assert_eq!(gqa.key.weight.dims(), [32, 16]);
    let err = MultiHeadAttention::try_from(gqa).unwrap_err();
    assert_eq!(err, MhaConversionError::GroupedHeads { n_heads: 4, n_kv_heads: 2 });
    assert!(err.to_string().contains("2 key/value heads for 4 query heads"), "{err}");
}

/// A record saved from burn's module loads into `GemmAttention` and back, unchanged.
#[test]
fn records_load_across() {
    let _rng = rng_lock();
    let dev = Default::default();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let theirs = mha::<F32>(32, 4, 12);
    let bytes = recorder.record(theirs.clone().into_record(), ()).unwrap();
    F32::seed(&dev, 99);
    let fresh: GemmAttention<F32> = GemmAttentionConfig::new(32, 4).init(&dev);
    let ours = fresh.load_record(recorder.load(bytes, &dev).expect("burn's record loads"));
    for (a, b) in [(&ours.query, &theirs.query), (&ours.value, &theirs.value), (&ours.output, &theirs.output)] {
        assert_eq!(values(a.weight.val()), values(b.weight.val()));
    }
    let bytes = recorder.record(ours.clone().into_record(), ()).unwrap();
    let back = mha::<F32>(32, 4, 98).load_record(recorder.load(bytes, &dev).expect("ours loads into burn's"));
    assert_eq!(values(back.key.weight.val()), values(ours.key.weight.val()));
}

/// `x + GemmAttention(x)` (grouped heads, causal) under `Autodiff<NdArray>`: the input's
/// and every projection's gradients equal those of the same block written with burn's own ops
/// (burn's matmul and `module::attention`, differentiated by burn's autodiff).
#[test]
fn residual_block_gradients_equal_burns_own() {
    type B = Autodiff<F32>;
    let _rng = rng_lock();
    let dev = Default::default();
    F32::seed(&dev, 13);
    let m = GemmAttentionConfig::new(64, 4).with_n_kv_heads(Some(2)).init::<B>(&dev);
    let x = tensor::<B, 3>([2, 37, 64], 80, FloatDType::F32, &dev).require_grad();
    let g = tensor::<B, 3>([2, 37, 64], 81, FloatDType::F32, &dev);
    let ours = (x.clone() + m.self_attention(x.clone(), AttnMask::Causal)) * g.clone();
    let ours = ours.sum().backward();
    let burns = (x.clone() + burn_block(&m, x.clone())) * g;
    let burns = burns.sum().backward();
    let e = rel(&values(x.grad(&ours).unwrap()), &values(x.grad(&burns).unwrap()));
    assert!(e <= 1e-5, "dx {e:e}");
    for (name, p) in [("query", &m.query), ("key", &m.key), ("value", &m.value), ("output", &m.output)] {
        let w = &p.weight;
        let e = rel(&values(w.grad(&ours).unwrap()), &values(w.grad(&burns).unwrap()));
        assert!(e <= 1e-5, "{name} weight: {e:e}");
    }
}

/// The module's causal self-attention in burn's own ops: `nn::Linear`'s forward,
/// `module::attention` with the key/value heads repeated.
fn burn_block<B: Backend>(m: &GemmAttention<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let (h, kv, d_k) = (m.n_heads, m.n_kv_heads(), m.d_k());
    let [b, s, _] = x.dims();
    let lin = |l: &GemmLinear<B>, x: Tensor<B, 3>| {
        burn::tensor::module::linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()))
    };
    let heads = |t: Tensor<B, 3>, n: usize| {
        let t = t.reshape([b, s, n, d_k]).swap_dims(1, 2);
        t.unsqueeze_dim::<5>(2).expand([b, n, h / n, s, d_k]).reshape([b, h, s, d_k])
    };
    let (q, k, v) =
        (heads(lin(&m.query, x.clone()), h), heads(lin(&m.key, x.clone()), kv), heads(lin(&m.value, x), kv));
    let opts = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
    let o = burn::tensor::module::attention(q, k, v, None, None, opts);
    lin(&m.output, o.swap_dims(1, 2).reshape([b, s, h * d_k]))
}
