//! FP8 (8-bit floating point) GEMM on Hopper: the formats, the scaling recipes, the layout of
//! the scale tensors, and the rules a problem must meet — all on the CPU, with no GPU needed.
//!
//! An FP8 GEMM here is row-major like every other GEMM in gemmbridge:
//! `y[M, N] = x[M, K] · w[N, K]ᵀ` (`F.linear`'s convention), where `x` and `w` are
//! [`Fp8Tensor`](crate::cuda::Fp8Tensor)s quantised by the library from f32/f16/bf16 data
//! ([`crate::cuda::GpuFp8::quantize`]), each with the scales of its [`Scaling`]. A weight stored
//! as `[K, N]` is quantised with [`Source::Transposed`] into the `[N, K]` layout the hardware
//! takes. The dequantised value of element `(r, c)` of an operand is `q[r, c] · s(r, c)` where
//! `s` is the scale of the group the element belongs to.
//!
//! What each recipe is, and where it runs (cuBLAS documentation, "cublasLtMatmul", the
//! scaling-mode table; checked at run time by [`check_support`]):
//!
//! | recipe | x scales | w scales | needs |
//! |---|---|---|---|
//! | tensor-wise | 1 | 1 | compute capability ≥ 8.9 |
//! | row-wise (outer vector) | `[M]` | `[N]` | sm_90, cuBLASLt ≥ 12.9 |
//! | block 1×128 · 128×128 (DeepSeek-V3's) | `[M, ⌈K/128⌉]` | `[⌈N/128⌉, ⌈K/128⌉]` | sm_90, cuBLASLt ≥ 12.9 |
//! | block 1×128 · 1×128 | `[M, ⌈K/128⌉]` | `[N, ⌈K/128⌉]` | sm_90, cuBLASLt ≥ 12.9 |
//! | block 128×128 · 1×128 | `[⌈M/128⌉, ⌈K/128⌉]` | `[N, ⌈K/128⌉]` | sm_90, cuBLASLt ≥ 12.9 |
//!
//! 128×128 · 128×128 is not offered by cuBLASLt, and neither is an FP8 output (with its D scale
//! and amax) with anything but tensor-wise scales.
//!
//! Formats: E4M3 × E4M3, and the gradient pairs E4M3 × E5M2 (E5M2 × E5M2 is not offered).
//! Outputs: bf16, f16 or f32 ([`crate::cuda::GpuFp8::gemm`]), or E4M3 with a D scale and amax
//! ([`crate::cuda::GpuFp8::gemm_to_fp8`], tensor-wise scales only). Every rule is checked on
//! the host before anything runs, a broken one [`crate::Error::Fp8`] naming it ([`Fp8Rule`]);
//! [`check_support`] says which recipes a GPU and cuBLASLt version offer.
//!
//! ```no_run
//! use gemmbridge::cuda::{Fp8Options, Gpu};
//! use gemmbridge::fp8::{Fp8Format, Scaling, Source};
//! use gemmbridge::half::bf16;
//!
//! let gpu = Gpu::new(0)?;
//! let (s, (m, n, k)) = (gpu.stream(), (4096, 7168, 2048));
//! let x = s.clone_htod(&vec![bf16::ONE; m * k])?; // activations [m, k]
//! let w = s.clone_htod(&vec![bf16::ONE; n * k])?; // nn.Linear's weight [n, k]
//! let xq = gpu.fp8().quantize(&x, m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row)?;
//! let wq = gpu.fp8().quantize(&w, n, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row)?;
//! let mut y = s.alloc_zeros::<bf16>(m * n)?;
//! gpu.fp8().gemm(&xq, &wq, &mut y, None, Fp8Options::default())?; // y[m, n] = x·wᵀ, row-wise scales
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the library takes care of
//! - **The layout Hopper needs** ("TN", 16-byte rows): an [`Fp8Tensor`](crate::cuda::Fp8Tensor)
//!   is made only by the library's quantisation, row-major `[rows, K]` with K padded with zeros
//!   to 16 bytes (zeros keep every product exact) and the scales in cuBLASLt's layout; a caller
//!   never builds a scale tensor.
//! - **Any M, N, K**: outputs whose rows the hardware cannot take, and block scales on shapes
//!   that are not multiples of 16, run on an aligned copy of `y` that is copied back.
//! - **The quantisation is specified on the CPU** ([`quantize`]: per group `scale = amax /
//!   max`, values multiplied by `max / amax`, rounded to nearest even and saturated to ±448 /
//!   ±57344) and the GPU kernels equal it bit for bit; [`dequantize`] reads a result back.
//! - **Capture**: the kernels compile on first use; `GpuFp8::prepare` compiles them ahead of
//!   a CUDA-graph capture.
//! - **Fast accumulation** is off by default ([`Fp8Options`](crate::cuda::Fp8Options)): at K =
//!   8192 on the H200 it raised the error against the dequantised product from 1.3e-4 to 1.0e-3
//!   (tensor-wise) and 2.0e-3 (row-wise).
//!
//! Accuracy: the GEMM is checked against the float64 product of the dequantised operands
//! (bf16/f16 output within 1e-2, f32 within 1e-3), and its error against the unquantised
//! inputs equals PyTorch's `torch._scaled_mm` recipe by recipe.

