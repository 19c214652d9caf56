//! Attention in burn's ops, for every call cuDNN does not serve: burn's own attention op
//! (forward without gradients), and the forward with statistics and the backward composed of
//! burn's matmul, max, exp and sum (under `Autodiff`). The composed pair computes in f32 for
//! f16/bf16 (f64 for f64) and rounds each result once to the inputs' dtype.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{AttentionModuleOptions, FloatTensor};
use burn::tensor::{DType, FloatDType, Shape, TensorData, TensorMetadata};

use super::{default_scale, AttnMask, AttnResiduals};

/// The dtype the composed attention computes in, for inputs of `dtype`.
pub(crate) fn compute_dtype(dtype: DType) -> FloatDType {
    match dtype {
        DType::F64 => FloatDType::F64,
        _ => FloatDType::F32,
    }
}

/// `dtype` as a float dtype (the inputs' dtype, to cast results back to).
fn float_dtype(dtype: DType) -> FloatDType {
    match dtype {
        DType::F64 => FloatDType::F64,
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        _ => FloatDType::F32,
    }
}

fn dims4<B: Backend>(t: &FloatTensor<B>) -> [usize; 4] {
    t.shape().dims::<4>()
}

/// `t[b, h_kv, s, d]` with each head repeated `g` times in place: `[b, h_kv·g, s, d]`, head
/// `hk·g + r` a copy of `hk` (query head `hq` reads key/value head `hq / g`).
fn repeat_heads<B: Backend>(t: FloatTensor<B>, g: usize) -> FloatTensor<B> {
    if g == 1 {
        return t;
    }
    let [b, h, s, d] = dims4::<B>(&t);
    let t = B::float_reshape(t, Shape::from([b, h, 1, s, d]));
    let t = B::float_expand(t, Shape::from([b, h, g, s, d]));
    B::float_reshape(t, Shape::from([b, h * g, s, d]))
}

/// The sum of each group of `g` consecutive heads of `t[b, h_kv·g, s, d]`: `[b, h_kv, s, d]`
/// (the gradient of [`repeat_heads`]).
fn sum_groups<B: Backend>(t: FloatTensor<B>, g: usize) -> FloatTensor<B> {
    if g == 1 {
        return t;
    }
    let [b, h, s, d] = dims4::<B>(&t);
    let t = B::float_sum_dim(B::float_reshape(t, Shape::from([b, h / g, g, s, d])), 2);
    B::float_reshape(t, Shape::from([b, h / g, s, d]))
}

/// The mask as burn's bool tensor (`true`: hidden) `[b, h, s_q, s_kv]` (a broadcast view), or
/// `None` where every key is visible.
fn mask_tensor<B: Backend>(
    mask: &AttnMask,
    [b, h, s_q, s_kv]: [usize; 4],
    device: &B::Device,
) -> Option<burn::tensor::ops::BoolTensor<B>> {
    if *mask == AttnMask::None {
        return None;
    }
    // per sequence only where lengths differ between sequences
    let nb = if mask.lengths().is_some() { b } else { 1 };
    let hidden: Vec<bool> = (0..nb)
        .flat_map(|n| (0..s_q).flat_map(move |i| (0..s_kv).map(move |j| (n, i, j))))
        .map(|(n, i, j)| !mask.visible(n, i, j, s_q, s_kv))
        .collect();
    let t = B::bool_from_data(TensorData::new(hidden, [nb, 1, s_q, s_kv]), device);
    Some(B::bool_expand(t, Shape::from([b, h, s_q, s_kv])))
}

/// burn's own attention op (`ModuleOps::attention`, what `burn::tensor::module::attention`
/// calls) on `q`, `k`, `v` with the key/value heads repeated for grouped queries; the causal
/// masks that burn's `is_causal` expresses (bottom-right, and top-left when `s_q = s_kv`) as
/// that flag, other masks as a bool tensor; `scale` passed only where it is not `1/√d`.
pub(crate) fn burn_attention<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: &AttnMask,
    scale: f32,
) -> FloatTensor<B> {
    let ([b, h_q, s_q, d], [_, h_kv, s_kv, _]) = (dims4::<B>(&q), dims4::<B>(&k));
    let (k, v) = (repeat_heads::<B>(k, h_q / h_kv), repeat_heads::<B>(v, h_q / h_kv));
    let is_causal = matches!(mask, AttnMask::CausalBottomRight) || (*mask == AttnMask::Causal && s_q == s_kv);
    let bool_mask = if is_causal { None } else { mask_tensor::<B>(mask, [b, h_q, s_q, s_kv], &B::float_device(&q)) };
    let scale = (scale != default_scale(d)).then_some(f64::from(scale));
    let options = AttentionModuleOptions { scale, softcap: None, is_causal };
    B::attention(q, k, v, bool_mask, None, options)
}

