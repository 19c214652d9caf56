//! The float64 pieces of the layer's reference, each the crate's own reference of the problem
//! the layer runs ([`DecoderLayer::gemms`], [`DecoderLayer::norm_problem`],
//! [`DecoderLayer::rope_problem`], [`DecoderLayer::attention`],
//! [`DecoderLayer::swiglu_problem`]): the GEMMs by [`crate::reference::gemm_rowmajor`], RMSNorm
//! by [`crate::norm::reference`], RoPE and SwiGLU by [`crate::layer_ops::reference`], the causal
//! attention over the fused `qkv` by [`crate::attention::reference`]. So the reference, the CPU
//! layer and the GPU layer follow one description of the step: the same problem values.

use super::{DecoderLayer, Tokens};
use crate::attention::{reference as attn_ref, Attention, AttnTensor};
use crate::layer_ops::{reference as ops_ref, Positions, RopeDirection};
use crate::norm::{reference as norm_ref, GradType};
use crate::problem::GemmProblem;

/// `C = op(A)·op(B)` of `p` (row-major, contiguous C `[m, n]`), in float64.
pub(super) fn product(p: &GemmProblem, a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut c = vec![0.0; p.m() * p.n()];
    crate::reference::gemm_rowmajor(p, 1.0, a, b, 0.0, &mut c);
    c
}

/// The tokens of `x[rows, d]` as one sequence each (the norm and SwiGLU problems read only
/// the count).
pub(super) fn rows(l: &DecoderLayer, x: &[f64]) -> Tokens {
    Tokens { b: x.len() / l.d_model, s: 1 }
}

/// RMSNorm of `x[T, d]` with weight `g[d]`: `(h, inv_rms)`.
pub(super) fn rms_norm(l: &DecoderLayer, x: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let f = norm_ref::forward(&l.norm_problem(rows(l, x), GradType::Io), x, g);
    (f.y, f.inv_rms)
}

/// RMSNorm's backward from `dh[T, d]`: `(dx, dg)`.
pub(super) fn rms_norm_backward(l: &DecoderLayer, x: &[f64], g: &[f64], dh: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let b = norm_ref::backward(&l.norm_problem(rows(l, x), GradType::Io), x, g, dh);
    (b.dx, b.dw)
}

/// RoPE on the fused `qkv[T, w]` of `t` tokens at `positions` (`Backward`: the transpose).
pub(super) fn rope(
    l: &DecoderLayer,
    t: Tokens,
    qkv: &[f64],
    positions: &Positions<&[i32]>,
    direction: RopeDirection,
) -> Vec<f64> {
    ops_ref::rope(&l.rope_problem(t), direction, qkv, positions, None)
}

/// `act = silu(gate)∘up` of `gu[T, 2·ffn]`, `[T, ffn]`.
pub(super) fn swiglu(l: &DecoderLayer, gu: &[f64]) -> Vec<f64> {
    let t = Tokens { b: gu.len() / (2 * l.ffn), s: 1 };
    ops_ref::swiglu(&l.swiglu_problem(t), gu)
}

/// SwiGLU's backward from `da[T, ffn]`: `dgu[T, 2·ffn]`, gate columns first.
pub(super) fn swiglu_backward(l: &DecoderLayer, da: &[f64], gu: &[f64]) -> Vec<f64> {
    let f = l.ffn;
    let t = Tokens { b: gu.len() / (2 * f), s: 1 };
    let (dg, du) = ops_ref::swiglu_backward(&l.swiglu_problem(t), da, gu);
    let mut dgu = vec![0.0; gu.len()];
    for (r, row) in dgu.chunks_exact_mut(2 * f).enumerate() {
        row[..f].copy_from_slice(&dg[r * f..(r + 1) * f]);
        row[f..].copy_from_slice(&du[r * f..(r + 1) * f]);
    }
    dgu
}

/// q, k and v of `p` read in place from the fused `qkv` (each view from its
/// [`DecoderLayer::qkv_offsets`] entry, as long as `p` addresses).
fn views<'a>(l: &DecoderLayer, p: &Attention, qkv: &'a [f64]) -> [&'a [f64]; 3] {
    let offs = l.qkv_offsets();
    [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| &qkv[offs[t as usize]..][..p.required_elems(t)])
}

/// The layer's causal attention over the fused `qkv[T, w]` of `t` tokens: `o[T, h_q·hd]` and
/// `lse[b, h_q, s]`.
pub(super) fn attention(l: &DecoderLayer, t: Tokens, qkv: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let p = l.attention(t);
    let [q, k, v] = views(l, &p, qkv);
    let f = attn_ref::forward(&p, q, k, v, None);
    (f.o, f.lse)
}

/// Attention's backward from `d_o[T, h_q·hd]`: `dq`, `dk`, `dv` in one fused `dqkv[T, w]`
/// laid out as `qkv` (`dk`, `dv` summed over the query heads sharing them).
pub(super) fn attention_backward(
    l: &DecoderLayer,
    t: Tokens,
    qkv: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
) -> Vec<f64> {
    let p = l.attention(t);
    let g = attn_ref::backward(&p, views(l, &p, qkv).into(), o, d_o, lse, None);
    let mut dqkv = vec![0.0; qkv.len()];
    for (off, grad) in l.qkv_offsets().into_iter().zip([g.dq, g.dk, g.dv]) {
        // each gradient holds zeros outside its own columns: the bands add without overlap
        dqkv[off..][..grad.len()].iter_mut().zip(&grad).for_each(|(d, x)| *d += x);
    }
    dqkv
}
