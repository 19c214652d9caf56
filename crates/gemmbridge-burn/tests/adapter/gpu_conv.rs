//! `conv2d` through gemmbridge's cuDNN convolutions on a CUDA GPU (ignored elsewhere): the
//! forward (plain and with the bias and ReLU fused) and the gradients of x, the filter and the
//! bias under `Autodiff`, on the plain backend and under fusion, in f32, f16 and bf16, against
//! float64 (f32 within 1e-5, f16/bf16 within 1e-2, ‖err‖/‖ref‖) and against burn's own
//! `module::conv2d` under burn's autodiff (f32 within 1e-3: burn's f32 convolution may round
//! to tf32 as its matmul does); channels-last inputs (cuDNN's NHWC); the counts show that
//! gemmbridge served each direction. Before each call the memory its outputs will likely get
//! is filled with NaN, so an element left unwritten shows as a failure. Each test counts calls
//! exactly, so it runs alone ([`crate::exclusive`]).

use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge::conv::{reference, Conv2d, ConvLayout};
use gemmbridge::Precision;
use gemmbridge_burn::{conv2d, conv_counts, set_enabled, ConvActivation, ConvOps};
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

fn check(what: &str, got: &[f64], want: &[f64], band: f64) {
    let e = rel(got, want);
    eprintln!("{what}: {e:e}");
    assert!(e <= band, "{what}: ‖err‖/‖ref‖ {e:e} > {band:e}");
}

/// The band against float64, and against burn's own convolution.
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

/// A tensor of `shape` uniform in `[-1, 1)` in `dtype`, and its values after the rounding.
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

/// A logical `[n, c, h, w]` input stored channels-last (a permuted view of a dense
/// `[n, h, w, c]`), and its values in logical order.
fn input_nhwc<B: AutodiffBackend>(
    rng: &mut rand::rngs::StdRng,
    [n, c, h, w]: [usize; 4],
    dtype: FloatDType,
) -> (Tensor<B, 4>, Vec<f64>) {
    let (dense, _) = input::<B, 4>(rng, [n, h, w, c], dtype);
    let t = dense.permute([0, 3, 1, 2]);
    let vals = values(t.clone());
    (t, vals)
}

fn poison<B: AutodiffBackend>(len: usize) {
    let t = Tensor::<B, 1>::full([len], f32::NAN, &Default::default());
    let _ = t.into_data();
}

fn case(x: [usize; 4], [k, r, s]: [usize; 3], stride: usize, pad: usize, dil: usize, groups: usize) -> Conv2d {
    Conv2d::new(x, [k, r, s], Precision::F32)
        .with_stride(stride, stride)
        .with_pad(pad, pad)
        .with_dilation(dil, dil)
        .with_groups(groups)
        .with_layout(ConvLayout::Nchw)
}

/// float64 `[y, dx, dw, db]` of `act(x ⋆ w + b)` for the loss `Σ y ⊙ g`.
fn reference_all(p: &Conv2d, [x, w, b, g]: [&[f64]; 4], relu: bool) -> [Vec<f64>; 4] {
    let y = reference::forward_fused(p, x, w, b, relu);
    let gm: Vec<f64> = y.iter().zip(g).map(|(&y, &g)| if !relu || y > 0.0 { g } else { 0.0 }).collect();
    let [_, k, pp, q] = p.y_dims();
    let mut db = vec![0.0; k];
    for (i, v) in gm.iter().enumerate() {
        db[(i / (pp * q)) % k] += v;
    }
    [y.clone(), reference::backward_data(p, w, &gm), reference::backward_filter(p, x, &gm), db]
}

