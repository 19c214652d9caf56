//! A transformer layer's elementwise operations on burn tensors: [`rms_norm`], [`swiglu`] and
//! [`rope`], forward and backward, through gemmbridge on burn's CUDA backend (cuDNN's norm
//! graph for RMSNorm, gemmbridge's own layer kernels for SwiGLU and RoPE) and as burn's own
//! ops everywhere else.
//!
//! The structure mirrors [`crate::GemmOps`]: the trait [`LayerOps`] has one method per
//! direction, each defaulting to burn's ops (`burn_ops.rs`), so NdArray implements it with an
//! empty body; `cube.rs` serves the CUDA `CubeBackend` (buffers handed to gemmbridge by
//! address, ordered with cubecl's stream as the GEMMs are), `fusion.rs` records the calls as
//! custom operations of burn's fusion stream, and `autodiff.rs` gives each operation one
//! autodiff node whose backward is the trait's backward method.

mod autodiff;
mod burn_ops;
mod cube;
mod fusion;
mod modules;
#[cfg(feature = "ndarray")]
mod ndarray;
pub(crate) mod run;

pub use gemmbridge::layer_ops::{RopeDirection, RopeStyle};
pub use modules::{
    GemmRmsNorm, GemmRmsNormConfig, GemmRmsNormRecord, GemmSwiGluMlp, GemmSwiGluMlpConfig, GemmSwiGluMlpRecord,
};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// Backends whose RMSNorm, SwiGLU and RoPE gemmbridge can serve.
///
/// Every method defaults to burn's own ops (products, sums, `sigmoid`, `narrow`, `cat`; in
/// f32 for f16 and bf16 inputs, rounded once to the input's dtype at the end), so a backend
/// gemmbridge cannot serve implements the trait with an empty body. This crate implements it
/// for every `CubeBackend<R, …>` (served when `R` is `CudaRuntime`), for `Fusion<B>`, for
/// `Autodiff<B, C>` (one node per operation whose backward is the methods below) and, with the
/// `ndarray` feature, for `NdArray` (burn's ops). The tensor-level functions [`rms_norm`],
/// [`swiglu`] and [`rope`] check shapes and call these; the methods expect checked shapes.
pub trait LayerOps: Backend {
    /// RMSNorm's forward over 2-D `x[rows, features]` with `w[features]`:
    /// `y = x · inv_rms · w`, `inv_rms = 1/√(mean(x²) + eps)` per row, f32 arithmetic, `y`
    /// `[rows, features]` in x's dtype. The inference form: nothing saved.
    fn layer_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        burn_ops::rms_norm::<Self>(x, w, eps).0
    }

    /// [`LayerOps::layer_rms_norm`] in the training form: `(y, inv_rms)`, `inv_rms` f32
    /// `[rows]`, what [`LayerOps::layer_rms_norm_backward`] reads.
    fn layer_rms_norm_training(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        burn_ops::rms_norm::<Self>(x, w, eps)
    }

    /// RMSNorm's backward from the forward's `x[rows, features]`, `w[features]`, `inv_rms`
    /// (f32 `[rows]`) and `dy[rows, features]`: `(dx, dw)` with `x̂ = x·inv_rms`, `g = dy·w`,
    /// `dx = inv_rms·(g − x̂·mean(g·x̂))` (x's shape and dtype), `dw = Σ_rows dy·x̂`
    /// (`[features]`, w's dtype).
    fn layer_rms_norm_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        inv_rms: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        burn_ops::rms_norm_backward::<Self>(x, w, inv_rms, dy)
    }

    /// SwiGLU over 2-D `gu[rows, 2f]` (gate `g = gu[:, ..f]`, up `u = gu[:, f..]`):
    /// `y[rows, f] = silu(g)·u`, f32 arithmetic, gu's dtype.
    fn layer_swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self> {
        burn_ops::swiglu::<Self>(gu)
    }

    /// SwiGLU's backward: from `dy[rows, f]` and the forward's `gu[rows, 2f]`, the gradient
    /// `[rows, 2f]` with `dg = dy·u·silu′(g)` in the gate half and `du = dy·silu(g)` in the up
    /// half.
    fn layer_swiglu_backward(dy: FloatTensor<Self>, gu: FloatTensor<Self>) -> FloatTensor<Self> {
        burn_ops::swiglu_backward::<Self>(dy, gu)
    }

    /// RoPE on `x[b, h, t, d]` with tables `cos`, `sin` `[T, d/2]` (`T ≥ t`; row `p` for the
    /// token at position `p` of each sequence): every pair `(x₁, x₂)` of `style` becomes
    /// `(x₁·c − x₂·s, x₂·c + x₁·s)` ([`RopeDirection::Forward`]) or is rotated by the
    /// opposite angle ([`RopeDirection::Backward`], the gradient's map). Output `[b, h, t, d]`
    /// in x's dtype, f32 arithmetic.
    fn layer_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        style: RopeStyle,
        direction: RopeDirection,
    ) -> FloatTensor<Self> {
        burn_ops::rope::<Self>(x, cos, sin, style, direction)
    }
}

