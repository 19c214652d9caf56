//! FP8 training: how [`crate::cuda::train::Mlp::new_fp8`] quantises each GEMM of a step.
//!
//! Every GEMM of an FP8 layer runs on the FP8 tensor cores with f32 accumulation and a
//! high-precision (bf16 or f16) output; the operands are quantised on the GPU just before it
//! from the layer's high-precision tensors, with scales computed from those tensors themselves
//! ("current scaling", Transformer Engine's `Float8CurrentScaling`). For layer `i` with input
//! `h[tokens, in]`, weight `w[out, in]` and pre-activation gradient `g[tokens, out]`:
//!
//! | GEMM | x operand (`[M, K]`) | w operand (`[N, K]`) | output |
//! |---|---|---|---|
//! | forward `y = h·wᵀ + b` | `h`, [`Fp8Training::activations`] | `w`, `activations` | `y[tokens, out]`, bias fused |
//! | data gradient `dh = g·w` | `g`, [`Fp8Training::gradients`] | `wᵀ` (`[in, out]`), `activations` | `dh[tokens, in]` |
//! | weight gradient `dw = gᵀ·h` | `gᵀ` (`[out, tokens]`), `gradients` | `hᵀ` (`[in, tokens]`), `activations` | `dw[out, in]` (β = 1 accumulates) |
//!
//! The transposed operands are made by the quantisation kernels' transposed source
//! ([`crate::fp8::Source::Transposed`]), so no high-precision transpose is stored. K is padded
//! with zeros where it is not a multiple of 16 (tokens, for the weight gradient), which keeps
//! every product exact. The bias gradient `db = Σ_tokens g` is a high-precision GEMM
//! (`ones[1, tokens]·g`, f32 accumulation; β = 1 accumulates), not an FP8 one: a sum of a
//! quantised `g` would add FP8's error to it for no gain. Activations are applied by
//! gemmbridge's elementwise kernels in high precision (forward and backward), never in FP8.
//!
//! Defaults: E4M3 forward operands, E5M2 gradients (the "hybrid" format of Transformer
//! Engine: E5M2's range for gradients), one scale per tensor. Row-wise and block scales work
//! the same way (rows of each operand as the table gives them; cuBLASLt's pairing rules,
//! [`crate::fp8::check_pair`], apply to every GEMM). Delayed scaling (scales from an amax
//! history) is not offered: every scale is computed from the tensor it scales.

use crate::dtype::DType;
use crate::error::Result;
use crate::fp8::{check_pair, Fp8Format, OutputKind, Scaling};

/// The FP8 formats and scalings of an FP8 training layer (module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Training {
    /// The format of the forward operands (inputs and weights) and of the weights and inputs
    /// in the backward's GEMMs. Default E4M3.
    pub activations: Fp8Format,
    /// The format of the gradients `g` in the backward's GEMMs. Default E5M2.
    pub gradients: Fp8Format,
    /// The scaling of every GEMM's x operand (`h`, `g`, `gᵀ`). Default [`Scaling::Tensor`].
    pub x_scaling: Scaling,
    /// The scaling of every GEMM's w operand (`w`, `wᵀ`, `hᵀ`). Default [`Scaling::Tensor`].
    pub w_scaling: Scaling,
}

impl Default for Fp8Training {
    fn default() -> Self {
        Fp8Training {
            activations: Fp8Format::E4M3,
            gradients: Fp8Format::E5M2,
            x_scaling: Scaling::Tensor,
            w_scaling: Scaling::Tensor,
        }
    }
}

impl Fp8Training {
    /// Checks the three GEMMs of a layer with tensors of `dtype` (bf16 or f16) against FP8's
    /// pairing rules: the forward (`activations` × `activations`, with a bias when `bias`)
    /// and the two gradients (`gradients` × `activations`, no bias).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a `dtype` other than bf16 or f16 (the layers keep
    /// their tensors in those); [`crate::Error::Fp8`] naming the rule:
    /// [`crate::fp8::Fp8Rule::NoE5m2Pair`] when `activations` is E5M2 (the forward GEMM would
    /// be E5M2 × E5M2, which has no kernel), a scaling pair cuBLASLt does not offer, a bias
    /// dtype the recipe cannot take.
    pub fn check(&self, dtype: DType, bias: bool) -> Result<()> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(crate::error::Error::Unsupported {
                backend: "the FP8 training layers",
                what: format!("{dtype} tensors (FP8 layers keep bf16 or f16 tensors)"),
            });
        }
        if self.activations == Fp8Format::E5M2 {
            return Err(crate::error::Error::Fp8 {
                rule: crate::fp8::Fp8Rule::NoE5m2Pair,
                detail: "activations = e5m2: the forward GEMM multiplies the input by the weight, both in the \
                         activations' format, and e5m2 × e5m2 has no kernel; use e4m3 activations (e5m2 is \
                         for the gradients)"
                    .into(),
            });
        }
        let out = OutputKind::Dense(dtype);
        let fwd = (self.activations, self.x_scaling);
        let w = (self.activations, self.w_scaling);
        check_pair(fwd, w, out, bias.then_some(dtype), false)?;
        check_pair((self.gradients, self.x_scaling), w, out, None, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::fp8::Fp8Rule;

    #[test]
    fn default_recipe_passes_and_broken_ones_name_their_rule() {
        let r = Fp8Training::default();
        r.check(DType::BF16, true).unwrap();
        r.check(DType::F16, false).unwrap();
        let e5 = Fp8Training { activations: Fp8Format::E5M2, ..r };
        let e = e5.check(DType::BF16, false).unwrap_err();
        assert!(matches!(e, Error::Fp8 { rule: Fp8Rule::NoE5m2Pair, .. }), "{e}");
        let mixed = Fp8Training { x_scaling: Scaling::Row, ..r };
        let e = mixed.check(DType::BF16, false).unwrap_err();
        assert!(matches!(e, Error::Fp8 { rule: Fp8Rule::ScalingPair, .. }), "{e}");
        let e = r.check(DType::F32, true).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        let e2 = Fp8Training { gradients: Fp8Format::E4M3, ..e5 };
        let e = e2.check(DType::F16, false).unwrap_err();
        assert!(e.to_string().contains("use e4m3 activations"), "{e}");
        let rows = Fp8Training { x_scaling: Scaling::Row, w_scaling: Scaling::Row, ..r };
        rows.check(DType::BF16, false).unwrap();
        let blocks = Fp8Training { x_scaling: Scaling::Block1x128, w_scaling: Scaling::Block128x128, ..r };
        blocks.check(DType::BF16, false).unwrap();
    }
}
