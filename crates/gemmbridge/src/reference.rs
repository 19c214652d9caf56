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
    if p.is_empty() {
        return; // without this, m rows of nothing (n = 0) would still be visited one by one
    }
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

/// [`gemm_rowmajor`] followed by the problem's epilogue ([`crate::epilogue`]), in f64, with
/// the scalars `(α, β)` and the inputs `[A, B]`.
///
/// - `vector`: the bias `[n]` read, or the bias gradient (`[m]` for `BiasGradA`, `[n]` for
///   `BiasGradB`) written (unscaled sums of op(A)'s rows / op(B)'s columns over k);
/// - `aux`: the `[m, n]` aux matrix in the layout [`GemmProblem::aux`], written (the
///   pre-activation) or read (`DGelu`: `C = T ⊙ gelu'(aux)`).
///
/// # Panics
/// If an operand the epilogue uses is missing or short.
pub fn gemm_epilogue_rowmajor(
    p: &GemmProblem,
    (alpha, beta): (f64, f64),
    [a, b]: [&[f64]; 2],
    c: &mut [f64],
    vector: Option<&mut [f64]>,
    aux: Option<&mut [f64]>,
) {
    use crate::epilogue::{gelu_tanh_grad, AuxUse, Epilogue, VectorUse};
    gemm_rowmajor(p, alpha, a, b, beta, c);
    let e = p.epilogue();
    let (lc, la) = (p.c(), p.aux());
    let mut vector = vector;
    let mut aux = aux;
    if matches!(e, Epilogue::BiasGradA | Epilogue::BiasGradB) {
        let v = vector.as_deref_mut().expect("bias gradient buffer");
        let (oa, ob) = (p.a(), p.b());
        if e == Epilogue::BiasGradA {
            for (i, g) in v.iter_mut().enumerate().take(p.m()) {
                *g = (0..p.k()).map(|l| a[oa.offset(0, i, l)]).sum();
            }
        } else {
            for (j, g) in v.iter_mut().enumerate().take(p.n()) {
                *g = (0..p.k()).map(|l| b[ob.offset(0, l, j)]).sum();
            }
        }
    }
    let rows = if p.is_empty() { 0 } else { p.m() }; // an empty C: nothing to visit
    for bt in 0..p.batch() {
        for i in 0..rows {
            for j in 0..p.n() {
                let at = lc.offset(bt, i, j);
                let mut t = c[at];
                if e.vector() == VectorUse::ReadsBias {
                    t += vector.as_deref().expect("bias")[j];
                }
                match e.aux() {
                    AuxUse::Writes => aux.as_deref_mut().expect("aux")[la.offset(bt, i, j)] = t,
                    AuxUse::Reads => t *= gelu_tanh_grad(aux.as_deref().expect("aux")[la.offset(bt, i, j)]),
                    AuxUse::None => {}
                }
                c[at] = e.activate(t);
            }
        }
    }
    if e == Epilogue::DGeluBiasGrad {
        // the sums of the result's columns (batch 1: a bias gradient is refused for more)
        let v = vector.expect("bias gradient buffer");
        for (j, g) in v.iter_mut().enumerate().take(p.n()) {
            *g = (0..p.m()).map(|i| c[lc.offset(0, i, j)]).sum();
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
    if m == 0 || n == 0 {
        return Ok(()); // nothing to visit (m columns of nothing would still be looped over)
    }
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
    use crate::precision::Precision;

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

    /// An empty C of many rows (n = 0, 64 batch entries of 2³¹ − 1 rows each) is returned from at
    /// once, not visited row by row: the property tests draw such problems, and a visit would
    /// take hours in a debug build.
    #[test]
    fn an_empty_c_of_many_rows_is_not_visited() {
        let p = GemmProblem::matmul(crate::MAX_DIM, 0, 0, Precision::F32).unwrap().batched(64).unwrap();
        let t = std::time::Instant::now();
        gemm_rowmajor(&p, 1.0, &[], &[], 0.0, &mut []);
        gemm_epilogue_rowmajor(&p, (1.0, 0.0), [&[], &[]], &mut [], None, None);
        let call = crate::mapping::column_major_call(&p);
        assert!(gemm_colmajor(&call, 1.0, &[], &[], 0.0, &mut []).is_ok());
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
    }

    #[test]
    fn errors_reject_nan() {
        assert_eq!(rel_error(&[1.0, f64::NAN], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_error(&[0.0, 2.0], &[1.0, 2.0]) - 1.0 / 5f64.sqrt()).abs() < 1e-15);
        assert_eq!(max_abs_diff(&[1.0, 3.0], &[1.0, 2.0]), (1.0, 0.5));
    }
}
