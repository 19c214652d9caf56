//! A LLaMA-style decoder layer as data: its sizes and every rule on them ([`DecoderLayer`]),
//! its weights' layouts ([`LayerWeight`]), the token batch it runs on ([`Tokens`]), and its
//! float64 forward and backward ([`mod@reference`], written from the sums below, for tests), and
//! the problems a step is made of ([`LayerGemms`], [`DecoderLayer::norm_problem`],
//! [`DecoderLayer::rope_problem`], [`DecoderLayer::swiglu_problem`],
//! [`DecoderLayer::attention`]), and its decode step over a paged KV cache ([`DecodeStep`],
//! [`decode_reference`]). The layer runs on the CPU backend as
//! [`cpu::CpuDecoderLayer`] and on the GPU as `crate::cuda::layer::GpuDecoderLayer`.
//!
//! # The layer
//! Tokens `x[T, d]` row-major, `T = b·s` (batch entry `n`'s token at position `p` is row
//! `n·s + p`); every weight row-major `[out, in]` as PyTorch's `nn.Linear` stores it, so each
//! projection is `x·Wᵀ`:
//! ```text
//! h1  = rms_norm(x)  ∘ w_norm1          rms_norm(v) = v / sqrt(mean(v²) + eps), per token
//! qkv = h1 · w_qkvᵀ                      [T, (h_q + 2·h_kv)·hd]: q heads, then k heads, then v
//! q, k ← rope(q), rope(k)                in place in qkv, position p = token's place in its sequence
//! o   = attention(q, k, v)               causal, GQA, scale 1/√hd; o [T, h_q·hd] (heads in order)
//! x2  = x + o · w_oᵀ                     the residual as the GEMM's C
//! h2  = rms_norm(x2) ∘ w_norm2
//! gu  = h2 · w_gate_upᵀ                  [T, 2·ffn]: gate = columns 0..ffn, up = ffn..2·ffn
//! a   = silu(gate) ∘ up                  silu(g) = g·σ(g)
//! y   = x2 + a · w_downᵀ
//! ```
//! RoPE ([`RopeStyle::RotateHalf`], LLaMA's and Hugging Face's `rotate_half`): in each head of
//! q and k, element `j < hd/2` pairs with `j + hd/2`, rotated by the angle
//! `p·θ^(−2j/hd)`: `(x₁, x₂) → (x₁·cos − x₂·sin, x₂·cos + x₁·sin)`. [`RopeStyle::Interleaved`]
//! pairs `2j` with `2j + 1` instead (GPT-J's form), same angles. [`RopeStyle`] is
//! [`crate::layer_ops`]'s.
//!
//! The backward takes `dy` and gives `dx` and every weight's gradient, each in its weight's
//! layout: `dW = dYᵀ·X` for a projection `Y = X·Wᵀ`, `dX = dY·W`; the residuals pass `dy` to
//! `dx2` and `dx2` to `dx` unchanged.
//!
//! # Weights ([`LayerWeight`])
//! | name | shape | rows |
//! |---|---|---|
//! | `w_qkv` | `[(h_q + 2·h_kv)·hd, d]` | q heads (head `h`: rows `h·hd..(h+1)·hd`), then k heads, then v heads |
//! | `w_o` | `[d, h_q·hd]` | |
//! | `w_gate_up` | `[2·ffn, d]` | gate rows `0..ffn`, up rows `ffn..2·ffn` |
//! | `w_down` | `[d, ffn]` | |
//! | `w_norm1`, `w_norm2` | `[d]` | |
//!
//! # The check file
//! `gemmbridge layer-check` writes one safetensors file for `bench/layer_peer.py --check`
//! ([`CHECK_FILE`]; its tensor names are [`check_names`]'s): the layer's sizes in the file's
//! metadata (every field of [`DecoderLayer`] and of [`Tokens`], as strings), the inputs in the
//! layer's dtype (`x` and `dy` as `[b, s, d]`, the six weights by [`LayerWeight::name`]), the
//! float64 reference's output and gradients (`ref64.<name>`, F64) and, where the GPU layer
//! ran, ours (`ours.<name>`, F32), for the names `y`, `dx` and `d_<weight>`.

pub mod cpu;
mod decode;
#[cfg(test)]
mod decode_tests;
mod f64ops;
mod problems;
pub mod reference;
#[cfg(test)]
mod tests;

pub use crate::layer_ops::RopeStyle;
pub use decode::{decode_reference, DecodeStep};
pub use problems::{LayerGemms, LayerOptions, Proj, Step, AFTER_ATTENTION, BACKWARD, FORWARD};

use crate::attention::{Attention, AttnMask, HeadLayout, MAX_HEAD_DIM};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The file `gemmbridge layer-check` writes into its output folder.
pub const CHECK_FILE: &str = "layer_check.safetensors";

