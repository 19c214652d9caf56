//! `rms_norm`, `swiglu` and `rope` through gemmbridge on a CUDA GPU (ignored elsewhere): the
//! forward and the gradients under `Autodiff`, on the plain backend and under fusion, in f32,
//! f16 and bf16, against float64 (f32 within 1e-5, f16/bf16 within 1e-2, ‖err‖/‖ref‖) and
//! against burn's own ops (`nn::RmsNorm`, `silu`·product, the rotation in burn's ops) under
//! burn's autodiff. Before each call the memory its outputs will likely get from cubecl's
//! pool is filled with NaN (best effort: a freed NaN buffer of the same size), so an output
//! element the operation leaves unwritten shows as a failure. These tests run beside each
//! other, with the adapter in its default state ([`crate::shared`]).

use burn::backend::autodiff::Autodiff;
use burn::module::Param;
use burn::nn::RmsNorm;
use burn::tensor::activation::silu;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{layer_counts, rms_norm, rope, swiglu, LayerOps, RopeStyle};
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

/// The precision's band against float64 (and against burn's own ops, which compute in f32
/// for every dtype here but round f16/bf16 intermediates).
fn band(dtype: FloatDType) -> f64 {
    if dtype == FloatDType::F32 {
        1e-5
    } else {
        1e-2
    }
}

fn seeded(salt: u64) -> rand::rngs::StdRng {
    let seed = std::env::var("GEMMBRIDGE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
    eprintln!("test seed {seed} (replay with GEMMBRIDGE_TEST_SEED={seed})");
    rand::rngs::StdRng::seed_from_u64(seed ^ salt)
}

/// A tensor of `shape` uniform in `[-scale, scale)`, in `dtype`, and its values (after the
/// rounding to `dtype`, what the references read).
fn input<B: AutodiffBackend, const D: usize>(
    rng: &mut rand::rngs::StdRng,
    shape: [usize; D],
    scale: f32,
    dtype: FloatDType,
) -> (Tensor<B, D>, Vec<f64>) {
    let v: Vec<f32> = (0..shape.iter().product()).map(|_| rng.random_range(-scale..scale)).collect();
    let t = Tensor::<B, D>::from_data(TensorData::new(v, shape), &Default::default()).cast(dtype);
    let vals = values(t.clone());
    (t, vals)
}

/// Fills and frees `len` f32 of NaN on the device, so that the next allocations of that size
/// likely reuse memory that holds NaN.
fn poison<B: AutodiffBackend>(len: usize) {
    let t = Tensor::<B, 1>::full([len], f32::NAN, &Default::default());
    let _ = t.into_data(); // executed (a fused stream runs it) before it is freed
}

fn check(what: &str, got: &[f64], want: &[f64], dtype: FloatDType) {
    let e = rel(got, want);
    eprintln!("{what} {dtype:?}: {e:e}");
    assert!(e <= band(dtype), "{what} {dtype:?}: ‖err‖/‖ref‖ {e:e} > {:e}", band(dtype));
}

/// float64 RMSNorm over rows of `f`: `[y, dx, dw]` for the loss `Σ y ⊙ g`.
fn rms_reference(x: &[f64], w: &[f64], g: &[f64], f: usize, eps: f64) -> [Vec<f64>; 3] {
    let (mut y, mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; f]);
    for (r, row) in x.chunks(f).enumerate() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / f as f64 + eps).sqrt();
        let gr = &g[r * f..(r + 1) * f];
        let c: f64 = (0..f).map(|k| w[k] * gr[k] * row[k] * inv).sum::<f64>() / f as f64;
        for j in 0..f {
            y[r * f + j] = row[j] * inv * w[j];
            dx[r * f + j] = inv * (w[j] * gr[j] - row[j] * inv * c);
            dw[j] += gr[j] * row[j] * inv;
        }
    }
    [y, dx, dw]
}

