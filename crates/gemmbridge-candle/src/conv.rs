//! `conv2d` (candle's `Tensor::conv2d` arguments) with an optional bias and ReLU fused into the
//! forward, and its backward: cuDNN through gemmbridge's engine on CUDA, candle's own
//! convolution everywhere else (gemmbridge has no CPU convolution).

use candle_core::{DType, Result, Tensor};
use gemmbridge::conv::{Conv2d, ConvLayout};
use gemmbridge::Precision;

use crate::conv_params::{Conv2dParams, ConvAct};
use crate::Served;

/// A 2-D convolution, `y = act(x ⋆ w + bias)`; see [`conv2d_served`].
///
/// # Errors
/// As [`conv2d_served`].
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: ConvAct, params: Conv2dParams) -> Result<Tensor> {
    conv2d_served(x, w, bias, act, params).map(|(t, _)| t)
}

/// [`conv2d`], and which path ran it.
///
/// - `x[n, c, h, w]` (NCHW, candle's layout), `w[k, c/groups, r, s]` (candle's and PyTorch's
///   filter layout), `bias[k]` or none; one float dtype, one device, any strides.
/// - Output `y[n, k, p, q]`, contiguous NCHW, x's dtype, with
///   `p = (h + 2·padding − dilation·(r − 1) − 1) / stride + 1` (floor) and `q` likewise:
///   `y[n, o, i, j] = act(bias[o] + Σ_{e, u, v} x[n, g·c/groups + e, i·stride − padding +
///   u·dilation, j·stride − padding + v·dilation] · w[o, e, u, v])` over `e < c/groups`,
///   `u < r`, `v < s`, with `g = o / (k/groups)` the group of output channel `o` and positions
///   outside the image reading 0 (a cross-correlation, as candle's `conv2d` and PyTorch's
///   `F.conv2d`).
/// - Backward (candle's autograd): `dx` (x's shape), `dw` (w's shape) and `db` (`[k]`, the
///   sum of `g` over `n`, `p`, `q`), from `g = dy`, or for ReLU `g = dy` where `y > 0` and 0
///   elsewhere (PyTorch's convention; candle's own `relu`, which the fallback and a ReLU
///   without a bias run, passes `dy` where the pre-activation is ≥ 0: the two differ only
///   where it is exactly 0).
///
/// Paths:
/// - **CUDA** (`cuda` feature), f32, f16 and bf16: one [`Conv2d`] problem (NCHW) on cuDNN
///   through gemmbridge's engine, on candle's buffers and stream. Served in place where x, w
///   and the bias are contiguous (a start offset is fine: [`Served::Gemmbridge`]), after
///   copying them contiguous otherwise ([`Served::AfterCopy`]). The bias and ReLU are one
///   fused cuDNN graph where an engine takes it (else separate cuDNN calls); without a bias,
///   ReLU is candle's `relu` on the convolution's output. f32 is strict f32 (no TF32 engine);
///   f16 and bf16 accumulate in f32. The backward runs cuDNN's backward-data and
///   backward-filter convolutions on a contiguous copy of `g`; `db` is candle's sum of `g`
///   over `n`, `p`, `q` in f32, rounded once.
/// - **Everything else** ([`Served::Candle`], [`conv2d_candle`]): the CPU (gemmbridge has no
///   CPU convolution), f64, an empty output (`n = 0` or `k = 0`), problems past cuDNN's `int`
///   sizes, other devices and [`crate::set_enabled`]`(false)`. Its backward is candle's own
///   autograd, with candle 0.11's limit: with `stride > 1`, `dx` needs `h + 2·padding −
///   dilation·(r − 1) − 1` and the same for the width to leave one remainder modulo the
///   stride (candle's transposed convolution takes one output padding for both axes), else
///   candle's backward fails with a shape mismatch.
///
/// # Errors
/// Before anything runs, on every path, candle's `Error::Msg` starting `conv2d:` and naming the
/// values: x or w not 4-D; a stride, dilation or groups of 0; x, w and the bias of different
/// dtypes, or not a float dtype, or on different devices; x's channels not `w`'s
/// `c/groups · groups`; `k` not a multiple of the groups; a bias that is not `[k]`; a kernel
/// with no taps (`c/groups`, `r` or `s` of 0) or an image with none (`h` or `w` of 0); the
/// dilated kernel larger than the padded input. On CUDA, a gemmbridge error, wrapped (cuDNN
/// missing: `LibraryNotFound`, naming the files tried).
pub fn conv2d_served(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: ConvAct,
    params: Conv2dParams,
) -> Result<(Tensor, Served)> {
    let problem = check(x, w, bias, params)?;
    if let Some(served) = gemmbridge_path(x, w, bias, act, &problem)? {
        return Ok(served);
    }
    Ok((candle_conv(x, w, bias, act, params, problem.y_dims())?, Served::Candle))
}