mod quant;
mod rules;

pub use crate::error::Fp8Rule;
pub(crate) use quant::scale_of;
pub use quant::{dequantize, fp8_to_f32, quantize, quantize_value, Quantized};
pub use rules::{check_pair, check_support, OutputKind, SCALING_PAIRS};

/// An 8-bit floating-point format (OCP FP8; the `FN` variants: no infinities in E4M3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits: largest finite value ±448, no infinity. The format
    /// for weights and activations.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits: largest finite value ±57344. The format for
    /// gradients (more range, less precision).
    E5M2,
}

impl Fp8Format {
    /// The largest finite value (448 for E4M3, 57344 for E5M2): a group's scale maps its
    /// largest magnitude onto it.
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    /// The name used in messages and tactic keys (`e4m3`, `e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }
}

impl std::fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How one operand's scales are grouped. The operand is `[rows, K]` (x: rows = M, w: rows = N).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaling {
    /// One scale for the whole tensor (cuBLASLt `SCALAR_32F`).
    Tensor,
    /// One scale per row (cuBLASLt `OUTER_VEC_32F`): `[rows]`.
    Row,
    /// One scale per 1×128 block along K (cuBLASLt `VEC128_32F`): `[rows, ⌈K/128⌉]`.
    Block1x128,
    /// One scale per 128×128 block (cuBLASLt `BLK128x128_32F`): `[⌈rows/128⌉, ⌈K/128⌉]`.
    Block128x128,
}

impl Scaling {
    /// The name used in messages, the benchmark and tactic keys.
    pub fn name(self) -> &'static str {
        match self {
            Scaling::Tensor => "tensor",
            Scaling::Row => "row",
            Scaling::Block1x128 => "1x128",
            Scaling::Block128x128 => "128x128",
        }
    }

    /// The group an element `(r, c)` belongs to, as (row group, column group).
    pub fn group(self, r: usize, c: usize) -> (usize, usize) {
        match self {
            Scaling::Tensor => (0, 0),
            Scaling::Row => (r, 0),
            Scaling::Block1x128 => (r, c / 128),
            Scaling::Block128x128 => (r / 128, c / 128),
        }
    }
}

impl std::fmt::Display for Scaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the high-precision source of a quantisation is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Row-major `[rows, K]` (activations `x[M, K]`, `F.linear`'s weight `w[N, K]`).
    RowMajor,
    /// Row-major `[K, rows]` (a weight stored `[K, N]`, as `x @ w`): transposed while it is
    /// quantised, into the `[rows, K]` layout the hardware takes.
    Transposed,
}

/// The layout of an FP8 operand and of its scale tensor: what [`crate::cuda::GpuFp8::quantize`]
/// produces for a `[rows, cols]` operand and what `cublasLtMatmul` reads.
///
/// Data: row-major `[rows_alloc, ld]` bytes, `ld` = `cols` rounded up to 16 and `rows_alloc` =
/// `rows` rounded up to 16 (Hopper's FP8 kernels need 16-byte leading dimensions, and 1×128
/// scales need row counts that are multiples of 4; the padding is zeros, which leaves every
/// product exact). Scales (f32, dequantisation factors), by [`Scaling`]:
/// - `Tensor`: 1 value; `Row`: `rows_alloc` values (1 for the padding rows);
/// - `Block1x128`: `[rows_alloc, ⌈cols/128⌉]` column-major: group `(r, kb)` at
///   `kb·rows_alloc + r`;
/// - `Block128x128`: `[⌈rows/128⌉, ⌈cols/128⌉]` K-major with the K extent rounded up to a
///   multiple of 4: group `(rb, kb)` at `rb·round4(⌈cols/128⌉) + kb`, the rest zeros.
///
/// (The block layouts are the ones cuBLASLt's `VEC128_32F` and `BLK128x128_32F` modes read,
/// the same PyTorch's `_scaled_mm` checks for its 1×128 and 128×128 scales.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Layout {
    /// Rows of the operand (M for x, N for w).
    pub rows: usize,
    /// Rows allocated: `rows` rounded up to 16 (the padding rows are zeros).
    pub rows_alloc: usize,
    /// Columns (K).
    pub cols: usize,
    /// Leading dimension of the data in bytes: `cols` rounded up to 16.
    pub ld: usize,
    /// How the scales are grouped.
    pub scaling: Scaling,
}

/// The most rows or columns an FP8 operand may have: 2³¹ − 16, so that its rows and leading
/// dimension rounded up to 16 still fit cuBLASLt's 32-bit `int` (and a kernel grid).
pub const MAX_ROWS: usize = (i32::MAX as usize) & !15;