/// RMSNorm forward and gradients at `[rows, f]` (`pad`: x a row slice of `[rows, f + pad]`).
fn rms_case<B: LayerOps + AutodiffBackend>(dtype: FloatDType, rows: usize, f: usize, pad: usize) {
    let mut rng = seeded(1);
    let (wide, wide_v) = input::<B, 2>(&mut rng, [rows, f + pad], 1.0, dtype);
    let x0 = wide.narrow(1, 0, f);
    let xv: Vec<f64> = wide_v.chunks(f + pad).flat_map(|r| r[..f].to_vec()).collect();
    let (w0, wv) = input::<B, 1>(&mut rng, [f], 1.0, dtype);
    let (g, gv) = input::<B, 2>(&mut rng, [rows, f], 1.0, dtype);
    let eps = 1e-5;
    let run = |ours: bool| {
        let (x, gamma) = (x0.clone().require_grad(), Param::from_tensor(w0.clone()));
        poison::<B>(rows * f);
        let y = if ours {
            rms_norm(x.clone(), gamma.val(), eps)
        } else {
            RmsNorm { gamma: gamma.clone(), epsilon: eps }.forward(x.clone())
        };
        poison::<B>(rows * f);
        let grads = (y.clone() * g.clone()).sum().backward();
        [values(y), values(x.grad(&grads).unwrap()), values(gamma.grad(&grads).unwrap())]
    };
    let before = layer_counts().0;
    let got = run(true);
    assert!(layer_counts().0 >= before + 2, "rms_norm [{rows}, {f}] {dtype:?}: forward and backward not served");
    let burn = run(false);
    let want = rms_reference(&xv, &wv, &gv, f, eps);
    for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
        let what = format!("rms_norm [{rows}, {f}] pad {pad} {name}");
        check(&format!("{what} vs f64"), &got[i], &want[i], dtype);
        check(&format!("{what} vs burn"), &got[i], &burn[i], dtype);
    }
}

/// float64 SwiGLU over rows of `2f`: `[y, dgu]` for the loss `Σ y ⊙ g`.
fn swiglu_reference(gu: &[f64], g: &[f64], f: usize) -> [Vec<f64>; 2] {
    let (mut y, mut dgu) = (Vec::new(), vec![0.0; gu.len()]);
    for (r, row) in gu.chunks(2 * f).enumerate() {
        for j in 0..f {
            let (a, u, d) = (row[j], row[f + j], g[r * f + j]);
            let s = 1.0 / (1.0 + (-a).exp());
            y.push(a * s * u);
            dgu[r * 2 * f + j] = d * u * (s + a * s * (1.0 - s));
            dgu[r * 2 * f + f + j] = d * a * s;
        }
    }
    [y, dgu]
}

fn swiglu_case<B: LayerOps + AutodiffBackend>(dtype: FloatDType, rows: usize, f: usize) {
    let mut rng = seeded(2);
    let (gu0, guv) = input::<B, 3>(&mut rng, [1, rows, 2 * f], 4.0, dtype);
    let (g, gv) = input::<B, 3>(&mut rng, [1, rows, f], 1.0, dtype);
    let run = |ours: bool| {
        let gu = gu0.clone().require_grad();
        poison::<B>(rows * f);
        let y = if ours { swiglu(gu.clone()) } else { silu(gu.clone().narrow(2, 0, f)) * gu.clone().narrow(2, f, f) };
        poison::<B>(rows * 2 * f);
        let grads = (y.clone() * g.clone()).sum().backward();
        [values(y), values(gu.grad(&grads).unwrap())]
    };
    let before = layer_counts().0;
    let got = run(true);
    assert!(layer_counts().0 >= before + 2, "swiglu [{rows}, {f}] {dtype:?}: forward and backward not served");
    let (burn, want) = (run(false), swiglu_reference(&guv, &gv, f));
    for (i, name) in ["y", "dgu"].iter().enumerate() {
        check(&format!("swiglu [{rows}, 2·{f}] {name} vs f64"), &got[i], &want[i], dtype);
        check(&format!("swiglu [{rows}, 2·{f}] {name} vs burn"), &got[i], &burn[i], dtype);
    }
}

/// float64 RoPE of `x[b, h, t, d]` with `[T, d/2]` tables, rotated by `sign·θ`.
fn rope_reference(x: &[f64], [b, h, t, d]: [usize; 4], c: &[f64], s: &[f64], style: RopeStyle, sign: f64) -> Vec<f64> {
    let half = d / 2;
    let mut y = x.to_vec();
    for at in (0..b * h * t).map(|r| r * d) {
        let p = (at / d) % t;
        for i in 0..half {
            let (i1, i2) = match style {
                RopeStyle::RotateHalf => (i, i + half),
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            };
            let (cv, sv, x1, x2) = (c[p * half + i], sign * s[p * half + i], x[at + i1], x[at + i2]);
            y[at + i1] = x1 * cv - x2 * sv;
            y[at + i2] = x2 * cv + x1 * sv;
        }
    }
    y
}

