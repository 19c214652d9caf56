//! gemmbridge-burn on a CUDA GPU (ignored elsewhere): forward and gradients equal burn's own
//! matmul within the precision bands, on the plain backend, under fusion and under Autodiff.

use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, Tensor};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{counts, matmul, set_enabled, GemmOps};

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;
type Fused = burn_fusion::Fusion<Plain>;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
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

fn band(dtype: FloatDType) -> f64 {
    if dtype == FloatDType::F32 {
        1e-5
    } else {
        1e-2
    }
}

/// gemmbridge's result against burn's own (adapter switched off) for one pair of tensors.
fn check<B: GemmOps, const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>, dtype: FloatDType) {
    set_enabled(false);
    let want = values(a.clone().matmul(b.clone()));
    set_enabled(true);
    let before = counts().0;
    let got = values(matmul(a, b));
    assert!(counts().0 > before, "{what}: gemmbridge did not serve the call");
    let e = rel(&got, &want);
    eprintln!("{what} {dtype:?}: rel {e:e}");
    assert!(e <= band(dtype), "{what} {dtype:?}: rel error {e:e}");
}

fn forward_cases<B: GemmOps>() {
    let dev = B::Device::default();
    let n = |s: [usize; 2], d| Tensor::<B, 2>::random(s, Distribution::Normal(0.0, 1.0), &dev).cast(d);
    let n3 = |s: [usize; 3], d| Tensor::<B, 3>::random(s, Distribution::Normal(0.0, 1.0), &dev).cast(d);
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        check("33x17·17x65", n([33, 17], dtype), n([17, 65], dtype), dtype);
        check("1000-wide (pitched)", n([40, 1000], dtype), n([1000, 24], dtype), dtype);
        check("x·wᵀ (transposed view)", n([64, 96], dtype), n([80, 96], dtype).transpose(), dtype);
        check("batched", n3([3, 33, 17], dtype), n3([3, 17, 20], dtype), dtype);
        check("broadcast rhs", n3([4, 16, 24], dtype), n3([1, 24, 8], dtype), dtype);
        check("5120x768·768x2048", n([5120, 768], dtype), n([768, 2048], dtype), dtype);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_plain_backend() {
    forward_cases::<Plain>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_under_fusion() {
    forward_cases::<Fused>();
}

fn grads<B: GemmOps + burn::tensor::backend::AutodiffBackend>(dtype: FloatDType) {
    let dev = B::Device::default();
    let a0 = Tensor::<B, 3>::random([2, 33, 17], Distribution::Normal(0.0, 1.0), &dev).cast(dtype);
    let b0 = Tensor::<B, 3>::random([1, 17, 40], Distribution::Normal(0.0, 1.0), &dev).cast(dtype);
    let g = Tensor::<B, 3>::random([2, 33, 40], Distribution::Normal(0.0, 1.0), &dev).cast(dtype);
    let run = |on: bool| {
        set_enabled(on);
        let (a, b) = (a0.clone().require_grad(), b0.clone().require_grad());
        let y = if on { matmul(a.clone(), b.clone()) } else { a.clone().matmul(b.clone()) };
        let grads = (y * g.clone()).sum().backward();
        (values(a.grad(&grads).unwrap()), values(b.grad(&grads).unwrap()))
    };
    let (want_a, want_b) = run(false);
    let before = counts().0;
    let (got_a, got_b) = run(true);
    set_enabled(true);
    assert!(counts().0 >= before + 3, "forward and both backward GEMMs through gemmbridge");
    let (ea, eb) = (rel(&got_a, &want_a), rel(&got_b, &want_b));
    eprintln!("grads {dtype:?}: dA {ea:e} dB {eb:e}");
    assert!(ea <= band(dtype) && eb <= band(dtype), "{dtype:?}: dA {ea:e} dB {eb:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_under_autodiff() {
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        grads::<Autodiff<Plain>>(dtype);
        grads::<Autodiff<Fused>>(dtype);
    }
}
