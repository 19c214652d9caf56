//! The GEMM problem: pure data, no GPU.
//!
//! `C[m, n] = α·op(A)[m, k]·op(B)[k, n] + β·C[m, n]`, row-major, optionally a strided batch of
//! `batch` such products. A [`GemmProblem`] is validated when it is built, so everything that
//! can be checked without the buffers has been checked before any backend sees it.

use crate::epilogue::{AuxUse, Epilogue, VectorUse};
use crate::error::{Error, Result, Which};
use crate::layout::{MatrixLayout, Op, Operand};
use crate::precision::Precision;

/// The largest dimension, leading dimension or batch count cuBLAS accepts (its `int`).
pub const MAX_DIM: usize = i32::MAX as usize;

/// A validated row-major GEMM (or strided-batched GEMM) description.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmProblem {
    a: Operand,
    b: Operand,
    c: MatrixLayout,
    batch: usize,
    precision: Precision,
    epilogue: Epilogue,
    aux: MatrixLayout,
}

/// cuBLASLt needs the aux leading dimension to be a multiple of 8 elements (cuBLAS
/// documentation, `CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD`).
pub const AUX_LD_MULTIPLE: usize = 8;

impl GemmProblem {
    /// Builds and validates a problem.
    ///
    /// - `a`: the stored A and its op; `op(A)` must be `[m, k]`.
    /// - `b`: the stored B and its op; `op(B)` must be `[k, n]`.
    /// - `c`: the output layout, `[m, n]`.
    /// - `batch`: number of products in the strided batch (1 for a plain GEMM; 0 is a no-op).
    ///
    /// # Errors
    /// - [`Error::ShapeMismatch`] when the shapes do not agree;
    /// - [`Error::LeadingDimTooSmall`] when an `ld` is below its matrix's column count;
    /// - [`Error::DimensionTooLarge`] when m, n, k, an ld or the batch count exceeds
    ///   [`MAX_DIM`] (cuBLAS's 32-bit `int`), or a batch stride exceeds `i64::MAX`;
    /// - [`Error::OutputBatchesOverlap`] when `batch > 1` and two products could write the
    ///   same element of C. Two layouts are accepted: a batch stride of at least one output's
    ///   extent (`(m - 1)·ld + n`: the outputs one after another), and outputs side by side
    ///   within each row (`[m, batch, n]` storage: batch stride ≥ n and
    ///   `(batch - 1)·batch stride + n ≤ ld`). Anything else is refused, even where the
    ///   outputs happen to miss each other.
    pub fn new(a: Operand, b: Operand, c: MatrixLayout, batch: usize, precision: Precision) -> Result<GemmProblem> {
        if a.rows() != c.rows || a.cols() != b.rows() || b.cols() != c.cols {
            return Err(Error::ShapeMismatch {
                a_rows: a.rows(),
                a_cols: a.cols(),
                b_rows: b.rows(),
                b_cols: b.cols(),
                c_rows: c.rows,
                c_cols: c.cols,
            });
        }
        a.layout.check_ld(Which::A)?;
        b.layout.check_ld(Which::B)?;
        c.check_ld(Which::C)?;
        // default aux layout: ld = n rounded up to 8 (overflow is impossible past the MAX_DIM
        // checks below, but those run on the built problem; saturate meanwhile)
        let aux_ld = c.cols.checked_next_multiple_of(AUX_LD_MULTIPLE).unwrap_or(c.cols);
        let aux = MatrixLayout::row_major(c.rows, c.cols).with_ld(aux_ld);
        let p = GemmProblem { a, b, c, batch, precision, epilogue: Epilogue::None, aux };
        for (what, value) in [
            ("m", p.m()),
            ("n", p.n()),
            ("k", p.k()),
            ("leading dimension of A", a.layout.ld),
            ("leading dimension of B", b.layout.ld),
            ("leading dimension of C", c.ld),
            ("batch count", batch),
        ] {
            if value > MAX_DIM {
                return Err(Error::DimensionTooLarge { what, value, max: MAX_DIM });
            }
        }
        for (what, value) in [
            ("batch stride of A", a.layout.batch_stride),
            ("batch stride of B", b.layout.batch_stride),
            ("batch stride of C", c.batch_stride),
        ] {
            if value > i64::MAX as usize {
                return Err(Error::DimensionTooLarge { what, value, max: i64::MAX as usize });
            }
        }
        // Every buffer's extent, in bytes of the widest element (4), must be addressable. Past
        // usize itself, the batch stride is named: one matrix's extent is bounded by the
        // MAX_DIM checks above, so only the batch can overflow it.
        for (what, stride_what, layout) in [
            ("extent of A in bytes", "batch stride of A (the extent overflows)", a.layout),
            ("extent of B in bytes", "batch stride of B (the extent overflows)", b.layout),
            ("extent of C in bytes", "batch stride of C (the extent overflows)", c),
        ] {
            match layout.required_elems(batch).and_then(|e| e.checked_mul(4)) {
                Some(bytes) if bytes <= isize::MAX as usize => {}
                Some(bytes) => return Err(Error::DimensionTooLarge { what, value: bytes, max: isize::MAX as usize }),
                None => {
                    let room = (isize::MAX as usize / 4).saturating_sub(layout.extent());
                    let max = room / batch.saturating_sub(1).max(1);
                    return Err(Error::DimensionTooLarge { what: stride_what, value: layout.batch_stride, max });
                }
            }
        }
        if batch > 1 && c.extent() > 0 && c.batch_stride < c.extent() && !side_by_side(&c, batch) {
            return Err(Error::OutputBatchesOverlap {
                batch_stride: c.batch_stride,
                rows: c.rows,
                cols: c.cols,
                ld: c.ld,
                extent: c.extent(),
                batch,
            });
        }
        Ok(p)
    }

