//! `GemmLinear` and the autodiff rules on burn's NdArray backend (CPU, runs in CI): the record
//! format is `nn::Linear`'s, and the forward and the gradients gemmbridge-burn computes through
//! its own backward nodes (`dx = dy·Wᵀ`, `dW = xᵀ·dy`, `db = Σ dy`) equal burn's `Linear`
//! and `matmul` under burn's own autodiff. On NdArray every GEMM is burn's, so what these
//! tests check is the adapter's plumbing: shapes, transposes, broadcast sums, the record.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{activation, Distribution, Tensor};
use gemmbridge_burn::{linear, matmul, Activation, GemmLinear, GemmLinearConfig};

type Cpu = NdArray<f32>;

/// NdArray's random generator is global to the process and the tests run on parallel threads:
/// every test holds this lock, so that a seeded initialisation is not interleaved with another
/// test's draws.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|p| p.into_inner())
}
type Ad = Autodiff<Cpu>;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// Largest |a − b| / max(1, |b|); panics on NaN.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0.0f32, f32::max);
    assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite output");
    assert!(worst <= tol, "{what}: worst relative difference {worst:e} > {tol:e}");
}

/// burn initialises parameters lazily, and a clone of an uninitialised `Param` initialises on
/// its own: materialise the parameters before cloning a layer.
fn materialised<B: Backend>(l: Linear<B>) -> Linear<B> {
    let _ = (l.weight.val(), l.bias.as_ref().map(|b| b.val()));
    l
}

fn random<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

#[test]
fn config_defaults_and_init_match_linear_config() {
    let _rng = rng_lock();
    let device = Default::default();
    let (ours, theirs) = (GemmLinearConfig::new(7, 5), LinearConfig::new(7, 5));
    assert_eq!(ours.initializer, theirs.initializer);
    assert_eq!((ours.bias, format!("{:?}", ours.layout)), (theirs.bias, format!("{:?}", theirs.layout)));
    Cpu::seed(&device, 42);
    let a: GemmLinear<Cpu> = ours.init(&device);
    let _ = (a.weight.val(), a.bias.as_ref().map(|b| b.val()));
    Cpu::seed(&device, 42);
    let b: Linear<Cpu> = materialised(theirs.init(&device));
    assert_eq!(values(a.weight.val()), values(b.weight.val()));
    assert_eq!(values(a.bias.unwrap().val()), values(b.bias.unwrap().val()));
}

#[test]
fn records_load_across_in_both_directions_and_layouts() {
    let _rng = rng_lock();
    let device = Default::default();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    for layout in [LinearLayout::Row, LinearLayout::Col] {
        for bias in [true, false] {
            let theirs: Linear<Cpu> =
                materialised(LinearConfig::new(6, 4).with_bias(bias).with_layout(layout).init(&device));
            let bytes = recorder.record(theirs.clone().into_record(), ()).unwrap();
            let fresh: GemmLinear<Cpu> = GemmLinearConfig::new(6, 4).with_bias(bias).with_layout(layout).init(&device);
            let ours = fresh.load_record(recorder.load(bytes.clone(), &device).unwrap());
            // the same bytes back out
            assert_eq!(recorder.record(ours.clone().into_record(), ()).unwrap(), bytes, "{layout:?} bias {bias}");
            let x = random::<Cpu, 3>([2, 3, 6], &device);
            assert_eq!(values(ours.forward(x.clone())), values(theirs.forward(x.clone())), "{layout:?} bias {bias}");
            // and the other way round
            let back: Linear<Cpu> = LinearConfig::new(6, 4).with_bias(bias).with_layout(layout).init(&device);
            let back =
                back.load_record(recorder.load(recorder.record(ours.into_record(), ()).unwrap(), &device).unwrap());
            assert_eq!(values(back.forward(x.clone())), values(theirs.forward(x)));
        }
    }
}

#[test]
fn conversions_keep_the_parameters() {
    let _rng = rng_lock();
    let device = Default::default();
    let theirs: Linear<Cpu> = materialised(LinearConfig::new(3, 2).init(&device));
    let ours: GemmLinear<Cpu> = theirs.clone().into();
    assert_eq!(ours.weight.id, theirs.weight.id);
    let back: Linear<Cpu> = ours.into();
    assert_eq!(values(back.weight.val()), values(theirs.weight.val()));
}

