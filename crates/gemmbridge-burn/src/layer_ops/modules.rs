//! Modules with burn's module API and records: [`GemmRmsNorm`] (burn's `nn::RmsNorm` through
//! [`crate::rms_norm`]) and [`GemmSwiGluMlp`] (burn's `nn::SwiGlu` followed by a down
//! `nn::Linear`, the gate and up projections fused into one GEMM and [`crate::swiglu`]).

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Initializer, Module, ModuleDisplay, Param};
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig, RmsNormRecord, SwiGlu, SwiGluConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::LayerOps;
use crate::{GemmLinear, GemmOps};

/// Configuration of a [`GemmRmsNorm`]: `RmsNormConfig`'s fields and defaults.
#[derive(Config, Debug)]
pub struct GemmRmsNormConfig {
    /// Features normalised over (the last dimension).
    pub d_model: usize,
    /// ε added to the mean square (burn's default 1e-5).
    #[config(default = 1e-5)]
    pub epsilon: f64,
}

impl GemmRmsNormConfig {
    /// A new layer on `device`, initialised as `RmsNormConfig::init` does (`gamma` ones).
    ///
    /// # Panics
    /// As `RmsNormConfig::init`: `epsilon` not positive.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GemmRmsNorm<B> {
        RmsNormConfig::new(self.d_model).with_epsilon(self.epsilon).init(device).into()
    }
}

/// `y = x / √(mean(x²) + ε) · γ` over the last dimension: burn's `nn::RmsNorm` through
/// [`crate::rms_norm`] (gemmbridge's cuDNN norm graph on burn's CUDA backend, burn's ops
/// elsewhere; backward under `Autodiff`).
///
/// Same fields, same record as `nn::RmsNorm` (`gamma [d_model]`, `epsilon`): a record saved
/// from one loads into the other, and `From` converts both ways keeping the parameter. As in
/// burn, ε is a constant of the module: loading a record keeps the module's own ε (set it
/// through [`GemmRmsNormConfig`]).
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct GemmRmsNorm<B: Backend> {
    /// The scale `[d_model]`, as `nn::RmsNorm::gamma`.
    pub gamma: Param<Tensor<B, 1>>,
    /// ε, as `nn::RmsNorm::epsilon`.
    pub epsilon: f64,
}

impl<B: LayerOps> GemmRmsNorm<B> {
    /// `x [.., d_model]` → `[.., d_model]`, x's dtype (see [`crate::rms_norm`]; it panics as
    /// that does).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        crate::rms_norm(x, self.gamma.val(), self.epsilon)
    }
}

impl<B: Backend> From<RmsNorm<B>> for GemmRmsNorm<B> {
    fn from(n: RmsNorm<B>) -> Self {
        GemmRmsNorm { gamma: n.gamma, epsilon: n.epsilon }
    }
}

impl<B: Backend> From<GemmRmsNorm<B>> for RmsNorm<B> {
    fn from(n: GemmRmsNorm<B>) -> Self {
        RmsNorm { gamma: n.gamma, epsilon: n.epsilon }
    }
}

impl<B: Backend> From<RmsNormRecord<B>> for GemmRmsNormRecord<B> {
    fn from(r: RmsNormRecord<B>) -> Self {
        GemmRmsNormRecord { gamma: r.gamma, epsilon: r.epsilon }
    }
}

impl<B: Backend> From<GemmRmsNormRecord<B>> for RmsNormRecord<B> {
    fn from(r: GemmRmsNormRecord<B>) -> Self {
        RmsNormRecord { gamma: r.gamma, epsilon: r.epsilon }
    }
}

/// Displays as `nn::RmsNorm` does: `d_model`, `epsilon`.
impl<B: Backend> ModuleDisplay for GemmRmsNorm<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new().with_new_line_after_attribute(false).optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        let [d_model] = self.gamma.shape().dims();
        content.add("d_model", &d_model).add("epsilon", &self.epsilon).optional()
    }
}

/// Configuration of a [`GemmSwiGluMlp`]: `SwiGluConfig`'s fields (`d_input` is `d_model`,
/// `d_output` is `d_hidden`) and defaults, the down projection `d_hidden → d_model` with the
/// same bias choice and initializer.
#[derive(Config, Debug)]
pub struct GemmSwiGluMlpConfig {
    /// Input and output features.
    pub d_model: usize,
    /// The MLP's intermediate size `f` (the gate and up projections' outputs each).
    pub d_hidden: usize,
    /// Whether the projections have biases (burn's `SwiGluConfig` default: no).
    #[config(default = false)]
    pub bias: bool,
    /// Parameter initialisation (burn's default for `SwiGlu` and `Linear`).
    #[config(default = "Initializer::KaimingUniform{gain:1.0/3.0f64.sqrt(), fan_out_only:false}")]
    pub initializer: Initializer,
}

