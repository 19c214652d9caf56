//! Property tests of the GEMM problem ([`GemmProblem`]: shapes, leading dimensions, batch
//! strides, precisions, epilogues and aux layouts) and of the CPU backend's `gemm` and
//! `gemm_c_in` on every problem small enough to run: nothing panics or overflows, a valid
//! problem's sizes are exact, and a run with right-sized finite buffers gives finite results
//! and touches nothing outside C's layout.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::mapping::column_major_call;
use gemmbridge::{
    cpu, reference, Element, Epilogue, Error, GemmProblem, MatrixLayout, Op, Operand, Precision, MAX_DIM,
};
use proptest::prelude::*;
use shared::{boundary, config, size, values, RUN_ELEMS, RUN_WORK};

/// A stored layout of `rows × cols`: its ld and batch stride mostly the contiguous ones, at
/// times a few elements more, at times anything.
fn layout(rows: usize, cols: usize) -> impl Strategy<Value = MatrixLayout> {
    let ld = prop_oneof![3 => Just(cols), 2 => (0usize..4).prop_map(move |d| cols.saturating_add(d)), 1 => size()];
    let stride = prop_oneof![3 => Just(None), 1 => (0usize..40).prop_map(Some), 1 => boundary().prop_map(Some)];
    (ld, stride).prop_map(move |(ld, stride)| {
        let l = MatrixLayout::row_major(rows, cols).with_ld(ld);
        match stride {
            Some(s) => l.with_batch_stride(s),
            None => l,
        }
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop::sample::select(vec![Op::N, Op::T])
}

fn operand(rows: usize, cols: usize) -> impl Strategy<Value = Operand> {
    (op(), any::<bool>(), size()).prop_flat_map(move |(op, agree, other)| {
        // op(X) is rows × cols; now and then one dimension disagrees
        let (r, c) = if agree { (rows, cols) } else { (rows, other) };
        let (sr, sc) = if op == Op::N { (r, c) } else { (c, r) };
        layout(sr, sc).prop_map(move |layout| Operand { layout, op })
    })
}

fn precision() -> impl Strategy<Value = Precision> {
    prop::sample::select(Precision::ALL.to_vec())
}

fn batch() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..=3, 1 => boundary()]
}

prop_compose! {
    fn raw_problem()(m in size(), n in size(), k in size())
        (a in operand(m, k), b in operand(k, n), c in layout(m, n), batch in batch(), precision in precision())
        -> (Operand, Operand, MatrixLayout, usize, Precision) {
        (a, b, c, batch, precision)
    }
}

/// The invariants of a problem that `GemmProblem::new` accepted.
fn check_valid(p: &GemmProblem) {
    for v in [p.m(), p.n(), p.k(), p.batch(), p.a().layout.ld, p.b().layout.ld, p.c().ld] {
        assert!(v <= MAX_DIM, "{}", p.describe());
    }
    for l in [p.a().layout, p.b().layout, p.c()] {
        let elems = l.required_elems(p.batch()).expect("a valid problem's extents fit usize");
        assert!(elems.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize), "{}", p.describe());
    }
    let call = column_major_call(p);
    assert_eq!((call.m as usize, call.n as usize, call.k as usize), (p.n(), p.m(), p.k()));
    assert_eq!(call.batch as usize, p.batch());
    assert!(call.lda >= 1 && call.ldb >= 1 && call.ldc >= 1);
    assert!(call.stride_a >= 0 && call.stride_b >= 0 && call.stride_c >= 0);
    let _ = (p.flops(), p.macs(), p.describe(), p.is_empty(), p.vector_len(), p.uses_aux());
    assert!(p.flops().is_finite() && p.flops() >= 0.0);
}

/// Elements of C the layout addresses (those `gemm` may write).
fn addressed(p: &GemmProblem) -> Vec<bool> {
    let c = p.c();
    let len = c.required_elems(p.batch()).unwrap();
    let mut hit = vec![false; len];
    if !p.is_empty() {
        for bt in 0..p.batch() {
            for i in 0..c.rows {
                for j in 0..c.cols {
                    hit[c.offset(bt, i, j)] = true;
                }
            }
        }
    }
    hit
}

