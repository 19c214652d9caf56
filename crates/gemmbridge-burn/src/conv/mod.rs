//! 2-D convolution on burn tensors: [`conv2d`] (burn's `module::conv2d`, with a bias and ReLU
//! fused into the forward where gemmbridge serves) and the module [`GemmConv2d`], forward and
//! backward, through gemmbridge's cuDNN convolutions on burn's CUDA backend and as burn's own
//! convolution everywhere else.
//!
//! The structure mirrors [`crate::LayerOps`]: the trait [`ConvOps`] has one method per
//! direction, each defaulting to burn's ops, so NdArray implements it with an empty body;
//! `cube.rs` serves the CUDA `CubeBackend` (buffers handed to gemmbridge by address, ordered
//! with cubecl's stream as the GEMMs are), `fusion.rs` records the calls as custom operations
//! of burn's fusion stream, and `autodiff.rs` gives each convolution one autodiff node whose
//! backward is the trait's backward methods.

mod autodiff;
mod cube;
mod fusion;
mod module;
#[cfg(feature = "ndarray")]
mod ndarray;

use burn::tensor::ops::{ConvOptions, PaddedConvOptions};
pub use gemmbridge::conv::ConvActivation;
pub use module::{GemmConv2d, GemmConv2dConfig, GemmConv2dRecord};

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, PadMode};
use burn::tensor::Tensor;

use crate::layer_ops::{primitive, tensor};

/// Backends whose 2-D convolutions gemmbridge can serve.
///
/// Every method defaults to burn's own ops (`ModuleOps::conv2d`, `conv2d_x_backward`,
/// `conv2d_weight_backward`, `relu`), so a backend gemmbridge cannot serve implements the trait
/// with an empty body. This crate implements it for every `CubeBackend<R, …>` (served when `R`
/// is `CudaRuntime`), for `Fusion<B>` (custom operations of the fusion stream), for
/// `Autodiff<B, C>` (one node per convolution whose backward is the methods below) and, with
/// the `ndarray` feature, for `NdArray` (burn's ops).
///
/// Shapes, burn's NCHW order whatever the strides: `x[n, c, h, w]`, `weight[k, c/groups, r,
/// s]`, `bias[k]`, `y` and `dy` `[n, k, p, q]` with `p = (h + 2·pad_h − dil_h·(r − 1) − 1) /
/// stride_h + 1` (floor), `q` likewise; one float dtype. The methods expect checked shapes
/// ([`conv2d`] checks them) and symmetric padding (`options.padding` on each side).
pub trait ConvOps: Backend {
    /// `act(x ⋆ weight + bias)` (cross-correlation, as burn's `conv2d`), `[n, k, p, q]` in x's
    /// dtype.
    fn gemm_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        act: ConvActivation,
    ) -> FloatTensor<Self> {
        burn_conv2d::<Self>(x, weight, bias, options, act)
    }

    /// The input's gradient `dx[n, c, h, w]` from the forward's `x` (read for its shape only),
    /// `weight` and the output's gradient `dy[n, k, p, q]` (after the activation's mask).
    fn gemm_conv2d_backward_data(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_x_backward(x, weight, dy, options)
    }

    /// The filter's gradient `dw[k, c/groups, r, s]` from the forward's `x`, `weight` (read for
    /// its shape only) and `dy[n, k, p, q]` (after the activation's mask).
    fn gemm_conv2d_backward_filter(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_weight_backward(x, weight, dy, options)
    }
}

/// burn's own convolution followed by the activation (the fallback path).
pub(crate) fn burn_conv2d<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    options: ConvOptions<2>,
    act: ConvActivation,
) -> FloatTensor<B> {
    let y = B::conv2d(x, weight, bias, options);
    match act {
        ConvActivation::Identity => y,
        ConvActivation::Relu => B::relu(y),
    }
}

static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

/// `(served, fell back)`: convolution calls (forwards, backward-data and backward-filter) that
/// reached the adapter on burn's CUDA backend (plain, under fusion or autodiff) and ran on
/// cuDNN through gemmbridge, or ran burn's own convolution instead (adapter off, a dtype
/// gemmbridge does not take, an empty tensor, no cuDNN, a non-CUDA cubecl runtime), since the
/// start of the process. Counted apart from [`crate::counts`]' GEMMs; backends on burn's ops
/// alone (NdArray) are not counted. The `tracing` debug log says why, per call.
pub fn conv_counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

