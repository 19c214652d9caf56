//! Training layers: `Linear` layers and MLP blocks, forward and backward, with PyTorch's
//! conventions — input `x[tokens, in]`, weight `w[out, in]` (`nn.Linear`'s layout), bias
//! `b[out]`, output `y[tokens, out] = act(x·wᵀ + b)`, all row-major and contiguous.
//!
//! This module is the part every backend shares: the layer specification ([`LinearSpec`],
//! [`Activation`]), the parameters on the host ([`Params`], PyTorch's default initialisation),
//! the float64 definitions of the activations and their derivatives, and where each step of
//! the backward fuses into a GEMM epilogue ([`Activation::fused_backward`]). The CPU backend is
//! [`cpu::Mlp`] (unfused, f32); the GPU one is [`crate::cuda::train::Mlp`] (cuBLASLt epilogues).
//!
//! Precisions f32, tf32, f16, bf16, and FP8 ([`fp8::Fp8Training`]). The GPU layers take the
//! same calls as the CPU ones, with the [`crate::cuda::Gpu`] first and cudarc buffers:
//!
//! ```no_run
//! use gemmbridge::cuda::{train::Mlp, Gpu};
//! use gemmbridge::half::bf16;
//! use gemmbridge::train::{init_params, Activation, GradMode, LinearSpec};
//! use gemmbridge::Precision;
//!
//! let gpu = Gpu::new(0)?;
//! // an MLP block 4096 → 14336 → 4096 with GELU (tanh), PyTorch's initialisation bounds
//! let layers = [LinearSpec::new(4096, 14336).with_activation(Activation::GeluTanh), LinearSpec::new(14336, 4096)];
//! let mut mlp = Mlp::<bf16>::new(&gpu, &layers, Precision::BF16, &init_params(&layers, 1))?;
//! let (s, tokens) = (gpu.stream(), 4096);
//! let x = s.alloc_zeros::<bf16>(tokens * 4096)?;
//! mlp.forward(&gpu, &x, tokens, true)?; // train = true keeps what the backward needs
//! let dy = s.alloc_zeros::<bf16>(tokens * 4096)?; // the loss's gradient for mlp.output()
//! let mut dx = s.alloc_zeros::<bf16>(tokens * 4096)?;
//! mlp.backward(&gpu, &x, &dy, Some(&mut dx), GradMode::Overwrite)?; // dw, db of every layer, and dx
//! mlp.sgd_step(&gpu, 1e-3)?; // or your optimiser over weight_grad(i) / bias_grad(i)
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`GradMode::Accumulate`] adds to the gradients (micro-batches). A backward must follow a
//! training forward of the same input ([`crate::Error::TrainingOrder`] otherwise). The example
//! `cargo run --release -p gemmbridge --example digits_mlp` trains an MLP on real handwritten
//! digits (kept in the repository) to 97.5 % test accuracy, on the GPU or, without one, the
//! CPU; `gemmbridge train-bench` times a step beside `bench/train_peer.py` (PyTorch autograd).
//!
//! # Where the backward fuses
//! In `h = act(x·W1ᵀ + b1)`, `y = h·W2ᵀ + b2` the backward is, layer by layer from the last:
//!
//! | gradient | GEMM (row-major) | fused epilogue |
//! |---|---|---|
//! | `dW2[out, f] = dyᵀ·h`, `db2 = Σ_tokens dy` | `m=out, n=f, k=tokens`, op(A) = T | `BiasGradA` writes `db2` |
//! | `dpre1 = (dy·W2) ⊙ act′(pre1)` | `m=tokens, n=f, k=out` | `DGelu` reads `pre1` (saved by the forward's `GeluAuxBias`) |
//! | `dW1 = dpre1ᵀ·x`, `db1 = Σ_tokens dpre1` | as for layer 2 | `BiasGradA` writes `db1` |
//! | `dx = dpre1·W1` | `m=tokens, n=in, k=f` | none |
//!
//! So an activation's backward fuses into the *next* layer's data-gradient GEMM, and every
//! bias gradient into its own layer's weight-gradient GEMM (by default: [`GeluPlacement`]
//! can move GELU-tanh's steps into kernels, or a GELU layer's bias gradient into the next
//! layer's `DGeluBiasGrad`). Where no epilogue exists — the
//! activation of the last layer (nothing after it), ReLU (cuBLASLt's DRELU reads a bit mask
//! this library does not produce), GELU-erf (cuBLASLt's GELU is the tanh form) — a small
//! elementwise kernel computes `dpre = dy ⊙ act′(·)` before the layer's GEMMs.
//!
//! # Activations: which GELU is which
//! - [`Activation::GeluTanh`]: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, cuBLASLt's GELU
//!   epilogue and PyTorch's `F.gelu(x, approximate="tanh")`; fused forward and backward in
//!   tf32, f16 and bf16 (by default: [`GeluPlacement`] moves either step to a kernel, which
//!   measured slower on the H200). In strict f32 the GPU applies it with its own kernels instead:
//!   cuBLASLt's GELU epilogues are less accurate than f32 arithmetic (measured on the H200,
//!   cuBLASLt 13.1: an MLP block's output at 11× PyTorch's error against float64).
//! - [`Activation::GeluErf`]: `0.5·x·(1 + erf(x/√2))`, PyTorch's default `F.gelu(x)`; never
//!   swapped for the tanh form: the GEMM writes `pre` (bias epilogue) and a kernel applies it.
//! - [`Activation::Relu`]: fused forward (`ReluBias`); backward `dy ⊙ [y > 0]` by kernel.
//!
//! # FP8
//! [`fp8::Fp8Training`] runs every GEMM of the layers in FP8 (bf16 or f16 tensors, operands
//! quantised per GEMM); its module says which operand is quantised how. There the activations
//! (forward and backward) and the bias gradients run in high precision by kernel and GEMM.

