//! RMSNorm as data: [`RmsNorm`] (PyTorch's `F.rms_norm(x, (features,), w, eps)` over the last
//! dimension, as LLaMA-style transformer layers use it), its tensors' row strides
//! ([`NormTensor`]), the weight gradient's type ([`GradType`]) and every rule a problem must
//! meet, checked on the CPU before anything is launched. [`self::reference`] holds the float64
//! definitions tests check against; the CPU backend is [`crate::cpu::rms_norm_forward`] and
//! [`crate::cpu::rms_norm_backward`], the GPU path [`crate::cuda::Gpu::rms_norm_forward`] and
//! [`crate::cuda::Gpu::rms_norm_backward`] on cuDNN's norm graph.
//!
//! Shapes (row-major, one row per token):
//! - input `x[rows, features]`, weight (scale) `w[features]`, output `y[rows, features]`;
//! - the inverse RMS `inv_rms[rows]` (f32, dense), what the training forward saves for the
//!   backward;
//! - gradients `dy`, `dx` shaped as `y` and `x`, `dw[features]` in f32 or the I/O type;
//! - with a pre-norm residual (GPU only): `residual[rows, features]` and the sum
//!   `sum = x + residual` (written; the norm reads it).
//!
//! Each of `x`, `y`, `dy`, `dx`, `residual`, `sum` has its own leading dimension (elements from
//! one row to the next, ≥ `features`), so a row slice of a wider buffer — a fused QKV
//! projection's output, a residual stream — is read or written in place.
//!
//! For row `i` (`C = features`, `ε = eps`):
//! `inv_rms[i] = 1 / √(Σ_j x[i, j]² / C + ε)`, `y[i, j] = x[i, j] · inv_rms[i] · w[j]`.
//! The backward, with `x̂ = x · inv_rms` and `g = dy · w`:
//! `dx[i, j] = inv_rms[i] · (g[i, j] − x̂[i, j] · Σ_k g[i, k] · x̂[i, k] / C)`,
//! `dw[j] = Σ_i dy[i, j] · x̂[i, j]`.
//!
//! The sum of squares is accumulated in f32, as PyTorch's f32 path does: a row whose sum of
//! squares passes f32's range (elements of about 1.8·10¹⁹/√features in magnitude) overflows
//! it, giving `inv_rms = 0` and `y = 0`.

pub mod reference;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The largest size, leading dimension or element count a problem may have: cuDNN's tensor
/// descriptors take `int64_t` sizes and strides, but its engines index within a tensor in 32
/// bits (as for attention, [`crate::attention::MAX_ELEMS`]).
pub const MAX_ELEMS: usize = i32::MAX as usize;

/// One of the problem's row-major tensors (for leading dimensions and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormTensor {
    /// The input `x` (the forward's, and the backward's saved one).
    X,
    /// The output `y`.
    Y,
    /// The output's gradient `dy`.
    Dy,
    /// The input's gradient `dx`.
    Dx,
    /// The pre-norm residual added to `x`.
    Residual,
    /// The sum `x + residual` the forward writes and normalises.
    Sum,
}

impl NormTensor {
    /// Every tensor, in the order of [`RmsNorm::lds`].
    pub const ALL: [NormTensor; 6] =
        [NormTensor::X, NormTensor::Y, NormTensor::Dy, NormTensor::Dx, NormTensor::Residual, NormTensor::Sum];

    /// `x`, `y`, `dy`, `dx`, `residual` or `sum`.
    pub const fn name(self) -> &'static str {
        match self {
            NormTensor::X => "x",
            NormTensor::Y => "y",
            NormTensor::Dy => "dy",
            NormTensor::Dx => "dx",
            NormTensor::Residual => "residual",
            NormTensor::Sum => "sum",
        }
    }
}

/// The storage type of the weight gradient `dw`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GradType {
    /// The I/O type ([`RmsNorm::dtype`]): what PyTorch's `F.rms_norm` gives.
    #[default]
    Io,
    /// f32 (the reduction over rows kept at full precision, for an f32 master weight).
    F32,
}

/// One RMSNorm problem (see the module documentation for shapes and the definition).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNorm {
    /// Rows (tokens).
    pub rows: usize,
    /// Features per row (the hidden size), the extent normalised over.
    pub features: usize,
    /// ε, added to the mean square; finite and positive.
    pub eps: f32,
    /// The element type of x, w, y, dy, dx, residual and sum: f16, bf16 or f32 (f32
    /// arithmetic throughout).
    pub dtype: DType,
    /// The weight gradient's type.
    pub dw: GradType,
    /// Leading dimensions, in elements, in the order of [`NormTensor::ALL`].
    pub lds: [usize; 6],
}

impl RmsNorm {
    /// `rows` rows of `features` features, ε = `eps`, every tensor contiguous (leading
    /// dimension `features`), `dw` in the I/O type. Not checked here (problems are data):
    /// [`RmsNorm::validate`] and every call check it.
    pub fn new(rows: usize, features: usize, eps: f32, dtype: DType) -> RmsNorm {
        RmsNorm { rows, features, eps, dtype, dw: GradType::Io, lds: [features; 6] }
    }

    /// The same with tensor `t`'s leading dimension `ld` (elements).
    #[must_use]
    pub fn with_ld(mut self, t: NormTensor, ld: usize) -> RmsNorm {
        self.lds[t as usize] = ld;
        self
    }

    /// The same with the weight gradient in `dw`.
    #[must_use]
    pub fn with_dw(self, dw: GradType) -> RmsNorm {
        RmsNorm { dw, ..self }
    }

