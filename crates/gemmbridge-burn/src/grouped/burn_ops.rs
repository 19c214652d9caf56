//! burn's own ops for the three grouped products: [`super::GroupedOps`]' defaults (NdArray, the
//! non-CUDA cubecl runtimes), the CUDA backend's fallback and [`super::grouped_matmul_burn`].
//! A loop over the experts with rows (`narrow`, `matmul`, `cat`); f16 and bf16 widened to f32,
//! computed there and rounded once to the input's dtype.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use super::busy;

fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The tensor in its compute dtype (f32 for f16 and bf16) and its own dtype.
fn widen<B: Backend, const D: usize>(t: Tensor<B, D>) -> (Tensor<B, D>, DType) {
    let dtype = t.dtype();
    match dtype {
        DType::F16 | DType::BF16 => (t.cast(DType::F32), dtype),
        _ => (t, dtype),
    }
}

/// Expert `e`'s `[N, K]` of `w[E, N, K]`.
fn expert<B: Backend>(w: &Tensor<B, 3>, e: usize) -> Tensor<B, 2> {
    let [_, n, k] = w.dims();
    w.clone().narrow(0, e, 1).reshape([n, k])
}

/// The parts concatenated along the rows, or an empty `[0, cols]` where there are none.
fn rows_of<B: Backend>(parts: Vec<Tensor<B, 2>>, cols: usize, like: &Tensor<B, 2>) -> Tensor<B, 2> {
    if parts.is_empty() {
        return Tensor::<B, 2>::zeros([0, cols], &like.device()).cast(like.dtype());
    }
    Tensor::cat(parts, 0)
}

/// `y[R, N]` from `x[R, K]` and `w[E, N, K]` (checked shapes).
pub(crate) fn forward_tensors<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 3>, sizes: &[usize]) -> Tensor<B, 2> {
    let ((x, dtype), (w, _)) = (widen(x), widen(w));
    let n = w.dims()[1];
    let parts = busy(sizes).map(|(e, r0, m)| x.clone().narrow(0, r0, m).matmul(expert(&w, e).transpose())).collect();
    rows_of(parts, n, &x).cast(dtype)
}

/// [`super::GroupedOps::gemm_grouped_matmul`] in burn's ops.
pub(crate) fn forward<B: Backend>(x: FloatTensor<B>, w: FloatTensor<B>, sizes: &[usize]) -> FloatTensor<B> {
    forward_tensors(tensor::<B, 2>(x), tensor::<B, 3>(w), sizes).into_primitive().tensor()
}

/// `dx[R, K]` from `dy[R, N]` and `w[E, N, K]`.
pub(crate) fn backward_data<B: Backend>(dy: FloatTensor<B>, w: FloatTensor<B>, sizes: &[usize]) -> FloatTensor<B> {
    let ((dy, dtype), (w, _)) = (widen(tensor::<B, 2>(dy)), widen(tensor::<B, 3>(w)));
    let k = w.dims()[2];
    let parts = busy(sizes).map(|(e, r0, m)| dy.clone().narrow(0, r0, m).matmul(expert(&w, e))).collect();
    rows_of(parts, k, &dy).cast(dtype).into_primitive().tensor()
}

/// `dw[E, N, K]` from `dy[R, N]` and `x[R, K]`: zeros for an expert without rows.
pub(crate) fn backward_weight<B: Backend>(dy: FloatTensor<B>, x: FloatTensor<B>, sizes: &[usize]) -> FloatTensor<B> {
    let ((dy, dtype), (x, _)) = (widen(tensor::<B, 2>(dy)), widen(tensor::<B, 2>(x)));
    let (n, k) = (dy.dims()[1], x.dims()[1]);
    let zeros = || Tensor::<B, 2>::zeros([n, k], &dy.device()).cast(dy.dtype());
    let mut parts: Vec<Tensor<B, 3>> = Vec::with_capacity(sizes.len());
    let mut r0 = 0;
    for &m in sizes {
        let part = match m {
            0 => zeros(),
            _ => dy.clone().narrow(0, r0, m).transpose().matmul(x.clone().narrow(0, r0, m)),
        };
        parts.push(part.unsqueeze());
        r0 += m;
    }
    let dw = match parts.is_empty() {
        true => Tensor::<B, 3>::zeros([0, n, k], &dy.device()).cast(dy.dtype()),
        false => Tensor::cat(parts, 0),
    };
    dw.cast(dtype).into_primitive().tensor()
}