/// One problem in `dtype`: ours against float64 and against burn's, with the counts of
/// served and fell-back calls checked exactly (forward, backward data, backward filter).
fn conv_case<B: ConvOps + AutodiffBackend>(p: Conv2d, dtype: FloatDType, bias: bool, act: ConvActivation, nhwc: bool) {
    let what = format!("{} bias {bias} {act:?} nhwc {nhwc} {dtype:?}", p.describe());
    let mut rng = seeded(p.c as u64 * 131 + p.k as u64);
    let (x0, xv) = match nhwc {
        true => input_nhwc::<B>(&mut rng, p.x_dims(), dtype),
        false => input::<B, 4>(&mut rng, p.x_dims(), dtype),
    };
    let (w0, wv) = input::<B, 4>(&mut rng, p.w_dims(), dtype);
    let (b0, bv) = input::<B, 1>(&mut rng, [p.k], dtype);
    let (g, gv) = input::<B, 4>(&mut rng, p.y_dims(), dtype);
    let bv = if bias { bv } else { vec![0.0; p.k] };
    let relu = act == ConvActivation::Relu;
    let opts = ConvOptions::new(p.stride, p.pad, p.dilation, p.groups);
    let run = |ours: bool| {
        let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
        poison::<B>(p.lens()[2]);
        let y = match ours {
            true => conv2d(x.clone(), w.clone(), bias.then(|| b.clone()), opts.clone(), act),
            false => {
                let y = burn::tensor::module::conv2d(x.clone(), w.clone(), bias.then(|| b.clone()), opts.clone());
                if relu {
                    burn::tensor::activation::relu(y)
                } else {
                    y
                }
            }
        };
        poison::<B>(p.lens()[0].max(p.lens()[1]));
        let grads = (y.clone() * g.clone()).sum().backward();
        let db = if bias { values(b.grad(&grads).unwrap()) } else { vec![0.0; p.k] };
        [values(y), values(x.grad(&grads).unwrap()), values(w.grad(&grads).unwrap()), db]
    };
    let before = conv_counts();
    let got = run(true);
    let after = conv_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (3, 0), "{what}: forward, data, filter served");
    let want = reference_all(&p, [&xv, &wv, &bv, &gv], relu);
    let burn = run(false);
    let (vs_f64, vs_burn) = bands(dtype);
    for (i, name) in ["y", "dx", "dw", "db"].into_iter().enumerate() {
        check(&format!("{what} {name} vs f64"), &got[i], &want[i], vs_f64);
        check(&format!("{what} {name} vs burn"), &got[i], &burn[i], vs_burn);
    }
}

fn all_cases<B: ConvOps + AutodiffBackend>() {
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        conv_case::<B>(case([2, 3, 9, 10], [5, 3, 3], 2, 1, 1, 1), dtype, true, ConvActivation::Relu, false);
        conv_case::<B>(case([2, 17, 7, 8], [17, 3, 3], 1, 2, 2, 17), dtype, true, ConvActivation::Identity, false);
        conv_case::<B>(case([3, 6, 8, 9], [4, 2, 3], 2, 1, 2, 2), dtype, false, ConvActivation::Relu, false);
        conv_case::<B>(case([4, 64, 14, 14], [32, 3, 3], 1, 1, 1, 1), dtype, true, ConvActivation::Relu, false);
        conv_case::<B>(case([4, 64, 14, 14], [32, 3, 3], 1, 1, 1, 1), dtype, true, ConvActivation::Relu, true);
        conv_case::<B>(case([2, 17, 9, 9], [8, 3, 3], 2, 1, 1, 1), dtype, false, ConvActivation::Identity, true);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv2d_plain_backend() {
    let _alone = crate::exclusive();
    all_cases::<Autodiff<Plain>>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv2d_under_fusion() {
    let _alone = crate::exclusive();
    all_cases::<Autodiff<Fused>>();
}

/// With the adapter off every direction runs burn's convolution, counted as fallen back,
/// and the results are float64's all the same; f64 inputs are burn's too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn disabled_adapter_and_f64_fall_back_to_burn() {
    let _alone = crate::exclusive();
    type B = Autodiff<Plain>;
    let p = case([2, 3, 9, 10], [5, 3, 3], 2, 1, 1, 1);
    let mut rng = seeded(9);
    let (x, xv) = input::<B, 4>(&mut rng, p.x_dims(), FloatDType::F32);
    let (w, wv) = input::<B, 4>(&mut rng, p.w_dims(), FloatDType::F32);
    let (b, bv) = input::<B, 1>(&mut rng, [p.k], FloatDType::F32);
    let opts = ConvOptions::new(p.stride, p.pad, p.dilation, p.groups);
    let want = reference::forward_fused(&p, &xv, &wv, &bv, true);
    set_enabled(false);
    let before = conv_counts();
    let y = conv2d(x.clone(), w.clone(), Some(b.clone()), opts.clone(), ConvActivation::Relu);
    check("disabled: y vs f64", &values(y), &want, 1e-3);
    let after = conv_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 1), "the forward fell back");
    set_enabled(true);
    let wide = |t: Tensor<B, 4>| t.cast(FloatDType::F64);
    let y = conv2d(wide(x), wide(w), Some(b.cast(FloatDType::F64)), opts, ConvActivation::Relu);
    check("f64: y vs f64", &values(y), &want, 1e-5);
    let last = conv_counts();
    assert_eq!((last.0 - after.0, last.1 - after.1), (0, 1), "f64 fell back");
}
