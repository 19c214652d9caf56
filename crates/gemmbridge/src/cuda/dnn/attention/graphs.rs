//! The operation graphs of scaled-dot-product attention in cuDNN's documented pattern, the one
//! its fused flash-attention engines recognise (cuDNN's developer guide, "Scaled Dot Product
//! Attention"; the same pattern cudnn-frontend's composite SDPA node lowers to, which is what
//! PyTorch's cuDNN backend runs): matmul, scale, masks as index comparisons and selects,
//! softmax as reductions and pointwise operations with the statistics, matmul — every
//! intermediate virtual.
//!
//! Logical shapes as cuDNN takes them: `q[b, h_q, s_q, d]`, `kᵀ[b, h_kv, d, s_kv]` (k's own
//! strides, the last two swapped), `v[b, h_kv, s_kv, d]` (backward: `vᵀ`), `o[b, h_q, s_q, d]`,
//! statistics `[b, h_q, s_q, 1]` f32 dense, lengths `[b, 1, 1, 1]` int32.

use crate::attention::{Attention, AttnMask, AttnTensor};
use crate::cuda::dnn::builder::{dense, Builder, Dims, Dt, Pw, Red, Scalar, Tensor};
use crate::dtype::DType;
use crate::error::Result;

/// Unique ids of the graphs' tensors in device memory (the variant pack names them).
pub(crate) mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const DO: i64 = 6;
    pub const DQ: i64 = 7;
    pub const DK: i64 = 8;
    pub const DV: i64 = 9;
    pub const LEN_Q: i64 = 10;
    pub const LEN_KV: i64 = 11;
    /// Backward: `Σ_e do·o` per query row, f32 `[b, h_q, s_q, 1]`, in the workspace.
    pub const SOFTMAX_SUM: i64 = 12;
    /// Backward: dq accumulated in f32 `[b, h_q, s_q, d]`, in the workspace.
    pub const DQ_ACCUM: i64 = 13;
    /// Paged decode: the page tables through which the key and the value containers are read
    /// (one device table, named twice, as cudnn-frontend's paged SDPA names a table per cache).
    pub const PAGE_TABLE_K: i64 = 14;
    pub const PAGE_TABLE_V: i64 = 15;
    /// FP8: the dequantisation scales of q, k, v (f32 `[1, 1, 1, 1]`, the quantisation's).
    pub const DESCALE_Q: i64 = 20;
    pub const DESCALE_K: i64 = 21;
    pub const DESCALE_V: i64 = 22;
    /// FP8: P's scale into E4M3 and its inverse, o's scale (f32, in the workspace).
    pub const SCALE_S: i64 = 23;
    pub const DESCALE_S: i64 = 24;
    pub const SCALE_O: i64 = 25;
    /// FP8: the largest |o| (f32, in the workspace; not read).
    pub const AMAX_O: i64 = 27;
    /// FP8 backward: the dequantisation scales of o and do (the tensors' own).
    pub const DESCALE_O: i64 = 28;
    pub const DESCALE_DO: i64 = 29;
    /// FP8 backward: dS's scale and inverse, the gradients' scales, and the four absolute
    /// maxima (f32, in the call's scratch; the maxima not read).
    pub const SCALE_DP: i64 = 30;
    pub const DESCALE_DP: i64 = 31;
    pub const SCALE_DQ: i64 = 32;
    pub const SCALE_DK: i64 = 33;
    pub const SCALE_DV: i64 = 34;
    pub const AMAX_DQ: i64 = 35;
    pub const AMAX_DK: i64 = 36;
    pub const AMAX_DV: i64 = 37;
    pub const AMAX_DP: i64 = 38;
}

pub(super) const F32: Dt = Dt::CUDNN_DATA_FLOAT;
const I32: Dt = Dt::CUDNN_DATA_INT32;
const BOOL: Dt = Dt::CUDNN_DATA_BOOLEAN;

/// cuDNN's data type of the problem's tensors.
pub(super) fn io_type(p: &Attention) -> Dt {
    match p.dtype {
        DType::BF16 => Dt::CUDNN_DATA_BFLOAT16,
        _ => Dt::CUDNN_DATA_HALF,
    }
}

pub(super) fn i(v: usize) -> i64 {
    // Attention::validate bounds every size and stride by i32::MAX
    v as i64
}

