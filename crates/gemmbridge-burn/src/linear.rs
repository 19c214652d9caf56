//! [`GemmLinear`]: burn's `nn::Linear` with its forward (and backward, under `Autodiff`)
//! through gemmbridge, the bias and an optional activation fused into the GEMM's epilogue.
//!
//! Same fields, same record: `GemmLinear<B>` has `nn::Linear<B>`'s `weight: Param<Tensor<B, 2>>`
//! (`[d_input, d_output]`) and `bias: Option<Param<Tensor<B, 1>>>` (`[d_output]`), so its
//! derived record serializes exactly as `LinearRecord<B>` and a file saved from one loads into
//! the other (tested in `tests/adapter/linear.rs`). [`GemmLinearConfig`] has `LinearConfig`'s fields
//! and defaults, and initialises through it, so the same seed gives the same weights.

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Initializer, Module, ModuleDisplay, Param};
use burn::nn::{Linear, LinearConfig, LinearLayout, LinearRecord};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::{Activation, GemmOps};

/// Configuration of a [`GemmLinear`]: `LinearConfig`'s fields and defaults.
#[derive(Config, Debug)]
pub struct GemmLinearConfig {
    /// Input features (`d_input`).
    pub d_input: usize,
    /// Output features (`d_output`).
    pub d_output: usize,
    /// Whether the layer has a bias `[d_output]`.
    #[config(default = true)]
    pub bias: bool,
    /// Parameter initialisation (burn's default for `Linear`).
    #[config(default = "Initializer::KaimingUniform{gain:1.0/3.0f64.sqrt(), fan_out_only:false}")]
    pub initializer: Initializer,
    /// How the weight is stored: `Row` (`[d_input, d_output]`, `op(B) = N`) or `Col`
    /// (`[d_output, d_input]` storage seen through a transposed view, `op(B) = T`).
    #[config(default = "LinearLayout::Row")]
    pub layout: LinearLayout,
}

impl GemmLinearConfig {
    /// A new layer on `device`, initialised exactly as `LinearConfig::init` would.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GemmLinear<B> {
        LinearConfig {
            d_input: self.d_input,
            d_output: self.d_output,
            bias: self.bias,
            initializer: self.initializer.clone(),
            layout: self.layout,
        }
        .init(device)
        .into()
    }
}

/// `y = act(x·W + b)`: burn's `nn::Linear` through gemmbridge.
///
/// Shapes: `x [.., d_input]` → `y [.., d_output]`; `weight [d_input, d_output]`, `bias
/// [d_output]`. Falls back to burn's `linear` wherever gemmbridge cannot serve (see
/// [`crate::linear`]).
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct GemmLinear<B: Backend> {
    /// `[d_input, d_output]`, as `nn::Linear::weight`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_output]`, as `nn::Linear::bias`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: GemmOps> GemmLinear<B> {
    /// `x·W + b`, as `nn::Linear::forward`: `x [.., d_input]` → `[.., d_output]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_activation(x, Activation::None)
    }

    /// `act(x·W + b)` with the activation fused into the GEMM's epilogue (see
    /// [`Activation`]: GELU-erf follows the GEMM as burn's op; under `Autodiff` a tracked call
    /// applies any activation as burn's op).
    pub fn forward_activation<const D: usize>(&self, x: Tensor<B, D>, act: Activation) -> Tensor<B, D> {
        crate::linear(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()), act)
    }
}

impl<B: Backend> From<Linear<B>> for GemmLinear<B> {
    fn from(l: Linear<B>) -> Self {
        GemmLinear { weight: l.weight, bias: l.bias }
    }
}

impl<B: Backend> From<GemmLinear<B>> for Linear<B> {
    fn from(l: GemmLinear<B>) -> Self {
        Linear { weight: l.weight, bias: l.bias }
    }
}

impl<B: Backend> From<LinearRecord<B>> for GemmLinearRecord<B> {
    fn from(r: LinearRecord<B>) -> Self {
        GemmLinearRecord { weight: r.weight, bias: r.bias }
    }
}

impl<B: Backend> From<GemmLinearRecord<B>> for LinearRecord<B> {
    fn from(r: GemmLinearRecord<B>) -> Self {
        LinearRecord { weight: r.weight, bias: r.bias }
    }
}

/// Displays as `nn::Linear` does: `d_input`, `d_output`, `bias`.
impl<B: Backend> ModuleDisplay for GemmLinear<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new().with_new_line_after_attribute(false).optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        let [d_input, d_output] = self.weight.shape().dims();
        content.add("d_input", &d_input).add("d_output", &d_output).add("bias", &self.bias.is_some()).optional()
    }
}
