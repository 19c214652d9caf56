//! [`GemmAttention`]: multi-head (and grouped-query) attention with its projections, the
//! attention through [`super::attention`] and the projections through [`GemmLinear`].
//!
//! It maps from burn's `nn::attention::MultiHeadAttention` (same four projections, same
//! fields' names, so burn's record of one loads into the other; tested in
//! `tests/adapter/attention/cpu.rs`), whose forward it equals where that module's semantics
//! are expressible here: no `quiet_softmax`, dropout not applied (burn applies it only while
//! training, to the scores before the softmax), a padding mask that hides a suffix of each
//! sequence's keys ([`AttnMask::Lengths`]; burn fills hidden scores with `min_float`, −10⁴ by
//! default, here they are −∞: the same softmax unless every key of a row is hidden, which
//! [`AttnMask`] cannot express), and burn's attention weights, which a fused kernel never
//! materialises, not returned.

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::attention::MultiHeadAttention;
use burn::nn::{DropoutConfig, Gelu, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::{attention, AttentionOps, AttnMask};
use crate::{GemmLinear, GemmOps};

/// Configuration of a [`GemmAttention`]: `MultiHeadAttentionConfig`'s `d_model`, `n_heads` and
/// `initializer` (same default), and the key/value heads of grouped-query attention.
#[derive(Config, Debug)]
pub struct GemmAttentionConfig {
    /// Model width: the inputs' and the output's last dimension.
    pub d_model: usize,
    /// Query heads; `d_model` is a multiple of it (head dimension `d_k = d_model / n_heads`).
    pub n_heads: usize,
    /// Key/value heads (`n_heads` a multiple of it); `None`: `n_heads` (multi-head attention).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Whether the four projections have biases (burn's `MultiHeadAttention`'s do).
    #[config(default = true)]
    pub bias: bool,
    /// Parameter initialisation (burn's default for `MultiHeadAttention`).
    #[config(default = "Initializer::KaimingUniform{gain:1.0/3.0f64.sqrt(), fan_out_only:false}")]
    pub initializer: Initializer,
}

impl GemmAttentionConfig {
    /// A new module on `device`, its projections initialised in `MultiHeadAttentionConfig::init`'s
    /// order (query, key, value, output), so that with `n_kv_heads` unset, biases on and the same
    /// seed it has the weights burn's module would have.
    ///
    /// # Panics
    /// `n_heads` zero or not dividing `d_model`; `n_kv_heads` zero or not dividing `n_heads`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GemmAttention<B> {
        let (h, kv) = (self.n_heads, self.n_kv_heads.unwrap_or(self.n_heads));
        assert!(
            h > 0 && self.d_model.is_multiple_of(h),
            "GemmAttentionConfig: d_model = {} is not a multiple of n_heads = {h}",
            self.d_model
        );
        assert!(
            kv > 0 && h.is_multiple_of(kv),
            "GemmAttentionConfig: n_heads = {h} is not a multiple of n_kv_heads = {kv}"
        );
        let d_k = self.d_model / h;
        let linear = |d_in, d_out| {
            let c = LinearConfig::new(d_in, d_out).with_bias(self.bias).with_initializer(self.initializer.clone());
            GemmLinear::from(c.init(device))
        };
        GemmAttention {
            query: linear(self.d_model, h * d_k),
            key: linear(self.d_model, kv * d_k),
            value: linear(self.d_model, kv * d_k),
            output: linear(h * d_k, self.d_model),
            n_heads: h,
        }
    }
}

/// `output(attention(query(x_q), key(x_k), value(x_v), mask))` with the projections split into
/// heads: `x_q[b, s_q, d_model]`, `x_k`, `x_v[b, s_kv, d_model]` → `[b, s_q, d_model]`.
///
/// Weights (as `nn::Linear`, `[d_input, d_output]`): `query [d_model, n_heads·d_k]`, `key`
/// and `value [d_model, n_kv_heads·d_k]`, `output [n_heads·d_k, d_model]`. The projections'
/// outputs `[b, s, h, d_k]` are handed to the attention as `[b, h, s, d_k]` views (read in
/// place by cuDNN); the attention's output is made `[b, s_q, n_heads·d_k]` (one copy) for
/// the output projection. Paths and dtypes: [`crate::linear`] and [`attention`] (cuDNN for
/// f16/bf16 with `d_k` a multiple of 8 up to 256 on burn's CUDA backend, burn's ops
/// elsewhere).
#[derive(Module, Debug)]
pub struct GemmAttention<B: Backend> {
    /// Query projection `[d_model, n_heads·d_k]`, as `MultiHeadAttention::query`.
    pub query: GemmLinear<B>,
    /// Key projection `[d_model, n_kv_heads·d_k]`, as `MultiHeadAttention::key`.
    pub key: GemmLinear<B>,
    /// Value projection `[d_model, n_kv_heads·d_k]`, as `MultiHeadAttention::value`.
    pub value: GemmLinear<B>,
    /// Output projection `[n_heads·d_k, d_model]`, as `MultiHeadAttention::output`.
    pub output: GemmLinear<B>,
    /// Query heads (`d_k` and the key/value heads follow from the weights' shapes).
    pub n_heads: usize,
}

