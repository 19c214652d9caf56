//! A forward's or backward data's groups cut into row chunks of a few shapes, for
//! [`super::streams::GroupedBackend::ChunkedBatched`]: each output row depends only on its own
//! input row and the group's weight, so group e's `m_e` rows may run as several GEMMs — as many
//! [`CHUNK_ROWS`]-row chunks as fit, then the rest as chunks of 64, 32, …, 1 rows (its binary
//! digits). Every chunk of one row count has one shape, whatever its group, so unequal groups
//! become at most eight shapes (each a batch of alike GEMMs in cuBLAS's grouped call) instead of
//! one shape per group.

use super::{GroupedOp, GroupedProblem};
use crate::error::{Error, Result};
use crate::problem::GemmProblem;

/// The rows of a full chunk.
pub const CHUNK_ROWS: usize = 128;

/// The row counts of the chunks `m` rows are cut into: `m / CHUNK_ROWS` full chunks, then one
/// chunk per set bit of the rest, largest first.
pub fn chunk_rows(m: usize) -> impl Iterator<Item = usize> {
    let rest = m % CHUNK_ROWS;
    std::iter::repeat_n(CHUNK_ROWS, m / CHUNK_ROWS)
        .chain((0..CHUNK_ROWS.trailing_zeros()).rev().map(|b| 1 << b).filter(move |bit| rest & bit != 0))
}

impl GroupedProblem {
    /// The chunks of a forward or backward data without a bias, sorted by row count (largest
    /// first; alike chunks next to each other): each an ordinary GEMM ([`GroupedProblem::group`]'s
    /// of `rows` rows) and where its operands start in the buffers (elements, `[a, b, c]`).
    ///
    /// # Errors
    /// [`Error::GroupedShape`] for a backward weight (its inner dimension is the rows) or a
    /// problem with a bias (the chunks go to cuBLAS's grouped call, which has none).
    pub fn row_chunks(&self) -> Result<Vec<(GemmProblem, [usize; 3])>> {
        if self.op() == GroupedOp::BackwardWeight || self.has_bias() {
            return Err(Error::GroupedShape {
                what: "row chunks are for a forward or backward data without a bias",
                detail: self.describe(),
            });
        }
        let (n, k) = (self.n(), self.k());
        // a row's elements in a and c, and the GEMM of `rows` rows
        let (a_row, c_row) = if self.op() == GroupedOp::Forward { (k, n) } else { (n, k) };
        let gemm = |rows| match self.op() {
            GroupedOp::Forward => GemmProblem::linear(rows, n, k, self.precision()),
            _ => GemmProblem::matmul(rows, k, n, self.precision()),
        };
        let mut out = Vec::new();
        for (e, &m) in self.sizes().iter().enumerate() {
            let mut r = self.row_start(e);
            for rows in chunk_rows(m) {
                out.push((gemm(rows)?, [r * a_row, e * n * k, r * c_row]));
                r += rows;
            }
        }
        out.sort_by_key(|(g, _)| std::cmp::Reverse(g.m()));
        Ok(out)
    }

    /// How many chunks [`GroupedProblem::row_chunks`] makes.
    pub fn chunk_count(&self) -> usize {
        self.sizes().iter().map(|&m| chunk_rows(m).count()).sum()
    }
}
