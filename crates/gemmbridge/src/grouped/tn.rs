//! Each group of a grouped product in the TN form an FP8 GEMM takes (Hopper's FP8 kernels read
//! both operands with the inner dimension contiguous): group e's output `c_e[r_a, r_b]`
//! (row-major) is `A_e · B_eᵀ` with `A_e[r_a, inner]` and `B_e[r_b, inner]` row-major. Where
//! each lies in the product's buffers, and whether it is read as stored or transposed while
//! it is quantised ([`Source`]):
//!
//! | op | `A_e` | `B_e` | `c_e` |
//! |---|---|---|---|
//! | forward | `x_e[m_e, K]` as stored | `w_e[N, K]` as stored | `y_e[m_e, N]` |
//! | backward data | `dy_e[m_e, N]` as stored | `w_e[N, K]` transposed: `[K, N]` | `dx_e[m_e, K]` |
//! | backward weight | `dy_e[m_e, N]` transposed: `[N, m_e]` | `x_e[m_e, K]` transposed: `[K, m_e]` | `dw_e[N, K]` |
//!
//! A group's slice of every buffer is contiguous, so a transposed operand is a row-major
//! `[inner, rows]` block, as [`Source::Transposed`] reads it.

use super::{GroupedOp, GroupedOperand, GroupedProblem};
use crate::fp8::Source;

/// Where one group's operand lies in its buffer and its TN shape (the table of
/// [`crate::grouped::tn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TnOperand {
    /// The first element of the group's slice in the buffer (elements, not bytes).
    pub start: usize,
    /// Rows of the operand in TN form (`r_a` or `r_b`).
    pub rows: usize,
    /// The product's inner dimension: K (forward), N (backward data) or `m_e` (backward
    /// weight).
    pub inner: usize,
    /// How the slice is stored: `[rows, inner]` ([`Source::RowMajor`]) or `[inner, rows]`
    /// ([`Source::Transposed`]) row-major.
    pub source: Source,
}

impl GroupedProblem {
    /// Group `e`'s operand `operand` in TN form (the table of [`crate::grouped::tn`]):
    /// `None` where the group has nothing to read — an empty group's rows of a row-indexed
    /// operand (a forward's or backward data's w exists for every expert, empty or not).
    ///
    /// # Panics
    /// For a group past the last (`e ≥ E`).
    pub fn tn_operand(&self, operand: GroupedOperand, e: usize) -> Option<TnOperand> {
        self.assert_group(e);
        let (m, r0, n, k) = (self.sizes()[e], self.row_start(e), self.n(), self.k());
        let of = |start, rows, inner, source| TnOperand { start, rows, inner, source };
        let (row, tr) = (Source::RowMajor, Source::Transposed);
        let weight = e * n * k;
        let t = match (self.op(), operand) {
            (GroupedOp::Forward, GroupedOperand::A) => of(r0 * k, m, k, row),
            (GroupedOp::Forward, GroupedOperand::B) => return Some(of(weight, n, k, row)),
            (GroupedOp::BackwardData, GroupedOperand::A) => of(r0 * n, m, n, row),
            (GroupedOp::BackwardData, GroupedOperand::B) => return Some(of(weight, k, n, tr)),
            (GroupedOp::BackwardWeight, GroupedOperand::A) => of(r0 * n, n, m, tr),
            (GroupedOp::BackwardWeight, GroupedOperand::B) => of(r0 * k, k, m, tr),
        };
        (m > 0).then_some(t)
    }

    /// Group `e`'s output `c_e` in TN form: its first element in `c` and its `[rows, cols]`
    /// (row-major, contiguous): `y_e[m_e, N]`, `dx_e[m_e, K]` or `dw_e[N, K]`.
    ///
    /// # Panics
    /// For a group past the last (`e ≥ E`).
    pub fn tn_output(&self, e: usize) -> (usize, [usize; 2]) {
        self.assert_group(e);
        let (m, r0, n, k) = (self.sizes()[e], self.row_start(e), self.n(), self.k());
        match self.op() {
            GroupedOp::Forward => (r0 * n, [m, n]),
            GroupedOp::BackwardData => (r0 * k, [m, k]),
            GroupedOp::BackwardWeight => (e * n * k, [n, k]),
        }
    }

    fn assert_group(&self, e: usize) {
        assert!(e < self.groups(), "grouped GEMM: there is no such group (group {e} of {})", self.groups());
    }
}
