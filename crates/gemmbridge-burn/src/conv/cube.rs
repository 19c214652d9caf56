//! The CUDA backend: [`ConvOps`] for every `CubeBackend<R, …>`, served by gemmbridge's cuDNN
//! convolutions when `R` is `CudaRuntime` (checked at run time by type) and the call fits;
//! burn's convolution otherwise.
//!
//! Each call is one [`Conv2d`] problem in the layout of x: NCHW where x is dense NCHW (or
//! strided otherwise: then copied dense NCHW), NHWC where x is a channels-last view of a dense
//! `[n, h, w, c]`. The other operands are copied into that layout where they are not in it,
//! and the output is allocated dense in it and returned as a `[n, c, h, w]`-ordered view.

use std::any::Any;

use burn::tensor::ops::{ActivationOps, ConvOptions, FloatTensor, FloatTensorOps, ModuleOps};
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use gemmbridge::conv::{Conv2d, ConvActivation, ConvLayout};
use gemmbridge::cuda::Gpu;
use gemmbridge::{Element, Precision};

use super::{burn_conv2d, served, ConvOps};
use crate::layer_ops::run::{run, Cuda, Raw};
use crate::layout::Fallback;

/// The tensor as a CUDA tensor when the runtime `R` is `CudaRuntime`.
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Result<&Cuda, Fallback> {
    (t as &dyn Any).downcast_ref::<Cuda>().ok_or_else(|| Fallback::Problem("not a CUDA backend".into()))
}

/// A CUDA tensor back as `CubeTensor<R>` (`R` is `CudaRuntime` whenever `as_cuda` succeeded).
fn from_cuda<R: CubeRuntime>(t: Cuda) -> CubeTensor<R> {
    *(Box::new(t) as Box<dyn Any>).downcast::<CubeTensor<R>>().expect("as_cuda succeeded, so R is CudaRuntime")
}

/// The 4-D shape of a tensor.
fn dims4<R: CubeRuntime>(t: &CubeTensor<R>) -> Result<[usize; 4], Fallback> {
    <[usize; 4]>::try_from(&t.meta.shape()[..]).map_err(|_| Fallback::Shape(format!("rank of {:?}", t.meta.shape())))
}

/// Whether `strides` are those of `layout` for logical dims `dims` (dims of extent 1 may have
/// any stride: they are never stepped over).
pub(crate) fn is_layout(layout: ConvLayout, dims: [usize; 4], strides: &[usize]) -> bool {
    let want = layout.strides(dims);
    strides.len() == 4 && (0..4).all(|i| dims[i] <= 1 || strides[i] == want[i])
}

/// The problem for checked shapes, in `precision` and `layout`, where gemmbridge takes it.
fn problem(
    x: [usize; 4],
    w: [usize; 4],
    o: &ConvOptions<2>,
    precision: Precision,
    layout: ConvLayout,
) -> Result<Conv2d, Fallback> {
    let p = Conv2d::new(x, [w[0], w[2], w[3]], precision)
        .with_stride(o.stride[0], o.stride[1])
        .with_pad(o.padding[0], o.padding[1])
        .with_dilation(o.dilation[0], o.dilation[1])
        .with_groups(o.groups)
        .with_layout(layout);
    p.validate().map_err(|e| Fallback::Problem(e.to_string()))?;
    if p.w_dims() != w {
        return Err(Fallback::Shape(format!("weight {w:?} for problem {}", p.describe())));
    }
    Ok(p)
}

/// The precision of tensors that share one of f32 (strict), f16, bf16.
fn precision(ts: &[&Cuda]) -> Result<Precision, Fallback> {
    let d = ts[0].dtype;
    let p = match d {
        DType::F32 => Precision::F32,
        DType::F16 => Precision::F16,
        DType::BF16 => Precision::BF16,
        _ => return Err(Fallback::Problem(format!("dtype {d:?}"))),
    };
    match ts.iter().all(|t| t.dtype == d) {
        true => Ok(p),
        false => Err(Fallback::Problem(format!("dtypes {:?}", ts.iter().map(|t| t.dtype).collect::<Vec<_>>()))),
    }
}

