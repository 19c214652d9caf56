//! The problems one step of a [`DecoderLayer`] is made of, as data: its four projections and
//! their backward GEMMs ([`LayerGemms`]), its RMSNorm, RoPE and SwiGLU ([`DecoderLayer::norm_problem`],
//! [`DecoderLayer::rope_problem`], [`DecoderLayer::swiglu_problem`]) and its attention
//! ([`DecoderLayer::attention`]). The CPU layer ([`crate::layer::cpu::CpuDecoderLayer`]) and the GPU
//! layer run exactly these.

use super::{DecoderLayer, LayerWeight, Tokens};
use crate::error::{Error, Result};
use crate::fp8::Scaling;
use crate::layer_ops::{GluLayout, Rope, SwiGlu};
use crate::layout::{MatrixLayout, Operand};
use crate::norm::{GradType, RmsNorm};
use crate::precision::Precision;
use crate::problem::GemmProblem;

/// How a layer runs beyond its sizes: the same for the CPU layer
/// ([`crate::layer::cpu::CpuDecoderLayer`]) and the GPU layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerOptions {
    /// `Some(scaling)`: the four forward projections (`qkv`, `o`, `gate_up`, `down`) take FP8
    /// E4M3 operands quantised with the recipe `scaling` for both — [`Scaling::Tensor`] or
    /// [`Scaling::Row`] (cuBLASLt's tensor·tensor and row·row pairs), with
    /// [`crate::fp8::quantize`]'s rounding — and accumulate in f32, the layer's dtype out, the
    /// residuals added as the GEMM's C: the weights quantised once at construction, each
    /// activation by every forward (on the GPU into an FP8 buffer made at construction:
    /// tensor-wise two passes over the activation, row-wise one). The backward stays in the
    /// layer's dtype, on the unquantised activations. On the GPU where it and cuBLASLt offer
    /// the recipe ([`crate::fp8::check_support`]: Hopper). `None` (the default): every GEMM in
    /// the layer's dtype.
    pub fp8_forward: Option<Scaling>,
}

