//! The quantisation every recipe uses, on the CPU: the specification the GPU kernels are
//! tested against bit for bit, and the reference the FP8 GEMM's accuracy is measured with.
//!
//! For each group (see [`Scaling::group`]) with largest magnitude `amax` (NaNs ignored, as
//! `fmaxf` does):
//! - the stored scale is `s = amax / fmax` and the quantisation multiplier `inv = fmax / amax`
//!   (both one correctly rounded f32 division; `s = inv = 1` for an all-zero group; where
//!   the division overflows, for groups below `fmax / f32::MAX`, `inv = f32::MAX` and
//!   `s = 1 / f32::MAX`), with
//!   `fmax` = 448 (E4M3) or 57344 (E5M2);
//! - each element becomes `q = fp8(x · inv)` (one f32 multiplication), rounded to nearest-even
//!   and saturated to ±fmax (CUDA's `cvt.rn.satfinite`; NaN becomes the NaN `0x7F`, ±∞
//!   becomes ±fmax).
//!
//! So `q · s` is within FP8's rounding of `x`. An infinite input makes its group's `s`
//! infinite and `inv` zero: that group dequantises to NaN, which the GEMM then propagates.

use float8::{F8E4M3, F8E5M2};

use super::{Fp8Format, Fp8Layout, Scaling, Source};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};

/// A quantised operand on the host: data `[rows_alloc, ld]` and scales in [`Fp8Layout`]'s
/// order.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    /// The layout (shape, leading dimension, scaling).
    pub layout: Fp8Layout,
    /// The format of the data.
    pub format: Fp8Format,
    /// FP8 bit patterns, row-major `[rows_alloc, ld]`, zeros past `cols` and `rows`.
    pub data: Vec<u8>,
    /// Dequantisation scales (see [`Fp8Layout`] for their order).
    pub scales: Vec<f32>,
}

/// `fp8(v · inv)`: the bit pattern of `v · inv` rounded to nearest-even and saturated; a NaN
/// (of either sign, as `∞ · 0` makes) becomes the positive NaN `0x7F`, as the GPU's
/// conversion writes it.
pub fn quantize_value(v: f32, inv: f32, format: Fp8Format) -> u8 {
    let x = v * inv;
    if x.is_nan() {
        return 0x7F;
    }
    match format {
        Fp8Format::E4M3 => F8E4M3::from_f32(x).to_bits(),
        Fp8Format::E5M2 => F8E5M2::from_f32(x).to_bits(),
    }
}

/// The value of an FP8 bit pattern (exact).
pub fn fp8_to_f32(bits: u8, format: Fp8Format) -> f32 {
    match format {
        Fp8Format::E4M3 => F8E4M3::from_bits(bits).to_f32(),
        Fp8Format::E5M2 => F8E5M2::from_bits(bits).to_f32(),
    }
}

/// `(s, inv)` for a group whose largest magnitude is `amax` (see the module documentation).
pub(crate) fn scale_of(amax: f32, format: Fp8Format) -> (f32, f32) {
    if amax == 0.0 {
        (1.0, 1.0)
    } else {
        let inv = format.max() / amax;
        if inv == f32::INFINITY {
            // a group so small that fmax / amax overflows (amax < fmax / f32::MAX): the largest
            // finite multiplier still maps it inside ±fmax (its zeros stay zeros), and the
            // scale is its reciprocal, as Transformer Engine does
            (1.0 / f32::MAX, f32::MAX)
        } else {
            (amax / format.max(), inv)
        }
    }
}

/// Quantises a `[rows, cols]` operand stored as `source` says (`[rows, cols]` row-major, or
/// `[cols, rows]` row-major for [`Source::Transposed`]) into `format` with `scaling`.
///
/// # Errors
/// [`Error::Fp8`] ([`super::Fp8Rule::Empty`]) for no rows or columns;
/// [`Error::DimensionTooLarge`] past [`super::MAX_ROWS`] rows or columns;
/// [`Error::BufferTooSmall`] when `src` holds fewer than `rows · cols` elements,
/// [`Error::BufferTooLarge`] when it holds more (`src` must be exactly the operand).
pub fn quantize<T: Element>(
    src: &[T],
    rows: usize,
    cols: usize,
    source: Source,
    format: Fp8Format,
    scaling: Scaling,
) -> Result<Quantized> {
    super::check_dims(rows, cols)?;
    let need = rows * cols; // < 2⁶² after check_dims
    if src.len() != need {
        let elem_bytes = T::DTYPE.size_bytes();
        let (operand, len_bytes, needed_bytes) = (Which::Source, src.len() * elem_bytes, need * elem_bytes);
        return Err(if src.len() < need {
            Error::BufferTooSmall { operand, len_bytes, needed_bytes, needed_elems: need, elem_bytes }
        } else {
            Error::BufferTooLarge { operand, len_bytes, needed_bytes, needed_elems: need, elem_bytes }
        });
    }
    let at = |r: usize, c: usize| match source {
        Source::RowMajor => src[r * cols + c].to_f32(),
        Source::Transposed => src[c * rows + r].to_f32(),
    };
    let layout = Fp8Layout::new(rows, cols, scaling);
    // padding rows (rows..rows_alloc) are zeros: their groups' amax stays 0, scale 1
    let mut amax = vec![0.0f32; layout.scale_len()];
    for r in 0..rows {
        for c in 0..cols {
            let i = layout.scale_index(r, c);
            amax[i] = amax[i].max(at(r, c).abs());
        }
    }
    let pairs: Vec<(f32, f32)> = amax.iter().map(|&a| scale_of(a, format)).collect();
    let mut data = vec![0u8; layout.data_len()];
    for r in 0..rows {
        for c in 0..cols {
            data[r * layout.ld + c] = quantize_value(at(r, c), pairs[layout.scale_index(r, c)].1, format);
        }
    }
    let mut scales: Vec<f32> = pairs.iter().map(|p| p.0).collect();
    if scaling == Scaling::Block128x128 {
        // the K extent's rounding to 4: entries past ⌈cols/128⌉ are not groups
        let (kb, ld) = (layout.k_blocks(), layout.scale_ld());
        for (i, s) in scales.iter_mut().enumerate() {
            if i % ld >= kb {
                *s = 0.0;
            }
        }
    }
    Ok(Quantized { layout, format, data, scales })
}