/// Gradients of a scalar loss through gemmbridge-burn's `linear` (its own backward node) and
/// through burn's `module::linear` (burn's), for `x [2, 5, 6] → [2, 5, 4]`, on leaf tensors: the
/// weight stored `[6, 4]` (`LinearLayout::Row`) or stored `[4, 6]` and used transposed
/// (`LinearLayout::Col`; the gradient lands on the stored leaf through the transpose).
#[test]
fn linear_gradients_equal_burns() {
    let _rng = rng_lock();
    let device = Default::default();
    for col in [false, true] {
        for bias in [true, false] {
            for act in Activation::ALL {
                let what = format!("col {col} bias {bias} {act:?}");
                let x0 = random::<Ad, 3>([2, 5, 6], &device);
                let w0 = if col { random::<Ad, 2>([4, 6], &device) } else { random::<Ad, 2>([6, 4], &device) };
                let b0 = random::<Ad, 1>([4], &device);
                let weights = random::<Ad, 3>([2, 5, 4], &device); // a loss that weighs every output
                let view = |w: &Tensor<Ad, 2>| if col { w.clone().transpose() } else { w.clone() };

                let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
                let y = linear(x.clone(), view(&w), bias.then(|| b.clone()), act);
                let g = (y.clone() * weights.clone()).sum().backward();

                let (xr, wr, br) = (x0.require_grad(), w0.require_grad(), b0.require_grad());
                let pre = burn::tensor::module::linear(xr.clone(), view(&wr), bias.then(|| br.clone()));
                let y_ref = match act {
                    Activation::None => pre,
                    Activation::Relu => activation::relu(pre),
                    Activation::GeluTanh => activation::gelu_approximate(pre),
                    Activation::GeluErf => activation::gelu(pre),
                };
                let gr = (y_ref.clone() * weights).sum().backward();

                let grad = |t: &Tensor<Ad, 2>, g| values(t.grad(g).unwrap_or_else(|| panic!("{what}: no gradient")));
                assert_close(&format!("{what}: y"), &values(y), &values(y_ref), 1e-6);
                assert_close(
                    &format!("{what}: dx"),
                    &values(x.grad(&g).unwrap()),
                    &values(xr.grad(&gr).unwrap()),
                    1e-5,
                );
                assert_close(&format!("{what}: dW"), &grad(&w, &g), &grad(&wr, &gr), 1e-5);
                if bias {
                    assert_close(
                        &format!("{what}: db"),
                        &values(b.grad(&g).unwrap()),
                        &values(br.grad(&gr).unwrap()),
                        1e-5,
                    );
                } else {
                    assert!(b.grad(&g).is_none(), "{what}: a gradient for an unused bias");
                }
            }
        }
    }
}

/// The module: `GemmLinear` trains the same parameters as `Linear` (gradients by parameter).
#[test]
fn module_gradients_equal_linear() {
    let _rng = rng_lock();
    let device = Default::default();
    let theirs: Linear<Ad> = materialised(LinearConfig::new(6, 4).init(&device));
    let ours: GemmLinear<Ad> = theirs.clone().into();
    let x = random::<Ad, 2>([5, 6], &device);
    let g = ours.forward(x.clone()).sum().backward();
    let gr = theirs.forward(x).sum().backward();
    let (dw, dwr) = (ours.weight.grad(&g).unwrap(), theirs.weight.grad(&gr).unwrap());
    assert_close("dW", &values(dw), &values(dwr), 1e-5);
    let (db, dbr) = (ours.bias.as_ref().unwrap().grad(&g).unwrap(), theirs.bias.as_ref().unwrap().grad(&gr).unwrap());
    assert_close("db", &values(db), &values(dbr), 1e-5);
}

/// An untracked call (no gradient needed) takes the fused path; its value is the same.
#[test]
fn untracked_linear_with_activation_equals_burn() {
    let _rng = rng_lock();
    let device = Default::default();
    let theirs: Linear<Ad> = materialised(LinearConfig::new(6, 4).init(&device));
    let x = random::<Ad, 2>([5, 6], &device);
    let w = theirs.weight.val().detach();
    let b = theirs.bias.as_ref().unwrap().val().detach();
    let ours = linear(x.clone(), w.clone(), Some(b.clone()), Activation::Relu);
    assert_close("untracked relu", &values(ours), &values(activation::relu(theirs.forward(x.clone()))), 1e-6);
    let ours = linear(x.clone(), w, Some(b), Activation::GeluErf);
    assert_close("untracked erf gelu", &values(ours), &values(activation::gelu(theirs.forward(x))), 1e-6);
}

