//! `grouped_matmul` on burn's NdArray backend (CPU, runs in CI): the fallback path (burn's ops,
//! `grouped_matmul_burn`) and the adapter's own autodiff node, forward and gradients against a
//! float64 reference written out here, with experts of 0 rows, of 1 row, uneven sizes, E = 1
//! and E = 7; the node's gradients against burn's autodiff through the fallback; bad shapes
//! panic at the call, naming the values.
//!
//! Inputs come from a seeded `StdRng`, never from NdArray's process-wide generator.

use crate::cpu_common::{rng, uniform, values};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::Tensor;
use gemmbridge_burn::{grouped_matmul, grouped_matmul_burn};

type Cpu = NdArray<f32>;
type Ad = Autodiff<Cpu>;

/// f32 arithmetic against float64: ‖got − want‖ / ‖want‖ at most this.
const F32_BAND: f64 = 1e-5;

/// ‖got − want‖ / ‖want‖ (infinite for a non-finite `got`; 0 when both are all zeros).
fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if norm == 0.0 {
        return d;
    }
    d / norm
}

fn assert_band(what: &str, got: &[f64], want: &[f64]) {
    let e = rel(got, want);
    assert!(e <= F32_BAND, "{what}: ‖err‖/‖ref‖ = {e:e} > {F32_BAND:e}");
}

/// float64 `[y, dx, dw]` of the grouped matmul for the loss `Σ y ⊙ g`: `y[r] = x[r]·w[e]ᵀ`,
/// `dx[r] = g[r]·w[e]`, `dw[e] = Σ_{r of e} g[r]ᵀ x[r]` (zeros for an expert without rows).
fn reference(x: &[f64], w: &[f64], g: &[f64], sizes: &[usize], n: usize, k: usize) -> [Vec<f64>; 3] {
    let rows: usize = sizes.iter().sum();
    let (mut y, mut dx, mut dw) = (vec![0.0; rows * n], vec![0.0; rows * k], vec![0.0; sizes.len() * n * k]);
    let mut r0 = 0;
    for (e, &m) in sizes.iter().enumerate() {
        let we = |j: usize, t: usize| w[(e * n + j) * k + t];
        for r in r0..r0 + m {
            for j in 0..n {
                y[r * n + j] = (0..k).map(|t| x[r * k + t] * we(j, t)).sum();
                for t in 0..k {
                    dx[r * k + t] += g[r * n + j] * we(j, t);
                    dw[(e * n + j) * k + t] += g[r * n + j] * x[r * k + t];
                }
            }
        }
        r0 += m;
    }
    [y, dx, dw]
}

/// Group sizes: E = 7 with empty experts (first, middle, last), 1-row experts and uneven ones;
/// E = 1; all rows in the last of three; every expert empty.
const CASES: [&[usize]; 5] = [&[0, 5, 1, 0, 13, 1, 0], &[9], &[0, 0, 6], &[3, 3, 3, 3, 3, 3, 3], &[0, 0]];

#[test]
fn forward_and_gradients_equal_float64() {
    let mut rng = rng(11);
    for sizes in CASES {
        let (n, k) = (13, 17);
        let rows: usize = sizes.iter().sum();
        let (x, xv) = uniform::<Ad, 2>(&mut rng, [rows, k]);
        let (w, wv) = uniform::<Ad, 3>(&mut rng, [sizes.len(), n, k]);
        let (g, gv) = uniform::<Ad, 2>(&mut rng, [rows, n]);
        let (x, w) = (x.require_grad(), w.require_grad());
        let y = grouped_matmul(x.clone(), w.clone(), sizes);
        assert_eq!(y.dims(), [rows, n], "sizes {sizes:?}");
        let grads = (y.clone() * g).sum().backward();
        let [ry, rdx, rdw] = reference(&xv, &wv, &gv, sizes, n, k);
        let what = format!("grouped_matmul sizes {sizes:?}");
        assert_band(&format!("{what} y"), &values(y), &ry);
        assert_band(&format!("{what} dx"), &values(x.grad(&grads).unwrap()), &rdx);
        let dw = values(w.grad(&grads).unwrap());
        assert_band(&format!("{what} dw"), &dw, &rdw);
        for (e, _) in sizes.iter().enumerate().filter(|(_, &m)| m == 0) {
            assert!(dw[e * n * k..(e + 1) * n * k].iter().all(|&v| v == 0.0), "{what}: dw[{e}] of an empty expert");
        }
    }
}