/// `(served, fell back)`: calls of [`rms_norm`], [`swiglu`] and [`rope`] (forward and backward)
/// that reached a backend gemmbridge can serve (burn's `CubeBackend`, also under fusion and
/// autodiff) and were run by gemmbridge, or were handed to burn's ops (adapter disabled, a
/// dtype, layout or shape gemmbridge does not take, a non-CUDA cubecl runtime, a refusal of
/// the GPU library), since the start of the process; apart from [`crate::counts`]' GEMMs.
/// NdArray's calls are not counted. The per-call detail is in the `tracing` debug log.
pub fn layer_counts() -> (usize, usize) {
    run::counts()
}

pub(crate) fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

pub(crate) fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// `x[.., features]` viewed as rows: `[rows, features]` (a view for a contiguous x, burn's
/// reshape otherwise).
fn as_rows<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, 2> {
    let dims = x.dims();
    let last = dims[D - 1];
    let rows = dims[..D - 1].iter().product();
    x.reshape([rows, last])
}

fn back_to<B: Backend, const D: usize>(y: FloatTensor<B>, dims: [usize; D]) -> Tensor<B, D> {
    tensor::<B, 2>(y).reshape(dims)
}

/// RMSNorm over the last dimension, as burn's `nn::RmsNorm` (`x / √(mean(x²) + eps) · w`),
/// with the backward (`dx`, `dw`) under `Autodiff`.
///
/// - `x[.., features]` of any rank ≥ 1, `weight[features]`, output shaped as x, x's dtype.
///   f32, f16 and bf16; f32 arithmetic throughout (the mean of squares accumulated in f32).
/// - Served by gemmbridge's `Gpu::rms_norm_forward` / `rms_norm_backward` (cuDNN's norm graph)
///   on burn's CUDA backend, plain or fused, when x and weight share a dtype among f32, f16
///   and bf16, x's leading dimensions collapse into one row stride over contiguous rows,
///   weight is contiguous, and cuDNN takes the problem (Ampere or later, cuDNN ≥ 8.9.6).
///   Everything else — other backends, dtypes, layouts, zero rows, the adapter disabled
///   ([`crate::set_enabled`]) or a cuDNN refusal — runs burn's own ops (`square`, `mean_dim`,
///   `sqrt`, products; [`LayerOps`]' defaults), and a `tracing` debug line says which path
///   each call took.
/// - Backward: `dx = inv_rms·(g − x̂·mean(g·x̂))`, `dw = Σ_rows dy·x̂` with `x̂ = x·inv_rms`,
///   `g = dy·w`, from the inverse RMS the training forward saved (f32 `[rows]`).
///
/// # Panics
/// Before anything runs: x and weight on different devices, `weight`'s length not x's last
/// dimension, `eps` not finite and positive (burn's `RmsNormConfig::init` panics on that too),
/// or `eps` below f32's smallest normal value (gemmbridge takes it as f32).
pub fn rms_norm<B: LayerOps, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    let dims = x.dims();
    assert!(x.device() == weight.device(), "gemmbridge_burn::rms_norm: x and weight are on different devices");
    assert!(
        weight.dims()[0] == dims[D - 1],
        "gemmbridge_burn::rms_norm: weight has {} elements but x's last dimension is {}: x shape {dims:?}",
        weight.dims()[0],
        dims[D - 1]
    );
    assert!(
        eps.is_finite() && eps >= f64::from(f32::MIN_POSITIVE) && eps <= f64::from(f32::MAX),
        "gemmbridge_burn::rms_norm: eps = {eps} is not a finite positive f32"
    );
    let y = B::layer_rms_norm(primitive(as_rows(x)), primitive(weight), eps);
    back_to(y, dims)
}

/// SwiGLU over a fused gate/up projection's output: `y = silu(g)·u` with `g = gu[.., ..f]`
/// and `u = gu[.., f..]` (the halves layout: `torch.chunk(gu, 2, -1)`, the gate first, as a
/// `[d, 2f]` weight made by concatenating burn's `SwiGlu::linear_inner` and `linear_outer`
/// weights gives), with the backward under `Autodiff`.
///
/// - `gu[.., 2f]` of any rank ≥ 1 → `y[.., f]`, gu's dtype; f32 arithmetic.
/// - Served by gemmbridge's `Gpu::swiglu` / `swiglu_backward` (its own kernels) on burn's
///   CUDA backend, plain or fused, for f32, f16 and bf16 where gu's leading dimensions
///   collapse into one row stride over contiguous rows; elsewhere (and for an empty gu) burn's
///   own ops (`narrow`, `sigmoid`, products; [`LayerOps`]' defaults).
/// - Backward: `dg = dy·u·silu′(g)`, `du = dy·silu(g)`, as one `[.., 2f]` gradient.
///
/// # Panics
/// Before anything runs: gu's last dimension odd.
pub fn swiglu<B: LayerOps, const D: usize>(gu: Tensor<B, D>) -> Tensor<B, D> {
    let mut dims = gu.dims();
    assert!(
        dims[D - 1].is_multiple_of(2),
        "gemmbridge_burn::swiglu: the last dimension {} is odd; gate/up must be [.., 2f]: shape {dims:?}",
        dims[D - 1]
    );
    let y = B::layer_swiglu(primitive(as_rows(gu)));
    dims[D - 1] /= 2;
    back_to(y, dims)
}

