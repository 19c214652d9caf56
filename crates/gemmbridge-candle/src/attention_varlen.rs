//! Variable-length attention over packed sequences (`[total, h, d]` rows, cumulative lengths),
//! forward and backward; the batch's arguments and their checks are in
//! [`crate::attention_varlen_batch`], the engine's side (padded batch, custom operations) in
//! [`crate::attention_varlen_op`].

use candle_core::{DType, Result, Tensor, D};

use crate::attention_varlen_batch::{Causal, CuSeqlens, Packing};
use crate::attention_varlen_op as op;
use crate::{device_served, Served};

/// Attention over packed variable-length sequences, forward and backward (candle-flash-attn's
/// `flash_attn_varlen`): sequence `n` is the query rows `cu_q[n]..cu_q[n+1]` of
/// `q[total_q, h_q, d]` and the key/value rows `cu_kv[n]..cu_kv[n+1]` of `k`, `v[total_kv,
/// h_kv, d]`; each attends within itself, `o = softmax(scale·q·kᵀ + mask)·v`, under `mask`
/// ([`Causal`]); `o` is `[total_q, h_q, d]`, contiguous, of q's dtype. Query head `hq` reads
/// key/value head `hq / (h_q / h_kv)` (grouped-query heads); `scale` is `1/√d` unless given.
/// `seqlens_q`, `seqlens_kv`: cumulative lengths, `b + 1` each ([`CuSeqlens`]: host values or
/// a `u32` tensor, which is read back — a synchronisation); `max_seqlen_q`, `max_seqlen_kv`:
/// bounds on the sequences' lengths. A sequence may be empty (0 queries: no output rows, its
/// keys get zero gradients), also to keep `b` fixed across batches.
///
/// # Which path serves it
/// f16 and bf16 with `d` a multiple of 8 up to 256, on the CPU or (feature `cuda`) a CUDA
/// device: gemmbridge's attention on a padded batch of the sequences, `[b, s, h, d]` with `s`
/// the longest sequence's length rounded up to a power of two (at most the bound given), with
/// per-sequence lengths (cuDNN's flash-attention engines with their padding mask on
/// CUDA, gemmbridge's CPU attention on the CPU: f32 scores and softmax, one rounding). The
/// packed rows are scattered into the padded tensors and the output gathered back with
/// candle's `index_add` / `index_select` (copies of q, k, v and o; cuDNN skips the padded
/// rows, the CPU path computes their scores). The engine plans once per problem: `b`, the
/// padded extents, the heads, `d`, the mask and the scale — a fixed `b` (padded with empty
/// sequences) keeps one cuDNN plan for every batch whose longest sequences stay within the
/// same powers of two. Inputs that are not contiguous are copied
/// first ([`Served::AfterCopy`]). Anything else (f32, other head dimensions, an empty batch,
/// other devices, [`crate::set_enabled`]`(false)`) runs [`sdpa_varlen_candle`].
///
/// # Backward
/// Through candle's autograd: `dq`, `dk`, `dv` of q's, k's, v's shapes (`dk`, `dv` summed over
/// the query heads sharing a key/value head). A served call's backward is one call of
/// gemmbridge's attention backward on the padded batch (cuDNN's fused backward on CUDA), from
/// the softmax statistics the forward kept (`4·b·h_q·s_q` bytes, `s_q` the padded query extent, held by the graph,
/// only where an input tracks a gradient); the fallback's is candle's own.
///
/// # Errors
/// Named errors (candle's `Error::Msg`, starting `sdpa_varlen:`), on every path, before
/// anything is launched: cumulative lengths that do not start at 0, decrease, do not end at
/// the tensor's rows, or whose counts differ between q and k/v; a tensor `seqlens_*` that is
/// not `u32 [b + 1]`; a sequence longer than its `max_seqlen`; a sequence with queries and no
/// keys, or (`BottomRight`) more queries than keys; `h_q` not a multiple of `h_kv`; q, k, v
/// not 3-D or of disagreeing shapes or dtypes; a `scale` that is not finite and positive.
/// From the engine, a gemmbridge error wrapped; the same from `Tensor::backward`.
#[allow(clippy::too_many_arguments)] // candle-flash-attn's `flash_attn_varlen` argument list
pub fn sdpa_varlen<'a>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: impl Into<CuSeqlens<'a>>,
    seqlens_kv: impl Into<CuSeqlens<'a>>,
    max_seqlen_q: usize,
    max_seqlen_kv: usize,
    mask: Causal,
    scale: Option<f32>,
) -> Result<Tensor> {
    sdpa_varlen_served(q, k, v, seqlens_q, seqlens_kv, max_seqlen_q, max_seqlen_kv, mask, scale).map(|(t, _)| t)
}

/// [`sdpa_varlen`], and which path ran it.
///
/// # Errors
/// As [`sdpa_varlen`].
#[allow(clippy::too_many_arguments)] // as `sdpa_varlen`
pub fn sdpa_varlen_served<'a>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: impl Into<CuSeqlens<'a>>,
    seqlens_kv: impl Into<CuSeqlens<'a>>,
    max_seqlen_q: usize,
    max_seqlen_kv: usize,
    mask: Causal,
    scale: Option<f32>,
) -> Result<(Tensor, Served)> {
    let pk =
        Packing::check([q, k, v], [seqlens_q.into(), seqlens_kv.into()], [max_seqlen_q, max_seqlen_kv], mask, scale)?;
    served(q, k, v, &pk, mask, scale)
}