#[test]
fn gradients_equal_burns_autodiff_through_the_fallback() {
    let mut rng = rng(12);
    let sizes = [4, 0, 1, 7, 2, 0, 5];
    let (n, k, rows) = (6, 10, sizes.iter().sum::<usize>());
    let (x0, _) = uniform::<Ad, 2>(&mut rng, [rows, k]);
    let (w0, _) = uniform::<Ad, 3>(&mut rng, [sizes.len(), n, k]);
    let (g, _) = uniform::<Ad, 2>(&mut rng, [rows, n]);
    let run = |ours: bool| {
        let (x, w) = (x0.clone().require_grad(), w0.clone().require_grad());
        let f = if ours { grouped_matmul::<Ad> } else { grouped_matmul_burn::<Ad> };
        let y = f(x.clone(), w.clone(), &sizes);
        let grads = (y.clone() * g.clone()).sum().backward();
        [values(y), values(x.grad(&grads).unwrap()), values(w.grad(&grads).unwrap())]
    };
    let (ours, burns) = (run(true), run(false));
    for (name, (got, want)) in ["y", "dx", "dw"].iter().zip(ours.iter().zip(&burns)) {
        assert_band(&format!("grouped_matmul vs burn's autodiff {name}"), got, want);
    }
}

#[test]
fn only_the_tracked_input_gets_a_gradient() {
    let mut rng = rng(13);
    let sizes = [2, 3];
    let (x, xv) = uniform::<Ad, 2>(&mut rng, [5, 4]);
    let (w, wv) = uniform::<Ad, 3>(&mut rng, [2, 3, 4]);
    let (g, gv) = uniform::<Ad, 2>(&mut rng, [5, 3]);
    let [_, rdx, rdw] = reference(&xv, &wv, &gv, &sizes, 3, 4);
    let x_tracked = x.clone().require_grad();
    let grads = (grouped_matmul(x_tracked.clone(), w.clone(), &sizes) * g.clone()).sum().backward();
    assert_band("x tracked: dx", &values(x_tracked.grad(&grads).unwrap()), &rdx);
    assert!(w.grad(&grads).is_none(), "w is not tracked: no gradient");
    let w_tracked = w.require_grad();
    let grads = (grouped_matmul(x.clone(), w_tracked.clone(), &sizes) * g).sum().backward();
    assert_band("w tracked: dw", &values(w_tracked.grad(&grads).unwrap()), &rdw);
    assert!(x.grad(&grads).is_none(), "x is not tracked: no gradient");
}

#[test]
fn untracked_forward_on_the_inner_backend_equals_float64() {
    let mut rng = rng(14);
    let sizes = [1, 0, 8];
    let (x, xv) = uniform::<Cpu, 2>(&mut rng, [9, 33]);
    let (w, wv) = uniform::<Cpu, 3>(&mut rng, [3, 20, 33]);
    let [ry, _, _] = reference(&xv, &wv, &vec![0.0; 9 * 20], &sizes, 20, 33);
    assert_band("NdArray grouped_matmul y", &values(grouped_matmul(x.clone(), w.clone(), &sizes)), &ry);
    assert_band("NdArray grouped_matmul_burn y", &values(grouped_matmul_burn(x, w, &sizes)), &ry);
}

fn zeros2(shape: [usize; 2]) -> Tensor<Cpu, 2> {
    Tensor::zeros(shape, &Default::default())
}

fn zeros3(shape: [usize; 3]) -> Tensor<Cpu, 3> {
    Tensor::zeros(shape, &Default::default())
}

#[test]
#[should_panic(expected = "the group sizes [4, 0, 6] add up to 10 but x has R = 11 rows")]
fn sizes_that_do_not_add_up_to_the_rows_panic() {
    grouped_matmul(zeros2([11, 4]), zeros3([3, 5, 4]), &[4, 0, 6]);
}

#[test]
#[should_panic(expected = "2 group sizes for the E = 3 experts of w")]
fn a_size_count_other_than_e_panics() {
    grouped_matmul(zeros2([11, 4]), zeros3([3, 5, 4]), &[5, 6]);
}

#[test]
#[should_panic(expected = "x's K = 4 is not w's K = 5: x [R, K] = [11, 4], w [E, N, K] = [3, 4, 5]")]
fn a_weight_of_the_wrong_k_panics() {
    // w as [E, K, N] (burn's Linear layout) instead of [E, N, K]
    grouped_matmul(zeros2([11, 4]), zeros3([3, 4, 5]), &[4, 1, 6]);
}

#[test]
#[should_panic(expected = "the group sizes [4, 1, 6] add up to 11 but x has R = 12 rows")]
fn the_fallback_checks_too() {
    grouped_matmul_burn(zeros2([12, 4]), zeros3([3, 5, 4]), &[4, 1, 6]);
}
