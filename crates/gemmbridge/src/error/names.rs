//! The names an [`super::Error`] carries: which operand ([`Which`]) and which FP8 rule
//! ([`Fp8Rule`]).

/// Which operand of `C = α·op(A)·op(B) + β·C` an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Which {
    /// The left operand, `op(A)` of shape `[m, k]`.
    A,
    /// The right operand, `op(B)` of shape `[k, n]`.
    B,
    /// The output (and, when β ≠ 0 and no separate C is given, input) `C` of shape `[m, n]`
    /// (cuBLASLt's D).
    C,
    /// A read-only C `[m, n]` given apart from the output (`Extras::c_in`,
    /// `RawOperands::c_in`): `D = α·op(A)·op(B) + β·C_in`, with C_in's layout and dtype D's.
    CIn,
    /// The epilogue's vector: a bias `[n]` it reads or a bias gradient (`[m]` or `[n]`) it
    /// writes.
    Bias,
    /// The epilogue's aux matrix `[m, n]`.
    Aux,
    /// The high-precision source of an FP8 quantisation.
    Source,
    /// FP8 scales: an operand's dequantisation scales, or an FP8 output's D scale or amax.
    Scale,
    /// A convolution's input-shaped tensor: `x[N, C, H, W]` (or its gradient `dx`).
    ConvX,
    /// A convolution's filter-shaped tensor: `w[K, C/groups, R, S]` (or its gradient `dw`).
    ConvW,
    /// A convolution's output-shaped tensor: `y[N, K, P, Q]` (or its gradient `dy`).
    ConvY,
    /// Attention's queries `q[b, h_q, s_q, d]`.
    AttnQ,
    /// Attention's keys `k[b, h_kv, s_kv, d]`.
    AttnK,
    /// Attention's values `v[b, h_kv, s_kv, d]`.
    AttnV,
    /// The gradient of attention's queries, `dq` (shaped as `q`).
    AttnDq,
    /// The gradient of attention's keys, `dk` (shaped as `k`).
    AttnDk,
    /// The gradient of attention's values, `dv` (shaped as `v`).
    AttnDv,
    /// Attention's output `o[b, h_q, s_q, d]`.
    AttnO,
    /// The gradient of attention's output, `do[b, h_q, s_q, d]`.
    AttnDo,
    /// Attention's softmax statistics `lse[b, h_q, s_q]` (f32).
    AttnStats,
    /// Attention's per-sequence lengths (`len_q` or `len_kv`, `b` int32 each).
    AttnLens,
    /// A grouped GEMM's buffer, by its name in the product
    /// ([`crate::grouped::GroupedOp::names`]: x, w, y; dy, w, dx; dy, x, dw).
    Grouped(&'static str),
    /// An RMSNorm buffer, by its name ([`crate::norm::NormTensor::name`], or `w`, `inv_rms`,
    /// `dw`, `scale`, `amax`).
    Norm(&'static str),
    /// A buffer of a transformer layer's elementwise operation, by name ([`crate::layer_ops`]:
    /// RoPE's `qkv`, `positions`, `cos table`, `sin table`; SwiGLU's `gate/up`, `y`, `dy`,
    /// `gate/up gradient`).
    LayerOp(&'static str),
    /// A buffer of a paged KV cache's call, by name ([`crate::paged`]: `k cache`, `v cache`,
    /// `new k`, `new v`, `page table`, `lengths`, `new lengths`).
    Paged(&'static str),
    /// A decoder layer's buffers as a whole, by name ([`crate::layer`]: `element type T`, the
    /// type its weights and activations are held in, which must be the layer's dtype).
    Decoder(&'static str),
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Which::Grouped(name) => return write!(f, "grouped GEMM's {name}"),
            Which::Norm(name) => return write!(f, "RMSNorm's {name}"),
            Which::LayerOp(name) => return write!(f, "{name}"),
            Which::Paged(name) => return write!(f, "paged cache's {name}"),
            Which::Decoder(name) => return write!(f, "decoder layer's {name}"),
            Which::A => "A",
            Which::B => "B",
            Which::C => "C",
            Which::CIn => "C (the read-only input c_in)",
            Which::Bias => "bias",
            Which::Aux => "aux",
            Which::Source => "quantisation source",
            Which::Scale => "FP8 scales (an operand's, or an FP8 output's D scale/amax)",
            Which::ConvX => "convolution input x (or dx)",
            Which::ConvW => "convolution filter w (or dw)",
            Which::ConvY => "convolution output y (or dy)",
            Which::AttnQ => "attention queries q",
            Which::AttnK => "attention keys k",
            Which::AttnV => "attention values v",
            Which::AttnDq => "attention query gradient dq",
            Which::AttnDk => "attention key gradient dk",
            Which::AttnDv => "attention value gradient dv",
            Which::AttnO => "attention output o",
            Which::AttnDo => "attention output gradient do",
            Which::AttnStats => "attention softmax statistics lse",
            Which::AttnLens => "attention sequence lengths",
        })
    }
}

/// A rule of FP8 GEMM on NVIDIA GPUs that a call broke (carried by [`super::Error::Fp8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fp8Rule {
    /// E5M2 × E5M2 has no kernel: one operand must be E4M3.
    NoE5m2Pair,
    /// The two operands' scalings do not form a recipe cuBLASLt offers.
    ScalingPair,
    /// The output dtype is not one the recipe can write.
    OutputDtype,
    /// Fast accumulation is not offered with block scales.
    FastAccum,
    /// The bias epilogue is not offered for this output dtype.
    Bias,
    /// The GPU's compute capability is too old for FP8 or for this recipe.
    ComputeCapability,
    /// The loaded cuBLASLt is too old for this recipe.
    LibraryVersion,
    /// The two operands do not share K.
    InnerDimension,
    /// An operand has no rows or columns.
    Empty,
    /// A hand-built [`crate::fp8::Fp8Layout`] contradicts itself (leading dimension below the
    /// columns, allocated rows below the rows, too few scales).
    Layout,
}

impl std::fmt::Display for Fp8Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fp8Rule::NoE5m2Pair => "no E5M2 × E5M2 GEMM",
            Fp8Rule::ScalingPair => "scaling recipe",
            Fp8Rule::OutputDtype => "output dtype",
            Fp8Rule::FastAccum => "fast accumulation",
            Fp8Rule::Bias => "bias epilogue",
            Fp8Rule::ComputeCapability => "compute capability",
            Fp8Rule::LibraryVersion => "cuBLASLt version",
            Fp8Rule::InnerDimension => "shared K",
            Fp8Rule::Empty => "empty operand",
            Fp8Rule::Layout => "operand layout",
        })
    }
}
