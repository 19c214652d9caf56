//! The RMSNorm operation graphs (the room's `mod.rs` says what they are and where the layout
//! comes from).

use super::NormOp;
use crate::cuda::dnn::builder::{Builder, Dt, Pw, Red, Scalar, Tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::norm::{GradType, NormTensor, RmsNorm};

/// Unique ids of the graphs' tensors in device memory (the variant pack names them).
pub(super) mod uid {
    pub const X: i64 = 1;
    pub const W: i64 = 2;
    pub const Y: i64 = 3;
    pub const INV_RMS: i64 = 4;
    pub const RESIDUAL: i64 = 5;
    pub const SUM: i64 = 6;
    pub const SCALE: i64 = 7;
    pub const AMAX: i64 = 8;
    pub const DY: i64 = 9;
    pub const DX: i64 = 10;
    pub const DW: i64 = 11;
}

const F32: Dt = Dt::CUDNN_DATA_FLOAT;

/// cuDNN's data type of `d`.
fn data_type(d: DType) -> Dt {
    match d {
        DType::BF16 => Dt::CUDNN_DATA_BFLOAT16,
        DType::F16 => Dt::CUDNN_DATA_HALF,
        _ => F32,
    }
}

fn i(v: usize) -> i64 {
    // RmsNorm::validate bounds every size and leading dimension by i32::MAX
    v as i64
}

/// Tensor `t` of the problem (uid `uid`, type `dtype`): `[N, C, 1, 1]`, strides
/// `{ld, 1, ld, ld}`.
fn rows(g: &mut Builder, p: &RmsNorm, t: NormTensor, uid: i64, dtype: Dt) -> Result<Tensor> {
    let ld = i(p.ld(t));
    g.io(uid, [i(p.rows), i(p.features), 1, 1], [ld, 1, ld, ld], dtype)
}

/// A per-feature tensor `[1, C, 1, 1]` (the scale and its gradient).
fn per_feature(g: &mut Builder, p: &RmsNorm, uid: i64, dtype: Dt) -> Result<Tensor> {
    let c = i(p.features);
    g.io(uid, [1, c, 1, 1], [c, 1, c, c], dtype)
}

/// The inverse RMS, f32 `[N, 1, 1, 1]`.
fn inv_rms(g: &mut Builder, p: &RmsNorm) -> Result<Tensor> {
    g.io(uid::INV_RMS, [i(p.rows), 1, 1, 1], [1; 4], F32)
}

/// The forward graph of `op` (a [`NormOp::Forward`]).
pub(super) fn forward(g: &mut Builder, p: &RmsNorm, op: NormOp) -> Result<()> {
    let NormOp::Forward { training, residual, fp8 } = op else { unreachable!("a forward direction") };
    let io = data_type(p.dtype);
    let mut x = rows(g, p, NormTensor::X, uid::X, io)?;
    if residual {
        let r = rows(g, p, NormTensor::Residual, uid::RESIDUAL, io)?;
        let sum = rows(g, p, NormTensor::Sum, uid::SUM, io)?;
        g.pointwise(Pw::CUDNN_POINTWISE_ADD, F32, &[x, r], sum, None)?;
        x = sum;
    }
    let w = per_feature(g, p, uid::W, io)?;
    let eps = g.scalar(Scalar::F32(p.eps))?;
    let stats = if training { Some(inv_rms(g, p)?) } else { None };
    if !fp8 {
        let y = rows(g, p, NormTensor::Y, uid::Y, io)?;
        return g.rms_norm([x, w, eps], y, stats);
    }
    // y kept in f32, scaled into E4M3; its absolute maximum (before the scale) reduced
    let c = i(p.features);
    let y = g.virt([i(p.rows), c, 1, 1], [c, 1, c, c], F32)?;
    g.rms_norm([x, w, eps], y, stats)?;
    let scale = g.io(uid::SCALE, [1; 4], [1; 4], F32)?;
    let y8 = rows(g, p, NormTensor::Y, uid::Y, Dt::CUDNN_DATA_FP8_E4M3)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, F32, &[y, scale], y8, None)?;
    let amax = g.io(uid::AMAX, [1; 4], [1; 4], F32)?;
    g.reduce(Red::CUDNN_REDUCE_TENSOR_AMAX, y, amax)
}

/// The backward graph: dx and dw (in f32 or the I/O type, as the problem says).
pub(super) fn backward(g: &mut Builder, p: &RmsNorm) -> Result<()> {
    let io = data_type(p.dtype);
    let x = rows(g, p, NormTensor::X, uid::X, io)?;
    let dy = rows(g, p, NormTensor::Dy, uid::DY, io)?;
    let w = per_feature(g, p, uid::W, io)?;
    let stats = inv_rms(g, p)?;
    let dx = rows(g, p, NormTensor::Dx, uid::DX, io)?;
    let dw_type = if p.dw == GradType::F32 { F32 } else { io };
    let dw = per_feature(g, p, uid::DW, dw_type)?;
    g.rms_norm_backward([x, dy, w, stats], [dx, dw])
}
