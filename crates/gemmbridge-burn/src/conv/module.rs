//! [`GemmConv2d`]: burn's `nn::conv::Conv2d` (same fields, same record) through
//! [`super::conv2d`], with an optional fused ReLU.

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Initializer, Module, ModuleDisplay, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig, Conv2dRecord};
use burn::nn::PaddingConfig2d;
use burn::tensor::backend::Backend;
use burn::tensor::ops::PaddedConvOptions;
use burn::tensor::Tensor;

use super::{conv2d, ConvActivation, ConvOps};

/// Configuration of a [`GemmConv2d`]: `Conv2dConfig`'s fields and defaults.
#[derive(Config, Debug)]
pub struct GemmConv2dConfig {
    /// `[channels_in, channels_out]`.
    pub channels: [usize; 2],
    /// `[r, s]`: the kernel's height and width.
    pub kernel_size: [usize; 2],
    /// `[stride_h, stride_w]`.
    #[config(default = "[1, 1]")]
    pub stride: [usize; 2],
    /// `[dil_h, dil_w]`: the spacing of the kernel's taps.
    #[config(default = "[1, 1]")]
    pub dilation: [usize; 2],
    /// Groups: both channel counts are multiples of it.
    #[config(default = "1")]
    pub groups: usize,
    /// burn's padding: `Valid`, `Explicit(top, left, bottom, right)` or `Same` (burn's
    /// formula, from the kernel size and stride; odd totals put the extra row or column at the
    /// bottom or right).
    #[config(default = "PaddingConfig2d::Valid")]
    pub padding: PaddingConfig2d,
    /// Whether the layer adds a bias.
    #[config(default = true)]
    pub bias: bool,
    /// Parameter initialisation (burn's default for `Conv2d`).
    #[config(default = "Initializer::KaimingUniform{gain:1.0/3.0f64.sqrt(), fan_out_only:false}")]
    pub initializer: Initializer,
}

impl GemmConv2dConfig {
    /// A new layer on `device`, initialised as `Conv2dConfig::init` does (the same seed gives
    /// the same weights).
    ///
    /// # Panics
    /// As `Conv2dConfig::init`: `channels_in` not a multiple of the groups.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GemmConv2d<B> {
        Conv2dConfig::new(self.channels, self.kernel_size)
            .with_stride(self.stride)
            .with_dilation(self.dilation)
            .with_groups(self.groups)
            .with_padding(self.padding.clone())
            .with_bias(self.bias)
            .with_initializer(self.initializer.clone())
            .init(device)
            .into()
    }
}

/// A 2-D convolution layer: burn's `nn::conv::Conv2d` through [`super::conv2d`] (gemmbridge's
/// cuDNN convolutions on burn's CUDA backend, burn's own elsewhere; backward under
/// `Autodiff`), with [`GemmConv2d::forward_relu`] fusing a ReLU after the bias.
///
/// Same fields, same record as `nn::conv::Conv2d` (`weight [channels_out, channels_in/groups,
/// r, s]`, `bias [channels_out]` if any, `stride`, `kernel_size`, `dilation`, `groups`,
/// `padding`): a record saved from one loads into the other, and `From` converts both ways
/// keeping the parameters (and their ids).
///
/// Padding: burn's `PaddingConfig2d` resolved per input as burn's `Conv2d` does; symmetric
/// padding is the convolution's own, asymmetric padding (`Explicit` with different sides, or
/// `Same` with an even total) pads x with zeros first (burn's `pad`, one copy), then
/// convolves without padding, as burn does.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct GemmConv2d<B: Backend> {
    /// `[channels_out, channels_in / groups, r, s]`, as `Conv2d::weight`.
    pub weight: Param<Tensor<B, 4>>,
    /// `[channels_out]`, as `Conv2d::bias`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// `[stride_h, stride_w]`.
    pub stride: [usize; 2],
    /// `[r, s]`.
    pub kernel_size: [usize; 2],
    /// `[dil_h, dil_w]`.
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
    /// burn's padding configuration.
    pub padding: PaddingConfig2d,
}

/// burn's "same" padding along one axis: `(start, end)`, the extra one at the end.
fn same_padding(kernel: usize, stride: usize, size: usize) -> (usize, usize) {
    let out = size.div_ceil(stride.max(1));
    let total = match out {
        0 => 0,
        _ => ((out - 1) * stride + kernel).saturating_sub(size),
    };
    (total / 2, total - total / 2)
}

