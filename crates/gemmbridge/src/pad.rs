//! The padding planner: which operands of a problem are off the 16-byte alignment cuBLASLt's
//! fast kernels need, and the aligned copies that fix them.
//!
//! cuBLASLt on Hopper runs its fast (TMA, tensor-core) kernels only when every pointer, leading
//! dimension and batch stride is a multiple of 16 bytes (cuBLASLt documentation,
//! `cublasLtMatmul`, "alignment requirements"; measured on the H200: bf16 4096×4096 with
//! K = 2047 ran 140 TFLOP/s against 746 at K = 2048). A row-major operand whose leading
//! dimension is not (for 16-bit types: K or N not a multiple of 8) drops it to slow kernels.
//! The plan copies each such operand into a buffer whose leading dimension is rounded up to 16
//! bytes, stages C the same way when C is off (copied in first when β ≠ 0, its logical part
//! copied back after), and runs the aligned problem on the copies.
//!
//! Where padding is legal: the copies hold the same logical elements, and the pad elements
//! either contribute nothing or land where nobody reads them. K is extended with zeros in both
//! A and B (each extra product is 0·0, so C is exact); N is extended with zeros in B and the
//! bias, and C is staged, so the extra columns are computed into scratch and never copied back;
//! pad columns beyond a matrix's `cols` are never read. M is not extended (an odd M where it is
//! a row count is harmless; where it runs along A stored transposed, the call runs directly), and
//! neither is N for an epilogue that writes aux or a bias gradient (the caller's buffers, sized
//! for N). Bias gradients sum over K, where the extra range adds zeros.

use crate::epilogue::VectorUse;
use crate::error::Which;
use crate::layout::{MatrixLayout, Op, Operand};
use crate::problem::GemmProblem;

/// The alignment, in bytes, the fast kernels want of every pointer, leading dimension and
/// batch stride.
pub(crate) const ALIGN_BYTES: usize = 16;

/// Offsets of the copies inside the scratch buffer are multiples of this (cuBLASLt prefers
/// 256-byte-aligned operands; the heuristic is told each pointer's alignment).
const SCRATCH_ALIGN: usize = 256;

/// A range of a copy that must be zero (the extended K-range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZeroPad {
    /// Columns `from..to` of every row (K runs along the rows of the stored matrix).
    Cols { from: usize, to: usize },
    /// Rows `from..to` of every matrix of the batch (K runs down the columns).
    Rows { from: usize, to: usize },
}

/// One operand copied between the caller's buffer and the scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Copy {
    pub which: Which,
    /// The caller's stored layout (the logical `rows × cols` are copied).
    pub src: MatrixLayout,
    /// The layout in scratch: aligned ld and batch stride, rows possibly extended (K).
    pub dst: MatrixLayout,
    /// Matrices copied: the batch count, or 1 for a broadcast (batch stride 0) input.
    pub depth: usize,
    /// Byte offset of the copy in the scratch buffer (a multiple of 256).
    pub offset: usize,
    /// The ranges to zero before the GEMM: the extended columns (of every row) and the
    /// extended rows (of every matrix), where the copy is wider or taller than its source.
    pub zero: [Option<ZeroPad>; 2],
}

/// What a padded call does: copies A and/or B in, stages C (and the bias), runs `problem` on
/// the copies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PadPlan {
    /// The aligned problem: the same m, n, ops, precision, epilogue and aux layout, with the
    /// copies' layouts (and K rounded up when both inputs are copied).
    pub problem: GemmProblem,
    pub a: Option<Copy>,
    pub b: Option<Copy>,
    /// C staged in scratch: copied in before the GEMM when β ≠ 0, copied back after.
    pub c: Option<Copy>,
    /// The bias staged in scratch with N extended (zeros beyond n).
    pub bias: Option<Copy>,
    /// Bytes of scratch the copies need.
    pub scratch_bytes: usize,
}

