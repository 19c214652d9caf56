//! The grouped product on the CPU ([`cpu::grouped_gemm`]) against the float64 definition
//! ([`grouped::reference::run`]): every product, every precision, ragged sizes with empty
//! groups and rows past the last group, a bias per group; outputs poisoned with NaN first.
//! Bad input is a named error with nothing written.

mod common;

use common::{normal, poison, rng};
use gemmbridge::grouped::{reference, GroupedOp, GroupedProblem};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{cpu, DType, Element, Error, Precision, Which};

const OPS: [GroupedOp; 3] = [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight];

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// One product of `p` with random operands, checked within the precision's band against
/// float64 over what the groups write (rows past the last group must keep their poison);
/// returns the relative error.
fn case<TI: Element, TO: Element>(p: &GroupedProblem) -> f64 {
    let mut rng = rng();
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<TI>, Vec<TI>) = (normal(&mut rng, la), normal(&mut rng, lb));
    let bias: Option<Vec<TO>> = p.has_bias().then(|| normal(&mut rng, p.groups() * p.n()));
    let mut c = poison::<TO>(lc);
    cpu::grouped_gemm(p, &a, &b, &mut c, bias.as_deref()).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    let mut want = vec![f64::NAN; lc];
    reference::run(p, &wide(&a), &wide(&b), bias.as_deref().map(wide).as_deref(), &mut want);
    let got = wide(&c);
    let used = (0..p.groups()).map(|e| p.tn_output(e)).map(|(start, [r, k])| start + r * k).max().unwrap();
    assert!(got[used..].iter().all(|v| v.is_nan()), "{}: rows past the groups were written", p.describe());
    let err = rel_error(&got[..used], &want[..used]);
    let band = if TO::DTYPE == DType::F32 && TI::DTYPE == DType::F32 { 1e-5 } else { 1e-2 };
    assert!(err <= band, "{}: {err:e} > {band:e}", p.describe());
    err
}

#[test]
fn every_product_and_precision_matches_float64_at_ragged_sizes() {
    for op in OPS {
        let sizes = [0, 1, 7, 129, 0, 40];
        let p = |precision| GroupedProblem::from_offsets(op, &[0, 1, 8, 137, 137, 177], 180, 24, 40, precision);
        case::<f32, f32>(&p(Precision::F32).unwrap());
        case::<f32, f32>(&p(Precision::TF32).unwrap());
        case::<f16, f16>(&p(Precision::F16).unwrap());
        case::<f16, f32>(&p(Precision::F16_F32OUT).unwrap());
        case::<bf16, bf16>(&p(Precision::BF16).unwrap());
        case::<bf16, f32>(&p(Precision::BF16_F32OUT).unwrap());
        // host counts give the same problem (no rows past the groups)
        case::<bf16, bf16>(&GroupedProblem::new(op, &sizes, 24, 40, Precision::BF16).unwrap());
    }
    // a bias per group, added before the output's rounding
    for precision in [Precision::F32, Precision::BF16, Precision::F16_F32OUT] {
        let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 17, 64], 24, 40, precision).unwrap();
        let p = p.with_bias().unwrap();
        match precision.input() {
            DType::F32 => case::<f32, f32>(&p),
            DType::BF16 => case::<bf16, bf16>(&p),
            _ => case::<f16, f32>(&p),
        };
    }
}

/// A backward weight's empty group is zeros even where the output held something else.
#[test]
fn an_empty_group_of_the_backward_weight_is_zeros() {
    let mut rng = rng();
    let p = GroupedProblem::new(GroupedOp::BackwardWeight, &[2, 0, 3], 4, 8, Precision::F32).unwrap();
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<f32>, Vec<f32>) = (normal(&mut rng, la), normal(&mut rng, lb));
    let mut c = vec![7.0f32; lc];
    cpu::grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    assert!(c[32..64].iter().all(|&v| v == 0.0), "{:?}", &c[32..64]);
    assert!(c[..32].iter().chain(&c[64..]).all(|&v| v != 7.0));
}

#[test]
fn bad_input_is_named_and_nothing_is_written() {
    let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 16, 8, Precision::BF16).unwrap();
    let [la, lb, lc] = p.lens();
    let (a, b) = (vec![bf16::ONE; la], vec![bf16::ONE; lb]);
    let mut c = poison::<bf16>(lc);
    let untouched = |c: &[bf16]| c.iter().all(|v| v.is_nan());
    // element types against the precision
    let (a32, b32) = (vec![1f32; la], vec![1f32; lb]);
    match cpu::grouped_gemm(&p, &a32, &b32, &mut c, None) {
        Err(Error::DTypeMismatch { operand: Which::Grouped("x"), expected: DType::BF16, got: DType::F32 }) => {}
        other => panic!("{other:?}"),
    }
    let mut c32 = vec![f32::NAN; lc];
    match cpu::grouped_gemm(&p, &a, &b, &mut c32, None) {
        Err(Error::DTypeMismatch { operand: Which::Grouped("y"), .. }) => {}
        other => panic!("{other:?}"),
    }
    // lengths: each buffer one element short, named as the product names it (x, w, y)
    for (i, which) in p.op().operands().into_iter().enumerate() {
        let (mut sa, mut sb, mut sc) = (a.clone(), b.clone(), c.clone());
        [&mut sa, &mut sb, &mut sc][i].pop();
        match cpu::grouped_gemm(&p, &sa, &sb, &mut sc, None) {
            Err(Error::BufferTooSmall { operand, needed_elems, .. }) => {
                assert_eq!(operand, which);
                assert_eq!(needed_elems, p.lens()[i]);
            }
            other => panic!("{which:?}: {other:?}"),
        }
        assert!(untouched(&sc));
    }
    // the bias: given without one, missing with one, too short
    let bias = vec![bf16::ONE; 3 * 16];
    let e = cpu::grouped_gemm(&p, &a, &b, &mut c, Some(&bias)).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { problem: "was given but is not used", .. }), "{e}");
    let with = p.clone().with_bias().unwrap();
    let e = cpu::grouped_gemm(&with, &a, &b, &mut c, None).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { problem: "is required but missing", .. }), "{e}");
    match cpu::grouped_gemm(&with, &a, &b, &mut c, Some(&bias[1..])) {
        Err(Error::BufferTooSmall { operand: Which::Bias, needed_elems: 48, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(untouched(&c));
    // and then it runs: every row of a group with rows is 8 (K ones times ones)
    cpu::grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    assert!(c.iter().all(|v| v.to_f32() == 8.0));
}