/// Tensor `t` of the problem (uid `uid`), as `[b, h, s, d]` or (`transposed`) `[b, h, d, s]`,
/// of the problem's type.
pub(super) fn operand(g: &mut Builder, p: &Attention, t: AttnTensor, uid: i64, transposed: bool) -> Result<Tensor> {
    operand_of(g, p, t, uid, transposed, io_type(p))
}

/// [`operand`] of type `dtype`.
pub(super) fn operand_of(
    g: &mut Builder,
    p: &Attention,
    t: AttnTensor,
    uid: i64,
    transposed: bool,
    dtype: Dt,
) -> Result<Tensor> {
    let ([b, h, s], l, d) = (p.dims(t), p.layout(t), p.d);
    let (dims, strides) = if transposed {
        ([i(b), i(h), i(d), i(s)], [i(l.batch), i(l.head), 1, i(l.seq)])
    } else {
        ([i(b), i(h), i(s), i(d)], [i(l.batch), i(l.head), i(l.seq), 1])
    };
    g.io(uid, dims, strides, dtype)
}

/// The per-sequence lengths, `[b, 1, 1, 1]` int32 each.
#[derive(Clone, Copy)]
pub(super) struct Lens {
    pub q: Tensor,
    pub kv: Tensor,
}

pub(super) fn lens(g: &mut Builder, p: &Attention) -> Result<Lens> {
    let dims = [i(p.b), 1, 1, 1];
    Ok(Lens { q: g.io(uid::LEN_Q, dims, [1; 4], I32)?, kv: g.io(uid::LEN_KV, dims, [1; 4], I32)? })
}

/// The scores `[b, h_q, s_q, s_kv]` (f32, virtual).
fn scores_dims(p: &Attention) -> Dims {
    [i(p.b), i(p.h_q), i(p.s_q), i(p.s_kv)]
}

/// Per-row values `[b, h_q, s_q, 1]`.
pub(super) fn row_dims(p: &Attention) -> Dims {
    [i(p.b), i(p.h_q), i(p.s_q), 1]
}

/// The masks on the scores `s`: the padding mask where there are lengths (rows and columns
/// past them), then the causal mask of `p`; masked scores become f32's lowest value.
pub(super) fn masks(g: &mut Builder, p: &Attention, s: Tensor, lens: Option<Lens>) -> Result<Tensor> {
    let mut s = s;
    if let Some(l) = lens {
        let row = g.index(s, 2, I32)?;
        let col = g.index(s, 3, I32)?;
        let row_in = g.pw(Pw::CUDNN_POINTWISE_CMP_LT, BOOL, &[row, l.q], BOOL)?;
        let col_in = g.pw(Pw::CUDNN_POINTWISE_CMP_LT, BOOL, &[col, l.kv], BOOL)?;
        let keep = g.pw(Pw::CUDNN_POINTWISE_LOGICAL_AND, BOOL, &[row_in, col_in], BOOL)?;
        let lowest = g.scalar(Scalar::F32(f32::MIN))?;
        s = g.pw(Pw::CUDNN_POINTWISE_BINARY_SELECT, F32, &[s, lowest, keep], F32)?;
    }
    if p.mask == AttnMask::None {
        return Ok(s);
    }
    let mut row = g.index(s, 2, F32)?;
    let col = g.index(s, 3, F32)?;
    if p.mask == AttnMask::CausalBottomRight {
        // row + len_kv − len_q ≥ col: the diagonal ends at the bottom right
        let kv = match lens {
            Some(l) => l.kv,
            None => g.scalar(Scalar::I32(p.s_kv as i32))?,
        };
        row = g.pw(Pw::CUDNN_POINTWISE_ADD, I32, &[row, kv], I32)?;
        let q = match lens {
            Some(l) => l.q,
            None => g.scalar(Scalar::I32(p.s_q as i32))?,
        };
        row = g.pw(Pw::CUDNN_POINTWISE_SUB, I32, &[row, q], I32)?;
    }
    let keep = g.pw(Pw::CUDNN_POINTWISE_CMP_GE, BOOL, &[row, col], BOOL)?;
    let lowest = g.scalar(Scalar::F32(f32::MIN))?;
    g.pw(Pw::CUDNN_POINTWISE_BINARY_SELECT, F32, &[s, lowest, keep], F32)
}

