//! The row-major → column-major mapping, checked exhaustively on the CPU: for every op
//! combination, odd sizes, padded leading dimensions and batches, the column-major call the
//! mapping produces, emulated in f64, must equal the f64 row-major reference.

mod common;

use common::{cases, operands, rng, Case};
use gemmbridge::mapping::{column_major_call, ColMajorCall};
use gemmbridge::reference::{gemm_colmajor, rel_error, InvalidValue};
use gemmbridge::{GemmProblem, Op, Precision};

const SIZES: [usize; 5] = [1, 2, 3, 7, 13];

fn all_cases() -> Vec<Case> {
    let mut shapes = Vec::new();
    for m in SIZES {
        for n in SIZES {
            for k in SIZES {
                shapes.push((m, n, k));
            }
        }
    }
    cases(&shapes)
}

/// Runs a column-major call on the row-major problem's buffers and returns the logical C.
fn emulate(
    p: &GemmProblem,
    call: &ColMajorCall,
    a: &[f64],
    b: &[f64],
    c: &[f64],
    alpha: f64,
    beta: f64,
) -> Result<Vec<f64>, InvalidValue> {
    let mut c = c.to_vec();
    let (first, second) = call.operands(a, b);
    gemm_colmajor(call, alpha, first, second, beta, &mut c)?;
    Ok(p.c().gather(&c, p.batch()))
}

#[test]
fn mapping_matches_reference_for_every_case() {
    let mut rng = rng();
    let cases = all_cases();
    assert_eq!(cases.len(), 125 * 4 * 2 * 2);
    for case in cases {
        for (alpha, beta) in [(1.0, 0.0), (0.75, -1.5)] {
            let p = case.problem(Precision::F32);
            let ops = operands::<f32, f32>(&mut rng, &p, alpha, beta);
            let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            let (a, b, c) = (wide(&ops.a), wide(&ops.b), wide(&ops.c));
            let call = column_major_call(&p);
            let got = emulate(&p, &call, &a, &b, &c, alpha, beta)
                .unwrap_or_else(|e| panic!("mapping produced an invalid call ({e:?}) for {case:?}"));
            let err = rel_error(&got, &ops.reference);
            assert!(err <= 1e-14, "{case:?} α={alpha} β={beta}: rel error {err:e}");
        }
    }
}

#[test]
fn mapping_of_the_documented_example() {
    // docs/BACKGROUND.md §1: C[M,N] = A[M,K]·B[K,N] → gemm(N, N, m=N, n=M, k=K, B lda=N, A ldb=K, ldc=N)
    let (m, n, k) = (256, 512, 128);
    let call = column_major_call(&GemmProblem::matmul(m, n, k, Precision::F32).unwrap());
    assert_eq!((call.transa, call.transb), (Op::N, Op::N));
    assert_eq!((call.m, call.n, call.k), (512, 256, 128));
    assert_eq!((call.lda, call.ldb, call.ldc), (512, 128, 512));
    assert_eq!(call.operands("A", "B"), ("B", "A"));
    // linear: act[M,K]·weight[N,K]ᵀ → gemm(T, N, m=N, n=M, k=K, weight lda=K, act ldb=K, ldc=N)
    let call = column_major_call(&GemmProblem::linear(m, n, k, Precision::F32).unwrap());
    assert_eq!((call.transa, call.transb), (Op::T, Op::N));
    assert_eq!((call.m, call.n, call.k), (512, 256, 128));
    assert_eq!((call.lda, call.ldb, call.ldc), (128, 128, 512));
}

/// The emulation is strict enough to catch the classic mistakes: swapping lda and ldb, or the
/// widely copied `(T, N, lda=K, ldb=K)` form, is rejected or wrong on a non-square problem.
#[test]
fn wrong_mappings_are_caught_by_the_emulation() {
    let mut rng = rng();
    let case = Case { m: 7, n: 13, k: 3, op_a: Op::N, op_b: Op::N, pad: 0, batch: 1 };
    let p = case.problem(Precision::F32);
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (a, b, c) = (wide(&ops.a), wide(&ops.b), vec![0.0; ops.c.len()]);
    let right = column_major_call(&p);
    let swapped = ColMajorCall { lda: right.ldb, ldb: right.lda, ..right };
    let copied = ColMajorCall { transa: Op::T, lda: 3, ldb: 3, ..right };
    for wrong in [swapped, copied] {
        // a padded copy of the inputs keeps a wrong-but-accepted call in bounds
        let mut ab = a.clone();
        ab.resize(1024, 0.5);
        let mut bb = b.clone();
        bb.resize(1024, 0.5);
        match emulate(&p, &wrong, &ab, &bb, &c, 1.0, 0.0) {
            Err(_) => {}
            Ok(got) => assert!(rel_error(&got, &ops.reference) > 1e-3, "{wrong:?} was not caught"),
        }
    }
}
