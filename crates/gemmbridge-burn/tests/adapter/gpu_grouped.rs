//! `grouped_matmul` through gemmbridge's grouped GEMM on a CUDA GPU (ignored elsewhere): the
//! forward and both gradients under `Autodiff`, on the plain backend and under fusion, in f32,
//! f16 and bf16, against float64 (f32 within 1e-5, f16/bf16 within 1e-2, ‖err‖/‖ref‖) and
//! against the fallback `grouped_matmul_burn` under burn's autodiff (f32 within 1e-3: burn's
//! own f32 matmul rounds to tf32), with experts of 0 and 1 rows, uneven and equal sizes,
//! E = 1 and E = 7. Every served call is counted (`grouped_counts`). Before each call the
//! memory its outputs will likely get from cubecl's pool is filled with NaN (best effort), so
//! an element the engine leaves unwritten shows as a failure; an empty expert's `dw[e]` must
//! be exactly zero.

use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{
    grouped_counts, grouped_matmul, grouped_matmul_burn, set_enabled, set_ordering, set_tf32, GemmOrdering, GroupedOps,
};
use rand::{Rng, SeedableRng};

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;
type Fused = burn_fusion::Fusion<Plain>;

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    d / want.iter().map(|w| w * w).sum::<f64>().sqrt()
}

/// The band against float64 (strict f32; f16/bf16 rounded once) and against the fallback
/// (burn's f32 matmul is tf32 on tensor cores: 1e-3).
fn bands(dtype: FloatDType) -> (f64, f64) {
    if dtype == FloatDType::F32 {
        (1e-5, 1e-3)
    } else {
        (1e-2, 1e-2)
    }
}

