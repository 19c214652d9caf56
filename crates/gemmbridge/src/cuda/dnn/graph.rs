//! cuDNN's graph (backend) API for the convolutions, the path PyTorch takes (through
//! cudnn-frontend): the operation graph of one problem and direction — the convolution, and for
//! the fused forward a bias ADD and a RELU_FWD on virtual f32 intermediates — and the unique
//! ids the variant pack names its tensors by. The rest of the API: `graph_desc.rs` (the backend
//! descriptor), `graph_search.rs` (cuDNN's ranked engine configurations, the choice among them
//! and the execution plan finalized for it), `graph_plan.rs` (the plan kept per problem and its
//! launch).

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::graph_desc::Desc;
use super::sys::types;
use super::{ConvBuffers, ConvOp};
use crate::conv::{Conv2d, ConvActivation, ConvLayout};
use crate::error::Result;

/// Unique ids of the graph's tensors (the variant pack names them).
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;
const BIAS: i64 = 4;
const CONV_OUT: i64 = 5;
const BIASED: i64 = 6;

/// A tensor of logical dims `[N, C, H, W]` (filters `[K, C/groups, R, S]`) in `layout`.
fn tensor(uid: i64, dtype: raw::cudnnDataType_t, dims: [usize; 4], layout: ConvLayout, align: i64) -> Result<Desc> {
    let i = |v: [usize; 4]| v.map(|x| x as i64);
    let virt = uid == CONV_OUT || uid == BIASED;
    // SAFETY: DATA_TYPE reads cudnnDataType_t, BOOLEAN a C bool.
    unsafe {
        Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_TENSOR_DATA_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[dtype])?
            .i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &i(dims))?
            .i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &i(layout.strides(dims)))?
            .i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?
            .i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[align])?
            .set(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, T::CUDNN_TYPE_BOOLEAN, &[virt])?
            .finalize(|| format!("tensor {uid} dims {dims:?} {layout}"))
    }
}

/// A pointwise operation `out = mode(x[, b])` in f32: the operation and its pointwise
/// descriptor.
fn pointwise(mode: raw::cudnnPointwiseMode_t, x: &Desc, b: Option<&Desc>, out: &Desc) -> Result<[Desc; 2]> {
    let f32_ = raw::cudnnDataType_t::CUDNN_DATA_FLOAT;
    // SAFETY: POINTWISE_MODE reads the enum, MATH_PREC a cudnnDataType_t.
    let pw = unsafe {
        Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_POINTWISE_MODE, T::CUDNN_TYPE_POINTWISE_MODE, &[mode])?
            .set(A::CUDNN_ATTR_POINTWISE_MATH_PREC, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
            .finalize(|| format!("pointwise {mode:?}"))?
    };
    let mut op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
    if let Some(b) = b {
        op = op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    let op =
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[out])?.finalize(|| format!("pointwise op {mode:?}"))?;
    Ok([op, pw])
}

/// The largest power of two ≤ 16 that divides every address (cuDNN's BYTE_ALIGNMENT; part of
/// the plan key, as PyTorch keys its plans on it).
pub(crate) fn alignment(b: &ConvBuffers) -> u8 {
    // an absent bias is 0, which constrains nothing
    let all = b.x | b.w | b.y | b.bias;
    1u8 << all.trailing_zeros().min(4)
}

/// The operation graph of `p` and `op`, and every descriptor it was made of (kept alive with
/// the plan: whether cuDNN copies a descriptor set as an attribute or refers to it is not
/// documented, and cudnn-frontend keeps them too).
pub(super) fn graph(h: raw::cudnnHandle_t, p: &Conv2d, op: ConvOp, align: u8) -> Result<(Desc, Vec<Desc>)> {
    let (dtype, _) = types(p.precision);
    let align = i64::from(align);
    let x = tensor(X, dtype, p.x_dims(), p.layout, align)?;
    let w = tensor(W, dtype, p.w_dims(), p.layout, align)?;
    let y = tensor(Y, dtype, p.y_dims(), p.layout, align)?;
    let conv = convolution(p)?;
    let describe = || format!("{} {op:?}", p.describe());
    let (ops, mut parts) = match op {
        ConvOp::Forward | ConvOp::Fused(_) => forward_ops(p, op, align, [&x, &w, &y], &conv)?,
        ConvOp::BackwardData => {
            let names = [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            ];
            let ty = D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
            (vec![conv_operation(ty, names, [&x, &w, &y], &conv, describe)?], Vec::new())
        }
        ConvOp::BackwardFilter => {
            let names = [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            ];
            let ty = D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
            (vec![conv_operation(ty, names, [&x, &w, &y], &conv, describe)?], Vec::new())
        }
    };
    let refs: Vec<&Desc> = ops.iter().collect();
    let g = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?
        .handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h)?
        .descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?
        .finalize(describe)?;
    parts.extend(ops);
    parts.extend([x, w, y, conv]);
    Ok((g, parts))
}

