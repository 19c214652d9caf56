//! Checks of the buffers a problem is run on, shared by every backend.
//!
//! [`GemmProblem::new`](crate::GemmProblem::new) has already checked everything that does not
//! depend on the buffers; this module checks the rest (dtype, null, alignment, length,
//! aliasing) before anything is launched.

use crate::dtype::DType;
use crate::error::{Error, Result, Which};
use crate::layout::MatrixLayout;
use crate::problem::GemmProblem;

/// A buffer as the checks see it: where it starts, how long it is, what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferDesc {
    /// Address of the first element (device or host), in bytes.
    pub address: u64,
    /// Length, in bytes.
    pub len_bytes: usize,
    /// Element type.
    pub dtype: DType,
}

/// The byte range a checked operand addresses: `[start, end)`; empty when `start == end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub start: u64,
    pub end: u64,
}

fn check_one(which: Which, buf: BufferDesc, expected: DType, layout: MatrixLayout, batch: usize) -> Result<Extent> {
    if buf.dtype != expected {
        return Err(Error::DTypeMismatch { operand: which, expected, got: buf.dtype });
    }
    if batch == 0 {
        // nothing is read or written: any buffer will do
        return Ok(Extent { start: buf.address, end: buf.address });
    }
    let elem_bytes = expected.size_bytes();
    // GemmProblem::new has checked that required_elems does not overflow.
    let needed_elems = layout.required_elems(batch).unwrap_or(usize::MAX);
    let needed_bytes = needed_elems.saturating_mul(elem_bytes);
    if needed_elems == 0 {
        return Ok(Extent { start: buf.address, end: buf.address });
    }
    if buf.address == 0 {
        return Err(Error::NullPointer { operand: which, needed_bytes });
    }
    if !buf.address.is_multiple_of(elem_bytes as u64) {
        return Err(Error::Misaligned { operand: which, address: buf.address, align: elem_bytes });
    }
    Error::check_bytes(which, buf.len_bytes, needed_elems, elem_bytes)?;
    let end = buf.address.checked_add(needed_bytes as u64).ok_or(Error::DimensionTooLarge {
        what: "end address of an operand",
        value: needed_bytes,
        max: (u64::MAX - buf.address) as usize,
    })?;
    Ok(Extent { start: buf.address, end })
}

/// Checks the epilogue's operands: present exactly when used, long enough, element-aligned,
/// and no operand the call writes (C, a written aux or bias gradient) sharing a byte with any
/// other operand. Addresses are fake-able: nothing is dereferenced.
///
/// # Errors
/// [`Error::EpilogueOperand`], then as [`check_buffers`] for [`Which::Bias`] / [`Which::Aux`],
/// then [`Error::OutputOverlapsInput`] naming the input a written operand overlaps.
pub fn check_epilogue(
    p: &GemmProblem,
    [a, b, c]: [BufferDesc; 3],
    bias: Option<BufferDesc>,
    aux: Option<BufferDesc>,
) -> Result<()> {
    use crate::epilogue::{AuxUse, VectorUse};
    let e = p.epilogue();
    let presence = |operand, used: bool, given: bool| match (used, given) {
        (true, false) => Err(Error::EpilogueOperand { epilogue: e, operand, problem: "is required but missing" }),
        (false, true) => Err(Error::EpilogueOperand { epilogue: e, operand, problem: "was given but is not used" }),
        _ => Ok(()),
    };
    presence("bias", e.vector() != VectorUse::None, bias.is_some())?;
    presence("aux", e.aux() != AuxUse::None, aux.is_some())?;
    let spans = spans(p, [a, b, c], bias, aux)?;
    // no written operand may share a byte with any other operand (A–C and B–C are reported
    // by check_buffers already, in the same terms)
    for (i, &(wo, w, writes)) in spans.iter().enumerate() {
        for (j, &(other, r, other_writes)) in spans.iter().enumerate() {
            let overlaps = w.start < w.end && r.start < r.end && w.start < r.end && r.start < w.end;
            if i != j && writes && overlaps && (!other_writes || i < j) {
                return Err(Error::OutputOverlapsInput {
                    output: wo,
                    input: other,
                    out_start: w.start,
                    out_end: w.end,
                    in_start: r.start,
                    in_end: r.end,
                });
            }
        }
    }
    Ok(())
}