impl<B: Backend> GemmConv2d<B> {
    /// The options for an input of `h × w`: burn's padding resolved as `nn::conv::Conv2d`
    /// resolves it.
    pub fn options(&self, [h, w]: [usize; 2]) -> PaddedConvOptions<2> {
        let ((top, bottom), (left, right)) = match self.padding {
            PaddingConfig2d::Valid => ((0, 0), (0, 0)),
            PaddingConfig2d::Explicit(top, left, bottom, right) => ((top, bottom), (left, right)),
            PaddingConfig2d::Same => (
                same_padding(self.kernel_size[0], self.stride[0], h),
                same_padding(self.kernel_size[1], self.stride[1], w),
            ),
        };
        PaddedConvOptions::asymmetric(self.stride, [top, left], [bottom, right], self.dilation, self.groups)
    }
}

impl<B: ConvOps> GemmConv2d<B> {
    /// `x[n, channels_in, h, w]` → `[n, channels_out, p, q]`, x's dtype: the convolution plus
    /// the bias, as `nn::conv::Conv2d::forward` (see [`super::conv2d`] for the paths; it
    /// panics as that does).
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.run(x, ConvActivation::Identity)
    }

    /// `relu(forward(x))`, the bias and ReLU fused into the convolution where gemmbridge
    /// serves (ReLU's gradient passes where the output is positive).
    pub fn forward_relu(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.run(x, ConvActivation::Relu)
    }

    fn run(&self, x: Tensor<B, 4>, act: ConvActivation) -> Tensor<B, 4> {
        let [_, _, h, w] = x.dims();
        conv2d(x, self.weight.val(), self.bias.as_ref().map(Param::val), self.options([h, w]), act)
    }
}

impl<B: Backend> From<Conv2d<B>> for GemmConv2d<B> {
    fn from(c: Conv2d<B>) -> Self {
        let Conv2d { weight, bias, stride, kernel_size, dilation, groups, padding } = c;
        GemmConv2d { weight, bias, stride, kernel_size, dilation, groups, padding }
    }
}

impl<B: Backend> From<GemmConv2d<B>> for Conv2d<B> {
    fn from(c: GemmConv2d<B>) -> Self {
        let GemmConv2d { weight, bias, stride, kernel_size, dilation, groups, padding } = c;
        Conv2d { weight, bias, stride, kernel_size, dilation, groups, padding }
    }
}

impl<B: Backend> From<Conv2dRecord<B>> for GemmConv2dRecord<B> {
    fn from(r: Conv2dRecord<B>) -> Self {
        let Conv2dRecord { weight, bias, stride, kernel_size, dilation, groups, padding } = r;
        GemmConv2dRecord { weight, bias, stride, kernel_size, dilation, groups, padding }
    }
}

impl<B: Backend> From<GemmConv2dRecord<B>> for Conv2dRecord<B> {
    fn from(r: GemmConv2dRecord<B>) -> Self {
        let GemmConv2dRecord { weight, bias, stride, kernel_size, dilation, groups, padding } = r;
        Conv2dRecord { weight, bias, stride, kernel_size, dilation, groups, padding }
    }
}

/// Displays as `nn::conv::Conv2d` does: channels, stride, kernel size, dilation, groups,
/// padding.
impl<B: Backend> ModuleDisplay for GemmConv2d<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new().with_new_line_after_attribute(false).optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        let [ch_out, ch_in_group, _, _] = self.weight.dims();
        content
            .add("ch_in", &format!("{:?}", ch_in_group * self.groups))
            .add("ch_out", &format!("{ch_out:?}"))
            .add("stride", &format!("{:?}", self.stride))
            .add("kernel_size", &format!("{:?}", self.kernel_size))
            .add("dilation", &format!("{:?}", self.dilation))
            .add("groups", &self.groups)
            .add_debug_attribute("padding", &self.padding)
            .optional()
    }
}

#[cfg(test)]
mod tests {
    use super::same_padding;

    #[test]
    fn same_padding_is_burns() {
        // kernel 3, stride 1: one on each side; kernel 4: 1 before, 2 after
        assert_eq!(same_padding(3, 1, 10), (1, 1));
        assert_eq!(same_padding(4, 1, 10), (1, 2));
        // stride 2 on 7: out 4, needs 3·2 + 3 = 9, total 2
        assert_eq!(same_padding(3, 2, 7), (1, 1));
        assert_eq!(same_padding(1, 1, 5), (0, 0));
    }
}
