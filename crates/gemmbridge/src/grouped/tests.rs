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

/// The FP8 emulation quantises each group on its own: its error against float64 is E4M3's
/// (a few %), the same for every recipe's shape of scales.
#[test]
fn the_fp8_emulation_quantises_each_group_on_its_own() {
    use crate::fp8::{Fp8Format::E4M3, Scaling};
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let p = GroupedProblem::new(GroupedOp::Forward, &[0, 1, 7, 129, 3], 16, 256, Precision::BF16).unwrap();
    let [lx, lw, ly] = p.lens();
    // groups of very different magnitudes: one scale for all would lose the small ones
    let x: Vec<f32> = (0..lx).map(|i| r.random_range(-1.0f32..1.0) * if i < 8 * 256 { 1e-5 } else { 1.0 }).collect();
    let w: Vec<f32> = (0..lw).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let mut want = vec![0.0; ly];
    let to64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
    run(&p, &to64(&x), &to64(&w), None, &mut want);
    for (sx, sw) in
        [(Scaling::Tensor, Scaling::Tensor), (Scaling::Row, Scaling::Row), (Scaling::Block1x128, Scaling::Block128x128)]
    {
        let mut got = vec![f64::NAN; ly];
        fp8::run(&p, (&x, &w), None, ((E4M3, sx), (E4M3, sw)), &mut got).unwrap();
        // the small-magnitude rows (groups 1 and 2) keep their relative accuracy
        let small = rel_error(&got[..8 * 16], &want[..8 * 16]);
        let all = rel_error(&got, &want);
        println!("{sx:?} × {sw:?}: error {all:.4}, small groups {small:.4}");
        assert!(all > 1e-3 && all < 0.05 && small < 0.05, "{sx:?} × {sw:?}: {all} {small}");
    }
    let mut short = vec![0.0; ly - 1];
    assert!(fp8::run(&p, (&x, &w), None, ((E4M3, Scaling::Row), (E4M3, Scaling::Row)), &mut short).is_err());
    // what the GPU refuses, the emulation refuses: two E5M2 operands, a pair cuBLASLt lacks
    let mut y = vec![0.0; ly];
    let e5 = crate::fp8::Fp8Format::E5M2;
    for recipe in [((e5, Scaling::Row), (e5, Scaling::Row)), ((E4M3, Scaling::Row), (E4M3, Scaling::Tensor))] {
        assert!(matches!(fp8::run(&p, (&x, &w), None, recipe, &mut y), Err(Error::Fp8 { .. })), "{recipe:?}");
    }
}

/// Values FP8 holds exactly at every scale (integers −2…2: a group's amax is 0, 1 or 2, and
/// ±1, ±2 scaled by 448/amax are ±224 or ±448, both E4M3 values) make every recipe exact but
/// for the f32 rounding of the scale (amax/448, a relative 6·10⁻⁸), so the emulation of each
/// product, through [`GroupedProblem::tn_operand`]'s slices and transposes, equals the float64
/// definition to 10⁻³ (sums of a few hundred integers; a wrong slice or transpose is off by
/// whole units) —
/// empty groups included (a backward weight's zeros), rows past the last group untouched.
#[test]
fn the_tn_form_of_every_product_is_the_grouped_definition() {
    use crate::fp8::{Fp8Format::E4M3, Scaling::*};
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    for op in [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight] {
        let p = GroupedProblem::from_offsets(op, &[0, 3, 3, 133, 140, 300], 305, 24, 136, Precision::BF16).unwrap();
        let p = if op == GroupedOp::Forward { p.with_bias().unwrap() } else { p };
        let [la, lb, lc] = p.lens();
        let mut ints = |len| (0..len).map(|_| r.random_range(-2i32..=2) as f32).collect::<Vec<_>>();
        let (a, b) = (ints(la), ints(lb));
        let bias: Option<Vec<f64>> = p.has_bias().then(|| (0..p.groups() * p.n()).map(|i| i as f64).collect());
        let to64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let mut want = vec![-7.0; lc];
        run(&p, &to64(&a), &to64(&b), bias.as_deref(), &mut want);
        for recipe in [(Tensor, Tensor), (Row, Row), (Block1x128, Block128x128), (Block128x128, Block1x128)] {
            let mut got = vec![-7.0; lc];
            let formats = ((E4M3, recipe.0), (E4M3, recipe.1));
            fp8::run(&p, (&a, &b), bias.as_deref(), formats, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-3, "{op:?} {recipe:?} at {i}: {g} where {w}");
            }
        }
    }
}

#[test]
fn signatures_name_the_layer_the_total_bucket_and_the_skew() {
    use GroupedOp::*;
    let p = |op, sizes: &[usize]| GroupedProblem::new(op, sizes, 768, 2048, BF16).unwrap();
    assert_eq!(p(Forward, &[256; 128]).signature(), "grouped_gemm forward e128 n768 k2048 m32768 equal bf16");
    // largest 700 against a mean of 256 over the groups with rows: log₂ 2.7 rounds to 1
    assert_eq!(
        p(BackwardData, &[700, 0, 60, 264]).signature(),
        "grouped_gemm backward_data e4 n768 k2048 m1024 skew1 bf16"
    );
    let biased = p(Forward, &[3, 5]).with_bias().unwrap();
    assert_eq!(biased.signature(), "grouped_gemm forward e2 n768 k2048 m8 skew0 bf16 bias");
    assert_eq!(p(BackwardWeight, &[0, 0]).signature(), "grouped_gemm backward_weight e2 n768 k2048 m1 skew0 bf16");
}