/// Checks a read-only C given apart from the output D (`c_in`; `c` is D): C's dtype, null,
/// alignment and length as D's own (the problem's one C layout, the output dtype), and that
/// no operand the call writes (D, a written aux or bias gradient) shares a byte with it. A
/// `c_in` at D's own address is the in-place call, accepted as such (nothing more checked);
/// one that overlaps D elsewhere is refused. C is checked even where β = 0 leaves it unread.
///
/// # Errors
/// As [`check_buffers`] for [`Which::CIn`], then [`Error::OutputOverlapsInput`] naming the
/// written operand and [`Which::CIn`].
pub fn check_c_in(
    p: &GemmProblem,
    [a, b, c]: [BufferDesc; 3],
    c_in: BufferDesc,
    bias: Option<BufferDesc>,
    aux: Option<BufferDesc>,
) -> Result<()> {
    if c_in.address == c.address {
        return Ok(());
    }
    let batch = if p.is_empty() { 0 } else { p.batch() };
    let r = check_one(Which::CIn, c_in, p.precision().output(), p.c(), batch)?;
    for (which, w, writes) in spans(p, [a, b, c], bias, aux)? {
        if writes && w.start < w.end && r.start < r.end && w.start < r.end && r.start < w.end {
            return Err(Error::OutputOverlapsInput {
                output: which,
                input: Which::CIn,
                out_start: w.start,
                out_end: w.end,
                in_start: r.start,
                in_end: r.end,
            });
        }
    }
    Ok(())
}

/// Every operand of a call with the bytes the call may touch and whether it writes them: A,
/// B and C, then the epilogue's bias and aux where given (those checked as [`check_buffers`]
/// checks A–C).
pub(crate) fn spans(
    p: &GemmProblem,
    [a, b, c]: [BufferDesc; 3],
    bias: Option<BufferDesc>,
    aux: Option<BufferDesc>,
) -> Result<Vec<(Which, Extent, bool)>> {
    use crate::epilogue::{AuxUse, VectorUse};
    let (e, out) = (p.epilogue(), p.precision().output());
    let batch = if p.is_empty() { 0 } else { p.batch() };
    let mut spans: Vec<(Which, Extent, bool)> = Vec::new();
    for (which, buf, layout, written) in
        [(Which::A, a, p.a().layout, false), (Which::B, b, p.b().layout, false), (Which::C, c, p.c(), true)]
    {
        let bytes = layout.required_elems(batch).unwrap_or(0).saturating_mul(buf.dtype.size_bytes());
        spans.push((which, Extent { start: buf.address, end: buf.address.saturating_add(bytes as u64) }, written));
    }
    if let Some(v) = bias {
        let ext = check_one(Which::Bias, v, out, MatrixLayout::row_major(1, p.vector_len()), 1)?;
        spans.push((Which::Bias, ext, e.vector() == VectorUse::WritesGrad));
    }
    if let Some(x) = aux {
        let ext = check_one(Which::Aux, x, out, p.aux(), batch)?;
        spans.push((Which::Aux, ext, e.aux() == AuxUse::Writes));
    }
    Ok(spans)
}