impl LayerOptions {
    /// The rule on the options: an FP8 recipe is tensor- or row-wise.
    ///
    /// # Errors
    /// [`Error::Fp8`] ([`crate::fp8::Fp8Rule::ScalingPair`]) for another recipe.
    pub fn validate(&self) -> Result<()> {
        match self.fp8_forward {
            Some(s) if !matches!(s, Scaling::Tensor | Scaling::Row) => Err(Error::Fp8 {
                rule: crate::fp8::Fp8Rule::ScalingPair,
                detail: format!(
                    "the decoder layer's FP8 forward takes the tensor-wise or the row-wise recipe (both operands \
                     alike), not {}",
                    s.name()
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// One step of the layer: the description the float64 reference ([`super::reference`]), the
/// CPU layer ([`super::cpu::CpuDecoderLayer`]) and the GPU layer all follow, in the order
/// [`FORWARD`] gives, the backward in its reverse ([`BACKWARD`]), each step on its problem
/// ([`DecoderLayer::gemms`], [`DecoderLayer::norm_problem`], [`DecoderLayer::rope_problem`],
/// [`DecoderLayer::attention`], [`DecoderLayer::swiglu_problem`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `h1 = rms_norm(x)∘w_norm1`; backward: `dx`, `dw_norm1`, then `dx += dx2` (the residual).
    Norm1,
    /// A projection ([`Proj`], its residual as the GEMM's C where it has one); backward: its
    /// weight and data gradients.
    Project(Proj),
    /// RoPE on q and k of `qkv`; backward: the opposite rotation of `dqkv`.
    Rope,
    /// Causal attention `qkv → o` (and `lse`); backward: `do → dqkv`.
    Attention,
    /// `h2 = rms_norm(x2)∘w_norm2`; backward: `dx2`, `dw_norm2`, then `dx2 += dy` (the residual).
    Norm2,
    /// `act = silu(gate)∘up`; backward: `d_act → d_gu`.
    SwiGlu,
}

/// A forward's steps, in order.
pub const FORWARD: [Step; 9] = [
    Step::Norm1,
    Step::Project(Proj::Qkv),
    Step::Rope,
    Step::Attention,
    Step::Project(Proj::O),
    Step::Norm2,
    Step::Project(Proj::GateUp),
    Step::SwiGlu,
    Step::Project(Proj::Down),
];

/// A backward's steps: [`FORWARD`] reversed.
pub const BACKWARD: [Step; 9] = {
    let mut b = FORWARD;
    let mut i = 0;
    while i < 9 {
        b[i] = FORWARD[8 - i];
        i += 1;
    }
    b
};

/// The steps after attention, which a decode step shares with the layer ([`FORWARD`] from the O
/// projection on).
pub const AFTER_ATTENTION: usize = 4;

/// One of the four projections, in the order of a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    /// `qkv = h1·w_qkvᵀ`.
    Qkv = 0,
    /// `x2 = x + o·w_oᵀ`.
    O = 1,
    /// `gu = h2·w_gate_upᵀ`.
    GateUp = 2,
    /// `y = x2 + act·w_downᵀ`.
    Down = 3,
}

impl Proj {
    /// The four, in the order of a forward.
    pub const ALL: [Proj; 4] = [Proj::Qkv, Proj::O, Proj::GateUp, Proj::Down];

    /// The weight this projection multiplies by.
    pub const fn weight(self) -> LayerWeight {
        match self {
            Proj::Qkv => LayerWeight::Qkv,
            Proj::O => LayerWeight::O,
            Proj::GateUp => LayerWeight::GateUp,
            Proj::Down => LayerWeight::Down,
        }
    }
}

/// The GEMMs of one step on `T` tokens, each projection `Y[T, out] = X[T, in]·W[out, in]ᵀ`
/// ([`GemmProblem::linear`]) with its data gradient `dX[T, in] = dY·W`
/// ([`GemmProblem::matmul`]) and its weight gradient `dW[out, in] = dYᵀ·X` (op(A) = T), all
/// row-major and contiguous, indexed by [`Proj`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerGemms {
    /// The forward projections.
    pub fwd: [GemmProblem; 4],
    /// The data gradients.
    pub dx: [GemmProblem; 4],
    /// The weight gradients.
    pub dw: [GemmProblem; 4],
}

impl DecoderLayer {
    /// `(out, in)` of a projection's weight.
    pub const fn proj_shape(&self, p: Proj) -> (usize, usize) {
        match p {
            Proj::Qkv => (self.qkv_width(), self.d_model),
            Proj::O => (self.d_model, self.q_width()),
            // saturating, as the size helpers of `DecoderLayer` are: `gemms` then refuses it
            Proj::GateUp => (self.ffn.saturating_mul(2), self.d_model),
            Proj::Down => (self.d_model, self.ffn),
        }
    }

    /// The step's GEMMs on `t` tokens in `precision`.
    ///
    /// # Errors
    /// As [`GemmProblem::new`] (a size past [`crate::MAX_DIM`]).
    pub fn gemms(&self, t: Tokens, precision: Precision) -> Result<LayerGemms> {
        let n = t.count();
        let fwd = |p: Proj| {
            let (o, i) = self.proj_shape(p);
            GemmProblem::linear(n, o, i, precision)
        };
        let dx = |p: Proj| {
            let (o, i) = self.proj_shape(p);
            GemmProblem::matmul(n, i, o, precision)
        };
        let dw = |p: Proj| {
            let (o, i) = self.proj_shape(p);
            let (a, b) = (Operand::t(MatrixLayout::row_major(n, o)), Operand::n(MatrixLayout::row_major(n, i)));
            GemmProblem::new(a, b, MatrixLayout::row_major(o, i), 1, precision)
        };
        let all = |f: &dyn Fn(Proj) -> Result<GemmProblem>| -> Result<[GemmProblem; 4]> {
            Ok([f(Proj::Qkv)?, f(Proj::O)?, f(Proj::GateUp)?, f(Proj::Down)?])
        };
        Ok(LayerGemms { fwd: all(&fwd)?, dx: all(&dx)?, dw: all(&dw)? })
    }

    /// Either RMSNorm of `t` tokens: `T` rows of `d`, the layer's ε (rounded to f32, as the
    /// norm's arithmetic is), contiguous, the weight gradient in `dw`.
    pub fn norm_problem(&self, t: Tokens, dw: GradType) -> RmsNorm {
        RmsNorm::new(t.count(), self.d_model, self.eps as f32, self.dtype).with_dw(dw)
    }

    /// RoPE on the fused `qkv[T, (h_q + 2·h_kv)·hd]` of `t` tokens: every element of the
    /// `h_q` query and `h_kv` key heads rotated (value heads untouched), the layer's style and
    /// θ, position = the token's place in its sequence (`Positions::Contiguous { start: 0 }`).
    pub fn rope_problem(&self, t: Tokens) -> Rope {
        Rope::new(t.b, t.s, (self.heads_q, self.heads_kv), self.head_dim)
            .with_style(self.rope)
            .with_theta(self.rope_theta, None)
    }

    /// SwiGLU over `gu[T, 2·ffn]` of `t` tokens: gate the first half of each row, up the
    /// second ([`GluLayout::Halves`], the order of `w_gate_up`'s rows), `act[T, ffn]`.
    pub fn swiglu_problem(&self, t: Tokens) -> SwiGlu {
        SwiGlu::new(t.count(), self.ffn, GluLayout::Halves)
    }
}