/// LLaMA 3's RoPE base θ.
pub const LLAMA3_ROPE_THETA: f64 = 500_000.0;

/// One weight of the layer (the table in the module documentation gives shapes and rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerWeight {
    /// The fused q, k, v projection `[(h_q + 2·h_kv)·hd, d]`.
    Qkv,
    /// The output projection `[d, h_q·hd]`.
    O,
    /// The fused gate and up projection `[2·ffn, d]` (gate rows first).
    GateUp,
    /// The down projection `[d, ffn]`.
    Down,
    /// The first RMSNorm's weight `[d]`.
    Norm1,
    /// The second RMSNorm's weight `[d]`.
    Norm2,
}

impl LayerWeight {
    /// Every weight, in the table's order.
    pub const ALL: [LayerWeight; 6] = [
        LayerWeight::Qkv,
        LayerWeight::O,
        LayerWeight::GateUp,
        LayerWeight::Down,
        LayerWeight::Norm1,
        LayerWeight::Norm2,
    ];

    /// Its name: `w_qkv`, `w_o`, `w_gate_up`, `w_down`, `w_norm1`, `w_norm2`.
    pub const fn name(self) -> &'static str {
        match self {
            LayerWeight::Qkv => "w_qkv",
            LayerWeight::O => "w_o",
            LayerWeight::GateUp => "w_gate_up",
            LayerWeight::Down => "w_down",
            LayerWeight::Norm1 => "w_norm1",
            LayerWeight::Norm2 => "w_norm2",
        }
    }
}

/// The tensor names of the check file's results, in order: `y`, `dx`, then `d_<weight>` for
/// every weight (`d_w_qkv`, …, `d_w_norm2`); the file prefixes them with `ref64.` or `ours.`.
pub fn check_names() -> Vec<String> {
    let mut names = vec!["y".to_string(), "dx".to_string()];
    names.extend(LayerWeight::ALL.iter().map(|w| format!("d_{}", w.name())));
    names
}

/// The tokens a layer runs on: `b` sequences of `s` positions each (`T = b·s` rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tokens {
    /// Sequences.
    pub b: usize,
    /// Positions per sequence.
    pub s: usize,
}

impl Tokens {
    /// `T = b·s` (saturating; [`DecoderLayer::check_tokens`] refuses an overflow).
    pub const fn count(&self) -> usize {
        self.b.saturating_mul(self.s)
    }
}

/// A decoder layer's sizes (the module documentation defines the layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecoderLayer {
    /// The model width `d`.
    pub d_model: usize,
    /// Query heads `h_q`.
    pub heads_q: usize,
    /// Key/value heads `h_kv` (a divisor of `h_q`: grouped-query attention).
    pub heads_kv: usize,
    /// Head dimension `hd` (even: RoPE rotates pairs).
    pub head_dim: usize,
    /// The feed-forward width `ffn` (gate and up are `ffn` wide each).
    pub ffn: usize,
    /// RMSNorm's ε, added to the mean square.
    pub eps: f64,
    /// RoPE's base θ (finite, at least 1, as [`crate::layer_ops::Rope::validate`] asks).
    pub rope_theta: f64,
    /// Which elements RoPE pairs.
    pub rope: RopeStyle,
    /// The GPU tensors' element type (f16 or bf16); the reference computes in f64 whatever it is.
    pub dtype: DType,
}

impl DecoderLayer {
    /// A layer of width `d_model`, `heads_q` query and `heads_kv` key/value heads of
    /// `head_dim`, feed-forward width `ffn`, with LLaMA 3's ε = 1e-5, θ = 500000 and
    /// rotate-half RoPE.
    pub fn new(d_model: usize, (heads_q, heads_kv): (usize, usize), head_dim: usize, ffn: usize, dtype: DType) -> Self {
        DecoderLayer {
            d_model,
            heads_q,
            heads_kv,
            head_dim,
            ffn,
            eps: 1e-5,
            rope_theta: LLAMA3_ROPE_THETA,
            rope: RopeStyle::RotateHalf,
            dtype,
        }
    }

    /// LLaMA-3-8B's layer: d 4096, 32 query and 8 key/value heads of 128, ffn 14336, bf16.
    pub fn llama3_8b() -> Self {
        DecoderLayer::new(4096, (32, 8), 128, 14336, DType::BF16)
    }

    /// The same with RMSNorm's ε.
    #[must_use]
    pub fn with_eps(self, eps: f64) -> Self {
        DecoderLayer { eps, ..self }
    }

    /// The same with RoPE's base and style.
    #[must_use]
    pub fn with_rope(self, rope_theta: f64, rope: RopeStyle) -> Self {
        DecoderLayer { rope_theta, rope, ..self }
    }