/// The CUDA path where it takes the call ([`crate::cuda_conv::conv2d`]).
#[cfg(feature = "cuda")]
fn gemmbridge_path(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: ConvAct,
    problem: &Conv2d,
) -> Result<Option<(Tensor, Served)>> {
    if !(crate::device_served(x.device()) && x.device().is_cuda()) {
        return Ok(None);
    }
    crate::cuda_conv::conv2d(x, w, bias, act, problem)
}

/// Without the `cuda` feature no convolution is gemmbridge's.
#[cfg(not(feature = "cuda"))]
fn gemmbridge_path(
    _: &Tensor,
    _: &Tensor,
    _: Option<&Tensor>,
    _: ConvAct,
    _: &Conv2d,
) -> Result<Option<(Tensor, Served)>> {
    Ok(None)
}

/// candle's own convolution: `Tensor::conv2d`, the bias added per channel (`broadcast_add` of
/// `bias` as `[1, k, 1, 1]`) and `relu`, each rounded to x's dtype — what the fallback runs,
/// and what the tests compare with. On the CPU, f16 and bf16 are computed in f32 (the inputs
/// widened, so the backward is f32 too) and rounded once at the end: candle 0.11's CPU
/// convolution has no bf16 matmul, and in f16 its backward would sum the bias gradient in
/// f16. An empty output (`n = 0` or `k = 0`) is made as zeros without running anything.
/// Shapes, dtypes and errors as [`conv2d_served`]; output contiguous. Its backward is
/// candle's autograd through those operations (ReLU's derivative 1 where the pre-activation
/// is ≥ 0, and the stride limit [`conv2d_served`] names).
///
/// # Errors
/// As [`conv2d_served`]'s checks; candle's own errors.
pub fn conv2d_candle(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: ConvAct,
    params: Conv2dParams,
) -> Result<Tensor> {
    let problem = check(x, w, bias, params)?;
    candle_conv(x, w, bias, act, params, problem.y_dims())
}

/// [`conv2d_candle`] once the inputs are checked, its output `[n, k, p, q]` being `dims`.
fn candle_conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: ConvAct,
    params: Conv2dParams,
    dims: [usize; 4],
) -> Result<Tensor> {
    let dtype = x.dtype();
    if dims.contains(&0) {
        // n = 0 or k = 0: nothing to compute (candle's CPU convolution panics on some empty
        // batches)
        return Tensor::zeros(&dims[..], dtype, x.device());
    }
    let wide = x.device().is_cpu() && matches!(dtype, DType::F16 | DType::BF16);
    let cast = |t: &Tensor| if wide { t.to_dtype(DType::F32) } else { Ok(t.clone()) };
    let Conv2dParams { padding, stride, dilation, groups } = params;
    let y = cast(x)?.conv2d(&cast(w)?, padding, stride, dilation, groups)?;
    let y = match bias {
        Some(b) => y.broadcast_add(&cast(b)?.reshape((1, b.elem_count(), 1, 1))?)?,
        None => y,
    };
    let y = act.apply(y)?;
    if wide {
        y.to_dtype(dtype)
    } else {
        Ok(y)
    }
}

