//! Fused epilogues on the row-major output, as cuBLASLt offers them.
//!
//! The GEMM first forms `T = α·op(A)·op(B) + β·C` (`[m, n]`, row-major); the epilogue then
//! transforms T before it is stored in C, and may read or write one extra operand:
//!
//! | epilogue | C receives | extra operand |
//! |---|---|---|
//! | `Bias` | `T + bias` | reads `bias[n]` |
//! | `Relu` / `ReluBias` | `max(T (+ bias), 0)` | (reads `bias[n]`) |
//! | `Gelu` / `GeluBias` | `gelu(T (+ bias))` | (reads `bias[n]`) |
//! | `GeluAux` / `GeluAuxBias` | `gelu(T (+ bias))` | writes `aux[m, n]` = the pre-activation `T (+ bias)` |
//! | `DGelu` | `T ⊙ gelu'(aux)` | reads `aux[m, n]` (saved by `GeluAux*`) |
//! | `DGeluBiasGrad` | `T ⊙ gelu'(aux)` | reads `aux[m, n]`; writes `bias_grad[n]` = column sums of that result over m |
//! | `BiasGradA` | `T` | writes `bias_grad[m]` = row sums of `op(A)` over k |
//! | `BiasGradB` | `T` | writes `bias_grad[n]` = column sums of `op(B)` over k |
//!
//! `bias` has one value per output column n (PyTorch's `nn.Linear` bias); `gelu` is the tanh
//! approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, which cuBLASLt computes
//! (cuBLAS documentation, `cublasLtEpilogue_t`). In a linear layer's backward,
//! `dW = dYᵀ·X` with `BiasGradA` yields `db = Σ_m dY`, and `dX = (dY·W) ⊙ gelu'(pre)` is
//! `DGelu` with the saved `aux`; `DGeluBiasGrad` (cuBLASLt's `DGELU_BGRAD`) also sums that
//! result over the rows, which is the previous layer's bias gradient.
//!
//! Extra operands are contiguous vectors (`bias`, `bias_grad`) or a row-major `[m, n]` matrix
//! with its own leading dimension and batch stride (`aux`, [`GemmProblem::aux`](crate::GemmProblem::aux)),
//! all of the output dtype. The bias gradient is the plain sum over k, not scaled by α. For an
//! empty problem (m, n or batch 0) nothing is written, the bias gradient included.

/// Which epilogue to fuse. See the module documentation for what each computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Epilogue {
    /// Plain GEMM.
    #[default]
    None,
    /// `+ bias[n]`.
    Bias,
    /// `max(·, 0)`.
    Relu,
    /// `max(· + bias[n], 0)`.
    ReluBias,
    /// `gelu(·)` (tanh approximation).
    Gelu,
    /// `gelu(· + bias[n])`.
    GeluBias,
    /// `gelu(·)`, saving the pre-activation to `aux`.
    GeluAux,
    /// `gelu(· + bias[n])`, saving the pre-activation (bias included) to `aux`.
    GeluAuxBias,
    /// `· ⊙ gelu'(aux)`: the GELU backward.
    DGelu,
    /// `· ⊙ gelu'(aux)`, and writes `bias_grad[n]`, the sums of that result's columns over m.
    DGeluBiasGrad,
    /// Also writes `bias_grad[m]`, the sums of `op(A)`'s rows over k.
    BiasGradA,
    /// Also writes `bias_grad[n]`, the sums of `op(B)`'s columns over k.
    BiasGradB,
}

/// What an epilogue does with its vector operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorUse {
    /// No vector.
    None,
    /// Reads `bias[n]`.
    ReadsBias,
    /// Writes a bias gradient of the given length (m for `BiasGradA`, n for `BiasGradB` and
    /// `DGeluBiasGrad`).
    WritesGrad,
}

/// What an epilogue does with its `[m, n]` aux operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuxUse {
    /// No aux.
    None,
    /// Writes the pre-activation.
    Writes,
    /// Reads the pre-activation.
    Reads,
}