/// The rotation in burn's own ops (the reference under burn's autodiff).
fn rope_burn<B: AutodiffBackend>(x: Tensor<B, 4>, c: Tensor<B, 2>, s: Tensor<B, 2>, style: RopeStyle) -> Tensor<B, 4> {
    let [b, h, t, d] = x.dims();
    let dtype = x.dtype();
    let (x, half) = (x.cast(FloatDType::F32), d / 2);
    let (c, s) = (c.narrow(0, 0, t).unsqueeze::<4>(), s.narrow(0, 0, t).unsqueeze::<4>());
    let y = match style {
        RopeStyle::RotateHalf => {
            let (x1, x2) = (x.clone().narrow(3, 0, half), x.narrow(3, half, half));
            Tensor::cat(vec![x1.clone() * c.clone() - x2.clone() * s.clone(), x2 * c + x1 * s], 3)
        }
        RopeStyle::Interleaved => {
            let p = x.reshape([b, h, t, half, 2]);
            let (c, s) = (c.unsqueeze_dim::<5>(4), s.unsqueeze_dim::<5>(4));
            let (x1, x2) = (p.clone().narrow(4, 0, 1), p.narrow(4, 1, 1));
            let y = Tensor::cat(vec![x1.clone() * c.clone() - x2.clone() * s.clone(), x2 * c + x1 * s], 4);
            y.reshape([b, h, t, d])
        }
    };
    y.cast(dtype)
}

fn rope_case<B: LayerOps + AutodiffBackend>(dtype: FloatDType, dims: [usize; 4], style: RopeStyle) {
    let mut rng = seeded(3);
    let [_, _, t, d] = dims;
    let (x0, xv) = input::<B, 4>(&mut rng, dims, 1.0, dtype);
    let (g, gv) = input::<B, 4>(&mut rng, dims, 1.0, dtype);
    let rows = t + 3; // rows past t are not read
    let angle = |k: usize| (k / (d / 2)) as f64 * 10_000f64.powf(-2.0 * (k % (d / 2)) as f64 / d as f64);
    let table = |f: fn(f64) -> f64| {
        let v: Vec<f32> = (0..rows * d / 2).map(|k| f(angle(k)) as f32).collect();
        let vals = v.iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
        (Tensor::<B, 2>::from_data(TensorData::new(v, [rows, d / 2]), &Default::default()), vals)
    };
    let ((c, cv), (s, sv)) = (table(f64::cos), table(f64::sin));
    let len = dims.iter().product();
    let run = |ours: bool| {
        let x = x0.clone().require_grad();
        poison::<B>(len);
        let y = if ours {
            rope(x.clone(), c.clone(), s.clone(), style)
        } else {
            rope_burn(x.clone(), c.clone(), s.clone(), style)
        };
        poison::<B>(len);
        let grads = (y.clone() * g.clone()).sum().backward();
        [values(y), values(x.grad(&grads).unwrap())]
    };
    let before = layer_counts().0;
    let got = run(true);
    assert!(layer_counts().0 >= before + 2, "rope {dims:?} {dtype:?}: forward and backward not served");
    let burn = run(false);
    let want = [rope_reference(&xv, dims, &cv, &sv, style, 1.0), rope_reference(&gv, dims, &cv, &sv, style, -1.0)];
    for (i, name) in ["y", "dx"].iter().enumerate() {
        check(&format!("rope {style:?} {dims:?} {name} vs f64"), &got[i], &want[i], dtype);
        check(&format!("rope {style:?} {dims:?} {name} vs burn"), &got[i], &burn[i], dtype);
    }
}

fn all_cases<B: LayerOps + AutodiffBackend>() {
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        rms_case::<B>(dtype, 37, 4096, 0);
        rms_case::<B>(dtype, 37, 1000, 64); // rows read in place from wider ones
        swiglu_case::<B>(dtype, 37, 17);
        swiglu_case::<B>(dtype, 37, 1000);
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            rope_case::<B>(dtype, [2, 5, 7, 64], style);
            rope_case::<B>(dtype, [1, 1, 9, 128], style); // one head: a zero key head is padded in
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_ops_plain_backend() {
    let _shared = crate::shared();
    all_cases::<Autodiff<Plain>>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_ops_under_fusion() {
    let _shared = crate::shared();
    all_cases::<Autodiff<Fused>>();
}

/// An odd feature count (rows of 17 f16 are 34 bytes apart): served or handed to burn, the
/// result is float64's within the band.
#[test]
#[ignore = "needs a CUDA GPU"]
fn rms_norm_at_odd_features_either_path() {
    let _shared = crate::shared();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let mut rng = seeded(4);
        let (x, xv) = input::<Autodiff<Plain>, 2>(&mut rng, [37, 17], 1.0, dtype);
        let (w, wv) = input::<Autodiff<Plain>, 1>(&mut rng, [17], 1.0, dtype);
        let want = rms_reference(&xv, &wv, &vec![0.0; xv.len()], 17, 1e-5);
        check("rms_norm [37, 17] y vs f64", &values(rms_norm(x, w, 1e-5)), &want[0], dtype);
    }
}