/// The dequantised operand `[rows, cols]` row-major: `q · s` per element, in f64.
///
/// # Errors
/// [`Error::BufferTooSmall`] when `data` or `scales` is shorter than the layout says
/// (a hand-built [`Quantized`]); [`Error::DimensionTooLarge`] as [`quantize`].
pub fn dequantize(q: &Quantized) -> Result<Vec<f64>> {
    let l = &q.layout;
    super::check_dims(l.rows, l.cols)?;
    // a hand-built layout must agree with itself (what Fp8Layout::new makes always does)
    let own = super::Fp8Layout::new(l.rows, l.cols, l.scaling);
    if l.ld < l.cols || l.rows_alloc < l.rows || l.scale_len() < own.scale_len() {
        return Err(Error::Fp8 {
            rule: super::Fp8Rule::Layout,
            detail: format!(
                "layout {l:?}: ld {} < cols {}, rows_alloc {} < rows {}, or {} scales where {} \
                 are needed; build it with Fp8Layout::new",
                l.ld,
                l.cols,
                l.rows_alloc,
                l.rows,
                l.scale_len(),
                own.scale_len()
            ),
        });
    }
    for (which, len, need, elem_bytes) in
        [(Which::Source, q.data.len(), l.data_len(), 1), (Which::Scale, q.scales.len(), l.scale_len(), 4)]
    {
        Error::check_len(which, len, need, elem_bytes)?;
    }
    let mut out = vec![0.0f64; l.rows * l.cols];
    for r in 0..l.rows {
        for c in 0..l.cols {
            let v = fp8_to_f32(q.data[r * l.ld + c], q.format) as f64;
            out[r * l.cols + c] = v * q.scales[l.scale_index(r, c)] as f64;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_nearest_even_and_saturates() {
        // E4M3 around 1: spacing 1/8; 1 + 1/16 is a tie → even (1.0), 1 + 3/16 → 1.25
        assert_eq!(fp8_to_f32(quantize_value(1.0625, 1.0, Fp8Format::E4M3), Fp8Format::E4M3), 1.0);
        assert_eq!(fp8_to_f32(quantize_value(1.1875, 1.0, Fp8Format::E4M3), Fp8Format::E4M3), 1.25);
        // saturation at ±448 / ±57344, infinity included; NaN stays NaN
        for (f, big) in [(Fp8Format::E4M3, 448.0f32), (Fp8Format::E5M2, 57344.0)] {
            assert_eq!(fp8_to_f32(quantize_value(1e9, 1.0, f), f), big);
            assert_eq!(fp8_to_f32(quantize_value(f32::NEG_INFINITY, 1.0, f), f), -big);
            assert!(fp8_to_f32(quantize_value(f32::NAN, 1.0, f), f).is_nan());
        }
        // E4M3's smallest subnormal is 2^-9; half of it ties to zero, just above rounds up
        assert_eq!(quantize_value(2f32.powi(-10), 1.0, Fp8Format::E4M3), 0);
        assert_eq!(quantize_value(2f32.powi(-10) * 1.01, 1.0, Fp8Format::E4M3), 1);
        assert_eq!(quantize_value(-0.0, 1.0, Fp8Format::E4M3), 0x80);
    }

    #[test]
    fn every_recipe_round_trips_within_fp8_rounding() {
        let (rows, cols) = (130, 260);
        let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013).collect();
        for scaling in [Scaling::Tensor, Scaling::Row, Scaling::Block1x128, Scaling::Block128x128] {
            for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
                let q = quantize(&src, rows, cols, Source::RowMajor, f, scaling).unwrap();
                let back = dequantize(&q).unwrap();
                // relative step of the format: 2^-3 (E4M3), 2^-2 (E5M2); half of it per element
                let tol = if f == Fp8Format::E4M3 { 1.0 / 16.0 } else { 1.0 / 8.0 };
                for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
                    let amax = 6.5f64; // |src| ≤ 6.5 everywhere
                    assert!(
                        (x as f64 - y).abs() <= tol * (x.abs() as f64).max(amax / 64.0),
                        "{scaling} {f} {i}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_transposed_source_gives_the_same_operand() {
        let (rows, cols) = (33, 140);
        let src: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * (1 + i % 5) as f32).collect();
        let mut t = vec![0.0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = src[r * cols + c];
            }
        }
        for scaling in [Scaling::Tensor, Scaling::Row, Scaling::Block1x128, Scaling::Block128x128] {
            let a = quantize(&src, rows, cols, Source::RowMajor, Fp8Format::E4M3, scaling).unwrap();
            let b = quantize(&t, rows, cols, Source::Transposed, Fp8Format::E4M3, scaling).unwrap();
            assert_eq!(a, b, "{scaling}");
        }
    }

    #[test]
    fn zero_groups_get_unit_scales_and_padding_stays_zero() {
        let src = vec![0.0f32; 4 * 20];
        let q = quantize(&src, 4, 20, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap();
        assert_eq!(q.scales, vec![1.0; 16]);
        assert_eq!(q.data.len(), 16 * 32);
        assert!(q.data.iter().all(|&b| b == 0));
        let e = quantize(&src[..10], 4, 20, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { .. }));
        // sizes are checked before any arithmetic on them
        let e = quantize::<f32>(&[], 1 << 33, 1 << 31, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { .. }), "{e}");
        let e = quantize::<f32>(&[], 0, 5, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap_err();
        assert!(matches!(e, Error::Fp8 { rule: super::super::Fp8Rule::Empty, .. }), "{e}");
        let mut short = q.clone();
        short.scales.truncate(3);
        assert!(matches!(dequantize(&short), Err(Error::BufferTooSmall { .. })));
    }

    #[test]
    fn a_source_of_any_other_length_than_rows_times_cols_is_refused() {
        let src: Vec<half::f16> = (0..31).map(|i| half::f16::from_f32(i as f32 / 8.0)).collect();
        let (rows, cols) = (5, 6);
        assert!(quantize(&src[..30], rows, cols, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).is_ok());
        let short = quantize(&src[..29], rows, cols, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).unwrap_err();
        let want = Error::BufferTooSmall {
            operand: Which::Source,
            len_bytes: 58,
            needed_bytes: 60,
            needed_elems: 30,
            elem_bytes: 2,
        };
        assert_eq!(short, want);
        for source in [Source::RowMajor, Source::Transposed] {
            let long = quantize(&src, rows, cols, source, Fp8Format::E5M2, Scaling::Row).unwrap_err();
            let want = Error::BufferTooLarge {
                operand: Which::Source,
                len_bytes: 62,
                needed_bytes: 60,
                needed_elems: 30,
                elem_bytes: 2,
            };
            assert_eq!(long, want, "{source:?}");
            assert_eq!(
                long.to_string(),
                "quantisation source buffer holds 62 bytes but its layout addresses exactly 60 (30 elements of 2 bytes)"
            );
        }
    }

    #[test]
    fn tiny_groups_stay_finite() {
        // fmax / amax overflows f32 below amax ≈ 1.3e-36 (E4M3): the multiplier is f32::MAX
        let src = [1e-37f32, 0.0, -5e-38, 0.0];
        for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let q = quantize(&src, 1, 4, Source::RowMajor, f, Scaling::Tensor).unwrap();
            let back = dequantize(&q).unwrap();
            assert!(back.iter().all(|v| v.is_finite()), "{f}: {back:?}");
            assert_eq!((back[1], back[3]), (0.0, 0.0));
            assert!((back[0] - 1e-37).abs() <= 0.13 * 1e-37 && back[2] < 0.0, "{f}: {back:?}");
        }
    }

    #[test]
    fn a_layout_that_contradicts_itself_is_refused() {
        let v = [1.0f32, -2.0, 3.5, 1000.0, 0.001, -448.0];
        let good = quantize(&v, 2, 3, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).unwrap();
        let mut q = good.clone();
        q.layout.rows_alloc = 0;
        q.data.clear();
        assert!(matches!(dequantize(&q), Err(Error::Fp8 { rule: super::super::Fp8Rule::Layout, .. })));
        let mut q = good.clone();
        q.layout.ld = 1;
        assert!(matches!(dequantize(&q), Err(Error::Fp8 { rule: super::super::Fp8Rule::Layout, .. })));
        let mut q = good;
        q.scales.clear();
        assert!(matches!(dequantize(&q), Err(Error::BufferTooSmall { operand: Which::Scale, .. })));
    }
}