    /// Tensor `t`'s leading dimension.
    pub fn ld(&self, t: NormTensor) -> usize {
        self.lds[t as usize]
    }

    /// Whether tensor `t`'s rows are strided (leading dimension above the features).
    pub fn strided(&self, t: NormTensor) -> bool {
        self.ld(t) != self.features
    }

    /// The element type of `dw`.
    pub fn dw_dtype(&self) -> DType {
        match self.dw {
            GradType::Io => self.dtype,
            GradType::F32 => DType::F32,
        }
    }

    /// Elements a buffer of tensor `t` must hold: `(rows − 1)·ld + features` (saturating).
    pub fn required_elems(&self, t: NormTensor) -> usize {
        self.rows.saturating_sub(1).saturating_mul(self.ld(t)).saturating_add(self.features)
    }

    /// Where element `[row, col]` of tensor `t` lives, in elements from its start:
    /// `row·ld + col`. Arithmetic only, no bounds check: meaningful for `row < rows`,
    /// `col < features` of a problem that passes [`RmsNorm::validate`] (its spans fit in
    /// [`MAX_ELEMS`], so the product cannot overflow).
    pub fn index(&self, t: NormTensor, row: usize, col: usize) -> usize {
        row * self.ld(t) + col
    }

    /// Tensor `t`'s logical elements of `buf` (laid out as the problem says), row by row:
    /// `rows·features` values.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] when `buf` holds fewer than [`RmsNorm::required_elems`]
    /// elements (nothing is read then).
    pub fn gather<V: Copy>(&self, t: NormTensor, buf: &[V]) -> Result<Vec<V>> {
        let which = crate::error::Which::Norm(t.name());
        Error::check_len(which, buf.len(), self.required_elems(t), std::mem::size_of::<V>())?;
        let mut out = Vec::with_capacity(self.rows * self.features);
        for i in 0..self.rows {
            let at = self.index(t, i, 0);
            out.extend_from_slice(&buf[at..at + self.features]);
        }
        Ok(out)
    }

    /// Bytes one forward moves at least: x and w read, y written, and (training) the inverse
    /// RMS written — the count a bandwidth figure divides by.
    pub fn forward_bytes(&self, training: bool) -> f64 {
        let e = self.dtype.size_bytes() as f64;
        let (r, c) = (self.rows as f64, self.features as f64);
        2.0 * r * c * e + c * e + if training { 4.0 * r } else { 0.0 }
    }

    /// Bytes one backward moves at least: x, dy, w and the inverse RMS read, dx and dw written.
    pub fn backward_bytes(&self) -> f64 {
        let e = self.dtype.size_bytes() as f64;
        let (r, c) = (self.rows as f64, self.features as f64);
        3.0 * r * c * e + c * e + 4.0 * r + c * self.dw_dtype().size_bytes() as f64
    }

    /// A one-line description for messages and logs.
    pub fn describe(&self) -> String {
        let lds = if self.lds.iter().all(|&l| l == self.features) {
            String::new()
        } else {
            let s: Vec<String> = NormTensor::ALL.iter().map(|&t| format!("{}{}", t.name(), self.ld(t))).collect();
            format!(" ld {}", s.join(","))
        };
        let dw = match self.dw {
            GradType::Io => "",
            GradType::F32 => " dw f32",
        };
        format!("rms_norm {}×{} {} eps {:e}{lds}{dw}", self.rows, self.features, self.dtype, self.eps)
    }

    /// Every rule: sizes non-zero and at most [`MAX_ELEMS`]; ε finite and positive; every
    /// leading dimension at least the features; every tensor's span at most [`MAX_ELEMS`]
    /// elements.
    ///
    /// Zero sizes: unlike SwiGLU and RoPE ([`crate::layer_ops`]), where zero rows or tokens
    /// are a call that does nothing, RMSNorm refuses zero rows as it refuses zero features —
    /// cuDNN's norm graph takes no tensor with an empty dimension, and the CPU backend keeps
    /// the same rule.
    ///
    /// The GPU calls check every tensor's leading dimension; the CPU calls
    /// ([`crate::cpu::rms_norm_forward`], [`crate::cpu::rms_norm_backward`]) only those of the
    /// tensors they read or write.
    ///
    /// # Errors
    /// [`Error::NormShape`] naming the rule and the values.
    pub fn validate(&self) -> Result<()> {
        self.validate_tensors(&NormTensor::ALL)
    }

    /// The rules of [`RmsNorm::validate`], the leading-dimension ones for the tensors in
    /// `used` only.
    pub(crate) fn validate_tensors(&self, used: &[NormTensor]) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::NormShape { what, detail });
        for (name, v) in [("rows", self.rows), ("features", self.features)] {
            if v == 0 {
                return bad("a size is zero", format!("{name} = 0 ({})", self.describe()));
            }
            if v > MAX_ELEMS {
                return bad("a size is too large", format!("{name} = {v} > {MAX_ELEMS} ({})", self.describe()));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("epsilon is not finite and positive", format!("eps = {} ({})", self.eps, self.describe()));
        }
        for &t in used {
            let ld = self.ld(t);
            if ld < self.features {
                let detail = format!("ld of {} = {ld} < features = {} ({})", t.name(), self.features, self.describe());
                return bad("a leading dimension is smaller than the features", detail);
            }
            if ld > MAX_ELEMS || self.required_elems(t) > MAX_ELEMS {
                let detail = format!(
                    "{} spans {} elements (ld {ld}), above {MAX_ELEMS} ({})",
                    t.name(),
                    self.required_elems(t),
                    self.describe()
                );
                return bad("a tensor spans more than 2³¹ − 1 elements", detail);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