/// [`Fp8Rule::Empty`] for no rows or columns, [`Error::DimensionTooLarge`] past [`MAX_ROWS`].
pub(crate) fn check_dims(rows: usize, cols: usize) -> crate::error::Result<()> {
    if rows == 0 || cols == 0 {
        return Err(crate::error::Error::Fp8 { rule: Fp8Rule::Empty, detail: format!("a [{rows}, {cols}] operand") });
    }
    for (what, v) in [("rows of an FP8 operand", rows), ("columns (K) of an FP8 operand", cols)] {
        if v > MAX_ROWS {
            return Err(crate::error::Error::DimensionTooLarge { what, value: v, max: MAX_ROWS });
        }
    }
    Ok(())
}

/// `x` rounded up to a multiple of `m`.
/// `x` rounded up to a multiple of `m`, saturating at `usize::MAX` (for sizes `check_dims`
/// refuses, so that a layout of them can be described without an overflow).
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m).saturating_mul(m)
}

impl Fp8Layout {
    /// The layout of a `[rows, cols]` operand with `scaling`. Sizes up to [`MAX_ROWS`] (what
    /// [`quantize`] and [`crate::cuda::GpuFp8::quantize`] accept); the size methods overflow
    /// beyond.
    pub fn new(rows: usize, cols: usize, scaling: Scaling) -> Fp8Layout {
        Fp8Layout { rows, rows_alloc: round_up(rows, 16), cols, ld: round_up(cols, 16), scaling }
    }

    /// Bytes of data: `rows_alloc · ld`.
    pub fn data_len(&self) -> usize {
        // saturating, as the other sizes: a layout built by hand may hold any counts
        self.rows_alloc.saturating_mul(self.ld)
    }

    /// Number of K blocks of 128.
    pub fn k_blocks(&self) -> usize {
        self.cols.div_ceil(128)
    }

    /// The leading dimension of the scale tensor, in f32s (see the type's documentation).
    pub fn scale_ld(&self) -> usize {
        match self.scaling {
            Scaling::Tensor | Scaling::Row => 1,
            Scaling::Block1x128 => self.rows_alloc,
            Scaling::Block128x128 => round_up(self.k_blocks(), 4),
        }
    }

    /// f32 values in the scale tensor.
    pub fn scale_len(&self) -> usize {
        match self.scaling {
            Scaling::Tensor => 1,
            Scaling::Row => self.rows_alloc,
            Scaling::Block1x128 => self.rows_alloc.saturating_mul(self.k_blocks()),
            Scaling::Block128x128 => self.rows.div_ceil(128).saturating_mul(self.scale_ld()),
        }
    }

    /// Where the scale of element `(r, c)` is stored.
    pub fn scale_index(&self, r: usize, c: usize) -> usize {
        let (gr, gc) = self.scaling.group(r, c);
        match self.scaling {
            Scaling::Tensor => 0,
            Scaling::Row => gr,
            Scaling::Block1x128 => gc * self.rows_alloc + gr,
            Scaling::Block128x128 => gr * self.scale_ld() + gc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_documented_scale_shapes() {
        // x [M=256, K=384] with 1×128: [256, 3] column-major (256 is a multiple of 16)
        let x = Fp8Layout::new(256, 384, Scaling::Block1x128);
        assert_eq!((x.ld, x.scale_len(), x.scale_ld()), (384, 768, 256));
        assert_eq!(x.scale_index(5, 130), 256 + 5);
        // w [N=512, K=384] with 128×128: 4 row blocks, 3 K blocks rounded up to 4
        let w = Fp8Layout::new(512, 384, Scaling::Block128x128);
        assert_eq!((w.scale_len(), w.scale_ld()), (16, 4));
        assert_eq!(w.scale_index(300, 260), 2 * 4 + 2);
        // K not a multiple of 16 pads the data to 16 bytes; a partial last block counts
        let odd = Fp8Layout::new(3, 130, Scaling::Block1x128);
        assert_eq!((odd.ld, odd.rows_alloc, odd.k_blocks(), odd.scale_len()), (144, 16, 2, 32));
        assert_eq!(odd.scale_index(2, 129), 16 + 2);
        assert_eq!(Fp8Layout::new(7, 5, Scaling::Row).scale_len(), 16);
        assert_eq!(Fp8Layout::new(7, 5, Scaling::Tensor).scale_index(6, 4), 0);
    }

    /// Sizes past usize describe saturated layouts instead of overflowing, and a hand-built
    /// layout with such counts is refused by `dequantize` (rows_alloc = usize::MAX with
    /// 1×128 scales overflowed `scale_len`).
    #[test]
    fn huge_layouts_saturate() {
        let l = Fp8Layout::new(usize::MAX, usize::MAX, Scaling::Block1x128);
        assert_eq!((l.rows_alloc, l.ld, l.data_len(), l.scale_len()), (usize::MAX, usize::MAX, usize::MAX, usize::MAX));
        let layout = Fp8Layout { rows: 1, rows_alloc: usize::MAX, cols: 1, ld: 1, scaling: Scaling::Block1x128 };
        let q = Quantized { layout, format: Fp8Format::E4M3, data: Vec::new(), scales: Vec::new() };
        assert!(dequantize(&q).is_err());
    }
}