/// Rotary position embedding on `x[b, h, t, d]` (`b` sequences of `h` heads of `t` tokens,
/// `d` even), pairs as `style` says — [`RopeStyle::RotateHalf`] `(x[i], x[i + d/2])` (LLaMA,
/// GPT-NeoX) or [`RopeStyle::Interleaved`] `(x[2i], x[2i+1])` (GPT-J) — with the backward
/// under `Autodiff`.
///
/// - `cos`, `sin`: `[T, d/2]`, `T ≥ t`, row `p` the cosines and sines of the token at
///   position `p` of every sequence (rows past `t` are not read; narrow a longer table to
///   start at an offset). Any float dtype; they enter as constants: no gradient flows to them.
/// - Output `[b, h, t, d]` in x's dtype: each pair `(x₁, x₂)` of token `p`, pair index `i`,
///   becomes `(x₁·c − x₂·s, x₂·c + x₁·s)`, `c = cos[p, i]`, `s = sin[p, i]`, in f32 and rounded
///   once. Backward: `dx` is `dy` rotated by the opposite angles.
/// - Served by gemmbridge's `Gpu::rope` (its layer kernels, angles from f32 tables) on burn's
///   CUDA backend, plain or fused, for f32, f16 and bf16 with `d ≤ 512`. gemmbridge rotates
///   the query and key heads of a fused QKV buffer in place, so x is copied (burn's
///   `swap_dims` and `cat`) into a scratch `[b, t, h + 1, d]` (`h + 2` for one head) laid out
///   as such a buffer, rotated there, and the output is a `[b, h, t, d]` view of it (strided).
///   Elsewhere — other backends, dtypes, `d > 512`, empty shapes — burn's own ops (`narrow`,
///   products, `cat`; [`LayerOps`]' defaults).
///
/// # Panics
/// Before anything runs: tensors on different devices, `d` odd, `cos` and `sin` of different
/// shapes or not `[T, d/2]` with `T ≥ t` (each message names the shapes).
pub fn rope<B: LayerOps>(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>, style: RopeStyle) -> Tensor<B, 4> {
    let ([_, _, t, d], (cd, sd)) = (x.dims(), (cos.dims(), sin.dims()));
    assert!(
        x.device() == cos.device() && x.device() == sin.device(),
        "gemmbridge_burn::rope: x, cos and sin are on different devices"
    );
    assert!(
        d.is_multiple_of(2) && cd == sd && cd[1] * 2 == d && cd[0] >= t,
        "gemmbridge_burn::rope: cos {cd:?} and sin {sd:?} do not fit x {:?}: both must be [T, d/2] with T ≥ t = {t} \
         and d = {d} even",
        x.dims()
    );
    let y = B::layer_rope(primitive(x), primitive(cos), primitive(sin), style, RopeDirection::Forward);
    tensor(y)
}

/// A 2-D tensor's rows: `(rows, cols, ld)` when its rows are contiguous and one stride `ld ≥
/// cols` apart (a single row has `ld = cols`), as gemmbridge's row-major problems take them.
pub(crate) fn row_layout(shape: &[usize], strides: &[usize]) -> Option<(usize, usize, usize)> {
    let (&[rows, cols], &[sr, sc]) = (shape, strides) else {
        return None;
    };
    let contiguous_row = sc == 1 || cols <= 1;
    match rows {
        0 | 1 if contiguous_row => Some((rows, cols, cols)),
        _ if contiguous_row && sr >= cols => Some((rows, cols, sr)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::row_layout;

    #[test]
    fn rows_are_read_in_place_only_when_contiguous_and_apart() {
        assert_eq!(row_layout(&[37, 17], &[17, 1]), Some((37, 17, 17)));
        assert_eq!(row_layout(&[37, 17], &[40, 1]), Some((37, 17, 40)), "a row slice of wider rows");
        assert_eq!(row_layout(&[1, 17], &[0, 1]), Some((1, 17, 17)), "one row: its stride is not used");
        assert_eq!(row_layout(&[37, 17], &[1, 37]), None, "transposed");
        assert_eq!(row_layout(&[37, 17], &[8, 1]), None, "overlapping rows");
        assert_eq!(row_layout(&[37, 17, 1], &[17, 1, 1]), None, "not 2-D");
        assert_eq!(row_layout(&[5, 1], &[3, 7]), Some((5, 1, 3)), "one column: its stride is not used");
    }
}