fn seeded(salt: u64) -> rand::rngs::StdRng {
    let seed = std::env::var("GEMMBRIDGE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
    eprintln!("test seed {seed} (replay with GEMMBRIDGE_TEST_SEED={seed})");
    rand::rngs::StdRng::seed_from_u64(seed ^ salt)
}

/// A tensor of `shape` uniform in `[-1, 1)`, in `dtype`, and its values after the rounding to
/// `dtype` (what the references read).
fn input<B: AutodiffBackend, const D: usize>(
    rng: &mut rand::rngs::StdRng,
    shape: [usize; D],
    dtype: FloatDType,
) -> (Tensor<B, D>, Vec<f64>) {
    let v: Vec<f32> = (0..shape.iter().product()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let t = Tensor::<B, D>::from_data(TensorData::new(v, shape), &Default::default()).cast(dtype);
    let vals = values(t.clone());
    (t, vals)
}

/// Fills and frees `len` elements of NaN in f32 and in `dtype`, so that the next allocations
/// of those sizes likely reuse memory that holds NaN.
fn poison<B: AutodiffBackend>(len: usize, dtype: FloatDType) {
    let t = Tensor::<B, 1>::full([len], f32::NAN, &Default::default());
    let _ = t.cast(dtype).into_data(); // executed (a fused stream runs it) before it is freed
}

/// float64 `[y, dx, dw]` for the loss `Σ y ⊙ g` (see `grouped_cpu.rs`).
fn reference(x: &[f64], w: &[f64], g: &[f64], sizes: &[usize], n: usize, k: usize) -> [Vec<f64>; 3] {
    let rows: usize = sizes.iter().sum();
    let (mut y, mut dx, mut dw) = (vec![0.0; rows * n], vec![0.0; rows * k], vec![0.0; sizes.len() * n * k]);
    let mut r0 = 0;
    for (e, &m) in sizes.iter().enumerate() {
        for r in r0..r0 + m {
            for j in 0..n {
                let wj = &w[(e * n + j) * k..(e * n + j + 1) * k];
                y[r * n + j] = (0..k).map(|t| x[r * k + t] * wj[t]).sum();
                for t in 0..k {
                    dx[r * k + t] += g[r * n + j] * wj[t];
                    dw[(e * n + j) * k + t] += g[r * n + j] * x[r * k + t];
                }
            }
        }
        r0 += m;
    }
    [y, dx, dw]
}

/// How the operands are laid out: contiguous, or as views the CUDA path copies first.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Views {
    Contiguous,
    /// x a transposed `[K, R]`, w a `[E, K, N]` with its last two dimensions swapped.
    Transposed,
}

/// `[y, dx, dw]` of one run, through the adapter (`ours`) or the fallback under burn's autodiff.
fn run<B: GroupedOps + AutodiffBackend>(
    ours: bool,
    (x0, w0, g): (&Tensor<B, 2>, &Tensor<B, 3>, &Tensor<B, 2>),
    sizes: &[usize],
    dtype: FloatDType,
) -> [Vec<f64>; 3] {
    let (x, w) = (x0.clone().require_grad(), w0.clone().require_grad());
    let [e, n, k] = w.dims();
    let rows = x.dims()[0];
    poison::<B>(rows * n, dtype);
    let y = if ours {
        grouped_matmul(x.clone(), w.clone(), sizes)
    } else {
        grouped_matmul_burn(x.clone(), w.clone(), sizes)
    };
    poison::<B>(rows * k, dtype);
    poison::<B>(e * n * k, dtype);
    let grads = (y.clone() * g.clone()).sum().backward();
    [values(y), values(x.grad(&grads).unwrap()), values(w.grad(&grads).unwrap())]
}

/// One case: served (at least three more products counted; [`counted_case`] counts exactly),
/// against float64 and the fallback, empty experts' `dw[e]` exactly zero.
fn case<B: GroupedOps + AutodiffBackend>(dtype: FloatDType, sizes: &[usize], n: usize, k: usize, views: Views) {
    let mut rng = seeded(sizes.len() as u64 * 1000 + n as u64);
    let rows: usize = sizes.iter().sum();
    let (xv, wv, x0, w0) = match views {
        Views::Contiguous => {
            let ((x, xv), (w, wv)) =
                (input::<B, 2>(&mut rng, [rows, k], dtype), input::<B, 3>(&mut rng, [sizes.len(), n, k], dtype));
            (xv, wv, x, w)
        }
        Views::Transposed => {
            let ((x, _), (w, _)) =
                (input::<B, 2>(&mut rng, [k, rows], dtype), input::<B, 3>(&mut rng, [sizes.len(), k, n], dtype));
            let (x, w) = (x.transpose(), w.swap_dims(1, 2));
            (values(x.clone()), values(w.clone()), x, w)
        }
    };
    let (g, gv) = input::<B, 2>(&mut rng, [rows, n], dtype);
    let what = format!("grouped_matmul {sizes:?} N{n} K{k} {views:?} {dtype:?}");
    let before = grouped_counts().0;
    let got = run::<B>(true, (&x0, &w0, &g), sizes, dtype);
    assert!(grouped_counts().0 >= before + 3, "{what}: the forward and both backward products were not all served");
    let burn = run::<B>(false, (&x0, &w0, &g), sizes, dtype);
    let want = reference(&xv, &wv, &gv, sizes, n, k);
    let (vs_f64, vs_burn) = bands(dtype);
    for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
        let (e, eb) = (rel(&got[i], &want[i]), rel(&got[i], &burn[i]));
        eprintln!("{what} {name}: vs f64 {e:e}, vs fallback {eb:e}");
        assert!(e <= vs_f64, "{what} {name}: ‖err‖/‖ref‖ vs f64 {e:e} > {vs_f64:e}");
        assert!(eb <= vs_burn, "{what} {name}: ‖err‖/‖ref‖ vs the fallback {eb:e} > {vs_burn:e}");
    }
    for (e, _) in sizes.iter().enumerate().filter(|(_, &m)| m == 0) {
        assert!(got[2][e * n * k..(e + 1) * n * k].iter().all(|&v| v == 0.0), "{what}: dw[{e}] of an empty expert");
    }
}

