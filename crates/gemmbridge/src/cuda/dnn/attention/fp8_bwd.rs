//! The FP8 backward graph, in the operations and order of cudnn-frontend's composite FP8
//! backward node (`SDPA_fp8_backward`, per-tensor scaling): `D = rowsum(do∘o)` descaled by do's
//! and o's scales; the scores `q·kᵀ` times the attention scale and q's and k's descales, masked,
//! minus the statistics, exponentiated (P); P scaled into E4M3 for `dv = Pᵀ·do`;
//! `dS = (do·vᵀ·descale_do·descale_v − D)·P·scale`, its absolute maximum, then dS scaled into
//! do's format for `dq = dS·k` and `dk = dSᵀ·q`. Each of the three products is the frontend's
//! FP8 matmul: an f32 matmul (summed over the query heads of a key/value head where the
//! gradient has fewer heads), the two descales, then the output's scale into its FP8 tensor
//! and the output's absolute maximum taken before that scale.
//!
//! Every scale is a one-element f32 tensor in device memory (uids in `graphs::uid`); which
//! values they hold is the entry point's choice (`attention::fp8` documents the bounds).

use super::graphs::{i, lens, masks, operand_of, row_dims, uid, F32};
use crate::attention::{Attention, AttnTensor};
use crate::cuda::dnn::builder::{dense, Builder, Dt, Pw, Red, Tensor};
use crate::error::Result;
use crate::fp8::Fp8Format;

/// cuDNN's type of an FP8 format.
pub(super) fn fp8_type(f: Fp8Format) -> Dt {
    match f {
        Fp8Format::E4M3 => Dt::CUDNN_DATA_FP8_E4M3,
        Fp8Format::E5M2 => Dt::CUDNN_DATA_FP8_E5M2,
    }
}

