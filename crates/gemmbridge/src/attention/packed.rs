//! q, k and v (or their gradients) interleaved in one buffer, as a fused projection writes them
//! (`x·w_qkvᵀ`: each token's row holds q's heads, then k's, then v's): when such views share no
//! element, although their byte ranges overlap.

use super::{Attention, AttnTensor};
use crate::error::{Error, Result};

/// Whether q, k and v laid out as `p.layouts` say, starting `offsets` elements into one buffer
/// (q, k, v in that order), share no element: every one has the same row stride `R`
/// (`layouts[t].seq`), a batch stride that is a multiple of `R`, and all of its heads inside
/// one column band of the row — `[offset mod R, offset mod R + (heads − 1)·head + d)`, within
/// the row — and the three bands do not meet. An element of view `t` then lies at a column
/// (address mod `R`) inside `t`'s band, so views in disjoint bands cannot share one. A view
/// of one batch entry and one row needs no stride rule.
///
/// # Errors
/// [`Error::AttentionShape`] naming the rule broken and the values.
pub fn check_packed(p: &Attention, offsets: [usize; 3]) -> Result<()> {
    let tensors = [AttnTensor::Q, AttnTensor::K, AttnTensor::V];
    let row = p.layout(AttnTensor::Q).seq;
    let bad = |what: &'static str| {
        let d = format!("offsets {offsets:?}, layouts {:?} ({})", &p.layouts[..3], p.describe());
        Err(Error::AttentionShape { what, detail: d })
    };
    let mut bands = [(0usize, 0usize); 3];
    for (i, t) in tensors.into_iter().enumerate() {
        let ([b, h, s], l) = (p.dims(t), p.layout(t));
        if p.d == 0 || b == 0 || h == 0 || s == 0 {
            continue; // an empty view holds no element
        }
        if row == 0 || l.seq != row || (b > 1 && !l.batch.is_multiple_of(row)) {
            return bad("packed q, k, v do not share one row stride (with batch strides whole rows)");
        }
        let start = offsets[i] % row;
        // checked, not saturating: a row stride of usize::MAX would let a saturated end pass
        let end = (h - 1).checked_mul(l.head).and_then(|w| w.checked_add(p.d)).and_then(|w| w.checked_add(start));
        let Some(end) = end.filter(|&e| e <= row && (h == 1 || l.head >= p.d)) else {
            return bad("a packed view's heads do not fit in one band of its row");
        };
        bands[i] = (start, end);
    }
    for i in 0..3 {
        for j in i + 1..3 {
            let ((a0, a1), (b0, b1)) = (bands[i], bands[j]);
            if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
                return bad("packed views share columns of their rows");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::HeadLayout;
    use crate::DType;

    /// GQA 4/2 heads of 8, s 5, b 2, packed with row width (4 + 2 + 2)·8 = 64.
    fn packed() -> Attention {
        let row = 64;
        let l = HeadLayout { batch: 5 * row, head: 8, seq: row };
        let mut p = Attention::new(2, (4, 2), (5, 5), 8, DType::BF16);
        p.layouts[..3].copy_from_slice(&[l; 3]);
        p
    }

    #[test]
    fn a_fused_projections_views_are_disjoint() {
        check_packed(&packed(), [0, 32, 48]).unwrap();
        // the same with a batch offset of whole rows
        check_packed(&packed(), [640, 672, 688]).unwrap();
    }

    #[test]
    fn overlapping_or_ill_formed_views_are_refused() {
        let what = |p: &Attention, o| match check_packed(p, o) {
            Err(Error::AttentionShape { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(what(&packed(), [0, 24, 48]), "packed views share columns of their rows");
        assert_eq!(what(&packed(), [0, 32, 56]), "a packed view's heads do not fit in one band of its row");
        let mut p = packed();
        p.layouts[2].seq = 72;
        assert_eq!(what(&p, [0, 32, 48]), "packed q, k, v do not share one row stride (with batch strides whole rows)");
        let mut p = packed();
        p.layouts[1].batch = 5 * 64 + 8;
        assert_eq!(what(&p, [0, 32, 48]), "packed q, k, v do not share one row stride (with batch strides whole rows)");
    }

    /// A band whose end passes `usize::MAX` is refused, not an overflow: d ≈ usize::MAX / 3 in
    /// a packed layout, whose row stride saturates at usize::MAX.
    #[test]
    fn a_band_past_usize_is_refused() {
        let d = 6_148_914_691_236_517_206;
        let mut p = Attention::new(1, (1, 1), (0, 1), d, DType::F32);
        p.layouts = [HeadLayout { batch: d, head: d, seq: d }; 4];
        p.layouts[..3].copy_from_slice(&[HeadLayout::packed_qkv(1, 1, d); 3]);
        let offsets = [0, 1, 2].map(|i| HeadLayout::packed_qkv_offset(i, 1, d));
        let e = check_packed(&p, offsets).unwrap_err();
        assert!(
            matches!(e, Error::AttentionShape { what: "a packed view's heads do not fit in one band of its row", .. }),
            "{e}"
        );
    }
}