    /// Every rule on the sizes.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] naming the rule: a size is zero; the query heads are not a
    /// multiple of the key/value heads; the head dimension is odd or above
    /// [`MAX_HEAD_DIM`] (cuDNN's attention engines); ε not finite and positive; θ not finite
    /// and at least 1; a dtype other than f16 and bf16; the six weights' bytes past `isize::MAX`
    /// (every product checked, so no size panics or wraps).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str| Err(Error::DecoderShape { what, detail: self.describe() });
        let sizes = [self.d_model, self.heads_q, self.heads_kv, self.head_dim, self.ffn];
        if sizes.contains(&0) {
            return bad("a size is zero");
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return bad("query heads are not a multiple of the key/value heads");
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("the head dimension is odd (RoPE rotates pairs of elements)");
        }
        if self.head_dim > MAX_HEAD_DIM {
            return bad("the head dimension exceeds 256 (cuDNN's fused attention engines)");
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("RMSNorm's eps is not finite and positive");
        }
        if !(self.rope_theta.is_finite() && self.rope_theta >= 1.0) {
            return bad("RoPE's theta is not finite and at least 1");
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return bad("the dtype is neither bf16 nor f16");
        }
        if self.checked_weight_bytes().is_none_or(|b| b > isize::MAX as usize) {
            return Err(Error::DecoderShape {
                what: "the weights' bytes overflow (more than isize::MAX)",
                detail: format!(
                    "{:.4e} elements of {} bytes ({})",
                    self.weight_elems_f64(),
                    self.dtype.size_bytes(),
                    self.describe()
                ),
            });
        }
        Ok(())
    }

    /// The bytes of all six weights, `None` where a product or the sum overflows `usize`.
    fn checked_weight_bytes(&self) -> Option<usize> {
        let (hd, d) = (self.head_dim, self.d_model);
        let qkv = self.heads_kv.checked_mul(2)?.checked_add(self.heads_q)?.checked_mul(hd)?.checked_mul(d)?;
        let o = self.heads_q.checked_mul(hd)?.checked_mul(d)?;
        let ffn = self.ffn.checked_mul(3)?.checked_mul(d)?; // gate, up and down
        let norms = d.checked_mul(2)?;
        qkv.checked_add(o)?.checked_add(ffn)?.checked_add(norms)?.checked_mul(self.dtype.size_bytes())
    }

    /// The element count of all six weights, in f64 (exact up to 2⁵³; for messages).
    fn weight_elems_f64(&self) -> f64 {
        let [hq, hkv, hd, d, ffn] =
            [self.heads_q, self.heads_kv, self.head_dim, self.d_model, self.ffn].map(|x| x as f64);
        (hq + 2.0 * hkv) * hd * d + hq * hd * d + 3.0 * ffn * d + 2.0 * d
    }

    /// The layer's rules and the tokens': `b` and `s` positive, and every activation's element
    /// count within cuDNN's, the GEMMs' and the kernels' reach (the rules of every problem a
    /// step is made of).
    ///
    /// # Errors
    /// As [`DecoderLayer::validate`]; [`Error::DecoderShape`] for zero or overflowing tokens;
    /// [`Error::AttentionShape`] from [`Attention::validate`]; [`Error::NormShape`],
    /// [`Error::LayerOp`] from the RMSNorm's, RoPE's and SwiGLU's rules; as
    /// [`DecoderLayer::gemms`].
    pub fn check_tokens(&self, t: Tokens) -> Result<()> {
        self.validate()?;
        let detail = || format!("b {} s {} ({})", t.b, t.s, self.describe());
        if t.b == 0 || t.s == 0 {
            return Err(Error::DecoderShape { what: "no tokens (b or s is zero)", detail: detail() });
        }
        let widest = self.qkv_width().max(2 * self.ffn).max(self.d_model);
        if t.b.checked_mul(t.s).and_then(|n| n.checked_mul(widest)).is_none() {
            return Err(Error::DecoderShape {
                what: "an activation's element count overflows usize",
                detail: detail(),
            });
        }
        self.attention(t).validate()?;
        self.norm_problem(t, crate::norm::GradType::Io).validate()?;
        self.rope_problem(t).check_call(false)?;
        self.rope_problem(t).check_start(0)?;
        self.swiglu_problem(t).validate()?;
        self.gemms(t, self.precision()).map(|_| ())
    }

    /// That `T`, the element type a layer is built with, is the layer's dtype:
    /// [`Error::DTypeMismatch`] naming the element type otherwise (the CPU and GPU layers and
    /// the decode step check it at construction).
    pub(crate) fn check_element<T: crate::dtype::Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            let operand = crate::error::Which::Decoder("element type T");
            return Err(Error::DTypeMismatch { operand, expected: self.dtype, got: T::DTYPE });
        }
        Ok(())
    }

    /// The precision of every GEMM: the layer's dtype in and out, f32 accumulation.
    pub fn precision(&self) -> crate::precision::Precision {
        use crate::precision::Precision;
        if self.dtype == DType::F16 {
            Precision::F16
        } else {
            Precision::BF16
        }
    }

    // The size helpers below saturate at `usize::MAX` rather than panic (debug) or wrap
    // (release): exact for every layer that passes `validate` (whose weights' bytes fit
    // `isize::MAX`), and on one it refuses a saturated size is never mistaken for a small one.

    /// The width of q's heads, `h_q·hd` (also o's). Saturating: exact for a layer that passes
    /// [`DecoderLayer::validate`].
    pub const fn q_width(&self) -> usize {
        self.heads_q.saturating_mul(self.head_dim)
    }

    /// The width of k's heads (and of v's), `h_kv·hd`. Saturating, as [`DecoderLayer::q_width`].
    pub const fn kv_width(&self) -> usize {
        self.heads_kv.saturating_mul(self.head_dim)
    }

    /// The fused projection's output width `(h_q + 2·h_kv)·hd`: one row of `qkv`. Saturating,
    /// as [`DecoderLayer::q_width`].
    pub const fn qkv_width(&self) -> usize {
        self.q_width().saturating_add(self.kv_width().saturating_mul(2))
    }

    /// Where q, k and v start in a row of `qkv`, in elements: `0`, `h_q·hd`, `(h_q + h_kv)·hd`.
    /// Saturating, as [`DecoderLayer::q_width`].
    pub const fn qkv_offsets(&self) -> [usize; 3] {
        [0, self.q_width(), self.q_width().saturating_add(self.kv_width())]
    }

    /// A weight's `[rows, cols]`. Saturating, as [`DecoderLayer::q_width`].
    pub const fn weight_shape(&self, w: LayerWeight) -> [usize; 2] {
        match w {
            LayerWeight::Qkv => [self.qkv_width(), self.d_model],
            LayerWeight::O => [self.d_model, self.q_width()],
            LayerWeight::GateUp => [self.ffn.saturating_mul(2), self.d_model],
            LayerWeight::Down => [self.d_model, self.ffn],
            LayerWeight::Norm1 | LayerWeight::Norm2 => [1, self.d_model],
        }
    }

    /// A weight's element count. Saturating: exact for a layer that passes
    /// [`DecoderLayer::validate`] (which also keeps the sum over the six weights, in bytes,
    /// within `isize::MAX`); `usize::MAX` where the product overflows.
    pub const fn weight_len(&self, w: LayerWeight) -> usize {
        let [r, c] = self.weight_shape(w);
        r.saturating_mul(c)
    }

    /// The attention of `t` tokens: causal, `h_q`/`h_kv` heads of `hd`, scale `1/√hd`, in
    /// the layer's dtype, q, k and v read in place from `qkv` (row stride
    /// [`DecoderLayer::qkv_width`], each view starting at its [`DecoderLayer::qkv_offsets`]
    /// entry), o written `[T, h_q·hd]` (BSHD).
    pub fn attention(&self, t: Tokens) -> Attention {
        let w = self.qkv_width();
        let packed = HeadLayout { batch: t.s.saturating_mul(w), head: self.head_dim, seq: w };
        let mut p = Attention::new(t.b, (self.heads_q, self.heads_kv), (t.s, t.s), self.head_dim, self.dtype)
            .with_mask(AttnMask::Causal);
        p.layouts[..3].copy_from_slice(&[packed; 3]);
        p
    }

    /// Floating-point operations of one forward on `t` (`backward`: forward and backward), as
    /// the benchmark counts them: 2 per multiply-add of the four projections (×3 with the
    /// backward: dX and dW), and attention's [`Attention::forward_flops`] (×3.5 with the
    /// backward); norms, RoPE and SwiGLU are not counted. Counted in f64 from the sizes (no
    /// integer product, so no overflow on any sizes; exact while the counts stay below 2⁵³).
    pub fn flops(&self, t: Tokens, backward: bool) -> f64 {
        let weights = self.weight_elems_f64() - 2.0 * self.d_model as f64; // the norms are not GEMMs
        let gemm = 2.0 * t.b as f64 * t.s as f64 * weights;
        let attn = self.attention(t).forward_flops();
        if backward {
            3.0 * gemm + 3.5 * attn
        } else {
            gemm + attn
        }
    }

    /// `d 4096 heads 32/8×128 ffn 14336 eps 1e-5 rope θ 500000 rotate-half bf16`.
    pub fn describe(&self) -> String {
        format!(
            "d {} heads {}/{}×{} ffn {} eps {:e} rope θ {} {} {}",
            self.d_model,
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            self.ffn,
            self.eps,
            self.rope_theta,
            self.rope.name(),
            self.dtype
        )
    }
}
