//! The FP8 forward graph, cuDNN's FP8 scaled-dot-product-attention pattern (cuDNN's developer
//! guide, "Scaled Dot Product Attention FP8"; the composite graph cudnn-frontend builds): E4M3
//! q, k, v with their dequantisation scales as f32 tensors in device memory, the scores
//! descaled after the attention scale, the softmax in f32 with its statistics, P scaled into
//! E4M3, the second matmul in FP8 with the P and v descales, and o in E4M3 with its scale and
//! absolute maximum. The pattern's absolute maximum of P (an output that feeds a
//! delayed-scaling recipe's next scale of P) is left out, as P's scale here is fixed (below):
//! without that reduction the forward measured 1–3 % faster on the H200 (cuDNN 9.19). o's
//! absolute maximum stays: without it no engine of cuDNN 9.19 takes the graph. On Hopper cuDNN's FP8 engines write o only in FP8
//! (an f16/bf16 o from FP8 inputs is a Blackwell engine: the frontend's support surface says
//! so).
//!
//! The scales, fixed so that no value can overflow and no host value is needed: P ≤ 1 is stored
//! as `fp8(P·448)` ([`P_SCALE`]); o, a convex combination of v's rows (Σ P = 1), is bounded by v's
//! largest value, so the graph's "descale v" is the constant [`O_FACTOR`] and o is stored in
//! units of v's FP8 values: `o = fp8(P₈·v₈/448 · O_FACTOR) · (v's scale / O_FACTOR)`. The stored
//! probabilities may sum past 1: each normal E4M3 value is at most 1/16 high, and one in E4M3's
//! subnormal range (P·448 < 2⁻⁶) up to 2⁻¹⁰ high in absolute terms, so Σ P₈/448 ≤ 1 + 1/16 +
//! s_kv·2⁻¹⁰/448 — below 1/O_FACTOR = 2 while s_kv ≤ [`MAX_KEYS`], the limit the entry point
//! enforces. Where P·448 falls into the subnormal range (rows spread evenly over tens of
//! thousands of keys) the stored probabilities lose precision, as the CPU emulation shows. The
//! output's dequantisation scale is `v's scale / O_FACTOR`, made on the device by the entry
//! point.

use super::graphs::{i, lens, operand_of, scores, softmax, uid, F32};
use crate::attention::{Attention, AttnTensor};
use crate::cuda::dnn::builder::{dense, Builder, Dt, Pw, Red};
use crate::error::Result;

/// The scale P is stored in E4M3 with: P ≤ 1, so 448 (E4M3's largest finite value) uses the
/// format's whole range.
pub(crate) const P_SCALE: f32 = 448.0;

/// The graph's constant "descale v" (see the module documentation): ½ leaves o room for P's
/// rounding (the stored probabilities may sum past 1).
pub(crate) const O_FACTOR: f32 = 0.5;

/// The most keys per row the FP8 forward takes: Σ P₈/448 ≤ 1 + 1/16 + s_kv·2⁻¹⁰/448 stays below
/// 1/[`O_FACTOR`] = 2 up to about 430 000 keys (module documentation).
pub const MAX_KEYS: usize = 400_000;

/// The FP8 forward graph; with `stats` the statistics are a tensor in memory.
pub(super) fn forward(g: &mut Builder, p: &Attention, stats: bool) -> Result<()> {
    let e4m3 = Dt::CUDNN_DATA_FP8_E4M3;
    let q = operand_of(g, p, AttnTensor::Q, uid::Q, false, e4m3)?;
    let kt = operand_of(g, p, AttnTensor::K, uid::K, true, e4m3)?;
    let v = operand_of(g, p, AttnTensor::V, uid::V, false, e4m3)?;
    let o = operand_of(g, p, AttnTensor::O, uid::O, false, e4m3)?;
    let one = [1i64; 4];
    let mut scalar = |id: i64| g.io(id, one, one, F32);
    let (dq, dk, dv) = (scalar(uid::DESCALE_Q)?, scalar(uid::DESCALE_K)?, scalar(uid::DESCALE_V)?);
    let (scale_s, descale_s, scale_o) = (scalar(uid::SCALE_S)?, scalar(uid::DESCALE_S)?, scalar(uid::SCALE_O)?);
    let amax_o = scalar(uid::AMAX_O)?;
    let lens = if p.var_len { Some(lens(g, p)?) } else { None };
    let (s, _) = scores(g, p, (q, kt), lens, None, &[dq, dk])?;
    let (e, sum) = softmax(g, p, s, stats)?;
    let probs = g.f32(Pw::CUDNN_POINTWISE_DIV, &[e, sum])?;
    let p8 = g.virt(probs.dims, probs.strides, e4m3)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[probs, scale_s], p8, None)?;
    let od = [i(p.b), i(p.h_q), i(p.s_q), i(p.d)];
    let acc = g.virt(od, dense(od), F32)?;
    g.matmul(p8, v, acc, [lens.map(|l| l.q), None, lens.map(|l| l.kv)])?;
    let x = g.f32(Pw::CUDNN_POINTWISE_MUL, &[acc, descale_s])?;
    let x = g.f32(Pw::CUDNN_POINTWISE_MUL, &[x, dv])?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[x, scale_o], o, None)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_AMAX, x, amax_o)
}