/// The scaled, masked scores `scale·q·kᵀ` (f32, virtual), multiplied by the `descales` (FP8:
/// q's and k's dequantisation scales) after the scale; the backward subtracts the statistics
/// `stats` before masking, as cuDNN's backward pattern has it. Returns the scores and the
/// scale's tensor.
pub(super) fn scores(
    g: &mut Builder,
    p: &Attention,
    (q, kt): (Tensor, Tensor),
    lens: Option<Lens>,
    stats: Option<Tensor>,
    descales: &[Tensor],
) -> Result<(Tensor, Tensor)> {
    let dims = scores_dims(p);
    let s = g.virt(dims, dense(dims), F32)?;
    g.matmul(q, kt, s, [lens.map(|l| l.q), lens.map(|l| l.kv), None])?;
    let scale = g.scalar(Scalar::F32(p.scale))?;
    let mut s = g.f32(Pw::CUDNN_POINTWISE_MUL, &[s, scale])?;
    for &d in descales {
        s = g.f32(Pw::CUDNN_POINTWISE_MUL, &[s, d])?;
    }
    if let Some(st) = stats {
        s = g.f32(Pw::CUDNN_POINTWISE_SUB, &[s, st])?;
    }
    Ok((masks(g, p, s, lens)?, scale))
}

/// The softmax of the scores `s` with its statistics (the lse in memory with `stats`, else
/// virtual): max, `e = exp(s − max)`, `sum = Σ e`, `lse = max + ln(sum)`; returns `(e, sum)`,
/// whose quotient is P.
pub(super) fn softmax(g: &mut Builder, p: &Attention, s: Tensor, stats: bool) -> Result<(Tensor, Tensor)> {
    let rows = row_dims(p);
    let max = g.virt(rows, dense(rows), F32)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_MAX, s, max)?;
    let shifted = g.f32(Pw::CUDNN_POINTWISE_SUB, &[s, max])?;
    let e = g.f32(Pw::CUDNN_POINTWISE_EXP, &[shifted])?;
    let sum = g.virt(rows, dense(rows), F32)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
    let log = g.f32(Pw::CUDNN_POINTWISE_LOG, &[sum])?;
    let lse = if stats { g.io(uid::STATS, rows, dense(rows), F32)? } else { g.virt(rows, dense(rows), F32)? };
    g.pointwise(Pw::CUDNN_POINTWISE_ADD, F32, &[max, log], lse, None)?;
    Ok((e, sum))
}

/// The forward graph: `o` (and, with `stats`, the statistics `lse` as a tensor in memory;
/// otherwise virtual); `var_len` adds the lengths.
pub(super) fn forward(g: &mut Builder, p: &Attention, stats: bool) -> Result<()> {
    let q = operand(g, p, AttnTensor::Q, uid::Q, false)?;
    let kt = operand(g, p, AttnTensor::K, uid::K, true)?;
    let v = operand(g, p, AttnTensor::V, uid::V, false)?;
    let o = operand(g, p, AttnTensor::O, uid::O, false)?;
    let lens = if p.var_len { Some(lens(g, p)?) } else { None };
    attend(g, p, [q, kt, v, o], lens, stats)
}

/// The forward from `q`, `kᵀ`, `v` into `o` (whichever operations produced them): the masked
/// scores, the softmax with its statistics, the product with `v`.
pub(super) fn attend(
    g: &mut Builder,
    p: &Attention,
    [q, kt, v, o]: [Tensor; 4],
    lens: Option<Lens>,
    stats: bool,
) -> Result<()> {
    let (s, _) = scores(g, p, (q, kt), lens, None, &[])?;
    let (e, sum) = softmax(g, p, s, stats)?;
    let probs = g.virt(s.dims, s.strides, io_type(p))?;
    g.pointwise(Pw::CUDNN_POINTWISE_DIV, F32, &[e, sum], probs, None)?;
    g.matmul(probs, v, o, [lens.map(|l| l.q), None, lens.map(|l| l.kv)])
}

