//! Checking a call against float64: which rows of C to compare, their reference values
//! (C and, where the epilogue writes it, aux), and the verdict.
//!
//! A problem of at most [`FULL_CHECK_MACS`] multiply-adds is compared whole. A larger one is
//! compared on a few rows only — the first and last row of the first and last batch entry,
//! and two random rows — whose reference costs a few rows' multiply-adds, so that a check of
//! 4096³ stays near a tenth of a second of one host core.

use gemmbridge::epilogue::{AuxUse, VectorUse};
use gemmbridge::reference::rel_error;
use gemmbridge::{GemmProblem, Op};
use rand::Rng;

use super::data::View;

/// Largest problem compared whole (multiply-adds).
pub const FULL_CHECK_MACS: u64 = 1 << 24;

/// A row of the output: (batch entry, row).
pub type RowId = (usize, usize);

/// The rows a check compares: every row, or (large problems) the corners and two random ones.
pub fn sample_rows(p: &GemmProblem, rng: &mut impl Rng) -> Vec<RowId> {
    let (batch, m) = (p.batch(), p.m());
    if p.is_empty() {
        return Vec::new();
    }
    if p.macs() <= FULL_CHECK_MACS {
        return (0..batch).flat_map(|b| (0..m).map(move |i| (b, i))).collect();
    }
    let mut rows = vec![(0, 0), (batch - 1, m - 1), (rng.random_range(0..batch), rng.random_range(0..m))];
    rows.push((rng.random_range(0..batch), rng.random_range(0..m)));
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// The inputs of a call as the reference reads them (element types of the problem).
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub alpha: f32,
    pub beta: f32,
    pub a: View<'a>,
    pub b: View<'a>,
    /// C before the call (read only when β ≠ 0).
    pub c0: View<'a>,
    /// The bias, when the epilogue reads one.
    pub bias: Option<View<'a>>,
}

/// Reference values of the sampled rows, each `n` long, concatenated in `rows` order.
#[derive(Debug, Default, PartialEq)]
pub struct Expected {
    pub c: Vec<f64>,
    /// The pre-activation an aux-writing epilogue stores.
    pub aux: Option<Vec<f64>>,
}

/// `α·op(A)·op(B) + β·C0`, plus the bias, activated, for `rows` only (as
/// `gemmbridge::reference::gemm_epilogue_rowmajor` computes it for the whole output).
pub fn reference_rows(p: &GemmProblem, x: Inputs<'_>, rows: &[RowId]) -> Expected {
    let (n, k, e) = (p.n(), p.k(), p.epilogue());
    let (oa, ob, lc) = (p.a(), p.b(), p.c());
    let writes_aux = e.aux() == AuxUse::Writes;
    let mut out = Expected { c: Vec::with_capacity(rows.len() * n), aux: writes_aux.then(Vec::new) };
    let mut t = vec![0.0f64; n];
    for &(bt, i) in rows {
        let arow: Vec<f64> = (0..k).map(|l| x.a.get(oa.offset(bt, i, l))).collect();
        t.iter_mut().for_each(|v| *v = 0.0);
        if ob.op == Op::N {
            // stored B[k, n]: row l is contiguous in j
            for (l, &av) in arow.iter().enumerate() {
                for (j, tj) in t.iter_mut().enumerate() {
                    *tj += av * x.b.get(ob.offset(bt, l, j));
                }
            }
        } else {
            // stored B[n, k]: column j of op(B) is contiguous in l
            for (j, tj) in t.iter_mut().enumerate() {
                *tj = arow.iter().enumerate().map(|(l, &av)| av * x.b.get(ob.offset(bt, l, j))).sum();
            }
        }
        for (j, tj) in t.iter_mut().enumerate() {
            *tj *= x.alpha as f64;
            if x.beta != 0.0 {
                *tj += x.beta as f64 * x.c0.get(lc.offset(bt, i, j));
            }
            if e.vector() == VectorUse::ReadsBias {
                *tj += x.bias.expect("the epilogue reads a bias").get(j);
            }
        }
        if let Some(aux) = out.aux.as_mut() {
            aux.extend_from_slice(&t);
        }
        out.c.extend(t.iter().map(|&v| e.activate(v)));
    }
    out
}

/// The error of a checked call: ‖got − want‖/‖want‖ over the sampled rows of C and of aux
/// (the larger); infinite when anything read back is not finite.
pub fn error(want: &Expected, got_c: &[f64], got_aux: Option<&[f64]>) -> f64 {
    let mut err = rel_error(got_c, &want.c);
    if let (Some(w), Some(g)) = (want.aux.as_deref(), got_aux) {
        err = err.max(rel_error(g, w));
    }
    err
}

/// Whether `err` is within `tolerance` (NaN never passes).
pub fn passes(err: f64, tolerance: f64) -> bool {
    err <= tolerance
}