pub mod cpu;
pub mod fp8;

use crate::epilogue::Epilogue;
use crate::error::{Error, Result};

/// An elementwise activation on a layer's output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation (cuBLASLt's epilogue; PyTorch's `approximate="tanh"`).
    GeluTanh,
    /// GELU, exact erf form (PyTorch's default `F.gelu`).
    GeluErf,
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 4] = [Activation::None, Activation::Relu, Activation::GeluTanh, Activation::GeluErf];

    /// The name used by the CLI, the benchmark and PyTorch-side scripts: `none`, `relu`,
    /// `gelu_tanh`, `gelu` (erf, PyTorch's default).
    pub const fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::GeluTanh => "gelu_tanh",
            Activation::GeluErf => "gelu",
        }
    }

    /// Parses [`Activation::name`].
    pub fn from_name(s: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The activation in float64.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::None => x,
            Activation::Relu => x.max(0.0),
            Activation::GeluTanh => crate::epilogue::gelu_tanh(x),
            Activation::GeluErf => 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
        }
    }

    /// Its derivative at the pre-activation `x`, in float64 (ReLU: 1 for x > 0, else 0, as
    /// PyTorch's autograd).
    pub fn grad(self, x: f64) -> f64 {
        match self {
            Activation::None => 1.0,
            Activation::Relu => f64::from(u8::from(x > 0.0)),
            Activation::GeluTanh => crate::epilogue::gelu_tanh_grad(x),
            Activation::GeluErf => {
                let cdf = 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
                let pdf = (-0.5 * x * x).exp() * (SQRT_2_OVER_PI * 0.5);
                cdf + x * pdf
            }
        }
    }

    /// The forward GEMM's epilogue: bias and the activation where cuBLASLt has it, saving the
    /// pre-activation to aux when a backward will need it (`save`). GELU-erf's GEMM applies
    /// the bias only (the activation follows as a kernel on the saved pre-activation).
    pub const fn fused_forward(self, bias: bool, save: bool) -> Epilogue {
        match (self, bias, save) {
            (Activation::None | Activation::GeluErf, false, _) => Epilogue::None,
            (Activation::None | Activation::GeluErf, true, _) => Epilogue::Bias,
            (Activation::Relu, false, _) => Epilogue::Relu,
            (Activation::Relu, true, _) => Epilogue::ReluBias,
            (Activation::GeluTanh, false, false) => Epilogue::Gelu,
            (Activation::GeluTanh, true, false) => Epilogue::GeluBias,
            (Activation::GeluTanh, false, true) => Epilogue::GeluAux,
            (Activation::GeluTanh, true, true) => Epilogue::GeluAuxBias,
        }
    }

    /// Whether the forward keeps the pre-activation in its own buffer for the backward
    /// (GELU: the derivative needs it; ReLU's comes from the output, the identity's is 1).
    pub const fn saves_pre(self) -> bool {
        matches!(self, Activation::GeluTanh | Activation::GeluErf)
    }

    /// The epilogue that applies this activation's backward inside the data-gradient GEMM of
    /// the layer after it (`dpre = (dy·W) ⊙ act′(pre)`), where cuBLASLt has one: `DGelu` for
    /// the tanh GELU. `None` when a kernel applies it (or nothing is to apply).
    pub const fn fused_backward(self) -> Option<Epilogue> {
        match self {
            Activation::GeluTanh => Some(Epilogue::DGelu),
            _ => None,
        }
    }
}

