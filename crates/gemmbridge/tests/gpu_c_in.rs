//! GPU tests of a read-only C apart from the output (`Extras::c_in`, `RawOperands::with_c_in`):
//! `D = α·op(A)·op(B) + β·C_in` against float64 with C_in left untouched bit for bit, on every
//! way a call can be served (cuBLASLt; cuBLAS with its copy of C into D; padded copies; graph
//! replay), and the checks that refuse an overlapping C_in.

mod common;
mod lt_common;

use common::{gpu, normal, poison, rng, Case};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::cuda::{Backend, Extras, Gpu, GraphReplay, Padding, RawBuffer, RawOperands, Scale};
use gemmbridge::half::bf16;
use gemmbridge::reference::{gemm_epilogue_rowmajor, rel_error};
use gemmbridge::{Element, Error, GemmProblem, Op, Precision, Which};
use lt_common::{raw, shared, wide};

/// f32 and bf16 bands (docs: f32 1e-5, bf16 1e-2).
fn band(p: Precision) -> f64 {
    if p == Precision::F32 {
        1e-5
    } else {
        1e-2
    }
}

/// One call `D = A·B + β·C_in` with D poisoned (NaN) first; checks C_in bit for bit and D's
/// logical elements against float64 (D's padding stays poisoned: it is not compared). Returns
/// the relative error.
fn residual_case<T: Element + DeviceRepr>(gpu: &Gpu, p: &GemmProblem, beta: f32) -> f64 {
    let mut rng = rng();
    let s = gpu.stream();
    let len = |l: gemmbridge::MatrixLayout| l.required_elems(p.batch()).unwrap();
    let (a, b): (Vec<T>, Vec<T>) = (normal(&mut rng, len(p.a().layout)), normal(&mut rng, len(p.b().layout)));
    let c_in: Vec<T> = normal(&mut rng, len(p.c()));
    let mut want = wide(&c_in);
    gemm_epilogue_rowmajor(p, (1.0, f64::from(beta)), [&wide(&a), &wide(&b)], &mut want, None, None);
    let (da, db, dci) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c_in).unwrap());
    let mut dd: CudaSlice<T> = s.clone_htod(&poison::<T>(len(p.c()))).unwrap();
    let ex = Extras { c_in: Some(&dci), ..Extras::default() };
    gpu.gemm_fused(p, Scale::new(1.0, beta), &da, &db, &mut dd, ex).unwrap();
    let (got, back) = (s.clone_dtoh(&dd).unwrap(), s.clone_dtoh(&dci).unwrap());
    let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&c_in), "C_in was written");
    let l = p.c();
    let logical = |v: &[f64]| l.gather(v, p.batch());
    let err = rel_error(&logical(&wide(&got)), &logical(&want));
    assert!(err.is_finite(), "NaN in D ({})", p.describe());
    err
}

/// The cases: square-ish, padded leading dimensions, transposed operands, a batch with gaps.
fn cases() -> [Case; 3] {
    [
        Case { m: 64, n: 96, k: 80, op_a: Op::N, op_b: Op::N, pad: 0, batch: 1 },
        Case { m: 37, n: 48, k: 72, op_a: Op::N, op_b: Op::T, pad: 8, batch: 1 },
        Case { m: 24, n: 40, k: 32, op_a: Op::T, op_b: Op::N, pad: 0, batch: 3 },
    ]
}