/// One direction of a call: the forward (`Some(act)`: fused with a bias), backward data,
/// backward filter.
#[derive(Clone, Copy, Debug)]
enum Dir {
    Forward(Option<ConvActivation>),
    Data,
    Filter,
}

/// Enqueues `dir` on the buffers, in the order `run` was given them: forward x, w, [bias], y;
/// backward data w, dy, dx; backward filter x, dy, dw.
fn enqueue<T: Element>(gpu: &Gpu, p: &Conv2d, dir: Dir, b: &[(u64, usize)]) -> gemmbridge::Result<()> {
    let raw = |i: usize| Raw::<T>::new(gpu, b[i]);
    match dir {
        Dir::Forward(None) => gpu.conv().forward::<T, _, _, _>(p, &raw(0), &raw(1), &mut raw(2)),
        Dir::Forward(Some(act)) => gpu.conv().fused::<T, _, _, _, _>(p, &raw(0), &raw(1), &raw(2), act, &mut raw(3)),
        Dir::Data => gpu.conv().backward_data::<T, _, _, _>(p, &raw(0), &raw(1), &mut raw(2)),
        Dir::Filter => gpu.conv().backward_filter::<T, _, _, _>(p, &raw(0), &raw(1), &mut raw(2)),
    }
}

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// burn's permutation from logical NCHW order to the layout's memory order, and back.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
const FROM_NHWC: [usize; 4] = [0, 3, 1, 2];

/// `t` (logical `[d0, d1, d2, d3]`) with the strides of `layout`: itself where it has them,
/// else a dense copy (burn's `into_contiguous`, through a permuted view for NHWC).
fn arrange<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    t: CubeTensor<R>,
    layout: ConvLayout,
) -> Result<CubeTensor<R>, Fallback> {
    if is_layout(layout, dims4(&t)?, t.meta.strides()) {
        return Ok(t);
    }
    Ok(match layout {
        ConvLayout::Nchw => burn_cubecl::kernel::into_contiguous(t),
        ConvLayout::Nhwc => {
            let dense = burn_cubecl::kernel::into_contiguous(Cube::<R, F, I, BT>::float_permute(t, &TO_NHWC));
            Cube::<R, F, I, BT>::float_permute(dense, &FROM_NHWC)
        }
    })
}

/// A fresh tensor of logical `dims` dense in `layout`, from burn's allocator on `like`'s
/// device and stream.
fn fresh<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    like: &Cuda,
    dims: [usize; 4],
    layout: ConvLayout,
) -> CubeTensor<R> {
    let stored = match layout {
        ConvLayout::Nchw => dims,
        ConvLayout::Nhwc => TO_NHWC.map(|i| dims[i]),
    };
    let t = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(stored.to_vec()),
        like.dtype,
    );
    match layout {
        ConvLayout::Nchw => from_cuda(t),
        ConvLayout::Nhwc => Cube::<R, F, I, BT>::float_permute(from_cuda(t), &FROM_NHWC),
    }
}