/// The named checks of [`conv2d_served`], then the problem they describe (NCHW, f32: the CUDA
/// path sets the precision).
pub(crate) fn check(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Conv2d> {
    let (xd, wd) = (x.dims(), w.dims());
    if xd.len() != 4 {
        candle_core::bail!("conv2d: x must be 4-D [n, c, h, w], not {xd:?}");
    }
    if wd.len() != 4 {
        candle_core::bail!("conv2d: w must be 4-D [k, c/groups, r, s], not {wd:?}");
    }
    let Conv2dParams { padding, stride, dilation, groups } = params;
    if stride == 0 || dilation == 0 || groups == 0 {
        candle_core::bail!("conv2d: stride {stride}, dilation {dilation} and groups {groups} must each be at least 1");
    }
    let bias_dtype = bias.map(Tensor::dtype);
    if w.dtype() != x.dtype() || bias_dtype.is_some_and(|d| d != x.dtype()) || !x.dtype().is_float() {
        let (xt, wt) = (x.dtype(), w.dtype());
        candle_core::bail!("conv2d: x ({xt:?}), w ({wt:?}) and bias ({bias_dtype:?}) must share one float dtype");
    }
    let dev = x.device();
    if !w.device().same_device(dev) || bias.is_some_and(|b| !b.device().same_device(dev)) {
        candle_core::bail!("conv2d: x, w and bias must be on one device");
    }
    let ([n, c, h, iw], [k, cg, r, s]) = ([xd[0], xd[1], xd[2], xd[3]], [wd[0], wd[1], wd[2], wd[3]]);
    if cg == 0 || r == 0 || s == 0 {
        candle_core::bail!("conv2d: w {wd:?} has no taps: c/groups, r and s must each be at least 1");
    }
    if h == 0 || iw == 0 {
        candle_core::bail!("conv2d: x {xd:?} has an empty image: h and w must each be at least 1");
    }
    if cg.checked_mul(groups) != Some(c) {
        candle_core::bail!("conv2d: x {xd:?} has {c} channels, w {wd:?} with groups {groups} takes {cg} × {groups}");
    }
    if !k.is_multiple_of(groups) {
        candle_core::bail!("conv2d: w {wd:?} has {k} filters, not a multiple of groups {groups}");
    }
    if let Some(b) = bias {
        if b.dims() != [k] {
            candle_core::bail!("conv2d: bias must be [{k}] (one value per filter of w {wd:?}), not {:?}", b.dims());
        }
    }
    // u128: no overflow for any usize values
    let padded = |size: usize| size as u128 + 2 * padding as u128;
    let span = |taps: usize| dilation as u128 * (taps as u128 - 1) + 1;
    if padded(h) < span(r) || padded(iw) < span(s) {
        candle_core::bail!(
            "conv2d: the dilated kernel {}×{} (w {wd:?}, dilation {dilation}) is larger than the padded input {}×{} \
             (x {xd:?}, padding {padding})",
            span(r),
            span(s),
            padded(h),
            padded(iw)
        );
    }
    // the output's height and width, and its elements: refused past 2³¹ − 1 each (cuDNN's
    // `int` extents) and past what an allocation can hold, before anything is allocated
    let out = |size: usize, taps: usize| (padded(size) - span(taps)) / stride as u128 + 1;
    let (p, q) = (out(h, r), out(iw, s));
    let elems = [k as u128, p, q].iter().try_fold(n as u128, |a, &b| a.checked_mul(b));
    if p > i32::MAX as u128 || q > i32::MAX as u128 || elems.is_none_or(|e| e > (isize::MAX as u128) / 8) {
        candle_core::bail!(
            "conv2d: the output [{n}, {k}, {p}, {q}] (x {xd:?}, w {wd:?}, padding {padding}, stride {stride}, \
             dilation {dilation}) is too large"
        );
    }
    Ok(Conv2d::new([n, c, h, iw], [k, r, s], Precision::F32)
        .with_pad(padding, padding)
        .with_stride(stride, stride)
        .with_dilation(dilation, dilation)
        .with_groups(groups)
        .with_layout(ConvLayout::Nchw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_problem_is_candles_geometry_in_nchw() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 6, 9, 10), DType::F32, &dev).unwrap();
        let w = Tensor::zeros((4, 3, 3, 2), DType::F32, &dev).unwrap();
        let p = check(&x, &w, None, Conv2dParams::new(1, 2, 2, 2)).unwrap();
        assert_eq!((p.x_dims(), p.w_dims()), ([2, 6, 9, 10], [4, 3, 3, 2]));
        assert_eq!((p.pad, p.stride, p.dilation, p.groups, p.layout), ([1, 1], [2, 2], [2, 2], 2, ConvLayout::Nchw));
        // (9 + 2 − 4 − 1) / 2 + 1 = 4, (10 + 2 − 2 − 1) / 2 + 1 = 5
        assert_eq!(p.y_dims(), [2, 4, 4, 5]);
        p.validate().unwrap();
        let cfg = candle_nn::Conv2dConfig { padding: 1, stride: 2, dilation: 2, groups: 2, cudnn_fwd_algo: None };
        assert_eq!(Conv2dParams::from(cfg), Conv2dParams::new(1, 2, 2, 2));
    }
}