impl std::fmt::Display for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a step of an activation runs on the GPU: in a cuBLASLt epilogue of a GEMM, or in a
/// kernel of gemmbridge's own on the GEMM's plain output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// In the GEMM's epilogue (no extra pass over memory; the GEMM may get a slower kernel).
    #[default]
    Epilogue,
    /// In an elementwise kernel after a plain GEMM (one extra pass over the tensors).
    Kernel,
}

/// Which GEMM writes the bias gradient of a GELU-tanh layer whose backward runs in the next
/// layer's epilogue ([`GeluPlacement::bias_grad`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GeluBiasGrad {
    /// The layer's own weight-gradient GEMM (`BiasGradA`, cuBLASLt's `BGRADB`), as for every
    /// other layer with a bias.
    #[default]
    WeightGrad,
    /// The next layer's data-gradient GEMM, together with the GELU backward
    /// ([`Epilogue::DGeluBiasGrad`], cuBLASLt's `DGELU_BGRAD`); the layer's weight-gradient
    /// GEMM is then plain.
    DataGrad,
}

/// Where GPU layers apply [`Activation::GeluTanh`] in tf32, f16 and bf16
/// ([`crate::cuda::train::MlpOptions::gelu`]); f32 and FP8 layers always use
/// gemmbridge's kernels (see the module's notes), and the other activations are placed as the
/// module's notes say. Both placements compute the same function; the kernels read values
/// rounded to the storage type where the epilogues read the GEMM's f32 result (the forward's
/// GELU reads the stored `pre`, the backward's product the stored gradient), as PyTorch's
/// separate kernels do. Default: both in epilogues. On the H200 with cuBLASLt 13.1 either
/// kernel placement made an MLP block's training step up to 3 % slower (docs/PERFORMANCE.md,
/// training layers): the extra pass over memory costs more than the epilogue does.
///
/// - `forward`: `Epilogue` — the GEMM's epilogue adds the bias (if any) and applies the GELU,
///   saving `pre` as aux in a training forward (`GeluAuxBias` or `GeluAux`); `Kernel` — the
///   GEMM writes `pre` (the bias fused, if any), a kernel writes `gelu(pre)`.
/// - `backward`: `Epilogue` — the next layer's data-gradient GEMM applies `⊙ gelu′(pre)`
///   (`DGelu`); `Kernel` — that GEMM writes the plain gradient and a kernel multiplies it in
///   place. `Epilogue` needs `pre`'s rows padded to a multiple of 8: with a `Kernel` forward on
///   a layer whose width is not a multiple of 8 the backward runs by kernel. The last layer's
///   GELU backward always runs by kernel (no GEMM of ours follows it).
/// - `bias_grad`: [`GeluBiasGrad`]. On the H200 with cuBLASLt 13.1 `DataGrad` made the step
///   4–6 % slower: cuBLASLt's `DGELU_BGRAD` kernel took 1.15 ms where `DGelu` took 0.77 and
///   the bias gradient in the weight-gradient GEMM 0.07 (bf16, 4096 tokens, 4096 → 14336).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GeluPlacement {
    /// The forward's `gelu(x·wᵀ + b)`.
    pub forward: Placement,
    /// The backward's `dh ⊙ gelu′(pre)`.
    pub backward: Placement,
    /// With the backward in an epilogue and a bias on the layer: which GEMM writes the bias
    /// gradient.
    pub bias_grad: GeluBiasGrad,
}

/// One linear layer: `y[tokens, out] = act(x[tokens, in]·w[out, in]ᵀ + b[out])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearSpec {
    /// `in_features`: columns of x and of w.
    pub in_features: usize,
    /// `out_features`: rows of w, columns of y, length of b.
    pub out_features: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
    /// The activation on its output.
    pub activation: Activation,
}

impl LinearSpec {
    /// A layer `in → out` with a bias and no activation.
    pub const fn new(in_features: usize, out_features: usize) -> LinearSpec {
        LinearSpec { in_features, out_features, bias: true, activation: Activation::None }
    }

    /// The same layer with `activation` on its output.
    #[must_use]
    pub const fn with_activation(self, activation: Activation) -> LinearSpec {
        LinearSpec { activation, ..self }
    }

    /// The same layer without a bias.
    #[must_use]
    pub const fn without_bias(self) -> LinearSpec {
        LinearSpec { bias: false, ..self }
    }
}

