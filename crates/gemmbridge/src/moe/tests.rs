//! The MoE problems' rules, the routing checks, and the references against plain float64.

use rand::{Rng, SeedableRng};

use super::reference::{combine, combine_backward, moe_gemm, route};
use super::*;
use crate::dtype::DType;

const BF16: Precision = Precision::BF16;

fn rule<T: std::fmt::Debug>(r: Result<T>) -> &'static str {
    match r {
        Err(Error::GroupedShape { what, .. }) => what,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_rule_of_a_product_is_a_named_error() {
    use GroupedOp::*;
    let mk = |op, e, r, nk, precision| MoeGemm::new(op, e, r, nk, precision);
    assert_eq!(
        rule(mk(BackwardWeight, 4, 8, (8, 8), BF16)),
        "a MoE product with device routing is a forward or a backward data"
    );
    assert!(matches!(mk(Forward, 4, 8, (8, 8), Precision::F32), Err(Error::Unsupported { .. })));
    assert_eq!(rule(mk(Forward, 0, 8, (8, 8), BF16)), "a size is zero");
    assert_eq!(rule(mk(Forward, 4, 0, (8, 8), BF16)), "a size is zero");
    assert_eq!(rule(mk(Forward, 4, 8, (8, 0), BF16)), "a size is zero");
    assert_eq!(rule(mk(Forward, 4, usize::MAX, (8, 8), BF16)), "a size is too large");
    assert_eq!(rule(mk(Forward, 1 << 30, 8, (1 << 20, 1 << 20), BF16)), "a buffer is too large to address");
    let e = mk(Forward, 4, 0, (8, 8), BF16).unwrap_err().to_string();
    assert!(e.contains("R = 0"), "{e}");
}

#[test]
fn lengths_widths_and_the_grouped_twin() {
    let p = MoeGemm::new(GroupedOp::BackwardData, 3, 10, (6, 4), BF16).unwrap();
    assert_eq!(p.width(), (6, 4));
    assert_eq!(p.lens(), [10 * 6, 3 * 6 * 4, 10 * 4]);
    let q = MoeGemm::new(GroupedOp::Forward, 3, 10, (6, 4), BF16).unwrap();
    assert_eq!(q.lens(), [40, 72, 60]);
    assert_eq!(q.grouped(&[4, 0, 6]).unwrap().sizes(), [4, 0, 6]);
    assert_eq!(rule(q.grouped(&[4, 0, 5])), "the group sizes do not match the MoE product");
    assert_eq!(starts_of(&[4, 0, 6]).unwrap(), [0, 4, 4]);
    assert_eq!(sizes_of(&[0, 4, 4], 10), [4, 0, 6]);
    // clamped as the device clamps: 5, then 2 → 5, then 9 → 8
    assert_eq!(sizes_of(&[5, 2, 9], 8), [0, 3, 0]);
    assert_eq!(sizes_of(&[0, 4], 2), [2, 0]);
    assert_eq!(sizes_of(&[-5, 3], 10), [3, 7]);
    assert_eq!(sizes_of(&[0], usize::MAX), [usize::MAX]);
    assert_eq!(rule(starts_of(&[usize::MAX, 1])), "a group start passes 2³¹ − 1");
    assert_eq!(q.describe(), "Forward E3 R10 N6 K4 bf16");
}

#[test]
fn start_checks_name_the_first_bad_value() {
    let g = MoeGemm::new(GroupedOp::Forward, 3, 6, (4, 4), BF16).unwrap();
    assert!(check_starts(&g, &[0, 2, 2]).is_ok());
    assert_eq!(rule(check_starts(&g, &[0, 2])), "the group starts have the wrong length");
    assert_eq!(rule(check_starts(&g, &[1, 2, 2])), "a group start is out of order");
    assert_eq!(rule(check_starts(&g, &[0, 3, 2])), "a group start is out of order");
    assert_eq!(rule(check_starts(&g, &[0, 3, 7])), "a group start is out of order");
    let e = check_starts(&g, &[0, 3, 7]).unwrap_err().to_string();
    assert!(e.contains("starts[2] = 7 (previous 3, R = 6)"), "{e}");
}

#[test]
fn router_and_combine_rules() {
    let r = |tokens, experts, top_k| MoeRouter { tokens, experts, top_k, dtype: DType::BF16 }.validate();
    assert!(r(4096, 128, 8).is_ok());
    assert_eq!(rule(r(0, 8, 2)), "a router needs tokens and experts");
    assert_eq!(rule(r(8, 4, 5)), "a router's top_k is out of range");
    assert_eq!(rule(r(8, 40, MAX_TOP_K + 1)), "a router's top_k is out of range");
    assert_eq!(rule(r(8, router::MAX_EXPERTS + 1, 2)), "a router has too many experts");
    assert_eq!(rule(r(1 << 30, 64, 8)), "a router's routed rows pass 2³¹ − 1");
    let router = MoeRouter { tokens: 5000, experts: 128, top_k: 8, dtype: DType::BF16 };
    assert_eq!(router.sort_blocks(), (40000usize.div_ceil(router::SORT_CHUNK), 20 * 128));
    let c = |tokens, top_k, n| MoeCombine { tokens, top_k, n, dtype: DType::BF16 }.validate();
    assert!(c(3, 2, 8).is_ok());
    assert_eq!(rule(c(3, 0, 8)), "a combine's sizes are out of range");
    assert_eq!(rule(c(3, MAX_TOP_K + 1, 8)), "a combine's sizes are out of range");
    assert_eq!(rule(c(1 << 40, 8, 1 << 20)), "a combine's routed rows pass 2³¹ − 1");
    assert_eq!(rule(c(1 << 27, 8, 1 << 40)), "a combine's buffers are too large");
}

/// The router picks each token's largest logits (ties to the lower expert, NaN last), weights
/// them by a softmax that sums to 1, and sorts the routed rows stably by expert.
#[test]
fn the_router_sorts_stably_by_expert() {
    let r = MoeRouter { tokens: 4, experts: 5, top_k: 2, dtype: DType::F32 };
    #[rustfmt::skip]
    let l = [
        0.0, 3.0, 1.0, 3.0, -1.0,      // tie 1 and 3: 1 first
        f32::NAN, 0.0, 0.0, 0.0, 0.0,  // NaN last: 1, 2
        5.0, -2.0, 4.0, 0.0, 0.0,      // 0, 2
        0.0, 0.0, 0.0, 0.0, 9.0,       // 4, 0
    ];
    let rt = route(&r, &l);
    assert_eq!(rt.ids, [1, 3, 1, 2, 0, 2, 4, 0]);
    assert_eq!(rt.starts, [0, 2, 4, 6, 7]);
    assert_eq!(rt.index, [2, 3, 0, 1, 1, 2, 0, 3]);
    assert_eq!(rt.ks, [0, 1, 0, 0, 1, 1, 1, 0]);
    assert_eq!(rt.slots, [4, 7, 0, 2, 3, 5, 1, 6]);
    assert_eq!(rt.pos, [2, 6, 3, 4, 0, 5, 7, 1]);
    assert_eq!(rt.sizes(), [2, 2, 2, 1, 1]);
    for t in 0..4 {
        let sum = rt.weights[2 * t] + rt.weights[2 * t + 1];
        assert!((sum - 1.0).abs() < 1e-6 && rt.weights[2 * t] >= rt.weights[2 * t + 1], "{t}: {:?}", rt.weights);
    }
    assert_eq!(rt.weights[0], 0.5); // a tie: equal weights
                                    // every slot once, in expert order, stably
    let mut seen = rt.slots.clone();
    seen.sort();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
}

/// The product over routing equals an explicit float64 loop; the combine and its backward
/// equal their float64 definitions within f32 rounding.
#[test]
fn the_references_agree_with_plain_float64() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut g = rand::rngs::StdRng::seed_from_u64(seed);
    let (s, e, k, n, kk) = (7, 3, 2, 5, 4);
    let r = MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::F32 };
    let l: Vec<f32> = (0..s * e).map(|_| g.random_range(-2.0..2.0)).collect();
    let rt = route(&r, &l);
    let x: Vec<f64> = (0..s * kk).map(|_| g.random_range(-1.0..1.0)).collect();
    let w: Vec<f64> = (0..e * n * kk).map(|_| g.random_range(-1.0..1.0)).collect();
    let p = MoeGemm::new(GroupedOp::Forward, e, s * k, (n, kk), BF16).unwrap();
    // x's rows in expert order, the product, and the grouped reference over the same sizes
    let xs: Vec<f64> = rt.index.iter().flat_map(|&t| x[t as usize * kk..(t as usize + 1) * kk].to_vec()).collect();
    let y = moe_gemm(&p, &xs, &w, &rt.starts);
    let sizes = rt.sizes();
    for row in 0..s * k {
        let ex = (0..e).rfind(|&f| rt.starts[f] as usize <= row && sizes[f] > 0).unwrap();
        let t = rt.index[row] as usize;
        for o in 0..n {
            let want: f64 = (0..kk).map(|i| x[t * kk + i] * w[ex * n * kk + o * kk + i]).sum();
            assert!((y[row * n + o] - want).abs() < 1e-12);
        }
    }
    let mut grouped = vec![f64::NAN; y.len()];
    crate::grouped::reference::run(&p.grouped(&sizes).unwrap(), &xs, &w, None, &mut grouped);
    assert_eq!(grouped, y);
    // back to token order through slots, then the combine
    let c = MoeCombine { tokens: s, top_k: k, n, dtype: DType::F32 };
    let mut of = vec![0.0f32; y.len()];
    for (p, &q) in rt.slots.iter().enumerate() {
        for col in 0..n {
            of[q as usize * n + col] = y[p * n + col] as f32;
        }
    }
    let yc = combine(&c, (&of, None), Some(&rt.weights));
    for t in 0..s {
        for col in 0..n {
            let want: f64 = (0..k).map(|j| rt.weights[t * k + j] as f64 * of[(t * k + j) * n + col] as f64).sum();
            assert!((yc[t * n + col] as f64 - want).abs() < 1e-5);
        }
    }
    // the same outputs in expert order, read through pos: the same combine, bit for bit
    let sorted: Vec<f32> = rt.slots.iter().flat_map(|&q| of[q as usize * n..(q as usize + 1) * n].to_vec()).collect();
    assert_eq!(combine(&c, (&sorted, Some(&rt.pos)), Some(&rt.weights)), yc);
    let dy: Vec<f32> = (0..s * n).map(|_| g.random_range(-1.0..1.0)).collect();
    let (d_sorted, dw_sorted, _) = combine_backward(&c, e, (&dy, &sorted, Some(&rt.pos)), (&rt.weights, &rt.ids));
    let (d_o, dw, dl) = combine_backward(&c, e, (&dy, &of, None), (&rt.weights, &rt.ids));
    assert_eq!(dw_sorted, dw);
    for (p, &q) in rt.slots.iter().enumerate() {
        assert_eq!(d_sorted[p * n..(p + 1) * n], d_o[q as usize * n..(q as usize + 1) * n]);
    }
    for q in 0..s * k {
        let t = q / k;
        let want: f64 = (0..n).map(|col| dy[t * n + col] as f64 * of[q * n + col] as f64).sum();
        assert!((dw[q] as f64 - want).abs() < 1e-5);
        assert!((d_o[q * n] - rt.weights[q] * dy[t * n]).abs() < 1e-6);
    }
    // the logits' gradient: the softmax's Jacobian at the chosen experts, zero elsewhere, and
    // its entries sum to 0 per token
    for t in 0..s {
        let row = &dl[t * e..(t + 1) * e];
        assert!(row.iter().sum::<f32>().abs() < 1e-5, "{row:?}");
        let chosen: Vec<i32> = rt.ids[t * k..(t + 1) * k].to_vec();
        assert!((0..e as i32).filter(|f| !chosen.contains(f)).all(|f| row[f as usize] == 0.0));
    }
}

