//! The grouped GEMM on the GPU ([`Gpu::grouped_gemm`]) against the float64 reference
//! (`grouped::reference`): every product (forward with and without a bias, backward data,
//! backward weight) at ragged group sizes (0, 1, 7, 129, 4096 rows), every precision, outputs
//! poisoned with NaN first; and bad input refused before anything is written.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::{reference, GroupedOp, GroupedProblem};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error, Precision, Which};
use rand::rngs::StdRng;

/// The ragged group sizes of every test.
const SIZES: [usize; 6] = [0, 1, 7, 129, 4096, 0];

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// One product against float64: ‖out − ref‖/‖ref‖ within the precision's band.
fn check<T: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, rng: &mut StdRng) -> f64 {
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<T>, Vec<T>) = (normal(rng, la), normal(rng, lb));
    let bias: Option<Vec<T>> = p.has_bias().then(|| normal(rng, p.groups() * p.n()));
    let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
    let dbias = bias.as_ref().map(|v| s.clone_htod(v).unwrap());
    let mut dc = s.clone_htod(&poison::<T>(lc)).unwrap();
    gpu.grouped_gemm(p, &da, &db, &mut dc, dbias.as_ref().map(|v| v as &dyn DevicePtr<T>))
        .unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    let got = wide(&s.clone_dtoh(&dc).unwrap());
    let mut want = vec![f64::NAN; lc];
    reference::run(p, &wide(&a), &wide(&b), bias.as_ref().map(|v| wide(v)).as_deref(), &mut want);
    let e = rel_error(&got, &want);
    let tol = p.precision().tolerance();
    assert!(e <= tol, "{}: rel error {e:e} > {tol:e}", p.describe());
    e
}

fn all_products<T: Element + DeviceRepr>(precisions: &[Precision]) {
    let (gpu, mut rng) = (gpu(), rng());
    for &precision in precisions {
        // (96, 64): aligned slices; (33, 17): every group's slice starts off 16 bytes
        for (n, k) in [(96, 64), (33, 17)] {
            for op in [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight] {
                let p = GroupedProblem::new(op, &SIZES, n, k, precision).unwrap();
                let e = check::<T>(&gpu, &p, &mut rng);
                eprintln!("{}: rel error {e:.2e}", p.describe());
            }
            let p = GroupedProblem::new(GroupedOp::Forward, &SIZES, n, k, precision).unwrap().with_bias().unwrap();
            check::<T>(&gpu, &p, &mut rng);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_f32_and_tf32() {
    all_products::<f32>(&[Precision::F32, Precision::TF32]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_f16() {
    all_products::<f16>(&[Precision::F16]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_bf16() {
    all_products::<bf16>(&[Precision::BF16]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 16, 8, Precision::BF16).unwrap();
    let [la, lb, lc] = p.lens();
    let up = |len: usize, rng: &mut StdRng| s.clone_htod(&normal::<bf16>(rng, len)).unwrap();
    let (a, b) = (up(la, &mut rng), up(lb, &mut rng));
    let untouched = |c: &CudaSlice<bf16>| s.clone_dtoh(c).unwrap().iter().all(|x| x.is_nan());
    // an output one element short
    let mut short = s.clone_htod(&poison::<bf16>(lc - 1)).unwrap();
    match gpu.grouped_gemm(&p, &a, &b, &mut short, None) {
        Err(Error::BufferTooSmall { operand: Which::C, needed_elems, .. }) => assert_eq!(needed_elems, lc),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&short));
    // a bias the problem does not have, and none where it has one
    let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    let bias = up(3 * 16, &mut rng);
    assert!(matches!(gpu.grouped_gemm(&p, &a, &b, &mut c, Some(&bias)), Err(Error::EpilogueOperand { .. })));
    let pb = p.clone().with_bias().unwrap();
    assert!(matches!(gpu.grouped_gemm(&pb, &a, &b, &mut c, None), Err(Error::EpilogueOperand { .. })));
    // buffers of another element type than the precision's
    let p16 = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 16, 8, Precision::F16).unwrap();
    match gpu.grouped_gemm(&p16, &a, &b, &mut c, None) {
        Err(Error::DTypeMismatch { expected, .. }) => assert_eq!(expected, gemmbridge::DType::F16),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&c));
    // a bias shorter than E·N
    let short_bias = up(3 * 16 - 1, &mut rng);
    match gpu.grouped_gemm(&pb, &a, &b, &mut c, Some(&short_bias)) {
        Err(Error::BufferTooSmall { operand: Which::Bias, needed_elems, .. }) => assert_eq!(needed_elems, 48),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&c));
    // the engine is usable afterwards
    let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    assert!(!untouched(&c));
}