/// The result of `attempt` when the adapter is on and gemmbridge can serve, `None` when the
/// caller should run burn's ops; counts and logs which path the call took.
pub(crate) fn served<T>(
    what: &str,
    shapes: &[&[usize]],
    attempt: impl FnOnce() -> Result<T, crate::layout::Fallback>,
) -> Option<T> {
    let r = if crate::enabled() { attempt() } else { Err(crate::layout::Fallback::Problem("adapter disabled".into())) };
    match r {
        Ok(out) => {
            SERVED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, "{what}: gemmbridge");
            Some(out)
        }
        Err(why) => {
            FELL_BACK.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, ?why, "{what}: burn");
            None
        }
    }
}

/// The output's `[n, k, p, q]` for checked shapes (saturating: no panic on others).
pub(crate) fn out_dims(x: &[usize], w: &[usize], o: &ConvOptions<2>) -> [usize; 4] {
    let dim = |i: usize| {
        let padded = x[2 + i].saturating_add(o.padding[i].saturating_mul(2));
        let span = o.dilation[i].saturating_mul(w[2 + i].saturating_sub(1)).saturating_add(1);
        padded.saturating_sub(span) / o.stride[i].max(1) + 1
    };
    [x[0], w[0], dim(0), dim(1)]
}

/// `act(x ⋆ weight + bias)`: burn's `module::conv2d` (PyTorch's `F.conv2d`, a
/// cross-correlation) followed by `act`, with the bias and ReLU fused into one cuDNN call where
/// gemmbridge serves, and the backward (`dx`, `dw`, `db`) under `Autodiff`.
///
/// - `x[n, c, h, w]`, `weight[k, c/groups, r, s]`, `bias[k]` or none; one float dtype, one
///   device, any strides. Output `[n, k, p, q]` in x's dtype with
///   `p = (h + top + bottom − dil_h·(r − 1) − 1) / stride_h + 1` (floor) and `q` likewise:
///   `y[n, o, i, j] = act(bias[o] + Σ x[n, g·c/groups + e, i·stride_h − top + u·dil_h,
///   j·stride_w − left + v·dil_w] · weight[o, e, u, v])` over `e < c/groups`, `u < r`,
///   `v < s`, with `g = o / (k/groups)` and positions outside the image reading 0.
/// - `options`: burn's `ConvOptions` (symmetric padding) or `PaddedConvOptions` (asymmetric:
///   as burn does, x is first padded with zeros by burn's `pad`, then convolved with no
///   padding).
/// - Served by gemmbridge's `GpuConv::forward` / `GpuConv::fused` (bias, then ReLU or the
///   identity, as one cuDNN graph where an engine takes it) on burn's CUDA backend, plain or
///   fused, for f32 (strict: no TF32), f16 and bf16 (f32 accumulation). Operands whose strides
///   are dense NCHW are read in place (cuDNN's NCHW layout); where x is channels-last (a
///   permuted view of a dense `[n, h, w, c]`) the call runs in cuDNN's NHWC layout, the other
///   operands copied channels-last where they are not, and the output is a `[n, k, p, q]` view
///   of a dense `[n, p, q, k]`; other strides are copied dense NCHW first. Without a bias, ReLU
///   is burn's `relu` on the convolution's output. Elsewhere — other backends, dtypes, an
///   empty tensor, sizes past cuDNN's `int`, the adapter disabled ([`crate::set_enabled`]), no
///   cuDNN — burn's own `conv2d` (and `relu`), [`ConvOps`]' defaults; [`conv_counts`] counts
///   the paths and a `tracing` debug line says which path each call took.
/// - Backward: with `g = dy` (for ReLU, `dy` where `y > 0`, 0 elsewhere: burn's
///   `relu_backward`), `dx` by cuDNN's backward-data and `dw` by its backward-filter
///   convolution (burn's `conv2d_x_backward` / `conv2d_weight_backward` where gemmbridge does
///   not serve), each only when its input needs a gradient; `db` the sum of `g` over `n`, `p`,
///   `q` by burn's ops, in f32 and rounded once to the bias's dtype.
///
/// # Panics
/// Before anything runs, each message naming the shapes: tensors on different devices; a
/// stride, dilation or groups of 0; x's channels not `weight`'s `c/groups · groups`; `k` not a
/// multiple of the groups; a bias that is not `[k]`; a kernel or an image with no taps
/// (`c/groups`, `r`, `s`, `h` or `w` of 0); the dilated kernel larger than the padded input.
pub fn conv2d<B: ConvOps>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: impl Into<PaddedConvOptions<2>>,
    act: ConvActivation,
) -> Tensor<B, 4> {
    let padded = options.into();
    let (opts, end) = (padded.options.clone(), padded.padding_end.unwrap_or(padded.options.padding));
    check(&x, &weight, bias.as_ref(), &opts, end);
    let (x, opts) = match padded.padding_end {
        Some([bottom, right]) => {
            let [top, left] = opts.padding;
            let x = x.pad((left, right, top, bottom), PadMode::Constant(0.0));
            (x, ConvOptions::new(opts.stride, [0, 0], opts.dilation, opts.groups))
        }
        None => (x, opts),
    };
    tensor(B::gemm_conv2d(primitive(x), primitive(weight), bias.map(primitive), opts, act))
}

