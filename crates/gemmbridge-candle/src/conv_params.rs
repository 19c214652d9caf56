//! The arguments of [`crate::conv2d`] beside its tensors: the geometry ([`Conv2dParams`]) and
//! the fused activation ([`ConvAct`]), which the CUDA path and candle's fallback both apply.

use candle_core::{Result, Tensor};

/// The activation fused into [`crate::conv2d`]'s forward: `y = act(x ⋆ w + bias)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConvAct {
    /// None.
    #[default]
    None,
    /// `max(·, 0)`.
    Relu,
}

impl ConvAct {
    /// The activation on `y` by candle's own operations (`relu`).
    pub(crate) fn apply(self, y: Tensor) -> Result<Tensor> {
        match self {
            ConvAct::None => Ok(y),
            ConvAct::Relu => y.relu(),
        }
    }
}

/// A convolution's geometry, as candle's `Tensor::conv2d(kernel, padding, stride, dilation,
/// groups)` takes it (the same value for the height and the width): zero `padding` on each
/// side, `stride`, `dilation` (the kernel taps' spacing) and `groups` (the channels split into
/// that many independent convolutions; `groups = c = k` is a depthwise convolution).
/// [`Default`] is padding 0, stride 1, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Zeros added on each side of the height and the width.
    pub padding: usize,
    /// The step between output positions, at least 1.
    pub stride: usize,
    /// The spacing of the kernel's taps, at least 1.
    pub dilation: usize,
    /// The groups, at least 1; `c` and `k` must be multiples of it.
    pub groups: usize,
}

impl Conv2dParams {
    /// `padding`, `stride`, `dilation` and `groups`, in the order of candle's `Tensor::conv2d`.
    pub const fn new(padding: usize, stride: usize, dilation: usize, groups: usize) -> Self {
        Conv2dParams { padding, stride, dilation, groups }
    }
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams::new(0, 1, 1, 1)
    }
}

impl From<candle_nn::Conv2dConfig> for Conv2dParams {
    /// candle-nn's configuration (its cuDNN algorithm choice is not used).
    fn from(c: candle_nn::Conv2dConfig) -> Self {
        Conv2dParams::new(c.padding, c.stride, c.dilation, c.groups)
    }
}
