//! Float64 references: simple, obviously correct, slow. For tests and diagnostics only.
//!
//! - [`gemm_rowmajor`]: the row-major problem, straight from its definition.
//! - [`gemm_colmajor`]: a column-major BLAS GEMM call emulated on the CPU, with the argument
//!   checks the BLAS standard (and cuBLAS) applies, so that a mapping can be checked by
//!   running the call it produces.
//! - [`rel_error`] and [`max_abs_diff`]: the error measures used against these references.

use crate::layout::Op;
use crate::mapping::ColMajorCall;
use crate::problem::GemmProblem;

/// `C = α·op(A)·op(B) + β·C` for a row-major problem, in f64, over the stored buffers.
///
/// Follows BLAS semantics: when `β = 0`, C is not read (a NaN in C does not propagate); when
/// `k = 0`, `C = β·C`; when m, n or the batch count is 0 nothing is touched. Elements of C
/// outside its layout (padding) are left as they are.
///
/// # Panics
/// If a buffer is shorter than its layout needs.
pub fn gemm_rowmajor(p: &GemmProblem, alpha: f64, a: &[f64], b: &[f64], beta: f64, c: &mut [f64]) {
    let (oa, ob, lc) = (p.a(), p.b(), p.c());
    for bt in 0..p.batch() {
        for i in 0..p.m() {
            for j in 0..p.n() {
                let mut acc = 0.0f64;
                for l in 0..p.k() {
                    acc += a[oa.offset(bt, i, l)] * b[ob.offset(bt, l, j)];
                }
                let at = lc.offset(bt, i, j);
                c[at] = if beta == 0.0 { alpha * acc } else { alpha * acc + beta * c[at] };
            }
        }
    }
}

/// Why an emulated column-major call was rejected, as cuBLAS would report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidValue {
    /// The argument that failed its check, e.g. `"lda"`.
    pub argument: &'static str,
}

/// Emulates the column-major BLAS call `C_cm = α·opa(A_cm)·opb(B_cm) + β·C_cm` in f64, where
/// `first` is `A_cm` and `second` is `B_cm`.
///
/// Applies the BLAS argument checks first (`m, n, k ≥ 0`; `lda ≥ max(1, rows of stored A_cm)`,
/// where stored A_cm has `m` rows when `transa = N` and `k` when `T`; likewise `ldb`;
/// `ldc ≥ max(1, m)`; batch ≥ 0) and returns [`InvalidValue`] naming the argument that fails,
/// as cuBLAS returns `CUBLAS_STATUS_INVALID_VALUE`.
///
/// # Panics
/// If a buffer is shorter than the call addresses.
pub fn gemm_colmajor(
    call: &ColMajorCall,
    alpha: f64,
    first: &[f64],
    second: &[f64],
    beta: f64,
    c: &mut [f64],
) -> Result<(), InvalidValue> {
    let ColMajorCall { transa, transb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch } = *call;
    let bad = |argument| Err(InvalidValue { argument });
    if m < 0 {
        return bad("m");
    }
    if n < 0 {
        return bad("n");
    }
    if k < 0 {
        return bad("k");
    }
    if batch < 0 {
        return bad("batchCount");
    }
    let rows_a = if transa == Op::N { m } else { k };
    let rows_b = if transb == Op::N { k } else { n };
    if lda < rows_a.max(1) {
        return bad("lda");
    }
    if ldb < rows_b.max(1) {
        return bad("ldb");
    }
    if ldc < m.max(1) {
        return bad("ldc");
    }
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let (lda, ldb, ldc) = (lda as usize, ldb as usize, ldc as usize);
    // column-major element (i, j) of a matrix with leading dimension ld: i + j·ld
    let at = |trans: Op, ld: usize, i: usize, j: usize| match trans {
        Op::N => i + j * ld,
        Op::T => j + i * ld,
    };
    for bt in 0..batch as usize {
        let (fa, fb, fc) = (bt * stride_a as usize, bt * stride_b as usize, bt * stride_c as usize);
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f64;
                for l in 0..k {
                    acc += first[fa + at(transa, lda, i, l)] * second[fb + at(transb, ldb, l, j)];
                }
                let o = fc + i + j * ldc;
                c[o] = if beta == 0.0 { alpha * acc } else { alpha * acc + beta * c[o] };
            }
        }
    }
    Ok(())
}

/// ‖got − want‖₂ / ‖want‖₂. Returns `f64::INFINITY` if any element of `got` is not finite
/// (NaN never passes) and, when `want` is all zeros, ‖got‖₂ (so that 0 means exact).
///
/// # Panics
/// If the lengths differ.
pub fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_error: lengths differ");
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let diff: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if norm == 0.0 {
        diff
    } else {
        diff / norm
    }
}

/// `(max|got − want|, max|got − want| / max|want|)`; both `INFINITY` if `got` has a non-finite
/// element.
///
/// # Panics
/// If the lengths differ.
pub fn max_abs_diff(got: &[f64], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "max_abs_diff: lengths differ");
    if got.iter().any(|v| !v.is_finite()) {
        return (f64::INFINITY, f64::INFINITY);
    }
    let d = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
    let r = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
    (d, if r == 0.0 { d } else { d / r })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Precision;

    #[test]
    fn rowmajor_reference_small_known_product() {
        // [[1,2],[3,4]]·[[5,6],[7,8]] = [[19,22],[43,50]]
        let p = GemmProblem::matmul(2, 2, 2, Precision::F32).unwrap();
        let mut c = vec![f64::NAN; 4];
        gemm_rowmajor(&p, 1.0, &[1., 2., 3., 4.], &[5., 6., 7., 8.], 0.0, &mut c);
        assert_eq!(c, vec![19., 22., 43., 50.]);
        gemm_rowmajor(&p, 1.0, &[1., 2., 3., 4.], &[5., 6., 7., 8.], -1.0, &mut c);
        assert_eq!(c, vec![0.; 4]);
    }

    #[test]
    fn errors_reject_nan() {
        assert_eq!(rel_error(&[1.0, f64::NAN], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_error(&[0.0, 2.0], &[1.0, 2.0]) - 1.0 / 5f64.sqrt()).abs() < 1e-15);
        assert_eq!(max_abs_diff(&[1.0, 3.0], &[1.0, 2.0]), (1.0, 0.5));
    }
}