impl GemmSwiGluMlpConfig {
    /// A new MLP on `device`: `SwiGluConfig::init` (gate, then up), then `LinearConfig::init`
    /// for the down projection, fused by [`GemmSwiGluMlp::from_burn`] — so the same seed
    /// gives the same weights as those burn modules.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GemmSwiGluMlp<B> {
        let swiglu = SwiGluConfig::new(self.d_model, self.d_hidden)
            .with_bias(self.bias)
            .with_initializer(self.initializer.clone())
            .init(device);
        let down = LinearConfig::new(self.d_hidden, self.d_model)
            .with_bias(self.bias)
            .with_initializer(self.initializer.clone())
            .init(device);
        GemmSwiGluMlp::from_burn(swiglu, down)
    }
}

/// A LLaMA-style MLP, `down(silu(x·W_g + b_g) · (x·W_u + b_u))`, as burn's `nn::SwiGlu`
/// followed by a down `nn::Linear`, with the gate and up projections fused into one GEMM
/// (`gate_up`, weight `[d_model, 2·d_hidden]` = `[W_g | W_u]`) whose output [`crate::swiglu`]
/// reads in place; every GEMM through [`crate::linear`].
///
/// Shapes: `x [.., d_model]` → `[.., d_model]`. The record is this module's own (`gate_up`,
/// `down`, each `nn::Linear`'s record); [`GemmSwiGluMlp::from_burn`] and
/// [`GemmSwiGluMlp::into_burn`] convert from and to burn's modules, weights kept exactly.
#[derive(Module, Debug)]
pub struct GemmSwiGluMlp<B: Backend> {
    /// The fused gate/up projection: weight `[d_model, 2·d_hidden]` (gate columns first),
    /// bias `[2·d_hidden]` if any.
    pub gate_up: GemmLinear<B>,
    /// The down projection: weight `[d_hidden, d_model]`, bias `[d_model]` if any.
    pub down: GemmLinear<B>,
}

/// `a` and `b` side by side along dimension `dim`.
fn cat<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    Tensor::cat(vec![a, b], dim)
}

impl<B: Backend> GemmSwiGluMlp<B> {
    /// Fuses burn's `SwiGlu` (its `linear_inner`, the gate under silu, and `linear_outer`, the
    /// up projection) and a down `Linear` (`[d_hidden, d_model]`): the gate/up weight is the
    /// two weights side by side (`[d_model, 2·d_hidden]`), the bias the two biases (a missing
    /// one as zeros when only the other has one). The parameters are new `Param`s (new ids).
    ///
    /// # Panics
    /// The two `SwiGlu` projections' weights of different shapes, or a down projection whose
    /// input is not their output size.
    pub fn from_burn(swiglu: SwiGlu<B>, down: Linear<B>) -> Self {
        let (g, u) = (swiglu.linear_inner, swiglu.linear_outer);
        let (gw, uw) = (g.weight.val(), u.weight.val());
        assert_eq!(
            gw.dims(),
            uw.dims(),
            "gemmbridge_burn::GemmSwiGluMlp::from_burn: gate and up weights differ in shape"
        );
        let f = gw.dims()[1];
        assert_eq!(down.weight.dims()[0], f, "gemmbridge_burn::GemmSwiGluMlp::from_burn: down's input is not d_hidden");
        let bias = match (g.bias.map(|b| b.val()), u.bias.map(|b| b.val())) {
            (None, None) => None,
            (gb, ub) => {
                let device = gw.device();
                let or_zeros = |b: Option<Tensor<B, 1>>| b.unwrap_or_else(|| Tensor::zeros([f], &device));
                Some(Param::from_tensor(cat(or_zeros(gb), or_zeros(ub), 0).detach()))
            }
        };
        // detached: a parameter is a leaf (under `Autodiff` the concatenation is not one)
        let gate_up = GemmLinear { weight: Param::from_tensor(cat(gw, uw, 1).detach()), bias };
        GemmSwiGluMlp { gate_up, down: down.into() }
    }

    /// Splits the gate/up projection back into burn's `SwiGlu` (`linear_inner` the gate,
    /// `linear_outer` the up projection) and returns the down `Linear`; the weights are those
    /// of this module, exactly. The parameters are new `Param`s (new ids) except the down
    /// projection's.
    pub fn into_burn(self) -> (SwiGlu<B>, Linear<B>) {
        let w = self.gate_up.weight.val();
        let f = w.dims()[1] / 2;
        let half = |t: Tensor<B, 2>, i: usize| Param::from_tensor(t.narrow(1, i * f, f).detach());
        let bias = self.gate_up.bias.map(|b| b.val());
        let half_bias = |i: usize| bias.clone().map(|b| Param::from_tensor(b.narrow(0, i * f, f).detach()));
        let inner = Linear { weight: half(w.clone(), 0), bias: half_bias(0) };
        let outer = Linear { weight: half(w, 1), bias: half_bias(1) };
        (SwiGlu { linear_inner: inner, linear_outer: outer }, self.down.into())
    }

    /// The intermediate size `d_hidden`.
    pub fn d_hidden(&self) -> usize {
        self.gate_up.weight.dims()[1] / 2
    }
}

impl<B: GemmOps + LayerOps> GemmSwiGluMlp<B> {
    /// `x [.., d_model]` → `[.., d_model]`: the fused gate/up GEMM, SwiGLU, the down GEMM.
    ///
    /// # Panics
    /// As [`crate::linear`]: x's last dimension not `d_model`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.down.forward(crate::swiglu(self.gate_up.forward(x)))
    }
}