/// Runs `dir` on gemmbridge: `x` decides the layout (NHWC where it is channels-last, else
/// NCHW), `operands` are arranged in it (`[x, w]`, `[x, w, bias]`, `[w, dy]` or `[x, dy]`
/// by direction; a bias must be a dense `[k]`), the output (of logical `out`) is fresh.
fn try_conv<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    x: &CubeTensor<R>,
    w: &CubeTensor<R>,
    options: &ConvOptions<2>,
    dir: Dir,
    operands: Vec<CubeTensor<R>>,
    out: [usize; 4],
) -> Result<CubeTensor<R>, Fallback> {
    let cuda: Vec<&Cuda> = operands.iter().map(as_cuda).collect::<Result<_, _>>()?;
    let precision = precision(&cuda)?;
    let xd = dims4(x)?;
    let layout = match is_layout(ConvLayout::Nchw, xd, x.meta.strides()) {
        false if is_layout(ConvLayout::Nhwc, xd, x.meta.strides()) => ConvLayout::Nhwc,
        _ => ConvLayout::Nchw,
    };
    let p = problem(xd, dims4(w)?, options, precision, layout)?;
    let mut ins = Vec::with_capacity(operands.len());
    for t in operands {
        match t.meta.shape().len() {
            1 => ins.push(burn_cubecl::kernel::into_contiguous(t)),
            _ => ins.push(arrange::<R, F, I, BT>(t, layout)?),
        }
    }
    let y = fresh::<R, F, I, BT>(as_cuda(&ins[0])?, out, layout);
    let mut ts: Vec<&Cuda> = ins.iter().map(as_cuda).collect::<Result<_, _>>()?;
    ts.push(as_cuda(&y)?);
    run(
        &ts,
        Box::new(move |gpu: &Gpu, b: &[(u64, usize)]| match precision {
            Precision::F16 => enqueue::<gemmbridge::half::f16>(gpu, &p, dir, b),
            Precision::BF16 => enqueue::<gemmbridge::half::bf16>(gpu, &p, dir, b),
            _ => enqueue::<f32>(gpu, &p, dir, b),
        }),
    )?;
    Ok(y)
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> ConvOps for CubeBackend<R, F, I, BT> {
    fn gemm_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        act: ConvActivation,
    ) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [x.meta.shape(), weight.meta.shape()];
        let out = super::out_dims(x.meta.shape(), weight.meta.shape(), &options);
        let attempt = || {
            let mut operands = vec![x.clone(), weight.clone()];
            operands.extend(bias.clone());
            let dir = Dir::Forward(bias.is_some().then_some(act));
            let y = try_conv::<R, F, I, BT>(&x, &weight, &options, dir, operands, out)?;
            Ok(match (bias.is_some(), act) {
                (false, ConvActivation::Relu) => Self::relu(y),
                _ => y,
            })
        };
        served("conv2d", &shapes, attempt).unwrap_or_else(|| burn_conv2d::<Self>(x, weight, bias, options, act))
    }

    fn gemm_conv2d_backward_data(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let shapes: [&[usize]; 3] = [x.meta.shape(), weight.meta.shape(), dy.meta.shape()];
        let attempt = || {
            let out = dims4(&x)?;
            try_conv::<R, F, I, BT>(&x, &weight, &options, Dir::Data, vec![weight.clone(), dy.clone()], out)
        };
        served("conv2d backward data", &shapes, attempt)
            .unwrap_or_else(|| Self::conv2d_x_backward(x, weight, dy, options))
    }

    fn gemm_conv2d_backward_filter(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let shapes: [&[usize]; 3] = [x.meta.shape(), weight.meta.shape(), dy.meta.shape()];
        let attempt = || {
            let out = dims4(&weight)?;
            try_conv::<R, F, I, BT>(&x, &weight, &options, Dir::Filter, vec![x.clone(), dy.clone()], out)
        };
        served("conv2d backward filter", &shapes, attempt)
            .unwrap_or_else(|| Self::conv2d_weight_backward(x, weight, dy, options))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_layout, ConvLayout};

    #[test]
    fn layouts_are_recognised_from_strides() {
        let d = [2, 3, 4, 5];
        assert!(is_layout(ConvLayout::Nchw, d, &[60, 20, 5, 1]));
        assert!(!is_layout(ConvLayout::Nhwc, d, &[60, 20, 5, 1]));
        // channels-last: [n][h][w][c] as the permuted view burn records
        assert!(is_layout(ConvLayout::Nhwc, d, &[60, 1, 15, 3]));
        assert!(!is_layout(ConvLayout::Nchw, d, &[60, 1, 15, 3]));
        // one channel: both layouts are the same memory
        let one = [2, 1, 4, 5];
        assert!(is_layout(ConvLayout::Nchw, one, &[20, 7, 5, 1]) && is_layout(ConvLayout::Nhwc, one, &[20, 1, 5, 1]));
        assert!(!is_layout(ConvLayout::Nchw, d, &[60, 20, 5]), "rank 3 strides");
        assert!(!is_layout(ConvLayout::Nchw, d, &[120, 40, 10, 2]), "a strided view");
    }
}