/// Checks the three buffers against the problem.
///
/// Overlap is judged on the byte ranges from each operand's first to its last addressed
/// element, so an input placed inside C's padding (between rows) is reported as overlapping
/// even though no element is shared: conservative, never wrong in the unsafe direction.
///
/// An empty problem (m, n or batch 0) reads and writes nothing, so only the dtypes are
/// checked for it.
///
/// # Errors
/// [`Error::DTypeMismatch`], [`Error::NullPointer`], [`Error::Misaligned`],
/// [`Error::BufferTooSmall`] (for A, then B, then C), then [`Error::OutputOverlapsInput`].
pub fn check_buffers(p: &GemmProblem, a: BufferDesc, b: BufferDesc, c: BufferDesc) -> Result<()> {
    let prec = p.precision();
    // An empty problem (m, n or batch 0) reads and writes nothing: only dtypes are checked.
    let batch = if p.is_empty() { 0 } else { p.batch() };
    let ea = check_one(Which::A, a, prec.input(), p.a().layout, batch)?;
    let eb = check_one(Which::B, b, prec.input(), p.b().layout, batch)?;
    let ec = check_one(Which::C, c, prec.output(), p.c(), batch)?;
    // An input nobody reads (k = 0, or an empty problem) cannot be overlapped harmfully.
    let reads_inputs = !p.is_empty() && p.k() > 0;
    for (which, e) in [(Which::A, ea), (Which::B, eb)] {
        let nonempty = e.start < e.end && ec.start < ec.end;
        if reads_inputs && nonempty && e.start < ec.end && ec.start < e.end {
            return Err(Error::OutputOverlapsInput {
                output: Which::C,
                input: which,
                out_start: ec.start,
                out_end: ec.end,
                in_start: e.start,
                in_end: e.end,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;

    fn desc(address: u64, len_bytes: usize, dtype: DType) -> BufferDesc {
        BufferDesc { address, len_bytes, dtype }
    }

    // m=4 n=6 k=5, f32: A 20 elems (80 B), B 30 (120 B), C 24 (96 B)
    fn problem() -> GemmProblem {
        GemmProblem::matmul(4, 6, 5, Precision::F32).unwrap()
    }

    #[test]
    fn accepts_exact_lengths() {
        check_buffers(
            &problem(),
            desc(0x1000, 80, DType::F32),
            desc(0x2000, 120, DType::F32),
            desc(0x3000, 96, DType::F32),
        )
        .unwrap();
    }

    #[test]
    fn buffer_too_small_names_operand_and_numbers() {
        let e = check_buffers(
            &problem(),
            desc(0x1000, 80, DType::F32),
            desc(0x2000, 116, DType::F32),
            desc(0x3000, 96, DType::F32),
        )
        .unwrap_err();
        assert_eq!(
            e,
            Error::BufferTooSmall {
                operand: Which::B,
                len_bytes: 116,
                needed_bytes: 120,
                needed_elems: 30,
                elem_bytes: 4
            }
        );
    }

    #[test]
    fn misaligned_address() {
        let e = check_buffers(
            &problem(),
            desc(0x1002, 80, DType::F32),
            desc(0x2000, 120, DType::F32),
            desc(0x3000, 96, DType::F32),
        )
        .unwrap_err();
        assert_eq!(e, Error::Misaligned { operand: Which::A, address: 0x1002, align: 4 });
    }

    #[test]
    fn null_pointer() {
        let e = check_buffers(
            &problem(),
            desc(0x1000, 80, DType::F32),
            desc(0x2000, 120, DType::F32),
            desc(0, 96, DType::F32),
        )
        .unwrap_err();
        assert_eq!(e, Error::NullPointer { operand: Which::C, needed_bytes: 96 });
    }

    #[test]
    fn dtype_mismatch() {
        let p = GemmProblem::matmul(4, 6, 5, Precision::BF16_F32OUT).unwrap();
        let e = check_buffers(
            &p,
            desc(0x1000, 40, DType::BF16),
            desc(0x2000, 60, DType::F16),
            desc(0x3000, 96, DType::F32),
        )
        .unwrap_err();
        assert_eq!(e, Error::DTypeMismatch { operand: Which::B, expected: DType::BF16, got: DType::F16 });
    }

    #[test]
    fn output_overlapping_input() {
        let e = check_buffers(
            &problem(),
            desc(0x1000, 80, DType::F32),
            desc(0x2000, 120, DType::F32),
            desc(0x1000 + 40, 96, DType::F32),
        )
        .unwrap_err();
        assert_eq!(
            e,
            Error::OutputOverlapsInput {
                output: Which::C,
                input: Which::A,
                out_start: 0x1028,
                out_end: 0x1028 + 96,
                in_start: 0x1000,
                in_end: 0x1050
            }
        );
        // adjacent, not overlapping
        check_buffers(
            &problem(),
            desc(0x1000, 80, DType::F32),
            desc(0x2000, 120, DType::F32),
            desc(0x1050, 96, DType::F32),
        )
        .unwrap();
    }

    #[test]
    fn empty_problems_need_no_memory() {
        let p = GemmProblem::matmul(0, 6, 5, Precision::F32).unwrap();
        check_buffers(&p, desc(0, 0, DType::F32), desc(0, 0, DType::F32), desc(0, 0, DType::F32)).unwrap();
        let e = check_buffers(&p, desc(0, 0, DType::F16), desc(0, 0, DType::F32), desc(0, 0, DType::F32)).unwrap_err();
        assert!(matches!(e, Error::DTypeMismatch { operand: Which::A, .. }), "{e}");
    }
}
