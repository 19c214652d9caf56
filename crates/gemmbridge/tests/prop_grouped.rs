//! Property tests of grouped GEMMs ([`GroupedProblem`] from sizes or device offsets, every
//! operation, with and without a bias), the MoE products and helpers ([`MoeGemm`],
//! [`starts_of`], [`sizes_of`], [`capacity`], [`check_starts`], [`MoeRouter`], [`MoeCombine`]),
//! and the CPU backend's grouped GEMM on every problem small enough to run: nothing panics or
//! overflows, a valid problem's groups and offsets stay inside its buffers, and finite inputs
//! give finite outputs.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::moe::{capacity, check_starts, sizes_of, starts_of, MoeCombine, MoeGemm, MoeRouter};
use gemmbridge::{cpu, Element, Precision, MAX_DIM};
use proptest::prelude::*;
use shared::{config, dtype, size, RUN_ELEMS, RUN_WORK};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=4, 1 => size()]
}

fn op() -> impl Strategy<Value = GroupedOp> {
    prop::sample::select(vec![GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight])
}

fn precision() -> impl Strategy<Value = Precision> {
    prop::sample::select(Precision::ALL.to_vec())
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![3 => 0usize..=4, 1 => size()], 0..5)
}

fn small(p: &GroupedProblem) -> bool {
    p.lens().iter().all(|&n| n <= RUN_ELEMS) && p.rows().saturating_mul(p.n()).saturating_mul(p.k()) <= RUN_WORK
}

fn check_valid(p: &GroupedProblem) {
    let _ = (p.describe(), p.signature(), p.busy_groups(), p.macs());
    let lens = p.lens();
    assert!(lens.iter().all(|&n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize)), "{}", p.describe());
    assert!(p.rows() <= MAX_DIM && p.sizes().iter().sum::<usize>() <= p.rows());
    for e in 0..p.groups() {
        let (g, offsets) = p.group(e).unwrap_or_else(|err| panic!("{}: group {e}: {err}", p.describe()));
        for ((l, off), len) in [g.a().layout, g.b().layout, g.c()].iter().zip(offsets).zip(lens) {
            assert!(off + l.required_elems(1).unwrap() <= len, "{}: group {e}", p.describe());
        }
    }
    assert!(p.group(p.groups()).is_err());
}

fn run<TI: Element, TO: Element>(p: &GroupedProblem, seed: u64) {
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<TI>, Vec<TI>) = (shared::buf(la, seed), shared::buf(lb, seed + 1));
    let mut c: Vec<TO> = shared::buf(lc, seed + 2);
    let bias: Vec<TO> = shared::buf(p.groups() * p.n(), seed + 3);
    let r = cpu::grouped_gemm(p, &a, &b, &mut c, p.has_bias().then_some(&bias[..]));
    r.unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    assert!(shared::finite(&c), "{}", p.describe());
    // the wrong bias presence is a named error
    assert!(cpu::grouped_gemm(p, &a, &b, &mut c, (!p.has_bias()).then_some(&bias[..])).is_err());
}

#[test]
fn problems_run() {
    let n = shared::runnable((op(), sizes(), dim(), dim(), precision()), |(op, s, n, k, pr)| {
        GroupedProblem::new(*op, s, *n, *k, *pr).is_ok_and(|p| small(&p))
    });
    assert!(n >= 10, "{n} of 1000 problems run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn grouped_problem(op in op(), sizes in sizes(), n in dim(), k in dim(), precision in precision(), bias in any::<bool>(), seed in any::<u64>()) {
        let Ok(mut p) = GroupedProblem::new(op, &sizes, n, k, precision) else { return Ok(()) };
        if bias {
            if let Ok(q) = p.clone().with_bias() {
                p = q;
            }
        }
        check_valid(&p);
        // the same problem from its device offsets (each group's end)
        let ends: Vec<i32> = p.sizes().iter().scan(0usize, |at, &m| { *at += m; Some(*at as i32) }).collect();
        let q = GroupedProblem::from_offsets(op, &ends, p.rows(), n, k, precision).unwrap();
        prop_assert_eq!(q.sizes(), p.sizes());
        if small(&p) {
            with_elem!(precision.input(), TI => {
                with_elem!(precision.output(), TO => { run::<TI, TO>(&p, seed) })
            });
        }
    }

    #[test]
    fn from_offsets(op in op(), offsets in prop::collection::vec(prop_oneof![0i32..10, any::<i32>()], 0..5), rows in size(), n in dim(), k in dim()) {
        if let Ok(p) = GroupedProblem::from_offsets(op, &offsets, rows, n, k, Precision::BF16) {
            check_valid(&p);
        }
    }

    #[test]
    fn moe(op in op(), e in dim(), rows in dim(), n in dim(), k in dim(), precision in precision(),
           sizes in sizes(), starts in prop::collection::vec(prop_oneof![0i32..10, any::<i32>()], 0..5)) {
        if let Ok(m) = MoeGemm::new(op, e, rows, (n, k), precision) {
            let _ = (m.describe(), m.width(), m.lens(), m.grouped(&sizes));
            prop_assert!(m.lens().iter().all(|&l| l.checked_mul(2).is_some_and(|b| b <= isize::MAX as usize)));
            if check_starts(&m, &starts).is_ok() {
                let s = sizes_of(&starts, m.rows());
                prop_assert_eq!(s.iter().sum::<usize>(), m.rows());
                let _ = m.grouped(&s);
            }
        }
        let s = sizes_of(&starts, rows);
        prop_assert_eq!(s.len(), starts.len());
        if let Some(cap) = capacity(&sizes) {
            prop_assert!(cap % 8 == 0 && sizes.iter().all(|&m| m <= cap));
        }
        if let Ok(st) = starts_of(&sizes) {
            prop_assert_eq!(st.len(), sizes.len());
        }
    }

    #[test]
    fn router_and_combine(tokens in size(), experts in prop_oneof![1usize..=8, size()], top_k in prop_oneof![1usize..=4, size()], n in size(), dtype in dtype()) {
        let r = MoeRouter { tokens, experts, top_k, dtype };
        let _ = (r.rows(), r.sort_blocks());
        if r.validate().is_ok() {
            prop_assert!(r.rows() <= MAX_DIM);
        }
        let c = MoeCombine { tokens, top_k, n, dtype };
        let _ = c.rows();
        if c.validate().is_ok() {
            prop_assert!(c.rows().checked_mul(c.n).is_some_and(|e| e <= isize::MAX as usize / 4));
        }
    }
}