    /// `out[m, n] = x[m, k]·w[k, n]` with contiguous row-major x, w and out (PyTorch's
    /// `x @ w`).
    ///
    /// # Errors
    /// [`Error::DimensionTooLarge`] when a dimension exceeds [`MAX_DIM`] or a buffer would
    /// not be addressable.
    pub fn matmul(m: usize, n: usize, k: usize, precision: Precision) -> Result<GemmProblem> {
        GemmProblem::new(
            Operand::n(MatrixLayout::row_major(m, k)),
            Operand::n(MatrixLayout::row_major(k, n)),
            MatrixLayout::row_major(m, n),
            1,
            precision,
        )
    }

    /// `out[m, n] = x[m, k]·w[n, k]ᵀ` with contiguous row-major x, w and out (a linear layer,
    /// PyTorch's `F.linear(x, w)`; w in `nn.Linear`'s `[out_features, in_features]` layout).
    ///
    /// # Errors
    /// As [`GemmProblem::matmul`].
    pub fn linear(m: usize, n: usize, k: usize, precision: Precision) -> Result<GemmProblem> {
        GemmProblem::new(
            Operand::n(MatrixLayout::row_major(m, k)),
            Operand::t(MatrixLayout::row_major(n, k)),
            MatrixLayout::row_major(m, n),
            1,
            precision,
        )
    }

    /// The same problem as a strided batch of `batch` products, each operand keeping the
    /// batch stride its layout carries (by default its matrix size, `rows·ld`; see
    /// [`MatrixLayout::with_batch_stride`]). The epilogue is kept; an aux layout gets the
    /// batch stride `m·ld`.
    ///
    /// # Errors
    /// As [`GemmProblem::new`].
    pub fn batched(self, batch: usize) -> Result<GemmProblem> {
        let p = GemmProblem::new(self.a, self.b, self.c, batch, self.precision)?.with_epilogue(self.epilogue)?;
        if self.uses_aux() {
            let aux = self.aux.with_batch_stride(self.aux.rows * self.aux.ld);
            return p.with_aux_layout(aux);
        }
        Ok(p)
    }

    /// The same problem with a fused epilogue (see [`crate::epilogue`]). Its aux operand, if
    /// any, defaults to a row-major `[m, n]` layout with `ld` = n rounded up to a multiple of
    /// 8 and batch stride `m·ld`; change it with [`GemmProblem::with_aux_layout`].
    ///
    /// # Errors
    /// [`Error::EpilogueBatch`] for a bias-gradient epilogue on a batch of more than one.
    pub fn with_epilogue(self, epilogue: Epilogue) -> Result<GemmProblem> {
        if epilogue.vector() == VectorUse::WritesGrad && self.batch > 1 {
            return Err(Error::EpilogueBatch { epilogue, batch: self.batch });
        }
        Ok(GemmProblem { epilogue, ..self })
    }