/// The FP8 backward graph; `grad` is the format of do, dS and the gradients.
pub(super) fn backward(g: &mut Builder, p: &Attention, grad: Fp8Format) -> Result<()> {
    let (e4m3, gt) = (Dt::CUDNN_DATA_FP8_E4M3, fp8_type(grad));
    let q = operand_of(g, p, AttnTensor::Q, uid::Q, false, e4m3)?;
    let kt = operand_of(g, p, AttnTensor::K, uid::K, true, e4m3)?;
    let vt = operand_of(g, p, AttnTensor::V, uid::V, true, e4m3)?;
    let o = operand_of(g, p, AttnTensor::O, uid::O, false, e4m3)?;
    let d_o = operand_of(g, p, AttnTensor::O, uid::DO, false, gt)?;
    let dq = operand_of(g, p, AttnTensor::Q, uid::DQ, false, gt)?;
    let dk = operand_of(g, p, AttnTensor::K, uid::DK, false, gt)?;
    let dv = operand_of(g, p, AttnTensor::V, uid::DV, false, gt)?;
    let rows = row_dims(p);
    let stats = g.io(uid::STATS, rows, dense(rows), F32)?;
    let one = [1i64; 4];
    let mut sc = |id: i64| g.io(id, one, one, F32);
    let (ds_q, ds_k, ds_v) = (sc(uid::DESCALE_Q)?, sc(uid::DESCALE_K)?, sc(uid::DESCALE_V)?);
    let (ds_o, ds_do) = (sc(uid::DESCALE_O)?, sc(uid::DESCALE_DO)?);
    let (scale_s, descale_s) = (sc(uid::SCALE_S)?, sc(uid::DESCALE_S)?);
    let (scale_dp, descale_dp) = (sc(uid::SCALE_DP)?, sc(uid::DESCALE_DP)?);
    let (scale_dq, scale_dk, scale_dv) = (sc(uid::SCALE_DQ)?, sc(uid::SCALE_DK)?, sc(uid::SCALE_DV)?);
    let amax = [sc(uid::AMAX_DQ)?, sc(uid::AMAX_DK)?, sc(uid::AMAX_DV)?, sc(uid::AMAX_DP)?];
    let lens = if p.var_len { Some(lens(g, p)?) } else { None };
    let (lq, lkv) = (lens.map(|l| l.q), lens.map(|l| l.kv));
    let (b, hq, sq, skv) = (i(p.b), i(p.h_q), i(p.s_q), i(p.s_kv));

    // D = rowsum(do∘o)·descale_do·descale_o
    let prod = g.f32(Pw::CUDNN_POINTWISE_MUL, &[d_o, o])?;
    let red = g.virt(rows, dense(rows), F32)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, prod, red)?;
    let red = g.f32(Pw::CUDNN_POINTWISE_MUL, &[red, ds_do])?;
    let sum = g.f32(Pw::CUDNN_POINTWISE_MUL, &[red, ds_o])?;

    // P = exp(mask(scale·q·kᵀ·descale_q·descale_k) − lse); dv = (P·scale_s)ᵀ·do
    let sd = [b, hq, sq, skv];
    let s = g.virt(sd, dense(sd), F32)?;
    g.matmul(q, kt, s, [lq, lkv, None])?;
    let attn_scale = g.scalar(crate::cuda::dnn::builder::Scalar::F32(p.scale))?;
    let s = g.f32(Pw::CUDNN_POINTWISE_MUL, &[s, attn_scale])?;
    let s = g.f32(Pw::CUDNN_POINTWISE_MUL, &[s, ds_q])?;
    let s = g.f32(Pw::CUDNN_POINTWISE_MUL, &[s, ds_k])?;
    let s = masks(g, p, s, lens)?;
    let s = g.f32(Pw::CUDNN_POINTWISE_SUB, &[s, stats])?;
    let exp_s = g.f32(Pw::CUDNN_POINTWISE_EXP, &[s])?;
    let p8 = g.virt(sd, dense(sd), e4m3)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[exp_s, scale_s], p8, None)?;
    let (td, ts) = ([b, hq, skv, sq], [hq * sq * skv, sq * skv, 1, skv]);
    let pt = g.virt(td, ts, e4m3)?;
    g.reshape(p8, pt)?;
    matmul_fp8(g, (pt, d_o), (descale_s, ds_do, scale_dv), (dv, amax[2]), [lkv, None, lq])?;

    // dS = (do·vᵀ·descale_do·descale_v − D)·P·scale, its amax, scaled into do's format
    let dp = g.virt(sd, dense(sd), F32)?;
    g.matmul(d_o, vt, dp, [lq, lkv, None])?;
    let dp = g.f32(Pw::CUDNN_POINTWISE_MUL, &[dp, ds_do])?;
    let dp = g.f32(Pw::CUDNN_POINTWISE_MUL, &[dp, ds_v])?;
    let dp = g.f32(Pw::CUDNN_POINTWISE_SUB, &[dp, sum])?;
    let dp = g.f32(Pw::CUDNN_POINTWISE_MUL, &[dp, exp_s])?;
    let dp = g.f32(Pw::CUDNN_POINTWISE_MUL, &[dp, attn_scale])?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_AMAX, dp, amax[3])?;
    let ds8 = g.virt(sd, dense(sd), gt)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[dp, scale_dp], ds8, None)?;

    // dq = dS·k; dk = dSᵀ·q
    let k = g.virt(
        [kt.dims[0], kt.dims[1], kt.dims[3], kt.dims[2]],
        [kt.strides[0], kt.strides[1], kt.strides[3], kt.strides[2]],
        e4m3,
    )?;
    g.reshape(kt, k)?;
    matmul_fp8(g, (ds8, k), (descale_dp, ds_k, scale_dq), (dq, amax[0]), [lq, None, lkv])?;
    let dst = g.virt(td, ts, gt)?;
    g.reshape(ds8, dst)?;
    matmul_fp8(g, (dst, q), (descale_dp, ds_q, scale_dk), (dk, amax[1]), [lkv, None, lq])
}

/// cudnn-frontend's FP8 matmul: `c = fp8(Σ(a·b)·descale_a·descale_b·scale_c)` (the sum over a's
/// heads per c head where c has fewer), `amax = max|Σ(a·b)·descale_a·descale_b|`.
fn matmul_fp8(
    g: &mut Builder,
    (a, b): (Tensor, Tensor),
    (descale_a, descale_b, scale_c): (Tensor, Tensor, Tensor),
    (c, amax): (Tensor, Tensor),
    ov: [Option<Tensor>; 3],
) -> Result<()> {
    let full = [a.dims[0], a.dims[1], a.dims[2], b.dims[3]];
    let mut x = g.virt(full, dense(full), F32)?;
    g.matmul(a, b, x, ov)?;
    if c.dims[1] != full[1] {
        let summed = g.virt(c.dims, dense(c.dims), F32)?;
        g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, x, summed)?;
        x = summed;
    }
    let x = g.f32(Pw::CUDNN_POINTWISE_MUL, &[x, descale_a])?;
    let x = g.f32(Pw::CUDNN_POINTWISE_MUL, &[x, descale_b])?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[x, scale_c], c, None)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_AMAX, x, amax)
}