fn all_cases<B: GroupedOps + AutodiffBackend>() {
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        // E = 7: empty experts first, in the middle and last, 1-row experts, uneven sizes
        case::<B>(dtype, &[0, 37, 1, 0, 130, 5, 0], 96, 128, Views::Contiguous);
        // equal experts (one strided batch), and E = 1
        case::<B>(dtype, &[32, 32, 32, 32], 64, 80, Views::Contiguous);
        case::<B>(dtype, &[77], 48, 40, Views::Contiguous);
        // small unequal experts (cuBLAS's grouped call) and a larger skewed layer (the pool)
        case::<B>(dtype, &[3, 9, 1, 17, 2, 0, 6, 4], 32, 64, Views::Contiguous);
        case::<B>(dtype, &[300, 12, 0, 45, 1], 256, 512, Views::Contiguous);
        // views copied contiguous first
        case::<B>(dtype, &[5, 0, 19], 40, 24, Views::Transposed);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_plain_backend() {
    let _shared = crate::shared();
    all_cases::<Autodiff<Plain>>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_under_fusion() {
    let _shared = crate::shared();
    all_cases::<Autodiff<Fused>>();
}

/// `case`, counted alone: exactly its three products served, none handed to burn.
fn counted_case<B: GroupedOps + AutodiffBackend>(dtype: FloatDType, sizes: &[usize], n: usize, k: usize) {
    let before = grouped_counts();
    case::<B>(dtype, sizes, n, k, Views::Contiguous);
    let after = grouped_counts();
    let delta = (after.0 - before.0, after.1 - before.1);
    assert_eq!(delta, (3, 0), "{sizes:?} {dtype:?}: (served, fell back) of the forward and both backward products");
}

/// Each product is served exactly once per call, on the plain backend and under fusion, with
/// either ordering (host waits give the same results as device ordering).
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_counts_exactly_with_either_ordering() {
    let _alone = crate::exclusive();
    for ordering in [GemmOrdering::Device, GemmOrdering::HostWait] {
        set_ordering(ordering);
        counted_case::<Autodiff<Plain>>(FloatDType::BF16, &[0, 37, 1, 0, 130, 5, 0], 96, 128);
        counted_case::<Autodiff<Fused>>(FloatDType::F32, &[3, 9, 1, 17, 2, 0, 6, 4], 32, 64);
        counted_case::<Autodiff<Fused>>(FloatDType::F16, &[32, 32, 32, 32], 64, 80);
    }
}

/// With the adapter off every product runs burn's ops (counted as such), with the same result.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_with_the_adapter_off_runs_the_fallback() {
    let _alone = crate::exclusive();
    let sizes = [4, 0, 9];
    let mut rng = seeded(7);
    let (x, xv) = input::<Autodiff<Fused>, 2>(&mut rng, [13, 24], FloatDType::F16);
    let (w, wv) = input::<Autodiff<Fused>, 3>(&mut rng, [3, 16, 24], FloatDType::F16);
    let (g, gv) = input::<Autodiff<Fused>, 2>(&mut rng, [13, 16], FloatDType::F16);
    set_enabled(false);
    let before = grouped_counts();
    let got = run::<Autodiff<Fused>>(true, (&x, &w, &g), &sizes, FloatDType::F16);
    let after = grouped_counts();
    set_enabled(true);
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 3), "adapter off: three products fell back");
    let want = reference(&xv, &wv, &gv, &sizes, 16, 24);
    for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
        let e = rel(&got[i], &want[i]);
        assert!(e <= 1e-2, "adapter off {name}: ‖err‖/‖ref‖ vs f64 {e:e}");
    }
}

/// Under `set_tf32(true)` f32 products run as tf32: served, within tf32's band.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_f32_as_tf32() {
    let _alone = crate::exclusive();
    let sizes = [0, 37, 1, 130];
    let mut rng = seeded(8);
    let (x, xv) = input::<Autodiff<Plain>, 2>(&mut rng, [168, 128], FloatDType::F32);
    let (w, wv) = input::<Autodiff<Plain>, 3>(&mut rng, [4, 96, 128], FloatDType::F32);
    let (g, gv) = input::<Autodiff<Plain>, 2>(&mut rng, [168, 96], FloatDType::F32);
    set_tf32(true);
    let before = grouped_counts().0;
    let got = run::<Autodiff<Plain>>(true, (&x, &w, &g), &sizes, FloatDType::F32);
    let served = grouped_counts().0 - before;
    set_tf32(false);
    assert_eq!(served, 3, "tf32: three products served");
    let want = reference(&xv, &wv, &gv, &sizes, 96, 128);
    for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
        let e = rel(&got[i], &want[i]);
        assert!(e <= 1e-3, "tf32 {name}: ‖err‖/‖ref‖ vs f64 {e:e}");
    }
}

/// Rows of an odd width (17 f16 elements, 34 bytes): served or handed to burn, the result is
/// float64's within the band, untracked and tracked.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_at_odd_widths_either_path() {
    let _shared = crate::shared();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let (sizes, n, k) = ([3, 0, 11], 9, 17);
        let mut rng = seeded(9);
        let (x, xv) = input::<Autodiff<Plain>, 2>(&mut rng, [14, k], dtype);
        let (w, wv) = input::<Autodiff<Plain>, 3>(&mut rng, [3, n, k], dtype);
        let (g, gv) = input::<Autodiff<Plain>, 2>(&mut rng, [14, n], dtype);
        let want = reference(&xv, &wv, &gv, &sizes, n, k);
        let untracked = values(grouped_matmul(x.clone(), w.clone(), &sizes));
        let got = run::<Autodiff<Plain>>(true, (&x, &w, &g), &sizes, dtype);
        let band = bands(dtype).0;
        let e = rel(&untracked, &want[0]);
        assert!(e <= band, "odd widths {dtype:?} untracked y: {e:e}");
        for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
            let e = rel(&got[i], &want[i]);
            assert!(e <= band, "odd widths {dtype:?} {name}: ‖err‖/‖ref‖ vs f64 {e:e}");
        }
    }
}
