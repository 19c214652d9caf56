//! The rules of a grouped problem, and its groups as ordinary GEMMs (what a backend runs)
//! against the grouped float64 definition, at ragged sizes with empty groups.

use rand::{Rng, SeedableRng};

use super::reference::run;
use super::*;
use crate::reference::{gemm_epilogue_rowmajor, rel_error};

const BF16: Precision = Precision::BF16;

fn rule(r: Result<GroupedProblem>) -> &'static str {
    match r {
        Err(Error::GroupedShape { what, .. }) => what,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_rule_is_a_named_error() {
    use GroupedOp::*;
    assert_eq!(rule(GroupedProblem::new(Forward, &[], 8, 8, BF16)), "there is no group");
    assert_eq!(rule(GroupedProblem::new(Forward, &[4], 0, 8, BF16)), "N or K is zero");
    assert_eq!(rule(GroupedProblem::new(Forward, &[usize::MAX, 2], 8, 8, BF16)), "a group is too large");
    let big = i32::MAX as usize;
    assert_eq!(
        rule(GroupedProblem::new(Forward, &[big, big], 8, 8, BF16)),
        "the groups' rows add up to more than 2³¹ − 1"
    );
    assert_eq!(
        rule(GroupedProblem::new(Forward, &vec![0; 1 << 20], big, big, BF16)),
        "a buffer is too large to address"
    );
    let p = GroupedProblem::new(Forward, &[1, 2, 3], 8, 8, BF16).unwrap();
    assert_eq!(rule(p.group(3).map(|_| p.clone())), "there is no such group");
    assert_eq!(rule(GroupedProblem::from_offsets(Forward, &[4, 2], 8, 8, 8, BF16)), "the offsets are not monotone");
    assert_eq!(rule(GroupedProblem::from_offsets(Forward, &[4, 9], 8, 8, 8, BF16)), "an offset is past the rows");
    assert_eq!(rule(GroupedProblem::from_offsets(Forward, &[-1], 8, 8, 8, BF16)), "an offset is negative");
    let p = GroupedProblem::new(BackwardData, &[4], 8, 8, BF16).unwrap();
    assert_eq!(rule(p.with_bias()), "a bias belongs to the forward only");
    let e = GroupedProblem::from_offsets(Forward, &[4, 2], 8, 8, 8, BF16).unwrap_err().to_string();
    assert!(e.contains("offsets[1] = 2"), "{e}");
}

#[test]
fn offsets_give_the_sizes_and_trailing_rows_belong_to_no_group() {
    let p = GroupedProblem::from_offsets(GroupedOp::Forward, &[0, 3, 3, 10], 12, 4, 8, BF16).unwrap();
    assert_eq!(p.sizes(), [0, 3, 0, 7]);
    assert_eq!((p.rows(), p.row_start(3)), (12, 3));
    assert_eq!(p.lens(), [12 * 8, 4 * 4 * 8, 12 * 4]);
    assert_eq!(
        p,
        GroupedProblem { rows: 12, ..GroupedProblem::new(GroupedOp::Forward, &[0, 3, 0, 7], 4, 8, BF16).unwrap() }
    );
    // the reference leaves rows 10 and 11 of y as they were
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<f64>, Vec<f64>) = ((0..la).map(|_| r.random()).collect(), (0..lb).map(|_| r.random()).collect());
    let mut c = vec![f64::NAN; lc];
    run(&p, &a, &b, None, &mut c);
    assert!(c[..40].iter().all(|x| x.is_finite()) && c[40..].iter().all(|x| x.is_nan()));
}

/// Each group run as its own GEMM (the float64 GEMM reference on the group's slices) gives
/// the grouped definition's output, for every product, with and without a bias.
#[test]
fn groups_as_gemms_equal_the_grouped_definition() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let sizes = [0, 1, 7, 129, 0, 3];
    for (op, bias) in [
        (GroupedOp::Forward, false),
        (GroupedOp::Forward, true),
        (GroupedOp::BackwardData, false),
        (GroupedOp::BackwardWeight, false),
    ] {
        let p = GroupedProblem::new(op, &sizes, 5, 6, BF16).unwrap();
        let p = if bias { p.with_bias().unwrap() } else { p };
        let [la, lb, lc] = p.lens();
        let mut draw = |n: usize| -> Vec<f64> { (0..n).map(|_| r.random_range(-1.0..1.0)).collect() };
        let (a, b, bv) = (draw(la), draw(lb), draw(p.groups() * p.n()));
        let bias_arg = bias.then_some(&bv[..]);
        let mut want = vec![f64::NAN; lc];
        run(&p, &a, &b, bias_arg, &mut want);
        let mut got = vec![f64::NAN; lc];
        for e in 0..p.groups() {
            let (g, [oa, ob, oc]) = p.group(e).unwrap();
            let span = |l: MatrixLayout| l.required_elems(1).unwrap();
            let (sa, sb, sc) = (span(g.a().layout), span(g.b().layout), span(g.c()));
            let mut vector = bias_arg.map(|bv| bv[e * p.n()..(e + 1) * p.n()].to_vec());
            gemm_epilogue_rowmajor(
                &g,
                (1.0, 0.0),
                [&a[oa..oa + sa], &b[ob..ob + sb]],
                &mut got[oc..oc + sc],
                vector.as_deref_mut(),
                None,
            );
        }
        assert!(rel_error(&got, &want) < 1e-15, "{}", p.describe());
        if op == GroupedOp::BackwardWeight {
            // an empty group's weight gradient is zero (the GEMM's k = 0 with β = 0)
            assert!(got[..p.n() * p.k()].iter().all(|&x| x == 0.0));
        }
    }
}
