//! Shared by the CPU and GPU test files: random inputs, problem cases, checks.
#![allow(dead_code)]

pub mod crash;
pub mod layer;
pub mod train;

/// Device 0, with the crash reporter installed (GPU tests only: they are `#[ignore]`d).
pub fn gpu() -> gemmbridge::cuda::Gpu {
    crash::install();
    gemmbridge::cuda::Gpu::new(0).expect("a CUDA GPU (these tests are #[ignore]d; run them on a GPU machine)")
}

/// Device 0 with `options`, as [`gpu`].
pub fn gpu_with(options: gemmbridge::cuda::GpuOptions) -> gemmbridge::cuda::Gpu {
    crash::install();
    gemmbridge::cuda::Gpu::with_options(0, options)
        .expect("a CUDA GPU (these tests are #[ignore]d; run them on a GPU machine)")
}

use gemmbridge::reference::{gemm_rowmajor, rel_error};
use gemmbridge::{Element, GemmProblem, MatrixLayout, Op, Operand, Precision};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// A fresh generator: seeded from the OS, so every run draws new inputs; the seed is printed
/// so that a failure can be replayed with GEMMBRIDGE_TEST_SEED.
pub fn rng() -> StdRng {
    let seed = std::env::var("GEMMBRIDGE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("test seed {seed} (replay with GEMMBRIDGE_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

/// `len` standard-normal values (never all zero), rounded to `T`.
pub fn normal<T: Element>(rng: &mut StdRng, len: usize) -> Vec<T> {
    (0..len).map(|_| T::from_f64(rng.sample::<f64, _>(StandardNormal))).collect()
}

/// One row-major problem: shapes, ops, padding and batch.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub op_a: Op,
    pub op_b: Op,
    /// Extra elements added to every leading dimension (0: contiguous).
    pub pad: usize,
    pub batch: usize,
}

impl Case {
    pub fn problem(&self, precision: Precision) -> GemmProblem {
        // stored shape: op N → [rows, cols] as in the product; op T → transposed
        let stored = |op: Op, r: usize, c: usize| {
            let (r, c) = if op == Op::N { (r, c) } else { (c, r) };
            let l = MatrixLayout::row_major(r, c).with_ld(c + self.pad);
            // batched cases get a batch stride with a gap, to catch stride mix-ups
            l.with_batch_stride(l.batch_stride + if self.batch > 1 { 5 } else { 0 })
        };
        let a = Operand { layout: stored(self.op_a, self.m, self.k), op: self.op_a };
        let b = Operand { layout: stored(self.op_b, self.k, self.n), op: self.op_b };
        let c = stored(Op::N, self.m, self.n);
        GemmProblem::new(a, b, c, self.batch, precision).expect("test cases are valid problems")
    }
}

/// Every op combination × `shapes` × (contiguous, padded) × (batch 1, batch 3).
pub fn cases(shapes: &[(usize, usize, usize)]) -> Vec<Case> {
    let mut out = Vec::new();
    for &(m, n, k) in shapes {
        for op_a in [Op::N, Op::T] {
            for op_b in [Op::N, Op::T] {
                for pad in [0, 3] {
                    for batch in [1, 3] {
                        out.push(Case { m, n, k, op_a, op_b, pad, batch });
                    }
                }
            }
        }
    }
    out
}

/// Host operands for a problem: random A, B (rounded to the input type) and C, and the f64
/// reference result of `α·op(A)·op(B) + β·C` over the logical elements of C.
pub struct Operands<TI, TO> {
    pub a: Vec<TI>,
    pub b: Vec<TI>,
    /// C before the call: random where β ≠ 0, NaN where β = 0 (a NaN that leaks fails).
    pub c: Vec<TO>,
    pub reference: Vec<f64>,
}

pub fn operands<TI: Element, TO: Element>(
    rng: &mut StdRng,
    p: &GemmProblem,
    alpha: f64,
    beta: f64,
) -> Operands<TI, TO> {
    let len = |l: MatrixLayout| l.required_elems(p.batch()).unwrap();
    let a: Vec<TI> = normal(rng, len(p.a().layout));
    let b: Vec<TI> = normal(rng, len(p.b().layout));
    let c: Vec<TO> = if beta == 0.0 { vec![TO::from_f64(f64::NAN); len(p.c())] } else { normal(rng, len(p.c())) };
    let wide = |v: &[TI]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let mut r: Vec<f64> = c.iter().map(|x| x.to_f64()).collect();
    gemm_rowmajor(p, alpha, &wide(&a), &wide(&b), beta, &mut r);
    let reference = p.c().gather(&r, p.batch());
    Operands { a, b, c, reference }
}

/// Checks a result: every logical element of C within the precision's band of the reference
/// (‖out − ref‖/‖ref‖, NaN fails), and every padding element of C unchanged from `before`.
pub fn check<TO: Element>(what: &str, p: &GemmProblem, before: &[TO], after: &[TO], reference: &[f64]) -> f64 {
    let got: Vec<f64> = p.c().gather(after, p.batch()).iter().map(|x| x.to_f64()).collect();
    let err = rel_error(&got, reference);
    let tol = p.precision().tolerance();
    assert!(err <= tol, "{what}: rel error {err:e} > {tol:e} for {}", p.describe());
    // padding (and the gap between batch entries) must be exactly as before
    let mut logical = vec![false; after.len()];
    let c = p.c();
    for bt in 0..p.batch() {
        for i in 0..c.rows {
            for j in 0..c.cols {
                logical[c.offset(bt, i, j)] = true;
            }
        }
    }
    for (idx, (x, y)) in before.iter().zip(after).enumerate() {
        if !logical[idx] {
            assert!(
                x.to_f64().to_bits() == y.to_f64().to_bits() || (x.to_f64().is_nan() && y.to_f64().is_nan()),
                "{what}: padding element {idx} changed from {x:?} to {y:?} for {}",
                p.describe()
            );
        }
    }
    err
}

/// A test value of every element type.
pub fn poison<T: Element>(len: usize) -> Vec<T> {
    vec![T::from_f64(f64::NAN); len]
}