impl<B: Backend> GemmAttention<B> {
    /// The head dimension `d_k`.
    pub fn d_k(&self) -> usize {
        self.query.weight.shape().dims::<2>()[1] / self.n_heads
    }

    /// The key/value heads.
    pub fn n_kv_heads(&self) -> usize {
        self.key.weight.shape().dims::<2>()[1] / self.d_k()
    }
}

impl<B: GemmOps + AttentionOps> GemmAttention<B> {
    /// Attention of `x_q[b, s_q, d_model]` over `x_k`, `x_v[b, s_kv, d_model]` under `mask`:
    /// `[b, s_q, d_model]`.
    ///
    /// # Panics
    /// As [`crate::linear`] and [`attention`] (shapes that do not agree, a mask's lengths).
    pub fn forward(&self, x_q: Tensor<B, 3>, x_k: Tensor<B, 3>, x_v: Tensor<B, 3>, mask: AttnMask) -> Tensor<B, 3> {
        let (h, kv, d_k) = (self.n_heads, self.n_kv_heads(), self.d_k());
        let [b, s_q, _] = x_q.dims();
        let heads = |x: Tensor<B, 3>, proj: &GemmLinear<B>, n: usize| {
            let [b, s, _] = x.dims();
            proj.forward(x).reshape([b, s, n, d_k]).swap_dims(1, 2)
        };
        let (q, k, v) = (heads(x_q, &self.query, h), heads(x_k, &self.key, kv), heads(x_v, &self.value, kv));
        let o = attention(q, k, v, mask).swap_dims(1, 2).reshape([b, s_q, h * d_k]);
        self.output.forward(o)
    }

    /// Self-attention: [`GemmAttention::forward`] with `x` as queries, keys and values.
    pub fn self_attention(&self, x: Tensor<B, 3>, mask: AttnMask) -> Tensor<B, 3> {
        self.forward(x.clone(), x.clone(), x, mask)
    }
}

/// Why a module does not convert between burn's `MultiHeadAttention` and [`GemmAttention`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MhaConversionError {
    /// burn's module uses `quiet_softmax` (a softmax with an extra 1 in its denominator), which
    /// cuDNN's attention does not compute.
    QuietSoftmax,
    /// Grouped key/value heads, which burn's module does not have.
    GroupedHeads {
        /// Query heads.
        n_heads: usize,
        /// Key/value heads.
        n_kv_heads: usize,
    },
}

impl std::fmt::Display for MhaConversionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MhaConversionError::QuietSoftmax => {
                f.write_str("MultiHeadAttention uses quiet_softmax, which GemmAttention does not compute")
            }
            MhaConversionError::GroupedHeads { n_heads, n_kv_heads } => write!(
                f,
                "GemmAttention has {n_kv_heads} key/value heads for {n_heads} query heads; MultiHeadAttention has no grouped heads"
            ),
        }
    }
}

impl std::error::Error for MhaConversionError {}

/// burn's module's projections and heads; its dropout and `min_float` are dropped (see the
/// module documentation).
impl<B: Backend> TryFrom<MultiHeadAttention<B>> for GemmAttention<B> {
    type Error = MhaConversionError;

    fn try_from(m: MultiHeadAttention<B>) -> Result<Self, MhaConversionError> {
        if m.quiet_softmax {
            return Err(MhaConversionError::QuietSoftmax);
        }
        Ok(GemmAttention {
            query: m.query.into(),
            key: m.key.into(),
            value: m.value.into(),
            output: m.output.into(),
            n_heads: m.n_heads,
        })
    }
}

/// Into burn's module with its defaults for what this one lacks: dropout 0, `min_float` −10⁴,
/// no `quiet_softmax`.
impl<B: Backend> TryFrom<GemmAttention<B>> for MultiHeadAttention<B> {
    type Error = MhaConversionError;

    fn try_from(m: GemmAttention<B>) -> Result<Self, MhaConversionError> {
        let (n_heads, n_kv_heads, d_k) = (m.n_heads, m.n_kv_heads(), m.d_k());
        if n_kv_heads != n_heads {
            return Err(MhaConversionError::GroupedHeads { n_heads, n_kv_heads });
        }
        let d_model = m.query.weight.shape().dims::<2>()[0];
        Ok(MultiHeadAttention {
            query: m.query.into(),
            key: m.key.into(),
            value: m.value.into(),
            output: m.output.into(),
            dropout: DropoutConfig::new(0.0).init(),
            activation: Gelu::new(),
            d_model,
            n_heads,
            d_k,
            min_float: -1.0e4,
            quiet_softmax: false,
        })
    }
}
