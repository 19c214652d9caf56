//! Float64 definitions of the three grouped products, straight from the sums in [`super`]'s
//! documentation (a loop per group, row and column; no per-group [`GemmProblem`]), for tests:
//! the GPU path runs [`GroupedProblem::group`]'s GEMMs, and the tests hold those against this.
//!
//! # Panics
//! On slices of the wrong length (test references, not an API that returns errors).
//!
//! [`GemmProblem`]: crate::GemmProblem

use super::{GroupedOp, GroupedProblem};

/// `c` of the product (argument order `a, b` as [`GroupedOp::names`]; `bias[E, N]` for a
/// forward with a bias), every element of `c` that a group writes; rows past the last group
/// keep the value `c` had (pass the output's initial content).
pub fn run(p: &GroupedProblem, a: &[f64], b: &[f64], bias: Option<&[f64]>, c: &mut [f64]) {
    let [la, lb, lc] = p.lens();
    assert_eq!((a.len(), b.len(), c.len()), (la, lb, lc), "grouped::reference: buffer lengths");
    assert_eq!(bias.map(|b| b.len()), p.has_bias().then(|| p.groups() * p.n()), "grouped::reference: bias");
    let (n, k) = (p.n(), p.k());
    for (e, &m) in p.sizes().iter().enumerate() {
        let r0 = p.row_start(e);
        let w = |i: usize, j: usize| e * n * k + i * k + j; // w[e][i][j], [N, K]
        match p.op() {
            GroupedOp::Forward => {
                for r in r0..r0 + m {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|t| a[r * k + t] * b[w(j, t)]).sum();
                        c[r * n + j] = dot + bias.map_or(0.0, |bb| bb[e * n + j]);
                    }
                }
            }
            GroupedOp::BackwardData => {
                for r in r0..r0 + m {
                    for t in 0..k {
                        c[r * k + t] = (0..n).map(|j| a[r * n + j] * b[w(j, t)]).sum();
                    }
                }
            }
            GroupedOp::BackwardWeight => {
                for j in 0..n {
                    for t in 0..k {
                        c[w(j, t)] = (r0..r0 + m).map(|r| a[r * n + j] * b[r * k + t]).sum();
                    }
                }
            }
        }
    }
}