/// matmul gradients under broadcasting, rank 2 and 3, against burn's own matmul.
#[test]
fn matmul_gradients_equal_burns() {
    let _rng = rng_lock();
    let device = Default::default();
    for (l, r) in [([1, 4, 3], [1, 3, 5]), ([3, 4, 3], [1, 3, 5]), ([1, 4, 3], [2, 3, 5]), ([2, 4, 3], [2, 3, 5])] {
        let (a0, b0) = (random::<Ad, 3>(l, &device), random::<Ad, 3>(r, &device));
        let (a, b) = (a0.clone().require_grad(), b0.clone().require_grad());
        let y = matmul(a.clone(), b.clone());
        let w = random::<Ad, 3>(y.dims(), &device);
        let g = (y.clone() * w.clone()).sum().backward();
        let (ar, br) = (a0.require_grad(), b0.require_grad());
        let yr = ar.clone().matmul(br.clone());
        let gr = (yr.clone() * w).sum().backward();
        assert_close(&format!("{l:?}·{r:?} y"), &values(y), &values(yr), 1e-6);
        assert_close(&format!("{l:?}·{r:?} dA"), &values(a.grad(&g).unwrap()), &values(ar.grad(&gr).unwrap()), 1e-5);
        assert_close(&format!("{l:?}·{r:?} dB"), &values(b.grad(&g).unwrap()), &values(br.grad(&gr).unwrap()), 1e-5);
    }
}

/// Rank-1 x is one row, as in burn's `module::linear`, on every path (also the fallback's).
#[test]
fn rank_one_linear_equals_burns() {
    let _rng = rng_lock();
    let device = Default::default();
    for bias in [true, false] {
        let (x0, w, b) =
            (random::<Ad, 1>([6], &device), random::<Ad, 2>([6, 4], &device), random::<Ad, 1>([4], &device));
        let x = x0.clone().require_grad();
        let y = linear(x.clone(), w.clone(), bias.then(|| b.clone()), Activation::None);
        assert_eq!(y.dims(), [4]);
        let g = y.clone().sum().backward();
        let xr = x0.require_grad();
        let yr = burn::tensor::module::linear(xr.clone(), w, bias.then_some(b));
        let gr = yr.clone().sum().backward();
        assert_close("rank 1 y", &values(y), &values(yr), 1e-6);
        assert_close("rank 1 dx", &values(x.grad(&g).unwrap()), &values(xr.grad(&gr).unwrap()), 1e-5);
    }
}

/// A one-element bias is burn's to broadcast (the adapter hands the call to burn's linear).
#[test]
fn one_element_bias_broadcasts_as_in_burn() {
    let _rng = rng_lock();
    let device = Default::default();
    let (x, w, b) =
        (random::<Cpu, 2>([3, 6], &device), random::<Cpu, 2>([6, 4], &device), random::<Cpu, 1>([1], &device));
    let ours = linear(x.clone(), w.clone(), Some(b.clone()), Activation::None);
    assert_close("bias [1]", &values(ours), &values(burn::tensor::module::linear(x, w, Some(b))), 1e-6);
}

#[test]
#[should_panic(expected = "inner dimensions differ (3 and 4): lhs shape [2, 3], rhs shape [4, 5]")]
fn matmul_with_mismatched_inner_dims_panics_at_the_call() {
    let device = Default::default();
    let _ = matmul(Tensor::<Cpu, 2>::zeros([2, 3], &device), Tensor::<Cpu, 2>::zeros([4, 5], &device));
}

#[test]
#[should_panic(expected = "batch dimension 0 does not broadcast (2 and 3)")]
fn matmul_with_batches_that_do_not_broadcast_panics_at_the_call() {
    let device = Default::default();
    let _ = matmul(Tensor::<Cpu, 3>::zeros([2, 4, 3], &device), Tensor::<Cpu, 3>::zeros([3, 3, 5], &device));
}

#[test]
#[should_panic(expected = "x's last dimension is 5 but weight is [d_input, d_output] = [6, 4]")]
fn linear_with_the_wrong_d_in_panics_at_the_call() {
    let device = Default::default();
    let _ = linear(
        Tensor::<Cpu, 2>::zeros([3, 5], &device),
        Tensor::<Cpu, 2>::zeros([6, 4], &device),
        None,
        Activation::None,
    );
}

#[test]
fn displays_as_linear_does() {
    let _rng = rng_lock(); // initialising a Linear draws from the shared generator
    let device = Default::default();
    let theirs: Linear<Cpu> = LinearConfig::new(5, 4).init(&device);
    let ours: GemmLinear<Cpu> = LinearConfig::new(5, 4).init(&device).into();
    assert_eq!(format!("{ours}").replace("GemmLinear", "Linear"), format!("{theirs}"));
}

#[test]
#[should_panic(expected = "bias has 3 elements but weight is [d_input, d_output] = [6, 5]")]
fn linear_with_the_wrong_bias_length_panics_at_the_call() {
    let device = Default::default();
    let _ = linear(
        Tensor::<Cpu, 2>::zeros([2, 6], &device),
        Tensor::<Cpu, 2>::zeros([6, 5], &device),
        Some(Tensor::<Cpu, 1>::zeros([3], &device)),
        Activation::None,
    );
}