fn run_typed<TI: Element, TO: Element>(p: &GemmProblem, seed: u64, (alpha, beta): (f32, f32)) {
    let len = |l: MatrixLayout| l.required_elems(p.batch()).unwrap();
    let (na, nb, nc) = (len(p.a().layout), len(p.b().layout), len(p.c()));
    let a: Vec<TI> = shared::buf(na, seed);
    let b: Vec<TI> = shared::buf(nb, seed + 1);
    let c0: Vec<TO> = shared::buf(nc, seed + 2);
    let mut c = c0.clone();
    cpu::gemm(p, alpha, &a, &b, beta, &mut c).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    let hit = addressed(p);
    for (i, (x, y)) in c.iter().zip(&c0).enumerate() {
        if hit[i] {
            assert!(x.to_f32().is_finite(), "{}: c[{i}] = {x:?}", p.describe());
        } else {
            assert_eq!(x.to_f32().to_bits(), y.to_f32().to_bits(), "{}: c[{i}] written", p.describe());
        }
    }
    // against the f64 definition, within the output type's rounding
    let wide = |v: &[TI]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let mut want: Vec<f64> = c0.iter().map(|x| x.to_f64()).collect();
    reference::gemm_rowmajor(p, alpha as f64, &wide(&a), &wide(&b), beta as f64, &mut want);
    let tol = 4.0 * (p.k() as f64 + 2.0) * if TO::DTYPE == gemmbridge::DType::F32 { 1e-6 } else { 1e-2 };
    for (i, (x, w)) in c.iter().zip(&want).enumerate() {
        if hit[i] {
            assert!((x.to_f64() - w).abs() <= tol * (1.0 + w.abs()), "{}: c[{i}] {x:?} vs {w}", p.describe());
        }
    }
    // gemm_c_in: D from C_in, C_in untouched
    let mut d: Vec<TO> = vec![TO::from_f32(0.0); nc];
    cpu::gemm_c_in(p, (alpha, beta), &a, &b, &c0, &mut d).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    for (i, (x, y)) in d.iter().zip(&c).enumerate() {
        if hit[i] {
            assert_eq!(x.to_f32().to_bits(), y.to_f32().to_bits(), "{}: d[{i}] vs c", p.describe());
        }
    }
    // one element short is refused, before anything is written
    if nc > 0 && !p.is_empty() {
        let mut short = c0[..nc - 1].to_vec();
        let e = cpu::gemm(p, alpha, &a, &b, beta, &mut short).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { .. }), "{}: {e}", p.describe());
        assert!(short.iter().zip(&c0).all(|(x, y)| x.to_f32().to_bits() == y.to_f32().to_bits()), "{}", p.describe());
    }
}

fn run(p: &GemmProblem, seed: u64, ab: (f32, f32)) {
    let pr = p.precision();
    with_elem!(pr.input(), TI => {
        with_elem!(pr.output(), TO => {
            run_typed::<TI, TO>(p, seed, ab)
        })
    })
}

fn small(p: &GemmProblem) -> bool {
    [p.a().layout, p.b().layout, p.c()].iter().all(|l| l.required_elems(p.batch()).is_some_and(|e| e <= RUN_ELEMS))
        && p.m().saturating_mul(p.n()).saturating_mul(p.k()).saturating_mul(p.batch()) <= RUN_WORK
        // loops over an empty problem's batch entries cost time too
        && p.batch() <= 64
}

#[test]
fn problems_run() {
    let n = shared::runnable(raw_problem(), |&(a, b, c, batch, pr)| {
        GemmProblem::new(a, b, c, batch, pr).is_ok_and(|p| small(&p) && !p.is_empty())
    });
    assert!(n >= 10, "{n} of 1000 problems run on the CPU");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gemm_problem((a, b, c, batch, precision) in raw_problem(), seed in any::<u64>(), ab in (-2.0f32..2.0, prop_oneof![Just(0.0f32), Just(1.0), -2.0f32..2.0])) {
        let Ok(p) = GemmProblem::new(a, b, c, batch, precision) else { return Ok(()) };
        check_valid(&p);
        if small(&p) {
            run(&p, seed, ab);
        }
    }

    #[test]
    fn matmul_linear_batched((m, n, k) in (size(), size(), size()), batch in batch(), precision in precision(), seed in any::<u64>()) {
        for p in [GemmProblem::matmul(m, n, k, precision), GemmProblem::linear(m, n, k, precision)] {
            let Ok(p) = p else { continue };
            check_valid(&p);
            if small(&p) {
                run(&p, seed, (1.0, 0.0));
            }
            if let Ok(q) = p.batched(batch) {
                check_valid(&q);
                if small(&q) {
                    run(&q, seed, (0.5, 1.0));
                }
            }
        }
    }

    #[test]
    fn epilogues((a, b, c, batch, precision) in raw_problem(), e in prop::sample::select(Epilogue::ALL.to_vec()), aux in (size(), size(), size(), size()), seed in any::<u64>()) {
        let Ok(p) = GemmProblem::new(a, b, c, batch, precision) else { return Ok(()) };
        let Ok(p) = p.with_epilogue(e) else { return Ok(()) };
        check_valid(&p);
        let (rows, cols, ld, stride) = aux;
        // the default aux layout, and one drawn at random
        for l in [p.aux(), MatrixLayout::row_major(rows, cols).with_ld(ld).with_batch_stride(stride),
                  MatrixLayout::row_major(p.m(), p.n()).with_ld(ld).with_batch_stride(stride)] {
            if let Ok(q) = p.with_aux_layout(l) {
                check_valid(&q);
                let x = q.aux();
                assert!(x.ld <= MAX_DIM && x.ld % 8 == 0 && x.ld >= x.cols);
                assert!(x.required_elems(q.batch()).is_some());
            }
        }
        if let Ok(q) = p.batched(batch) {
            check_valid(&q);
        }
        if small(&p) && e != Epilogue::None {
            // the CPU backend offers no epilogue: a named error, nothing written
            let pr = p.precision();
            with_elem!(pr.input(), TI => {
                with_elem!(pr.output(), TO => {
                    let len = |l: MatrixLayout| l.required_elems(p.batch()).unwrap();
                    let (a, b): (Vec<TI>, Vec<TI>) = (shared::buf(len(p.a().layout), seed), shared::buf(len(p.b().layout), seed));
                    let mut c: Vec<TO> = shared::buf(len(p.c()), seed);
                    let e = cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap_err();
                    prop_assert!(matches!(e, Error::Unsupported { .. }), "{e}");
                })
            });
        }
    }
}

#[test]
fn values_are_finite_and_bounded() {
    assert!(values(1000, 3).iter().all(|v| v.is_finite() && v.abs() <= 2.0));
}