/// Checks a layer sequence: at least one layer, no zero-sized feature count, each layer's
/// `in_features` equal to the previous one's `out_features`, and every weight addressable:
/// feature counts at most [`crate::MAX_DIM`] (a GEMM dimension) and `out × in` elements
/// within `isize::MAX` bytes of f32.
///
/// # Errors
/// [`Error::LayerShape`] naming the first layer that breaks a rule; [`Error::DimensionTooLarge`]
/// for a feature count or weight beyond those limits.
pub fn check_layers(layers: &[LinearSpec]) -> Result<()> {
    if layers.is_empty() {
        return Err(Error::LayerShape { layer: 0, what: "number of layers", got: 0, expected: 1 });
    }
    for (i, l) in layers.iter().enumerate() {
        if l.in_features == 0 || l.out_features == 0 {
            let (what, got) = if l.in_features == 0 { ("in_features", 0) } else { ("out_features", 0) };
            return Err(Error::LayerShape { layer: i, what, got, expected: 1 });
        }
        for (what, value) in [("in_features", l.in_features), ("out_features", l.out_features)] {
            if value > crate::MAX_DIM {
                return Err(Error::DimensionTooLarge { what, value, max: crate::MAX_DIM });
            }
        }
        let max = isize::MAX as usize / 4;
        let weight = l.out_features.checked_mul(l.in_features).filter(|&w| w <= max);
        if weight.is_none() {
            // the larger factor is the one to shrink: the most it may be for the other
            let (what, value, other) = if l.out_features >= l.in_features {
                ("out_features (weight elements past isize::MAX bytes of f32)", l.out_features, l.in_features)
            } else {
                ("in_features (weight elements past isize::MAX bytes of f32)", l.in_features, l.out_features)
            };
            return Err(Error::DimensionTooLarge { what, value, max: max / other });
        }
        if i > 0 && l.in_features != layers[i - 1].out_features {
            return Err(Error::LayerShape {
                layer: i,
                what: "in_features (must equal the previous layer's out_features)",
                got: l.in_features,
                expected: layers[i - 1].out_features,
            });
        }
    }
    Ok(())
}

/// Whether a backward overwrites the parameter gradients or adds to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GradMode {
    /// `dw = …`, `db = …` (the weight-gradient GEMM with β = 0).
    #[default]
    Overwrite,
    /// `dw += …` (β = 1), `db += …`: gradient accumulation over micro-batches. cuBLASLt's
    /// bias-gradient epilogue overwrites its vector, so the GPU writes it to a per-layer
    /// temporary and adds it with one cuBLAS `axpy` per layer (a `[out]` vector: a few µs).
    Accumulate,
}

/// One layer's parameters on the host, f32, row-major: `w[out, in]`, `b[out]` (empty without
/// a bias).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerParams {
    /// The weight, `out_features × in_features` values.
    pub w: Vec<f32>,
    /// The bias, `out_features` values, or empty.
    pub b: Vec<f32>,
}

/// Every layer's parameters.
pub type Params = Vec<LayerParams>;

/// PyTorch's default `nn.Linear` initialisation, from a seed: w and b uniform in
/// `[-1/√in, 1/√in)` (Kaiming-uniform with a = √5 reduces to this bound; PyTorch's
/// `nn.Linear.reset_parameters`). Deterministic for a seed (a 64-bit xorshift generator), not
/// PyTorch's random stream.
pub fn init_params(layers: &[LinearSpec], seed: u64) -> Params {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 // [0, 1)
    };
    layers
        .iter()
        .map(|l| {
            let bound = 1.0 / (l.in_features as f64).sqrt();
            let mut draw = |n: usize| (0..n).map(|_| ((2.0 * uniform() - 1.0) * bound) as f32).collect::<Vec<_>>();
            let w = draw(l.out_features * l.in_features);
            let b = if l.bias { draw(l.out_features) } else { Vec::new() };
            LayerParams { w, b }
        })
        .collect()
}

/// Checks parameters against the layers.
///
/// # Errors
/// [`Error::LayerShape`] for a weight or bias of the wrong length.
pub fn check_params(layers: &[LinearSpec], params: &[LayerParams]) -> Result<()> {
    if params.len() != layers.len() {
        return Err(Error::LayerShape {
            layer: params.len().min(layers.len()),
            what: "number of parameter sets",
            got: params.len(),
            expected: layers.len(),
        });
    }
    for (i, (l, p)) in layers.iter().zip(params).enumerate() {
        // check_layers bounds this product; saturate for layers it has not seen
        let want_w = l.out_features.saturating_mul(l.in_features);
        if p.w.len() != want_w {
            return Err(Error::LayerShape { layer: i, what: "weight length", got: p.w.len(), expected: want_w });
        }
        let want_b = if l.bias { l.out_features } else { 0 };
        if p.b.len() != want_b {
            return Err(Error::LayerShape { layer: i, what: "bias length", got: p.b.len(), expected: want_b });
        }
    }
    Ok(())
}