/// `scale·q·kᵀ` with hidden entries `−∞`, in the compute dtype (`q` and `k` cast, `k`'s heads
/// repeated): `[b, h_q, s_q, s_kv]`.
fn scores<B: Backend>(q: FloatTensor<B>, k: FloatTensor<B>, mask: &AttnMask, scale: f32) -> FloatTensor<B> {
    let ([b, h_q, s_q, _], [_, _, s_kv, _]) = (dims4::<B>(&q), dims4::<B>(&k));
    let device = B::float_device(&q);
    let s = B::float_mul_scalar(B::float_matmul(q, B::float_transpose(k)), scale.into());
    match mask_tensor::<B>(mask, [b, h_q, s_q, s_kv], &device) {
        Some(m) => B::float_mask_fill(s, m, f32::NEG_INFINITY.into()),
        None => s,
    }
}

/// The forward with its statistics, composed: `(o, lse)` (see [`AttnResiduals`]); `o` in the
/// inputs' dtype, `lse[b, h_q, s_q]` in the compute dtype.
pub(crate) fn forward_stats<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: &AttnMask,
    scale: f32,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let dtype = q.dtype();
    let (c, g) = (compute_dtype(dtype), dims4::<B>(&q)[1] / dims4::<B>(&k)[1]);
    let [b, h_q, s_q, _] = dims4::<B>(&q);
    let k = repeat_heads::<B>(B::float_cast(k, c), g);
    let v = repeat_heads::<B>(B::float_cast(v, c), g);
    let s = scores::<B>(B::float_cast(q, c), k, mask, scale);
    // every row has a visible key (the entry checks), so its maximum is finite
    let max = B::float_max_dim(s.clone(), 3);
    let e = B::float_exp(B::float_sub(s, max.clone()));
    let sum = B::float_sum_dim(e.clone(), 3);
    let o = B::float_matmul(B::float_div(e, sum.clone()), v);
    let lse = B::float_reshape(B::float_add(max, B::float_log(sum)), Shape::from([b, h_q, s_q]));
    (B::float_cast(o, float_dtype(dtype)), lse)
}

/// The backward from the residuals, composed (gemmbridge's attention module documentation has
/// the formulas): `P = exp(scale·q·kᵀ − lse)` (hidden entries 0), `dv = Pᵀ·do`,
/// `dS = P ∘ (do·vᵀ − rowsum(do ∘ o))`, `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dk` and `dv`
/// summed over each group's query heads; each cast to the inputs' dtype.
pub(crate) fn backward<B: Backend>(
    saved: AttnResiduals<B>,
    d_o: FloatTensor<B>,
    mask: &AttnMask,
    scale: f32,
) -> [FloatTensor<B>; 3] {
    let AttnResiduals { q, k, v, o, lse } = saved;
    let dtype = q.dtype();
    let ([b, h_q, s_q, _], [_, h_kv, _, _]) = (dims4::<B>(&q), dims4::<B>(&k));
    let (c, g) = (compute_dtype(dtype), h_q / h_kv);
    let cast = |t: FloatTensor<B>| B::float_cast(t, c);
    let (q, k, v) = (cast(q), repeat_heads::<B>(cast(k), g), repeat_heads::<B>(cast(v), g));
    let (o, d_o) = (cast(o), cast(d_o));
    let lse = B::float_reshape(cast(lse), Shape::from([b, h_q, s_q, 1]));
    let p = B::float_exp(B::float_sub(scores::<B>(q.clone(), k.clone(), mask, scale), lse));
    let dv = B::float_matmul(B::float_transpose(p.clone()), d_o.clone());
    let dp = B::float_matmul(d_o.clone(), B::float_transpose(v));
    let rows = B::float_sum_dim(B::float_mul(d_o, o), 3);
    let ds = B::float_mul(p, B::float_sub(dp, rows));
    let dq = B::float_mul_scalar(B::float_matmul(ds.clone(), k), scale.into());
    let dk = B::float_mul_scalar(B::float_matmul(B::float_transpose(ds), q), scale.into());
    let back = |t: FloatTensor<B>| B::float_cast(t, float_dtype(dtype));
    [back(dq), back(sum_groups::<B>(dk, g)), back(sum_groups::<B>(dv, g))]
}