impl Epilogue {
    /// Every epilogue, for tests and the probe.
    pub const ALL: [Epilogue; 12] = [
        Epilogue::None,
        Epilogue::Bias,
        Epilogue::Relu,
        Epilogue::ReluBias,
        Epilogue::Gelu,
        Epilogue::GeluBias,
        Epilogue::GeluAux,
        Epilogue::GeluAuxBias,
        Epilogue::DGelu,
        Epilogue::DGeluBiasGrad,
        Epilogue::BiasGradA,
        Epilogue::BiasGradB,
    ];

    /// Its vector operand.
    pub const fn vector(self) -> VectorUse {
        match self {
            Epilogue::Bias | Epilogue::ReluBias | Epilogue::GeluBias | Epilogue::GeluAuxBias => VectorUse::ReadsBias,
            Epilogue::BiasGradA | Epilogue::BiasGradB | Epilogue::DGeluBiasGrad => VectorUse::WritesGrad,
            _ => VectorUse::None,
        }
    }

    /// Its aux operand.
    pub const fn aux(self) -> AuxUse {
        match self {
            Epilogue::GeluAux | Epilogue::GeluAuxBias => AuxUse::Writes,
            Epilogue::DGelu | Epilogue::DGeluBiasGrad => AuxUse::Reads,
            _ => AuxUse::None,
        }
    }

    /// The name used in benchmark JSON and messages, e.g. `gelu_aux_bias`.
    pub const fn name(self) -> &'static str {
        match self {
            Epilogue::None => "none",
            Epilogue::Bias => "bias",
            Epilogue::Relu => "relu",
            Epilogue::ReluBias => "relu_bias",
            Epilogue::Gelu => "gelu",
            Epilogue::GeluBias => "gelu_bias",
            Epilogue::GeluAux => "gelu_aux",
            Epilogue::GeluAuxBias => "gelu_aux_bias",
            Epilogue::DGelu => "dgelu",
            Epilogue::DGeluBiasGrad => "dgelu_bgrad",
            Epilogue::BiasGradA => "bgrada",
            Epilogue::BiasGradB => "bgradb",
        }
    }

    /// The elementwise function applied after the bias (f64, for references): identity, relu
    /// or tanh-approximated gelu.
    pub fn activate(self, x: f64) -> f64 {
        match self {
            Epilogue::Relu | Epilogue::ReluBias => x.max(0.0),
            Epilogue::Gelu | Epilogue::GeluBias | Epilogue::GeluAux | Epilogue::GeluAuxBias => gelu_tanh(x),
            _ => x,
        }
    }
}

impl std::fmt::Display for Epilogue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// d/dx of [`gelu_tanh`].
pub fn gelu_tanh_grad(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_grad_matches_finite_difference() {
        for x in [-3.0, -1.0, -0.1, 0.0, 0.3, 1.0, 2.5] {
            let h = 1e-6;
            let fd = (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2.0 * h);
            assert!((fd - gelu_tanh_grad(x)).abs() < 1e-8, "{x}: {fd} vs {}", gelu_tanh_grad(x));
        }
        assert!((gelu_tanh(1.0) - 0.841_191_990_607_477).abs() < 1e-12);
    }

    #[test]
    fn operand_uses() {
        assert_eq!(Epilogue::GeluAuxBias.vector(), VectorUse::ReadsBias);
        assert_eq!(Epilogue::GeluAuxBias.aux(), AuxUse::Writes);
        assert_eq!(Epilogue::DGelu.aux(), AuxUse::Reads);
        assert_eq!(Epilogue::BiasGradB.vector(), VectorUse::WritesGrad);
        assert_eq!(Epilogue::DGeluBiasGrad.vector(), VectorUse::WritesGrad);
        assert_eq!(Epilogue::DGeluBiasGrad.aux(), AuxUse::Reads);
        assert_eq!(Epilogue::None.vector(), VectorUse::None);
    }
}