/// Checks an input or gradient length: `tokens × features` elements.
pub(crate) fn check_len(layer: usize, what: &'static str, got: usize, tokens: usize, features: usize) -> Result<()> {
    let expected = tokens.checked_mul(features).ok_or(Error::DimensionTooLarge {
        what: "tokens × features",
        value: usize::MAX,
        max: isize::MAX as usize,
    })?;
    if got != expected {
        return Err(Error::LayerShape { layer, what, got, expected });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_match_finite_differences() {
        for a in [Activation::GeluTanh, Activation::GeluErf, Activation::None] {
            for x in [-3.0, -1.0, -0.2, 0.1, 0.7, 2.5] {
                let h = 1e-6;
                let fd = (a.apply(x + h) - a.apply(x - h)) / (2.0 * h);
                assert!((fd - a.grad(x)).abs() < 1e-7, "{a} at {x}: {fd} vs {}", a.grad(x));
            }
        }
        assert_eq!(Activation::Relu.grad(0.0), 0.0);
        assert_eq!(Activation::Relu.grad(1e-30), 1.0);
        // PyTorch: F.gelu(torch.tensor(1.0, dtype=float64)) = 0.8413447460685429
        assert!((Activation::GeluErf.apply(1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
    }

    #[test]
    fn epilogue_choices() {
        assert_eq!(Activation::GeluTanh.fused_forward(true, true), Epilogue::GeluAuxBias);
        assert_eq!(Activation::GeluTanh.fused_forward(true, false), Epilogue::GeluBias);
        assert_eq!(Activation::GeluErf.fused_forward(true, true), Epilogue::Bias);
        assert_eq!(Activation::Relu.fused_forward(false, true), Epilogue::Relu);
        assert_eq!(Activation::GeluTanh.fused_backward(), Some(Epilogue::DGelu));
        assert_eq!(Activation::GeluErf.fused_backward(), None);
        for a in Activation::ALL {
            assert_eq!(Activation::from_name(a.name()), Some(a));
        }
    }

    #[test]
    fn layer_checks_name_the_layer() {
        let ok = [LinearSpec::new(4, 8).with_activation(Activation::Relu), LinearSpec::new(8, 3)];
        check_layers(&ok).unwrap();
        let e = check_layers(&[LinearSpec::new(4, 8), LinearSpec::new(7, 3)]).unwrap_err();
        assert!(matches!(e, Error::LayerShape { layer: 1, got: 7, expected: 8, .. }), "{e}");
        assert!(matches!(check_layers(&[]).unwrap_err(), Error::LayerShape { layer: 0, .. }));
        // past a GEMM dimension, or a weight past isize::MAX bytes: named, no overflow
        let e = check_layers(&[LinearSpec::new(1 << 33, 4)]).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { what: "in_features", value, .. } if value == 1 << 33), "{e}");
        let big = crate::MAX_DIM;
        let e = check_layers(&[LinearSpec::new(big, big)]).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { value, max, .. } if value == big && max < big), "{e}");
        let e = check_layers(&[LinearSpec::new(0, 3)]).unwrap_err();
        assert!(matches!(e, Error::LayerShape { what: "in_features", .. }), "{e}");
        let p = init_params(&ok, 1);
        check_params(&ok, &p).unwrap();
        let mut bad = p.clone();
        bad[1].b.pop();
        let e = check_params(&ok, &bad).unwrap_err();
        assert!(matches!(e, Error::LayerShape { layer: 1, what: "bias length", got: 2, expected: 3 }), "{e}");
    }

    #[test]
    fn init_is_bounded_and_deterministic() {
        let l = [LinearSpec::new(16, 5)];
        let (a, b) = (init_params(&l, 7), init_params(&l, 7));
        assert_eq!(a, b);
        assert_ne!(a, init_params(&l, 8));
        let bound = 0.25f32;
        assert!(a[0].w.iter().chain(&a[0].b).all(|v| v.abs() <= bound));
        assert!(a[0].w.iter().any(|v| v.abs() > bound / 2.0));
    }
}