#[cfg(test)]
mod tests {
    use super::super::cases::{self, Shape};
    use super::super::data::{encode, normals};
    use super::*;
    use gemmbridge::reference::gemm_epilogue_rowmajor;
    use gemmbridge::{Epilogue, Precision};
    use rand::SeedableRng;

    /// Row-sampled reference vs the library's full one, on the stored (rounded) values.
    fn agree(shape: Shape, precision: Precision, e: Epilogue, alpha: f32, beta: f32) {
        let p = shape.problem(precision, e).unwrap();
        let case = cases::Case { label: String::new(), problem: p };
        let [na, nb, nc, nbias, naux] = case.elems();
        let (ti, to) = (precision.input(), precision.output());
        let (a, b) = (encode(ti, &normals(na, 1)), encode(ti, &normals(nb, 2)));
        let (c0, bias) = (encode(to, &normals(nc, 3)), encode(to, &normals(nbias.max(1), 4)));
        let v = |d, bytes: &Vec<u8>| -> Vec<f64> { View::new(d, bytes).range(0, View::new(d, bytes).len()) };
        let mut want_c = v(to, &c0);
        let mut want_bias = v(to, &bias);
        let mut want_aux = vec![0.0; naux];
        gemm_epilogue_rowmajor(
            &p,
            (alpha as f64, beta as f64),
            [&v(ti, &a), &v(ti, &b)],
            &mut want_c,
            (nbias > 0).then_some(&mut want_bias[..]),
            (naux > 0).then_some(&mut want_aux[..]),
        );
        let x = Inputs {
            alpha,
            beta,
            a: View::new(ti, &a),
            b: View::new(ti, &b),
            c0: View::new(to, &c0),
            bias: (nbias > 0).then(|| View::new(to, &bias)),
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let rows = sample_rows(&p, &mut rng);
        let got = reference_rows(&p, x, &rows);
        let pick = |full: &[f64], l: gemmbridge::MatrixLayout| -> Vec<f64> {
            rows.iter().flat_map(|&(bt, i)| (0..p.n()).map(move |j| full[l.offset(bt, i, j)])).collect()
        };
        let want = Expected { c: pick(&want_c, p.c()), aux: (naux > 0).then(|| pick(&want_aux, p.aux())) };
        let err = error(&want, &got.c, got.aux.as_deref());
        assert!(err < 1e-12, "{}: {err:e}", p.describe());
        assert_eq!(got.aux.is_some(), naux > 0);
    }

    #[test]
    fn sampled_reference_equals_the_full_reference() {
        for shape in cases::PLAIN.iter().filter(|s| s.m * s.n * s.k * s.batch <= 1 << 20) {
            for (alpha, beta) in [(1.0, 0.0), (-1.5, 0.5)] {
                agree(*shape, Precision::BF16_F32OUT, Epilogue::None, alpha, beta);
                agree(*shape, Precision::F32, Epilogue::None, alpha, beta);
            }
        }
        for shape in cases::FUSED.iter().filter(|s| s.m * s.n * s.k * s.batch <= 1 << 20) {
            for e in cases::epilogues() {
                agree(*shape, Precision::F16, e, 0.5, -0.25);
                agree(*shape, Precision::F32, e, 1.0, 0.0);
            }
        }
    }

    #[test]
    fn sampled_rows_of_a_large_problem_equal_the_full_reference() {
        // 64·512·520 multiply-adds: just above FULL_CHECK_MACS, so only a few rows are compared
        let shape = cases::Shape { m: 64, n: 512, k: 520, op_a: Op::N, op_b: Op::T, pad: [0, 8, 8], batch: 1 };
        assert!(shape.problem(Precision::F16, Epilogue::None).unwrap().macs() > FULL_CHECK_MACS);
        agree(shape, Precision::F16, Epilogue::GeluAuxBias, -1.5, 0.5);
    }

    #[test]
    fn large_problems_sample_a_few_rows_small_ones_every_row() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let big = GemmProblem::matmul(4096, 4096, 4096, Precision::F16).unwrap().batched(2).unwrap();
        let rows = sample_rows(&big, &mut rng);
        assert!((2..=4).contains(&rows.len()) && rows.contains(&(0, 0)) && rows.contains(&(1, 4095)), "{rows:?}");
        let small = GemmProblem::matmul(7, 13, 5, Precision::F16).unwrap().batched(3).unwrap();
        assert_eq!(sample_rows(&small, &mut rng).len(), 21);
        // a NaN read back never passes
        let want = Expected { c: vec![1.0, 2.0], aux: None };
        assert!(!passes(error(&want, &[1.0, f64::NAN], None), 1e-2));
        assert!(passes(error(&want, &[1.0, 2.0], None), 0.0));
    }
}
