//! Row-major matrix layouts and operands.
//!
//! Row-major is the only public convention. A matrix of `rows × cols` elements is stored with
//! element `(i, j)` of batch entry `b` at offset `b·batch_stride + i·ld + j` (in elements), where
//! `ld ≥ cols` is the leading dimension (elements from one row to the next).
//!
//! Column-major data is described as the transposed row-major view of the same memory: a
//! column-major `r × c` matrix with leading dimension `ld` *is* a row-major `c × r` matrix with
//! leading dimension `ld`, so it enters a GEMM as that row-major matrix with `op = T`
//! ([`Operand::col_major`]).

use crate::error::{Error, Result, Which};

/// Whether an operand enters the product as stored (`N`) or transposed (`T`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// As stored: `op(X) = X`.
    N,
    /// Transposed: `op(X) = Xᵀ`.
    T,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::N => "N",
            Op::T => "T",
        })
    }
}

/// The row-major layout of a stored matrix (or of each matrix of a strided batch).
///
/// All quantities are in elements, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixLayout {
    /// Rows of the stored matrix.
    pub rows: usize,
    /// Columns of the stored matrix.
    pub cols: usize,
    /// Leading dimension: elements from one row to the next; must be ≥ `cols`.
    pub ld: usize,
    /// Elements from one batch entry to the next. 0 is allowed for A and B (the same matrix
    /// is used by every batch entry: broadcasting) but not for C when the batch count is > 1.
    pub batch_stride: usize,
}

impl MatrixLayout {
    /// A contiguous `rows × cols` matrix: `ld = cols`, `batch_stride = rows·cols`
    /// (saturating at `usize::MAX`, which [`GemmProblem::new`](crate::GemmProblem::new) then
    /// rejects by name).
    pub const fn row_major(rows: usize, cols: usize) -> MatrixLayout {
        MatrixLayout { rows, cols, ld: cols, batch_stride: rows.saturating_mul(cols) }
    }

    /// The same matrix with leading dimension `ld`. A batch stride equal to `rows·ld` of the
    /// old ld (the default, or an explicit one that happens to equal it) follows to `rows·ld`
    /// of the new one; any other batch stride (such as 0 for broadcasting) is kept. To keep a
    /// stride that equals `rows·ld`, call [`MatrixLayout::with_batch_stride`] after this.
    pub const fn with_ld(self, ld: usize) -> MatrixLayout {
        let batch_stride = if self.batch_stride == self.rows.saturating_mul(self.ld) {
            self.rows.saturating_mul(ld)
        } else {
            self.batch_stride
        };
        MatrixLayout { ld, batch_stride, ..self }
    }

    /// The same matrix with an explicit batch stride, in elements.
    pub const fn with_batch_stride(self, batch_stride: usize) -> MatrixLayout {
        MatrixLayout { batch_stride, ..self }
    }

    /// Elements one matrix spans from its first to its last element, inclusive:
    /// `(rows - 1)·ld + cols`, or 0 when the matrix is empty (saturating at `usize::MAX`).
    pub const fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1).saturating_mul(self.ld).saturating_add(self.cols)
        }
    }

    /// Elements a buffer must hold for `batch` matrices of this layout:
    /// `(batch - 1)·batch_stride + extent`, or 0 when nothing is addressed; `None` if that
    /// overflows `usize`.
    pub fn required_elems(&self, batch: usize) -> Option<usize> {
        let extent = self.extent();
        if extent == 0 || batch == 0 {
            return Some(0);
        }
        if extent == usize::MAX {
            return None;
        }
        (batch - 1).checked_mul(self.batch_stride)?.checked_add(extent)
    }

    /// Offset of element `(i, j)` of batch entry `b`, in elements (no overflow check: for
    /// indices inside a layout a validated problem accepted).
    pub const fn offset(&self, b: usize, i: usize, j: usize) -> usize {
        b * self.batch_stride + i * self.ld + j
    }

    /// Copies the logical elements (no padding) of `batch` matrices out of `buf`, batch-major
    /// then row-major: `out[b·rows·cols + i·cols + j]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`MatrixLayout::required_elems`]; this is a test and
    /// diagnostics helper, not a library path.
    pub fn gather<T: Copy>(&self, buf: &[T], batch: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(batch * self.rows * self.cols);
        for b in 0..batch {
            for i in 0..self.rows {
                let start = self.offset(b, i, 0);
                out.extend_from_slice(&buf[start..start + self.cols]);
            }
        }
        out
    }

    pub(crate) fn check_ld(&self, operand: Which) -> Result<()> {
        // (an Operand::col_major view reports its row count as `cols` here; the error's text
        // says so)
        if self.ld < self.cols {
            return Err(Error::LeadingDimTooSmall { operand, ld: self.ld, cols: self.cols });
        }
        Ok(())
    }
}

/// A stored row-major matrix and how it enters the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// The stored matrix.
    pub layout: MatrixLayout,
    /// `N`: it enters as stored; `T`: transposed.
    pub op: Op,
}

impl Operand {
    /// A stored row-major matrix entering as is (`op = N`).
    pub const fn n(layout: MatrixLayout) -> Operand {
        Operand { layout, op: Op::N }
    }

    /// A stored row-major matrix entering transposed (`op = T`).
    pub const fn t(layout: MatrixLayout) -> Operand {
        Operand { layout, op: Op::T }
    }

    /// A column-major `rows × cols` matrix with leading dimension `ld` (elements from one
    /// column to the next, ≥ `rows`), entering the product as is. Described as the row-major
    /// `cols × rows` matrix over the same memory, entering transposed.
    pub const fn col_major(rows: usize, cols: usize, ld: usize) -> Operand {
        Operand::t(MatrixLayout::row_major(cols, rows).with_ld(ld))
    }

    /// Rows of `op(X)`.
    pub const fn rows(&self) -> usize {
        match self.op {
            Op::N => self.layout.rows,
            Op::T => self.layout.cols,
        }
    }

    /// Columns of `op(X)`.
    pub const fn cols(&self) -> usize {
        match self.op {
            Op::N => self.layout.cols,
            Op::T => self.layout.rows,
        }
    }

    /// Element `(i, j)` of `op(X)` for batch entry `b`: its offset in the stored buffer.
    pub const fn offset(&self, b: usize, i: usize, j: usize) -> usize {
        match self.op {
            Op::N => self.layout.offset(b, i, j),
            Op::T => self.layout.offset(b, j, i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_and_required_elems() {
        let l = MatrixLayout::row_major(3, 4).with_ld(6);
        assert_eq!(l.extent(), 2 * 6 + 4);
        assert_eq!(l.required_elems(1).unwrap(), 16);
        assert_eq!(l.required_elems(3).unwrap(), 2 * 18 + 16);
        assert_eq!(l.with_batch_stride(0).required_elems(5).unwrap(), 16);
        assert_eq!(MatrixLayout::row_major(0, 4).required_elems(3).unwrap(), 0);
        assert_eq!(l.required_elems(0).unwrap(), 0);
    }

    #[test]
    fn col_major_is_transposed_row_major() {
        // column-major 2×3, ld 5: element (i, j) at j·5 + i
        let x = Operand::col_major(2, 3, 5);
        assert_eq!((x.rows(), x.cols()), (2, 3));
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(x.offset(0, i, j), j * 5 + i);
            }
        }
    }

    #[test]
    fn gather_skips_padding() {
        let l = MatrixLayout::row_major(2, 2).with_ld(3);
        let buf = [1, 2, 99, 3, 4, 99, 5, 6, 99, 7, 8];
        assert_eq!(l.gather(&buf, 2), vec![1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