/// candle's own operations, one sequence at a time: each sequence's rows taken with `narrow`,
/// its scores `scale·q·kᵀ` (`[h_q, len_q, len_kv]`) materialised in f32, the mask added as
/// `−∞`, the softmax with its row maximum subtracted, `·v`, rounded to q's dtype; the
/// sequences' outputs concatenated (`[total_q, h_q, d]`; an empty batch gives `[0, h_q, d]`).
/// Any dtype candle's matmul takes, any `d`, any device. What [`sdpa_varlen`] falls back to,
/// and what the tests compare with; its backward is candle's autograd.
///
/// # Errors
/// As [`sdpa_varlen`] (the same checks, before any operation).
#[allow(clippy::too_many_arguments)] // as `sdpa_varlen`
pub fn sdpa_varlen_candle<'a>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: impl Into<CuSeqlens<'a>>,
    seqlens_kv: impl Into<CuSeqlens<'a>>,
    max_seqlen_q: usize,
    max_seqlen_kv: usize,
    mask: Causal,
    scale: Option<f32>,
) -> Result<Tensor> {
    let pk =
        Packing::check([q, k, v], [seqlens_q.into(), seqlens_kv.into()], [max_seqlen_q, max_seqlen_kv], mask, scale)?;
    candle_varlen(q, k, v, &pk, mask, scale)
}

/// The path for checked inputs: the engine where it serves them, else candle's operations.
fn served(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pk: &Packing,
    mask: Causal,
    scale: Option<f32>,
) -> Result<(Tensor, Served)> {
    let (_, h_q, d) = q.dims3()?;
    let h_kv = k.dims()[1];
    let plan = device_served(q.device()).then(|| op::plan(pk, (h_q, h_kv, d), mask, scale, q.dtype())).flatten();
    let Some(plan) = plan else { return Ok((candle_varlen(q, k, v, pk, mask, scale)?, Served::Candle)) };
    if q.is_contiguous() && k.is_contiguous() && v.is_contiguous() {
        return Ok((op::run([q, k, v], plan, pk)?, Served::Gemmbridge));
    }
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    Ok((op::run([&q, &k, &v], plan, pk)?, Served::AfterCopy))
}

/// [`sdpa_varlen_candle`] on checked inputs.
fn candle_varlen(q: &Tensor, k: &Tensor, v: &Tensor, pk: &Packing, mask: Causal, scale: Option<f32>) -> Result<Tensor> {
    let (_, h_q, d) = q.dims3()?;
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let mut parts = Vec::with_capacity(pk.b());
    for n in 0..pk.b() {
        let (lq, lkv) = pk.lens(n);
        if lq == 0 {
            continue;
        }
        let rows = |t: &Tensor, cu: &[u32], len| t.narrow(0, cu[n] as usize, len);
        let (qn, kn, vn) = (rows(q, &pk.cu_q, lq)?, rows(k, &pk.cu_kv, lkv)?, rows(v, &pk.cu_kv, lkv)?);
        parts.push(candle_sequence([&qn, &kn, &vn], mask, scale)?);
    }
    if parts.is_empty() {
        return Tensor::zeros((0, h_q, d), q.dtype(), q.device());
    }
    Tensor::cat(&parts, 0)
}

/// One sequence, `q[lq, h_q, d]`, `k`, `v[lkv, h_kv, d]` (`lq`, `lkv` ≥ 1), through candle's
/// operations in f32: `o[lq, h_q, d]` in q's dtype.
fn candle_sequence([q, k, v]: [&Tensor; 3], mask: Causal, scale: f32) -> Result<Tensor> {
    let (lq, h_q, d) = q.dims3()?;
    let (lkv, h_kv, _) = k.dims3()?;
    let g = h_q / h_kv;
    // [l, h, d] → [h_q, l, d] in f32, key/value heads repeated for grouped queries
    let heads = |t: &Tensor, l: usize, h: usize| -> Result<Tensor> {
        let t = t.to_dtype(DType::F32)?.transpose(0, 1)?;
        if h == h_q {
            return t.contiguous();
        }
        t.unsqueeze(1)?.broadcast_as((h, g, l, d))?.reshape((h_q, l, d))
    };
    let (q32, k32, v32) = (heads(q, lq, h_q)?, heads(k, lkv, h_kv)?, heads(v, lkv, h_kv)?);
    let mut s = (q32.matmul(&k32.t()?.contiguous()?)? * f64::from(scale))?;
    if mask != Causal::None {
        let m: Vec<f32> = (0..lq * lkv)
            .map(|e| if mask.visible(e / lkv, e % lkv, lq, lkv) { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        s = s.broadcast_add(&Tensor::from_vec(m, (lq, lkv), q.device())?)?;
    }
    let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v32)?.transpose(0, 1)?.to_dtype(q.dtype())
}