/// The capacity layout: each expert's rows at e·cap in their sorted order, pad rows −1, pos
/// the slots' new rows; the combine through it equals the sorted one's, bit for bit; a
/// capacity below the largest group drops that group's last slots (they add nothing and get
/// no gradient). `capacity` pads near-balanced sizes only.
#[test]
fn the_capacity_layout_moves_rows_and_drops_past_the_capacity() {
    let r = MoeRouter { tokens: 4, experts: 5, top_k: 2, dtype: DType::F32 };
    #[rustfmt::skip]
    let l = [0.0, 3.0, 1.0, 3.0, -1.0, f32::NAN, 0.0, 0.0, 0.0, 0.0, 5.0, -2.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0];
    let rt = route(&r, &l); // sizes [2, 2, 2, 1, 1], as the_router_sorts_stably_by_expert
    let p = super::reference::pad(&rt, 3);
    assert_eq!(p.index, [2, 3, -1, 0, 1, -1, 1, 2, -1, 0, -1, -1, 3, -1, -1]);
    assert_eq!(p.slots, [4, 7, -1, 0, 2, -1, 3, 5, -1, 1, -1, -1, 6, -1, -1]);
    assert_eq!(p.ks, [0, 1, -1, 0, 0, -1, 1, 1, -1, 1, -1, -1, 0, -1, -1]);
    for (q, &at) in p.pos.iter().enumerate() {
        assert_eq!(p.slots[at as usize], q as i32, "slot {q}");
    }
    let c = MoeCombine { tokens: 4, top_k: 2, n: 3, dtype: DType::F32 };
    let sorted: Vec<f32> = (0..8 * 3).map(|v| v as f32 * 0.25 - 2.0).collect();
    let mut padded = vec![f32::NAN; 15 * 3];
    for (row, &q) in p.slots.iter().enumerate() {
        if q >= 0 {
            let from = rt.pos[q as usize] as usize;
            padded[row * 3..row * 3 + 3].copy_from_slice(&sorted[from * 3..from * 3 + 3]);
        }
    }
    let y = combine(&c, (&sorted, Some(&rt.pos)), Some(&rt.weights));
    assert_eq!(combine(&c, (&padded, Some(&p.pos)), Some(&rt.weights)), y);
    let dy: Vec<f32> = (0..12).map(|v| 1.0 - v as f32 * 0.125).collect();
    let (d_s, dw_s, dl_s) = combine_backward(&c, 5, (&dy, &sorted, Some(&rt.pos)), (&rt.weights, &rt.ids));
    let (d_p, dw_p, dl_p) = combine_backward(&c, 5, (&dy, &padded, Some(&p.pos)), (&rt.weights, &rt.ids));
    assert_eq!((dw_p, dl_p), (dw_s, dl_s));
    for (row, &q) in p.slots.iter().enumerate() {
        let got = &d_p[row * 3..row * 3 + 3];
        match q {
            -1 => assert_eq!(got, [0.0; 3], "pad row {row}"),
            _ => assert_eq!(got, &d_s[rt.pos[q as usize] as usize * 3..][..3], "row {row}"),
        }
    }
    // capacity 1: experts 0, 1, 2 keep their first row; slots 7, 2, 5 are dropped
    let p1 = super::reference::pad(&rt, 1);
    assert_eq!(p1.index, [2, 0, 1, 0, 3]);
    assert_eq!(p1.pos, [1, 3, -1, 2, 0, -1, 4, -1]);
    let compact: Vec<f32> =
        p1.slots.iter().flat_map(|&q| sorted[rt.pos[q as usize] as usize * 3..][..3].to_vec()).collect();
    let y1 = combine(&c, (&compact, Some(&p1.pos)), Some(&rt.weights));
    let (_, dw1, _) = combine_backward(&c, 5, (&dy, &compact, Some(&p1.pos)), (&rt.weights, &rt.ids));
    for q in [7usize, 2, 5] {
        assert_eq!(dw1[q], 0.0, "dropped slot {q}");
    }
    // token 1 (slots 2, 3) keeps only slot 3's term
    for col in 0..3 {
        let want = rt.weights[3].mul_add(compact[2 * 3 + col], 0.0);
        assert_eq!(y1[3 + col], want, "token 1 col {col}");
    }
    assert_eq!(capacity(&[250, 260, 255, 263]), Some(264));
    assert_eq!(capacity(&[1000, 10, 10, 10]), None);
    assert_eq!(capacity(&[0, 0]), None);
    assert_eq!(capacity(&[]), None);
    // overflow and past what a layout may hold: no capacity, never a panic
    assert_eq!(capacity(&[usize::MAX]), None);
    assert_eq!(capacity(&[usize::MAX, 1]), None);
    assert_eq!(capacity(&[1 << 62; 4]), None);
    assert_eq!(capacity(&[1 << 40; 4]), None);
    assert_eq!(capacity(&[1 << 30, (1 << 30) - 8]), None);
}