/// Whether a stored matrix at `address` (bytes) is off the fast kernels' alignment: its base,
/// its leading dimension (when it has more than one row) or its batch stride (when more than
/// one matrix is read).
pub(crate) fn misaligned(l: &MatrixLayout, address: u64, esize: usize, batch: usize) -> bool {
    !address.is_multiple_of(ALIGN_BYTES as u64)
        || (l.rows > 1 && !(l.ld * esize).is_multiple_of(ALIGN_BYTES))
        || (batch > 1 && !(l.batch_stride * esize).is_multiple_of(ALIGN_BYTES))
}

/// The plan for `p` with its operands at `addresses` (A, B, C), or `None` when nothing needs
/// it, the problem is empty, a misaligned operand's batch cannot be copied in one strided copy
/// (its batch stride is not a multiple of its ld), or what is off cannot be fixed by copies:
/// M when it runs along a stored matrix's rows (A entering transposed), N with an epilogue that
/// writes aux or a bias gradient (their buffers are the caller's, sized for N). Such calls run
/// directly.
///
/// What the fast kernels need (measured on the H200; docs/DESIGN.md, Design rationale):
/// aligned leading dimensions and bases, and an aligned K and N themselves — a copy with an
/// aligned ld but K or N still odd ran as slowly as the direct call. So an odd K is extended
/// with zeros in both A and B, and an odd N is extended in B (zeros), C (staged; the extra
/// columns are computed into scratch and never copied back) and the bias (zeros). An odd M is
/// harmless where M is a row count (A as stored), and not handled where it is not.
pub(crate) fn plan(p: &GemmProblem, [a, b, c]: [u64; 3]) -> Option<PadPlan> {
    if p.is_empty() || p.k() == 0 {
        return None;
    }
    let prec = p.precision();
    let (ein, eout) = (prec.input().size_bytes(), prec.output().size_bytes());
    let (m, n, k, batch) = (p.m(), p.n(), p.k(), p.batch());
    let off = |elems: usize, esize: usize| !(elems * esize).is_multiple_of(ALIGN_BYTES);
    let (a_op, b_op, e) = (p.a().op, p.b().op, p.epilogue());
    let n_off = off(n, eout) || (b_op == Op::N && off(n, ein));
    if (a_op == Op::T && off(m, ein)) || (n_off && (p.uses_aux() || e.vector() == VectorUse::WritesGrad)) {
        return None;
    }
    let k2 = if off(k, ein) { k.next_multiple_of(ALIGN_BYTES / ein) } else { k };
    let n2 = if n_off { n.next_multiple_of((ALIGN_BYTES / ein).max(ALIGN_BYTES / eout)) } else { n };
    let copy_a = k2 != k || misaligned(&p.a().layout, a, ein, batch);
    let copy_b = k2 != k || n2 != n || misaligned(&p.b().layout, b, ein, batch);
    let copy_c = n2 != n || misaligned(&p.c(), c, eout, batch);
    if !(copy_a || copy_b || copy_c) {
        return None;
    }
    let mut offset = 0;
    let mut place = |which, src: MatrixLayout, size: (usize, usize), esize: usize| {
        let copy = copy_of(which, src, size, esize, batch, offset)?;
        offset = (offset + copy.dst.required_elems(copy.depth)? * esize).next_multiple_of(SCRATCH_ALIGN);
        Some(copy)
    };
    // stored shapes: A [m, k] (N) or [k, m] (T); B [k, n] (N) or [n, k] (T); C [m, n]
    let a_size = if a_op == Op::N { (m, k2) } else { (k2, m) };
    let b_size = if b_op == Op::N { (k2, n2) } else { (n2, k2) };
    let ca = if copy_a { Some(place(Which::A, p.a().layout, a_size, ein)?) } else { None };
    let cb = if copy_b { Some(place(Which::B, p.b().layout, b_size, ein)?) } else { None };
    let cc = if copy_c { Some(place(Which::C, p.c(), (m, n2), eout)?) } else { None };
    let bias = (n2 != n && e.vector() == VectorUse::ReadsBias)
        .then(|| place(Which::Bias, MatrixLayout::row_major(1, n).with_batch_stride(0), (1, n2), eout))
        .flatten();
    let operand = |copy: Option<Copy>, o: Operand| Operand { layout: copy.map_or(o.layout, |c| c.dst), op: o.op };
    let mut aligned =
        GemmProblem::new(operand(ca, p.a()), operand(cb, p.b()), cc.map_or(p.c(), |c| c.dst), batch, prec)
            .ok()?
            .with_epilogue(e)
            .ok()?;
    if p.uses_aux() {
        aligned = aligned.with_aux_layout(p.aux()).ok()?;
    }
    Some(PadPlan { problem: aligned, a: ca, b: cb, c: cc, bias, scratch_bytes: offset })
}

