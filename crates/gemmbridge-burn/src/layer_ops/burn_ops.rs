//! burn's own ops for RMSNorm, SwiGLU and RoPE: [`super::LayerOps`]' defaults (NdArray, the
//! non-CUDA cubecl runtimes) and the CUDA backend's fallback. f16 and bf16 inputs are widened
//! to f32, computed there and rounded once to the input's dtype.

use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use super::{primitive, tensor, RopeDirection, RopeStyle};

fn f32_of<B: Backend, const D: usize>(p: FloatTensor<B>) -> (Tensor<B, D>, DType) {
    let t = tensor::<B, D>(p);
    let dtype = t.dtype();
    (t.cast(DType::F32), dtype)
}

/// `(y, inv_rms)` for `x[rows, features]`, `w[features]`; `inv_rms` f32 `[rows]`.
pub(crate) fn rms_norm<B: Backend>(x: FloatTensor<B>, w: FloatTensor<B>, eps: f64) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, dtype) = f32_of::<B, 2>(x);
    let rows = x.dims()[0];
    let (w, _) = f32_of::<B, 1>(w);
    let inv = (x.clone().square().mean_dim(1) + eps).sqrt().recip(); // [rows, 1]
    let y = x * inv.clone() * w.unsqueeze::<2>();
    (primitive(y.cast(dtype)), primitive(inv.reshape([rows])))
}

/// `(dx, dw)` of RMSNorm (see `LayerOps::layer_rms_norm_backward`).
pub(crate) fn rms_norm_backward<B: Backend>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    inv_rms: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, x_dtype) = f32_of::<B, 2>(x);
    let (w, w_dtype) = f32_of::<B, 1>(w);
    let (dy, _) = f32_of::<B, 2>(dy);
    let (inv, _) = f32_of::<B, 1>(inv_rms);
    let features = w.dims()[0];
    let inv = inv.unsqueeze_dim::<2>(1); // [rows, 1]
    let x_hat = x * inv.clone();
    let g = dy.clone() * w.unsqueeze::<2>();
    let c = (g.clone() * x_hat.clone()).mean_dim(1); // [rows, 1]
    let dx = inv * (g - x_hat.clone() * c);
    let dw = (dy * x_hat).sum_dim(0).reshape([features]);
    (primitive(dx.cast(x_dtype)), primitive(dw.cast(w_dtype)))
}

/// The gate and up halves of `gu[rows, 2f]`, in f32, and gu's dtype.
fn halves<B: Backend>(gu: FloatTensor<B>) -> (Tensor<B, 2>, Tensor<B, 2>, DType) {
    let (gu, dtype) = f32_of::<B, 2>(gu);
    let f = gu.dims()[1] / 2;
    (gu.clone().narrow(1, 0, f), gu.narrow(1, f, f), dtype)
}

/// `silu(g)·u` over `gu[rows, 2f]`.
pub(crate) fn swiglu<B: Backend>(gu: FloatTensor<B>) -> FloatTensor<B> {
    let (g, u, dtype) = halves::<B>(gu);
    let y = g.clone() * sigmoid(g) * u;
    primitive(y.cast(dtype))
}

/// `[dg | du]` from `dy[rows, f]` and `gu[rows, 2f]`.
pub(crate) fn swiglu_backward<B: Backend>(dy: FloatTensor<B>, gu: FloatTensor<B>) -> FloatTensor<B> {
    let (g, u, dtype) = halves::<B>(gu);
    let (dy, _) = f32_of::<B, 2>(dy);
    let s = sigmoid(g.clone());
    let silu = g.clone() * s.clone();
    // silu′(g) = σ(g)·(1 + g·(1 − σ(g)))
    let d_silu = s.clone() * ((s.neg() + 1.0) * g + 1.0);
    let dg = dy.clone() * u * d_silu;
    let du = dy * silu;
    primitive(Tensor::cat(vec![dg, du], 1).cast(dtype))
}

/// RoPE on `x[b, h, t, d]` with `[T, d/2]` tables (see `LayerOps::layer_rope`).
pub(crate) fn rope<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    style: RopeStyle,
    direction: RopeDirection,
) -> FloatTensor<B> {
    let (x, dtype) = f32_of::<B, 4>(x);
    let [b, h, t, d] = x.dims();
    let half = d / 2;
    // [1, 1, t, d/2]: the first t rows, broadcast over sequences and heads
    let table = |p: FloatTensor<B>| f32_of::<B, 2>(p).0.narrow(0, 0, t).unsqueeze::<4>();
    let (c, s) = (table(cos), table(sin));
    // the backward rotates by −θ: the same cosines, the sines negated
    let s = match direction {
        RopeDirection::Forward => s,
        RopeDirection::Backward => s.neg(),
    };
    let y = match style {
        RopeStyle::RotateHalf => {
            let (x1, x2) = (x.clone().narrow(3, 0, half), x.narrow(3, half, half));
            let y1 = x1.clone() * c.clone() - x2.clone() * s.clone();
            let y2 = x2 * c + x1 * s;
            Tensor::cat(vec![y1, y2], 3)
        }
        RopeStyle::Interleaved => {
            let pairs = x.reshape([b, h, t, half, 2]);
            let (c, s) = (c.unsqueeze_dim::<5>(4), s.unsqueeze_dim::<5>(4));
            let (x1, x2) = (pairs.clone().narrow(4, 0, 1), pairs.narrow(4, 1, 1));
            let y1 = x1.clone() * c.clone() - x2.clone() * s.clone();
            let y2 = x2 * c + x1 * s;
            Tensor::cat(vec![y1, y2], 4).reshape([b, h, t, d])
        }
    };
    primitive(y.cast(dtype))
}