/// The backward graph: `dq`, `dk`, `dv` from q, k, v, o, `do` and the statistics, with
/// `lens` (per-sequence lengths, or the full extents where cuDNN needs a padding mask) and
/// f32 `softmax_sum` and `dq` accumulator tensors in the workspace.
pub(super) fn backward(g: &mut Builder, p: &Attention, with_lens: bool) -> Result<()> {
    let ty = io_type(p);
    let q = operand(g, p, AttnTensor::Q, uid::Q, false)?;
    let kt = operand(g, p, AttnTensor::K, uid::K, true)?;
    let vt = operand(g, p, AttnTensor::V, uid::V, true)?;
    let o = operand(g, p, AttnTensor::O, uid::O, false)?;
    let d_o = operand(g, p, AttnTensor::O, uid::DO, false)?;
    let dq = operand(g, p, AttnTensor::Q, uid::DQ, false)?;
    let dk = operand(g, p, AttnTensor::K, uid::DK, false)?;
    let dv = operand(g, p, AttnTensor::V, uid::DV, false)?;
    let rows = row_dims(p);
    let stats = g.io(uid::STATS, rows, dense(rows), F32)?;
    let lens = if with_lens { Some(lens(g, p)?) } else { None };
    let (lq, lkv) = (lens.map(|l| l.q), lens.map(|l| l.kv));
    let (b, hq, sq, skv, d) = (i(p.b), i(p.h_q), i(p.s_q), i(p.s_kv), i(p.d));

    // D = Σ_e do·o per row, kept in the workspace
    let prod = g.virt([b, hq, sq, d], [hq * sq * d, sq * d, hq * d, 1], F32)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[d_o, o], prod, None)?;
    let red = g.virt(rows, dense(rows), F32)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, prod, red)?;
    let one = g.scalar(Scalar::F32(1.0))?;
    let softmax_sum = g.io(uid::SOFTMAX_SUM, rows, dense(rows), F32)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[red, one], softmax_sum, None)?;

    // P = exp(scale·q·kᵀ − lse), masked; dv = Pᵀ·do (summed over a key/value head's queries)
    let (s, scale) = scores(g, p, (q, kt), lens, Some(stats), &[])?;
    let probs = g.f32(Pw::CUDNN_POINTWISE_EXP, &[s])?;
    let transposed = [b, hq, skv, sq];
    let t_strides = [hq * sq * skv, sq * skv, 1, skv];
    let pt = g.virt(transposed, t_strides, ty)?;
    g.reshape(probs, pt)?;
    grad_kv(g, p, pt, d_o, dv, [lkv, None, lq])?;

    // dS = P ∘ (do·vᵀ − D) · scale; dk = dSᵀ·q; dq = dS·k (accumulated in f32)
    let dims = scores_dims(p);
    let dp = g.virt(dims, dense(dims), F32)?;
    g.matmul(d_o, vt, dp, [lq, lkv, None])?;
    let centred = g.f32(Pw::CUDNN_POINTWISE_SUB, &[dp, softmax_sum])?;
    let weighted = g.f32(Pw::CUDNN_POINTWISE_MUL, &[centred, probs])?;
    let ds = g.f32(Pw::CUDNN_POINTWISE_MUL, &[weighted, scale])?;
    let dst = g.virt(transposed, t_strides, ty)?;
    g.reshape(ds, dst)?;
    grad_kv(g, p, dst, q, dk, [lkv, None, lq])?;
    let k = g.virt(
        [kt.dims[0], kt.dims[1], kt.dims[3], kt.dims[2]],
        [kt.strides[0], kt.strides[1], kt.strides[3], kt.strides[2]],
        F32,
    )?;
    g.reshape(kt, k)?;
    let accum = g.io(uid::DQ_ACCUM, [b, hq, sq, d], dense([b, hq, sq, d]), F32)?;
    g.matmul(ds, k, accum, [lq, None, lkv])?;
    g.pointwise(Pw::CUDNN_POINTWISE_IDENTITY, F32, &[accum], dq, None)
}

/// `out = aᵀ · b` into a key/value-shaped gradient: directly with one query head per
/// key/value head, else into all query heads and summed over each group (GQA).
fn grad_kv(g: &mut Builder, p: &Attention, a: Tensor, b: Tensor, out: Tensor, ov: [Option<Tensor>; 3]) -> Result<()> {
    if p.h_q == p.h_kv {
        return g.matmul(a, b, out, ov);
    }
    let full = [i(p.b), i(p.h_q), i(p.s_kv), i(p.d)];
    let per_head = g.virt(full, dense(full), io_type(p))?;
    g.matmul(a, b, per_head, ov)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, per_head, out)
}