/// The named checks of [`conv2d`] (u128 arithmetic: no overflow for any sizes); `end` is the
/// bottom and right padding.
fn check<B: Backend>(
    x: &Tensor<B, 4>,
    w: &Tensor<B, 4>,
    bias: Option<&Tensor<B, 1>>,
    o: &ConvOptions<2>,
    end: [usize; 2],
) {
    const F: &str = "gemmbridge_burn::conv2d";
    let (xd, wd) = (x.dims(), w.dims());
    let device = x.device();
    assert!(
        w.device() == device && bias.is_none_or(|b| b.device() == device),
        "{F}: x, weight and bias are on different devices"
    );
    let (stride, dilation, groups) = (o.stride, o.dilation, o.groups);
    assert!(
        !stride.contains(&0) && !dilation.contains(&0) && groups != 0,
        "{F}: stride {stride:?}, dilation {dilation:?} and groups {groups} must each be at least 1"
    );
    let ([_, c, h, iw], [k, cg, r, s]) = (xd, wd);
    assert!(cg != 0 && r != 0 && s != 0, "{F}: weight {wd:?} has no taps: c/groups, r and s must each be at least 1");
    assert!(h != 0 && iw != 0, "{F}: x {xd:?} has an empty image: h and w must each be at least 1");
    assert!(
        cg.checked_mul(groups) == Some(c),
        "{F}: x {xd:?} has {c} channels, weight {wd:?} with groups {groups} takes {cg} × {groups}"
    );
    assert!(k.is_multiple_of(groups), "{F}: weight {wd:?} has {k} filters, not a multiple of groups {groups}");
    if let Some(b) = bias {
        assert!(b.dims() == [k], "{F}: bias must be [{k}] (one value per filter of weight {wd:?}), not {:?}", b.dims());
    }
    let padded = |i: usize, size: usize| size as u128 + o.padding[i] as u128 + end[i] as u128;
    let span = |i: usize, taps: usize| dilation[i] as u128 * (taps as u128 - 1) + 1;
    assert!(
        padded(0, h) >= span(0, r) && padded(1, iw) >= span(1, s),
        "{F}: the dilated kernel {}×{} (weight {wd:?}, dilation {dilation:?}) is larger than the padded input {}×{} \
         (x {xd:?}, padding {:?} before, {end:?} after)",
        span(0, r),
        span(1, s),
        padded(0, h),
        padded(1, iw),
        o.padding
    );
}

#[cfg(test)]
mod tests {
    use super::{out_dims, ConvOptions};

    #[test]
    fn output_dims_follow_pytorchs_formula() {
        // (9 + 2 − 4 − 1) / 2 + 1 = 4, (10 + 2 − 2 − 1) / 2 + 1 = 5
        let o = ConvOptions::new([2, 2], [1, 1], [2, 2], 2);
        assert_eq!(out_dims(&[2, 6, 9, 10], &[4, 3, 3, 2], &o), [2, 4, 4, 5]);
        let o = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        assert_eq!(out_dims(&[1, 1, 3, 3], &[1, 1, 3, 3], &o), [1, 1, 1, 1]);
    }
}