fn every_case<T: Element + DeviceRepr>(gpu: &Gpu, precision: Precision) {
    for case in cases() {
        let p = case.problem(precision);
        for beta in [1.0, 0.5] {
            let err = residual_case::<T>(gpu, &p, beta);
            eprintln!("{} beta {beta}: {err:.2e}", p.describe());
            assert!(err <= band(precision), "{} beta {beta}: {err:.2e}", p.describe());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn c_in_on_cublaslt_f32_and_bf16() {
    let _g = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.graph_replay = GraphReplay::off()).unwrap();
    every_case::<f32>(&gpu, Precision::F32);
    every_case::<bf16>(&gpu, Precision::BF16);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn c_in_on_cublas_is_copied_into_d_first() {
    let _g = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.backend = Backend::Blas).unwrap();
    every_case::<f32>(&gpu, Precision::F32);
    every_case::<bf16>(&gpu, Precision::BF16);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn c_in_on_padded_copies() {
    let _g = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.graph_replay = GraphReplay::off()).unwrap();
    gpu.update_options(|o| o.padding = Padding::default().with_min_macs(0, 0, 0)).unwrap();
    // odd N and K: B, A and C staged (C copied in from C_in, back to D)
    for case in [
        Case { m: 33, n: 45, k: 27, op_a: Op::N, op_b: Op::N, pad: 0, batch: 1 },
        Case { m: 16, n: 31, k: 19, op_a: Op::N, op_b: Op::T, pad: 1, batch: 2 },
    ] {
        for (precision, beta) in [(Precision::F32, 1.0), (Precision::BF16, 0.5)] {
            let p = case.problem(precision);
            let err = if precision == Precision::F32 {
                residual_case::<f32>(&gpu, &p, beta)
            } else {
                residual_case::<bf16>(&gpu, &p, beta)
            };
            assert!(err <= band(precision), "{} beta {beta}: {err:.2e}", p.describe());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn beta_zero_never_reads_c_in() {
    let _g = shared();
    let gpu = gpu();
    let s = gpu.stream();
    let p = GemmProblem::matmul(32, 48, 16, Precision::F32).unwrap();
    let (a, b) = (vec![1.0f32; 32 * 16], vec![0.5f32; 16 * 48]);
    let (da, db, dci) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&poison::<f32>(32 * 48)));
    let dci = dci.unwrap();
    for backend in [Backend::Lt, Backend::Blas] {
        gpu.update_options(|o| o.backend = backend).unwrap();
        let mut dd = s.alloc_zeros::<f32>(32 * 48).unwrap();
        let ex = Extras { c_in: Some(&dci), ..Extras::default() };
        gpu.gemm_fused(&p, Scale::PRODUCT, &da, &db, &mut dd, ex).unwrap();
        let got = s.clone_dtoh(&dd).unwrap();
        assert!(got.iter().all(|&v| v == 8.0), "{backend:?}: {:?}", &got[..4]);
    }
}

/// Graph replay keys on C_in: the same D with another C_in is not the cached graph.
#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_tells_c_in_apart() {
    let _g = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.graph_replay = GraphReplay::default().with_after_calls(1)).unwrap();
    let s = gpu.stream();
    let p = GemmProblem::matmul(16, 32, 8, Precision::F32).unwrap();
    let (da, db) = (s.alloc_zeros::<f32>(16 * 8).unwrap(), s.alloc_zeros::<f32>(8 * 32).unwrap());
    let (one, two) = (s.clone_htod(&vec![1.0f32; 16 * 32]).unwrap(), s.clone_htod(&vec![2.0f32; 16 * 32]).unwrap());
    let mut dd = s.alloc_zeros::<f32>(16 * 32).unwrap();
    for (c_in, want) in [(&one, 1.0), (&one, 1.0), (&one, 1.0), (&two, 2.0), (&two, 2.0), (&one, 1.0)] {
        let ex = Extras { c_in: Some(c_in), ..Extras::default() };
        gpu.gemm_fused(&p, Scale::new(1.0, 1.0), &da, &db, &mut dd, ex).unwrap();
        let got = s.clone_dtoh(&dd).unwrap();
        assert!(got.iter().all(|&v| v == want), "want {want}, got {:?}", &got[..4]);
    }
}

/// The raw entry: C_in overlapping D is refused by name before anything runs; C_in at D's own
/// address is the in-place call; C_in too short is refused as C_in.
#[test]
#[ignore = "needs a CUDA GPU"]
fn raw_c_in_is_checked() {
    let _g = shared();
    let gpu = gpu();
    let s = gpu.stream();
    let p = GemmProblem::matmul(8, 8, 8, Precision::F32).unwrap();
    let (da, db) = (s.clone_htod(&vec![1.0f32; 64]).unwrap(), s.clone_htod(&vec![1.0f32; 64]).unwrap());
    let big = s.clone_htod(&vec![3.0f32; 128]).unwrap();
    let (ra, rb, rbig) = (raw(&da, s), raw(&db, s), raw(&big, s));
    let d = RawBuffer { address: rbig.address, len_bytes: 64 * 4 };
    let at = |elems: u64, len: usize| RawBuffer { address: rbig.address + elems * 4, len_bytes: len * 4 };
    let run = |ops: RawOperands| unsafe { gpu.gemm_raw(&p, Scale::new(1.0, 1.0), ops, s.cu_stream()) };
    let e = run(RawOperands::new(ra, rb, d).with_c_in(at(32, 64))).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::C, input: Which::CIn, .. }), "{e}");
    let e = run(RawOperands::new(ra, rb, d).with_c_in(at(64, 63))).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::CIn, .. }), "{e}");
    assert!(s.clone_dtoh(&big).unwrap().iter().all(|&v| v == 3.0), "a refused call wrote");
    // in place: D = 8 + 3
    run(RawOperands::new(ra, rb, d).with_c_in(d)).unwrap();
    // apart: D (first half) = 8 + C_in (second half, 3)
    run(RawOperands::new(ra, rb, d).with_c_in(at(64, 64))).unwrap();
    let got = s.clone_dtoh(&big).unwrap();
    assert!(got[..64].iter().all(|&v| v == 11.0), "{:?}", &got[..4]);
    assert!(got[64..].iter().all(|&v| v == 3.0), "C_in written");
}