    /// Sets the aux operand's layout (row-major `[m, n]`, in elements).
    ///
    /// # Errors
    /// [`Error::AuxLayout`] when it is not `[m, n]`, its ld is below n, not a multiple of
    /// [`AUX_LD_MULTIPLE`] or above [`MAX_DIM`], its batch stride is above `i64::MAX`, or
    /// (batch > 1) its batch stride is below one matrix's extent; [`Error::EpilogueOperand`]
    /// when the epilogue uses no aux (set the epilogue first).
    pub fn with_aux_layout(self, aux: MatrixLayout) -> Result<GemmProblem> {
        if !self.uses_aux() {
            return Err(Error::EpilogueOperand {
                epilogue: self.epilogue,
                operand: "aux",
                problem: "layout was given but is not used",
            });
        }
        let bad = aux.rows != self.m()
            || aux.cols != self.n()
            || aux.ld < aux.cols
            || !aux.ld.is_multiple_of(AUX_LD_MULTIPLE)
            || aux.ld > MAX_DIM
            || aux.batch_stride > i64::MAX as usize
            || (self.batch > 1 && aux.batch_stride < aux.extent())
            || aux.required_elems(self.batch).is_none();
        if bad {
            return Err(Error::AuxLayout {
                rows: aux.rows,
                cols: aux.cols,
                ld: aux.ld,
                batch_stride: aux.batch_stride,
                m: self.m(),
                n: self.n(),
            });
        }
        Ok(GemmProblem { aux, ..self })
    }

    /// The fused epilogue.
    pub const fn epilogue(&self) -> Epilogue {
        self.epilogue
    }

    /// The aux operand's layout (meaningful when the epilogue reads or writes aux).
    pub const fn aux(&self) -> MatrixLayout {
        self.aux
    }

    /// Elements of the epilogue's vector operand: n for a bias, `BiasGradB` or
    /// `DGeluBiasGrad`, m for `BiasGradA`, 0 when there is none.
    pub const fn vector_len(&self) -> usize {
        match (self.epilogue.vector(), self.epilogue) {
            (VectorUse::None, _) => 0,
            (_, Epilogue::BiasGradA) => self.m(),
            _ => self.n(),
        }
    }

    /// Whether the epilogue uses an aux matrix.
    pub const fn uses_aux(&self) -> bool {
        !matches!(self.epilogue.aux(), AuxUse::None)
    }

    /// Rows of `op(A)` and of C.
    pub const fn m(&self) -> usize {
        self.c.rows
    }

    /// Columns of `op(B)` and of C.
    pub const fn n(&self) -> usize {
        self.c.cols
    }

    /// Columns of `op(A)`, rows of `op(B)`: the reduction length.
    pub const fn k(&self) -> usize {
        self.a.cols()
    }

    /// Operand A (stored layout and op).
    pub const fn a(&self) -> Operand {
        self.a
    }

    /// Operand B (stored layout and op).
    pub const fn b(&self) -> Operand {
        self.b
    }

    /// Layout of C.
    pub const fn c(&self) -> MatrixLayout {
        self.c
    }

    /// Batch count.
    pub const fn batch(&self) -> usize {
        self.batch
    }

    /// The precision.
    pub const fn precision(&self) -> Precision {
        self.precision
    }

    /// True when the problem writes nothing (m, n or batch is 0).
    pub const fn is_empty(&self) -> bool {
        self.m() == 0 || self.n() == 0 || self.batch == 0
    }

    /// Floating-point operations: `2·m·n·k·batch` (the TFLOP/s convention of the benchmarks).
    pub fn flops(&self) -> f64 {
        2.0 * self.m() as f64 * self.n() as f64 * self.k() as f64 * self.batch as f64
    }

    /// Multiply-adds: `m·n·k·batch` (saturating at `u64::MAX`).
    pub fn macs(&self) -> u64 {
        [self.n(), self.k(), self.batch].iter().fold(self.m() as u64, |acc, &d| acc.saturating_mul(d as u64))
    }

    /// A one-line description for error messages and logs, e.g.
    /// `m=256 n=512 k=128 A[256x128 ld 128]·N B[128x512 ld 512]·N C[256x512 ld 512] batch 1 bf16
    /// epilogue none`.
    pub fn describe(&self) -> String {
        let l = |x: &MatrixLayout| format!("{}x{} ld {}", x.rows, x.cols, x.ld);
        let op = |o: Op| o.to_string();
        format!(
            "m={} n={} k={} A[{}]·{} B[{}]·{} C[{}] batch {} {} epilogue {}",
            self.m(),
            self.n(),
            self.k(),
            l(&self.a.layout),
            op(self.a.op),
            l(&self.b.layout),
            op(self.b.op),
            l(&self.c),
            self.batch,
            self.precision,
            self.epilogue
        )
    }
}