/// The copy of one stored matrix `src` into scratch at `offset`, `rows × cols` (at least the
/// source's; the extra rows and columns are zeroed, except in C, whose extra columns are only
/// ever written), ld rounded up to 16 bytes. `None` where one strided copy cannot express the
/// batch.
fn copy_of(
    which: Which,
    src: MatrixLayout,
    (rows, cols): (usize, usize),
    esize: usize,
    batch: usize,
    offset: usize,
) -> Option<Copy> {
    let align = ALIGN_BYTES / esize;
    let broadcast = batch > 1 && src.batch_stride == 0;
    let depth = if broadcast { 1 } else { batch.max(1) };
    if depth > 1 && (src.ld == 0 || !src.batch_stride.is_multiple_of(src.ld) || src.batch_stride / src.ld < src.rows) {
        return None;
    }
    let ld = cols.next_multiple_of(align).max(align);
    let dst = MatrixLayout { rows, cols, ld, batch_stride: if broadcast { 0 } else { rows * ld } };
    let zero = |extended: bool, pad: ZeroPad| (extended && which != Which::C).then_some(pad);
    let zero = [
        zero(cols > src.cols, ZeroPad::Cols { from: src.cols, to: cols }),
        zero(rows > src.rows, ZeroPad::Rows { from: src.rows, to: rows }),
    ];
    Some(Copy { which, src, dst, depth, offset, zero })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epilogue::Epilogue;
    use crate::precision::Precision;

    const AL: u64 = 0x7f00_0000_0000; // a 256-byte-aligned address

    #[test]
    fn aligned_problems_are_not_padded() {
        for prec in Precision::ALL {
            let p = GemmProblem::linear(4096, 4096, 4096, prec).unwrap();
            assert_eq!(plan(&p, [AL, AL + 0x1000_0000, AL + 0x2000_0000]), None, "{prec}");
            let p = GemmProblem::matmul(3537, 12288, 2048, prec).unwrap();
            assert_eq!(plan(&p, [AL, AL, AL]), None, "odd M alone is aligned ({prec})");
        }
    }

    #[test]
    fn odd_k_linear_pads_both_inputs_and_extends_k() {
        let p = GemmProblem::linear(4096, 4096, 2047, Precision::BF16).unwrap();
        let plan = plan(&p, [AL, AL, AL]).expect("K = 2047 is off 16 bytes in bf16");
        assert_eq!(plan.problem.k(), 2048);
        assert_eq!((plan.problem.m(), plan.problem.n()), (4096, 4096));
        let a = plan.a.unwrap();
        assert_eq!(a.dst, MatrixLayout::row_major(4096, 2048));
        assert_eq!(a.zero, [Some(ZeroPad::Cols { from: 2047, to: 2048 }), None]);
        // w[n, k] enters transposed: K along its rows too
        let b = plan.b.unwrap();
        assert_eq!(b.dst, MatrixLayout::row_major(4096, 2048));
        assert_eq!(b.zero, [Some(ZeroPad::Cols { from: 2047, to: 2048 }), None]);
        assert_eq!(plan.c, None, "C[4096, 4096] is aligned");
        assert_eq!(b.offset, 4096 * 2048 * 2);
        assert_eq!(plan.scratch_bytes, 2 * 4096 * 2048 * 2);
    }

    #[test]
    fn odd_k_matmul_extends_k_in_both_inputs() {
        // x[m, k]·w[k, n]: x has ld = k (off), w has an aligned ld but K rows: both are copied
        // (an aligned ld with K still odd ran as slowly as the direct call)
        let p = GemmProblem::matmul(4096, 4096, 4095, Precision::F16).unwrap();
        let plan = plan(&p, [AL, AL, AL]).unwrap();
        assert_eq!(plan.problem.k(), 4096);
        assert_eq!(plan.a.unwrap().dst, MatrixLayout::row_major(4096, 4096));
        assert_eq!(plan.a.unwrap().zero, [Some(ZeroPad::Cols { from: 4095, to: 4096 }), None]);
        assert_eq!(plan.b.unwrap().dst, MatrixLayout::row_major(4096, 4096));
        assert_eq!(plan.b.unwrap().zero, [None, Some(ZeroPad::Rows { from: 4095, to: 4096 })]);
        assert_eq!((plan.c, plan.bias), (None, None));
    }

    #[test]
    fn odd_n_extends_n_in_b_c_and_the_bias() {
        // matmul: w[k, n] with n = 4095 and C[m, n]: N becomes 4096, C is staged
        let p = GemmProblem::matmul(4096, 4095, 4096, Precision::BF16).unwrap();
        let plan = plan(&p, [AL, AL, AL]).unwrap();
        assert_eq!(plan.a, None);
        assert_eq!(plan.problem.n(), 4096);
        let b = plan.b.unwrap();
        assert_eq!(b.dst, MatrixLayout::row_major(4096, 4096));
        assert_eq!(b.zero, [Some(ZeroPad::Cols { from: 4095, to: 4096 }), None]);
        let c = plan.c.unwrap();
        assert_eq!((c.src, c.dst), (MatrixLayout::row_major(4096, 4095), MatrixLayout::row_major(4096, 4096)));
        assert_eq!(c.zero, [None, None], "C's extra columns are only written");
        assert_eq!(c.offset, (4096 * 4096 * 2usize).next_multiple_of(256));
        // linear with a bias: w[n, k] gets zero rows, the bias zeros beyond n
        let p = GemmProblem::linear(4096, 4095, 4096, Precision::BF16).unwrap().with_epilogue(Epilogue::Bias).unwrap();
        let plan = super::plan(&p, [AL, AL, AL]).unwrap();
        assert_eq!(plan.a, None);
        assert_eq!(plan.b.unwrap().zero, [None, Some(ZeroPad::Rows { from: 4095, to: 4096 })]);
        let bias = plan.bias.unwrap();
        assert_eq!((bias.dst.cols, bias.depth), (4096, 1));
        assert_eq!(bias.zero, [Some(ZeroPad::Cols { from: 4095, to: 4096 }), None]);
        // f16 in, f32 out: N aligned to 8 (the inputs' 16 bytes)
        let p = GemmProblem::matmul(64, 100, 64, Precision::F16_F32OUT).unwrap();
        assert_eq!(super::plan(&p, [AL, AL, AL]).unwrap().problem.n(), 104);
    }

    #[test]
    fn what_copies_cannot_fix_runs_directly() {
        // an odd N with an epilogue that writes aux or a bias gradient (the caller's buffers)
        for e in [Epilogue::GeluAux, Epilogue::GeluAuxBias, Epilogue::BiasGradB] {
            let p = GemmProblem::linear(512, 1001, 512, Precision::BF16).unwrap().with_epilogue(e).unwrap();
            assert_eq!(plan(&p, [AL, AL, AL]), None, "{e}");
        }
        // an odd M along the rows of A stored [k, m] (A transposed)
        let a = Operand::t(MatrixLayout::row_major(256, 511));
        let b = Operand::n(MatrixLayout::row_major(256, 256));
        let p = GemmProblem::new(a, b, MatrixLayout::row_major(511, 256), 1, Precision::F16).unwrap();
        assert_eq!(plan(&p, [AL, AL, AL]), None);
    }

    #[test]
    fn f32_aligns_to_four_elements() {
        let p = GemmProblem::linear(1024, 1024, 1022, Precision::F32).unwrap();
        let plan = plan(&p, [AL, AL, AL]).expect("1022·4 bytes is off 16");
        assert_eq!(plan.problem.k(), 1024);
        let p = GemmProblem::linear(1024, 1024, 1020, Precision::F32).unwrap();
        assert_eq!(super::plan(&p, [AL, AL, AL]), None, "1020·4 is a multiple of 16");
        let p = GemmProblem::linear(1024, 1024, 1020, Precision::F16).unwrap();
        assert!(super::plan(&p, [AL, AL, AL]).is_some(), "1020·2 is not");
    }

    #[test]
    fn a_misaligned_base_address_pads_that_operand() {
        let p = GemmProblem::linear(256, 256, 256, Precision::F16).unwrap();
        let plan = plan(&p, [AL + 2, AL, AL]).unwrap();
        assert!(plan.a.is_some() && plan.b.is_none() && plan.c.is_none());
        assert_eq!(plan.problem.k(), 256);
        let plan = super::plan(&p, [AL, AL, AL + 8]).unwrap();
        assert!(plan.a.is_none() && plan.c.is_some());
    }

    #[test]
    fn transposed_a_pads_along_rows() {
        // A stored [k, m] entering as T, B stored [k, n]: K runs down the columns of both
        let a = Operand::t(MatrixLayout::row_major(2047, 512).with_ld(517));
        let b = Operand::n(MatrixLayout::row_major(2047, 256).with_ld(257));
        let p = GemmProblem::new(a, b, MatrixLayout::row_major(512, 256), 1, Precision::F16).unwrap();
        let plan = plan(&p, [AL, AL, AL]).unwrap();
        assert_eq!(plan.problem.k(), 2048);
        let ca = plan.a.unwrap();
        assert_eq!(ca.dst, MatrixLayout::row_major(2048, 512));
        assert_eq!(ca.zero, [None, Some(ZeroPad::Rows { from: 2047, to: 2048 })]);
        let cb = plan.b.unwrap();
        assert_eq!(cb.dst, MatrixLayout::row_major(2048, 256));
        assert_eq!(cb.zero, [None, Some(ZeroPad::Rows { from: 2047, to: 2048 })]);
        assert_eq!(plan.problem.a().op, Op::T);
    }

    #[test]
    fn batches_copy_in_one_strided_copy_or_not_at_all() {
        let p = GemmProblem::matmul(64, 64, 63, Precision::BF16).unwrap().batched(4).unwrap();
        let plan = plan(&p, [AL, AL, AL]).unwrap();
        let a = plan.a.unwrap();
        assert_eq!((a.depth, a.dst.batch_stride), (4, 64 * 64));
        // a broadcast A (stride 0) is copied once and stays broadcast
        let a = Operand::n(MatrixLayout::row_major(64, 63).with_batch_stride(0));
        let b = Operand::n(MatrixLayout::row_major(63, 64));
        let c = MatrixLayout::row_major(64, 64);
        let p = GemmProblem::new(a, b, c, 3, Precision::BF16).unwrap();
        let ca = super::plan(&p, [AL, AL, AL]).unwrap().a.unwrap();
        assert_eq!((ca.depth, ca.dst.batch_stride), (1, 0));
        // a batch stride that is not a multiple of ld: one strided copy cannot hold it
        let a = Operand::n(MatrixLayout::row_major(64, 63).with_batch_stride(64 * 63 + 5));
        let p = GemmProblem::new(a, b, c, 3, Precision::BF16).unwrap();
        assert_eq!(super::plan(&p, [AL, AL, AL]), None);
    }

    #[test]
    fn epilogues_and_aux_layouts_are_kept() {
        for e in [Epilogue::GeluAuxBias, Epilogue::BiasGradB, Epilogue::DGelu] {
            let p = GemmProblem::linear(512, 1000, 999, Precision::BF16).unwrap().with_epilogue(e).unwrap();
            let plan = plan(&p, [AL, AL, AL]).unwrap();
            assert_eq!(plan.problem.epilogue(), e);
            assert_eq!(plan.problem.aux(), p.aux());
            assert_eq!(plan.problem.k(), 1000);
        }
    }

    #[test]
    fn empty_problems_are_not_padded() {
        let p = GemmProblem::linear(0, 4095, 4095, Precision::F16).unwrap();
        assert_eq!(plan(&p, [AL, AL, AL]), None);
        let p = GemmProblem::linear(16, 4095, 0, Precision::F16).unwrap();
        assert_eq!(plan(&p, [AL, AL, AL]), None);
    }
}