/// The convolution descriptor of `p`: cross-correlation (PyTorch's `conv2d`) in two spatial
/// dimensions with its dilation, stride and padding, f32 compute.
fn convolution(p: &Conv2d) -> Result<Desc> {
    let f32_ = raw::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let two = |v: [usize; 2]| v.map(|x| x as i64);
    // SAFETY: COMP_TYPE reads a cudnnDataType_t, CONV_MODE a cudnnConvolutionMode_t.
    unsafe {
        Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
            .set(
                A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                T::CUDNN_TYPE_CONVOLUTION_MODE,
                &[raw::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
            )?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &two(p.dilation))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &two(p.stride))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &two(p.pad))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &two(p.pad))?
            .finalize(|| p.describe())
    }
}

/// A convolution operation descriptor of type `ty`, finalized: its x, w and y (dx, dw, dy
/// backward) and the convolution `conv` set as the attributes `names` name them (x, w, y,
/// convolution, then α and β), α = 1, β = 0.
fn conv_operation(
    ty: D,
    [ax, aw, ay, aconv, alpha, beta]: [A; 6],
    [x, w, y]: [&Desc; 3],
    conv: &Desc,
    what: impl FnOnce() -> String,
) -> Result<Desc> {
    let d = Desc::new(ty)?.descs(ax, &[x])?.descs(aw, &[w])?.descs(ay, &[y])?.descs(aconv, &[conv])?;
    // SAFETY: FLOAT attributes read a float (the scaling type of float, half and bfloat16).
    let d = unsafe { d.set(alpha, T::CUDNN_TYPE_FLOAT, &[1.0f32])?.set(beta, T::CUDNN_TYPE_FLOAT, &[0.0f32])? };
    d.finalize(what)
}

/// The forward graph's operations, and the descriptors they use besides x, w, y and the
/// convolution: the convolution writing y, or (fused) writing a virtual f32 tensor that a bias
/// ADD carries to y, for ReLU through a second virtual tensor and a RELU_FWD.
fn forward_ops(
    p: &Conv2d,
    op: ConvOp,
    align: i64,
    [x, w, y]: [&Desc; 3],
    conv: &Desc,
) -> Result<(Vec<Desc>, Vec<Desc>)> {
    let (dtype, _) = types(p.precision);
    let f32_ = raw::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let describe = || format!("{} {op:?}", p.describe());
    let mut ops = Vec::with_capacity(3);
    let mut parts = Vec::new();
    // the fused graph's convolution writes a virtual f32 tensor, its bias ADD (and ReLU) write y
    let conv_out = match op {
        ConvOp::Fused(_) => Some(tensor(CONV_OUT, f32_, p.y_dims(), p.layout, align)?),
        _ => None,
    };
    let out = conv_out.as_ref().unwrap_or(y);
    let names = [
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
    ];
    let ty = D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
    ops.push(conv_operation(ty, names, [x, w, out], conv, describe)?);
    if let ConvOp::Fused(act) = op {
        let bias = tensor(BIAS, dtype, [1, p.k, 1, 1], p.layout, align)?;
        use raw::cudnnPointwiseMode_t::*;
        if act == ConvActivation::Relu {
            let biased = tensor(BIASED, f32_, p.y_dims(), p.layout, align)?;
            let [add, add_pw] = pointwise(CUDNN_POINTWISE_ADD, out, Some(&bias), &biased)?;
            let [relu, relu_pw] = pointwise(CUDNN_POINTWISE_RELU_FWD, &biased, None, y)?;
            ops.extend([add, relu]);
            parts.extend([add_pw, relu_pw, biased]);
        } else {
            let [add, add_pw] = pointwise(CUDNN_POINTWISE_ADD, out, Some(&bias), y)?;
            ops.push(add);
            parts.push(add_pw);
        }
        parts.push(bias);
    }
    parts.extend(conv_out);
    Ok((ops, parts))
}

/// The variant pack's unique ids and pointers of a call, in the same order.
pub(super) fn variant(op: ConvOp, b: &ConvBuffers) -> (Vec<i64>, Vec<*mut c_void>) {
    let v = |a: u64| a as *mut c_void;
    match op {
        ConvOp::Fused(_) => (vec![X, W, Y, BIAS], vec![v(b.x), v(b.w), v(b.y), v(b.bias)]),
        _ => (vec![X, W, Y], vec![v(b.x), v(b.w), v(b.y)]),
    }
}