/// Whether `batch` outputs of layout `c` sit side by side within each row: row `r` of output
/// `z` spans `[r·ld + z·stride, r·ld + z·stride + cols)`, inside row `r`'s `ld` elements and
/// apart from the other outputs' (stride ≥ cols), so no element is written twice.
fn side_by_side(c: &MatrixLayout, batch: usize) -> bool {
    let end = (batch - 1).checked_mul(c.batch_stride).and_then(|v| v.checked_add(c.cols));
    c.batch_stride >= c.cols && end.is_some_and(|e| e <= c.ld)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_mismatch_names_every_shape() {
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(4, 5)),
            Operand::n(MatrixLayout::row_major(6, 7)),
            MatrixLayout::row_major(4, 7),
            1,
            Precision::F32,
        )
        .unwrap_err();
        assert_eq!(e, Error::ShapeMismatch { a_rows: 4, a_cols: 5, b_rows: 6, b_cols: 7, c_rows: 4, c_cols: 7 });
        assert!(e.to_string().contains("op(A) is [4, 5]"), "{e}");
    }

    #[test]
    fn output_shape_mismatch() {
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(4, 5)),
            Operand::n(MatrixLayout::row_major(5, 7)),
            MatrixLayout::row_major(4, 8),
            1,
            Precision::F32,
        )
        .unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { c_cols: 8, b_cols: 7, .. }), "{e}");
    }

    #[test]
    fn leading_dim_too_small() {
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(4, 5)),
            Operand::t(MatrixLayout::row_major(7, 5).with_ld(4)),
            MatrixLayout::row_major(4, 7),
            1,
            Precision::F32,
        )
        .unwrap_err();
        assert_eq!(e, Error::LeadingDimTooSmall { operand: Which::B, ld: 4, cols: 5 });
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(4, 5)),
            Operand::n(MatrixLayout::row_major(5, 7)),
            MatrixLayout::row_major(4, 7).with_ld(6),
            1,
            Precision::F32,
        )
        .unwrap_err();
        assert_eq!(e, Error::LeadingDimTooSmall { operand: Which::C, ld: 6, cols: 7 });
    }

    #[test]
    fn dimension_too_large() {
        let big = MAX_DIM + 1;
        let e = GemmProblem::matmul(big, 1, 1, Precision::F32).unwrap_err();
        assert_eq!(e, Error::DimensionTooLarge { what: "m", value: big, max: MAX_DIM });
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(2, 2).with_ld(big)),
            Operand::n(MatrixLayout::row_major(2, 2)),
            MatrixLayout::row_major(2, 2),
            1,
            Precision::F32,
        )
        .unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { what: "leading dimension of A", .. }), "{e}");
        let e = GemmProblem::matmul(2, 2, 2, Precision::F32).unwrap().batched(big).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { what: "batch count", .. }), "{e}");
    }

    #[test]
    fn output_batches_overlap() {
        let e = GemmProblem::new(
            Operand::n(MatrixLayout::row_major(3, 2)),
            Operand::n(MatrixLayout::row_major(2, 4)),
            MatrixLayout::row_major(3, 4).with_batch_stride(5),
            2,
            Precision::F32,
        )
        .unwrap_err();
        assert!(matches!(e, Error::OutputBatchesOverlap { batch_stride: 5, extent: 12, .. }), "{e}");
        // outputs side by side in each row ([m, batch, n] storage) are disjoint: accepted
        let side = |stride: usize, ld: usize| {
            GemmProblem::new(
                Operand::n(MatrixLayout::row_major(2, 2)),
                Operand::n(MatrixLayout::row_major(2, 3)),
                MatrixLayout::row_major(2, 3).with_ld(ld).with_batch_stride(stride),
                2,
                Precision::F32,
            )
        };
        side(3, 6).unwrap();
        side(4, 8).unwrap();
        // a stride below n, or a last output past the row's ld, overlaps: refused
        assert!(matches!(side(2, 6).unwrap_err(), Error::OutputBatchesOverlap { .. }));
        assert!(matches!(side(3, 5).unwrap_err(), Error::OutputBatchesOverlap { .. }));
        // broadcast inputs (stride 0) are fine
        GemmProblem::new(
            Operand::n(MatrixLayout::row_major(3, 2).with_batch_stride(0)),
            Operand::n(MatrixLayout::row_major(2, 4)),
            MatrixLayout::row_major(3, 4),
            2,
            Precision::F32,
        )
        .unwrap();
    }

    #[test]
    fn linear_is_transposed_weight() {
        let p = GemmProblem::linear(3, 5, 7, Precision::BF16).unwrap();
        assert_eq!((p.m(), p.n(), p.k()), (3, 5, 7));
        assert_eq!(p.b().op, Op::T);
        assert_eq!((p.b().layout.rows, p.b().layout.cols), (5, 7));
    }
}
