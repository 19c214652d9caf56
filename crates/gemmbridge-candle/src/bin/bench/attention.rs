//! The attention rows: causal attention with grouped-query heads (32 query heads, 8 key/value
//! heads, head dimension 128: Llama-3-8B's) at every `--seq` length, `--batch` sequences, in
//! candle's `[b, h, s, d]` order. A row's m and n are the sequence length, k the head
//! dimension, batch b, its label `h32:8-causal`; its TFLOP/s counts 2·b·h_q·s²·d per forward
//! (4·b·h_q·s²·d halved by the causal mask) and 3.5× that for `sdpa_bwd`, as `gemmbridge
//! bench`'s `attn_fwd` and `attn_fwd_bwd` rows do.
//!
//! candle's side has two ways, each its own row: its matmul-softmax path as
//! candle-transformers' Llama runs it (scores in f32, key/value heads repeated, the mask
//! filled with −∞), under the plain label, and the same path kept in bf16, labelled
//! `h32:8-causal+bf16_scores`; `gemmbridge compare` sets both beside our one row.

use candle_core::{DType, Result, Tensor, Var, D};

use crate::rows::{randn, Bench, Case, Outputs, Work};
use crate::BenchArgs;

/// Query heads, key/value heads and the head dimension (Llama-3-8B's).
pub const HEADS: (usize, usize, usize) = (32, 8, 128);

/// `sdpa`: the forward. candle's softmax is candle-nn's fused `softmax_last_dim`;
/// ours is [`gemmbridge_candle::sdpa`] (cuDNN's flash attention).
pub fn forward(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    rows(b, a, false)
}

/// `sdpa_bwd`: the forward and the backward through candle's autograd (`Tensor::backward`
/// of the output, whose gradient is all ones, to q, k and v), timed together. candle's
/// softmax is candle-nn's `softmax` (candle's `softmax_last_dim` has no backward); ours is
/// [`gemmbridge_candle::sdpa`], whose backward is cuDNN's fused one. `rel_diff` is the largest
/// over the output and the three gradients.
pub fn forward_backward(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    rows(b, a, true)
}

fn rows(b: &mut Bench, a: &BenchArgs, backward: bool) -> Result<()> {
    let (h_q, h_kv, d) = HEADS;
    for &s in &a.seq {
        let n = a.batch;
        // variables for the backward; without one plain tensors, for which the forward keeps
        // no statistics
        let input = |h: usize| -> Result<Tensor> {
            let t = randn(&[n, h, s, d], 1.0, &b.dev)?;
            if backward {
                Ok(Var::from_tensor(&t)?.as_tensor().clone())
            } else {
                Ok(t)
            }
        };
        let (q, k, v) = (input(h_q)?, input(h_kv)?, input(h_kv)?);
        let mask: Vec<u8> = (0..s * s).map(|e| u8::from(e % s > e / s)).collect();
        let mask = Tensor::from_vec(mask, (s, s), &b.dev)?;
        let forward_flops = 2.0 * (n * h_q * s * s * d) as f64;
        let (op, flops) = if backward { ("sdpa_bwd", 3.5 * forward_flops) } else { ("sdpa", forward_flops) };
        let case = Case {
            op,
            dtype: "bf16",
            dims: [s, s, d, n],
            layout: format!("h{h_q}:{h_kv}-causal"),
            work: Work::Flops(flops),
        };
        let mut ours = || {
            let (o, served) = gemmbridge_candle::sdpa_served(&q, &k, &v, true, None)?;
            Ok((with_grads(o, backward, [&q, &k, &v])?, served))
        };
        let candle = |dtype: DType| {
            let o = candle_attention(&q, &k, &v, &mask, dtype, !backward)?;
            with_grads(o, backward, [&q, &k, &v])
        };
        let mut f32_scores = || candle(DType::F32);
        let mut bf16_scores = || candle(DType::BF16);
        b.row(&case, &mut ours, &mut [("", &mut f32_scores), ("bf16_scores", &mut bf16_scores)])?;
    }
    Ok(())
}

/// `o` alone, or (with `backward`) `o` and the gradients of `inputs` from `o.backward()`.
fn with_grads(o: Tensor, backward: bool, inputs: [&Tensor; 3]) -> Result<Outputs> {
    if !backward {
        return Ok(vec![o]);
    }
    let grads = o.backward()?;
    let mut out = vec![o];
    for t in inputs {
        match grads.get(t) {
            Some(g) => out.push(g.clone()),
            None => candle_core::bail!("sdpa_bwd: the backward gave no gradient of an input"),
        }
    }
    Ok(out)
}

/// candle-transformers' `repeat_kv`: each key/value head repeated `g` times, next to itself.
fn repeat_kv(x: &Tensor, g: usize) -> Result<Tensor> {
    if g == 1 {
        return Ok(x.clone());
    }
    let (b, h, s, d) = x.dims4()?;
    Tensor::cat(&vec![x; g], 2)?.reshape((b, h * g, s, d))
}

/// candle's matmul-softmax attention as candle-transformers' Llama runs it, in `dtype` (f32
/// there): scores, the causal mask (`mask[i][j] = 1` where `j > i`) filled with −∞, the
/// softmax over the last dimension (candle-nn's fused `softmax_last_dim` where `fused`, else
/// its differentiable `softmax`), `·v`, back to q's dtype.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, dtype: DType, fused: bool) -> Result<Tensor> {
    let (h_q, h_kv, d) = (q.dims()[1], k.dims()[1], q.dims()[3]);
    let (q2, k2, v2) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);
    let (k2, v2) = (repeat_kv(&k2, h_q / h_kv)?, repeat_kv(&v2, h_q / h_kv)?);
    let att = (q2.matmul(&k2.t()?)? / (d as f64).sqrt())?;
    let neg = Tensor::new(f32::NEG_INFINITY, q.device())?.to_dtype(dtype)?.broadcast_as(att.shape())?;
    let att = mask.broadcast_as(att.shape())?.where_cond(&neg, &att)?;
    let att = if fused { candle_nn::ops::softmax_last_dim(&att)? } else { candle_nn::ops::softmax(&att, D::Minus1)? };
    att.matmul(&v2.contiguous()?)?.to_dtype(q.dtype())
}
