//! The CUDA backend: [`GroupedOps`] for every `CubeBackend<R, …>`, served by gemmbridge's
//! grouped GEMM when `R` is `CudaRuntime` (checked at run time by type) and the call fits;
//! burn's ops otherwise.

use std::any::Any;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use gemmbridge::cuda::{Gpu, RawBuffer};
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::Precision;

use super::{burn_ops, served, GroupedOps};
use crate::layer_ops::run::{run, Cuda};
use crate::layout::Fallback;

/// The tensor as a CUDA tensor when the runtime `R` is `CudaRuntime`.
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Result<&Cuda, Fallback> {
    (t as &dyn Any).downcast_ref::<Cuda>().ok_or_else(|| Fallback::Problem("not a CUDA backend".into()))
}

/// A CUDA tensor back as `CubeTensor<R>` (`R` is `CudaRuntime` whenever `as_cuda` succeeded).
fn from_cuda<R: CubeRuntime>(t: Cuda) -> CubeTensor<R> {
    *(Box::new(t) as Box<dyn Any>).downcast::<CubeTensor<R>>().expect("as_cuda succeeded, so R is CudaRuntime")
}

/// gemmbridge's precision for operands of one dtype among f32 (tf32 under
/// [`crate::set_tf32`]), f16 and bf16: one element type for every buffer, as the grouped GEMM
/// takes them.
fn precision(a: &Cuda, b: &Cuda) -> Result<Precision, Fallback> {
    let p = match a.dtype {
        DType::F32 if crate::tf32() => Precision::TF32,
        DType::F32 => Precision::F32,
        DType::F16 => Precision::F16,
        DType::BF16 => Precision::BF16,
        d => return Err(Fallback::Problem(format!("dtype {d:?}"))),
    };
    match a.dtype == b.dtype {
        true => Ok(p),
        false => Err(Fallback::Problem(format!("dtypes {:?} and {:?}", a.dtype, b.dtype))),
    }
}

/// `(rows, n, k, out shape)` of the product `op` on `a` and `b` ([`GroupedOp::names`]' order)
/// with `groups` experts, or why the shapes do not fit it.
fn geometry(
    op: GroupedOp,
    a: &[usize],
    b: &[usize],
    groups: usize,
) -> Result<(usize, usize, usize, Vec<usize>), Fallback> {
    let fit = match (op, a, b) {
        (GroupedOp::Forward, &[r, k], &[e, n, kw]) if k == kw && e == groups => Some((r, n, k, vec![r, n])),
        (GroupedOp::BackwardData, &[r, n], &[e, nw, k]) if n == nw && e == groups => Some((r, n, k, vec![r, k])),
        (GroupedOp::BackwardWeight, &[r, n], &[rx, k]) if r == rx => Some((r, n, k, vec![groups, n, k])),
        _ => None,
    };
    fit.ok_or_else(|| {
        Fallback::Shape(format!("{op:?}: {:?} {a:?} and {:?} {b:?}, {groups} groups", op.names()[0], op.names()[1]))
    })
}

/// The product `op` through `Gpu::grouped_gemm_raw` on `a` and `b` (copied contiguous first
/// where they are not), into a fresh contiguous output from burn's allocator.
fn try_grouped(op: GroupedOp, a: &Cuda, b: &Cuda, sizes: &[usize]) -> Result<Cuda, Fallback> {
    let prec = precision(a, b)?;
    let (rows, n, k, out_shape) = geometry(op, a.meta.shape(), b.meta.shape(), sizes.len())?;
    if sizes.iter().sum::<usize>() != rows || rows == 0 {
        return Err(Fallback::Shape(format!("{rows} rows, group sizes {sizes:?}")));
    }
    let p = GroupedProblem::new(op, sizes, n, k, prec).map_err(|e| Fallback::Problem(e.to_string()))?;
    let (a, b) = (burn_cubecl::kernel::into_contiguous(a.clone()), burn_cubecl::kernel::into_contiguous(b.clone()));
    let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        a.client.clone(),
        a.device.clone(),
        Shape::from(out_shape),
        a.dtype,
    );
    let launch = move |gpu: &Gpu, bufs: &[(u64, usize)]| {
        // one buffer per tensor given to `run`, in their order: a, b, out
        let [ba, bb, bc] = [0, 1, 2].map(|i| RawBuffer { address: bufs[i].0, len_bytes: bufs[i].1 });
        // SAFETY: the buffers are live cubecl allocations of the primary context (which
        // gemmbridge's Gpu shares), held by `run`'s bindings and by the tensors; the call goes
        // on gemmbridge's stream (the engine joins its pool back there); the ordering with
        // cubecl's stream is `run`'s; the engine checks every length against the problem and
        // the output apart from the inputs.
        unsafe { gpu.grouped_gemm_raw(&p, [ba, bb, bc], None, gpu.stream().cu_stream()) }
    };
    run(&[&a, &b, &out], Box::new(launch))?;
    Ok(out)
}

/// The product `op` served by gemmbridge, or `None` (counted and logged) for burn's ops.
fn grouped_served<R: CubeRuntime>(
    what: &str,
    op: GroupedOp,
    a: &CubeTensor<R>,
    b: &CubeTensor<R>,
    sizes: &[usize],
) -> Option<CubeTensor<R>> {
    let shapes: [&[usize]; 2] = [a.meta.shape(), b.meta.shape()];
    served(what, &shapes, || try_grouped(op, as_cuda(a)?, as_cuda(b)?, sizes).map(from_cuda::<R>))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GroupedOps for CubeBackend<R, F, I, BT> {
    fn gemm_grouped_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        grouped_served("grouped_matmul", GroupedOp::Forward, &x, &w, sizes)
            .unwrap_or_else(|| burn_ops::forward::<Self>(x, w, sizes))
    }

    fn gemm_grouped_backward_data(dy: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        grouped_served("grouped_matmul backward data", GroupedOp::BackwardData, &dy, &w, sizes)
            .unwrap_or_else(|| burn_ops::backward_data::<Self>(dy, w, sizes))
    }

    fn gemm_grouped_backward_weight(dy: FloatTensor<Self>, x: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        grouped_served("grouped_matmul backward weight", GroupedOp::BackwardWeight, &dy, &x, sizes)
            .unwrap_or_else(|| burn_ops::backward_weight::<Self>(dy, x, sizes))
    }
}
