//! `rms_norm`, `swiglu`, `rope` and the modules `GemmRmsNorm`, `GemmSwiGluMlp` on burn's
//! NdArray backend (CPU, runs in CI): the fallback path (burn's ops) and the adapter's own
//! autodiff nodes, forward and gradients against float64 references written out here, at odd
//! shapes; the modules' conversions from and to burn's `nn` modules keep every weight; bad
//! shapes panic at the call.
//!
//! Inputs come from a seeded `StdRng`, never from NdArray's process-wide generator (the
//! `linear` tests seed that one and compare draws).

use crate::cpu_common::{assert_band, rng, uniform, values, F32_BAND};
use burn::backend::{Autodiff, NdArray};
use burn::module::{Initializer, Module, Param};
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorData};
use gemmbridge_burn::{
    rms_norm, rope, swiglu, GemmRmsNorm, GemmRmsNormConfig, GemmSwiGluMlp, GemmSwiGluMlpConfig, RopeStyle,
};

type Cpu = NdArray<f32>;
type Ad = Autodiff<Cpu>;

/// float64 RMSNorm over rows of `f`: `(y, dx, dw)` for the loss `Σ y ⊙ g`.
fn rms_reference(x: &[f64], w: &[f64], g: &[f64], f: usize, eps: f64) -> [Vec<f64>; 3] {
    let (mut y, mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; f]);
    for (r, row) in x.chunks(f).enumerate() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / f as f64 + eps).sqrt();
        let gr = &g[r * f..(r + 1) * f];
        // dL/dx_j = inv·(w_j g_j − x̂_j · Σ_k w_k g_k x̂_k / f)
        let c: f64 = (0..f).map(|k| w[k] * gr[k] * row[k] * inv).sum::<f64>() / f as f64;
        for j in 0..f {
            y[r * f + j] = row[j] * inv * w[j];
            dx[r * f + j] = inv * (w[j] * gr[j] - row[j] * inv * c);
            dw[j] += gr[j] * row[j] * inv;
        }
    }
    [y, dx, dw]
}

#[test]
fn rms_norm_forward_and_gradients_equal_float64() {
    let mut rng = rng(1);
    for (shape, eps) in [([37, 17], 1e-5), ([37, 4096], 1e-6), ([1, 3], 0.5)] {
        let f = shape[1];
        let (x, xv) = uniform::<Ad, 2>(&mut rng, shape);
        let (w, wv) = uniform::<Ad, 1>(&mut rng, [f]);
        let (g, gv) = uniform::<Ad, 2>(&mut rng, shape);
        let (x, w) = (x.require_grad(), w.require_grad());
        // rank 3: the rows of [rows, f] as [1, rows, f]
        let y = rms_norm(x.clone().unsqueeze::<3>(), w.clone(), eps).squeeze_dim::<2>(0);
        let grads = (y.clone() * g).sum().backward();
        let [ry, rdx, rdw] = rms_reference(&xv, &wv, &gv, f, eps);
        let what = format!("rms_norm {shape:?}");
        assert_band(&format!("{what} y"), &values(y), &ry, F32_BAND);
        assert_band(&format!("{what} dx"), &values(x.grad(&grads).unwrap()), &rdx, F32_BAND);
        assert_band(&format!("{what} dw"), &values(w.grad(&grads).unwrap()), &rdw, F32_BAND);
    }
}

#[test]
fn rms_norm_gradients_equal_burns_rms_norm_under_its_autodiff() {
    let mut rng = rng(2);
    let (x0, _) = uniform::<Ad, 3>(&mut rng, [3, 5, 33]);
    let (w0, _) = uniform::<Ad, 1>(&mut rng, [33]);
    let (g, _) = uniform::<Ad, 3>(&mut rng, [3, 5, 33]);
    let theirs = RmsNorm { gamma: Param::from_tensor(w0), epsilon: 1e-5 };
    let ours: GemmRmsNorm<Ad> = theirs.clone().into();
    let run = |ours_: bool| {
        let x = x0.clone().require_grad();
        let y = if ours_ { ours.forward(x.clone()) } else { theirs.forward(x.clone()) };
        let grads = (y.clone() * g.clone()).sum().backward();
        let gamma = if ours_ { &ours.gamma } else { &theirs.gamma };
        [values(y), values(x.grad(&grads).unwrap()), values(gamma.grad(&grads).unwrap())]
    };
    for (name, (got, want)) in ["y", "dx", "dgamma"].iter().zip(run(true).iter().zip(run(false).iter())) {
        assert_band(&format!("GemmRmsNorm vs nn::RmsNorm {name}"), got, want, F32_BAND);
    }
}

/// float64 SwiGLU over rows of `2f`: `(y, dgu)` for the loss `Σ y ⊙ g`.
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

#[test]
fn swiglu_forward_and_gradient_equal_float64() {
    let mut rng = rng(3);
    for (rows, f) in [(37, 17), (37, 1000), (1, 1)] {
        let (gu, guv) = uniform::<Ad, 2>(&mut rng, [rows, 2 * f]);
        let gu = (gu * 4.0).require_grad(); // gates over [-4, 4): both tails of σ
        let guv: Vec<f64> = guv.iter().map(|v| v * 4.0).collect();
        let (g, gv) = uniform::<Ad, 3>(&mut rng, [1, rows, f]);
        let y = swiglu(gu.clone().unsqueeze::<3>());
        assert_eq!(y.dims(), [1, rows, f]);
        let grads = (y.clone() * g).sum().backward();
        let [ry, rdgu] = swiglu_reference(&guv, &gv, f);
        assert_band(&format!("swiglu {rows}×{f} y"), &values(y), &ry, F32_BAND);
        assert_band(&format!("swiglu {rows}×{f} dgu"), &values(gu.grad(&grads).unwrap()), &rdgu, F32_BAND);
    }
}

/// float64 RoPE of `x[b, h, t, d]` with `[T, d/2]` tables (`rows` T), rotated by `sign·θ`.
fn rope_reference(x: &[f64], [b, h, t, d]: [usize; 4], c: &[f64], s: &[f64], style: RopeStyle, sign: f64) -> Vec<f64> {
    let half = d / 2;
    let mut y = x.to_vec();
    for seq in 0..b * h {
        for p in 0..t {
            let at = (seq * t + p) * d;
            for i in 0..half {
                let (i1, i2) = match style {
                    RopeStyle::RotateHalf => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (cv, sv) = (c[p * half + i], sign * s[p * half + i]);
                let (x1, x2) = (x[at + i1], x[at + i2]);
                y[at + i1] = x1 * cv - x2 * sv;
                y[at + i2] = x2 * cv + x1 * sv;
            }
        }
    }
    y
}

#[test]
fn rope_forward_and_gradient_equal_float64_in_both_styles() {
    let mut rng = rng(4);
    for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        for dims in [[2, 5, 7, 16], [1, 1, 3, 2]] {
            let [_, _, t, d] = dims;
            let (x, xv) = uniform::<Ad, 4>(&mut rng, dims);
            let (g, gv) = uniform::<Ad, 4>(&mut rng, dims);
            // tables with two rows past t (not read), from angles p·ω_i
            let rows = t + 2;
            let angle = |k: usize| (k / (d / 2)) as f64 * 0.3f64.powf((k % (d / 2)) as f64 / 4.0);
            let table = |f: fn(f64) -> f64| -> (Tensor<Ad, 2>, Vec<f64>) {
                let v: Vec<f32> = (0..rows * d / 2).map(|k| f(angle(k)) as f32).collect();
                let wide = v.iter().map(|&e| f64::from(e)).collect();
                (Tensor::from_data(TensorData::new(v, [rows, d / 2]), &Default::default()), wide)
            };
            let ((c, cv), (s, sv)) = (table(f64::cos), table(f64::sin));
            let x = x.require_grad();
            let y = rope(x.clone(), c, s, style);
            let grads = (y.clone() * g).sum().backward();
            let what = format!("rope {style:?} {dims:?}");
            assert_band(&format!("{what} y"), &values(y), &rope_reference(&xv, dims, &cv, &sv, style, 1.0), F32_BAND);
            // the gradient of a rotation is the opposite rotation of the output's gradient
            let want = rope_reference(&gv, dims, &cv, &sv, style, -1.0);
            assert_band(&format!("{what} dx"), &values(x.grad(&grads).unwrap()), &want, F32_BAND);
        }
    }
}

#[test]
fn untracked_calls_equal_tracked_ones() {
    let mut rng = rng(5);
    let (x, _) = uniform::<Ad, 2>(&mut rng, [9, 10]);
    let (w, _) = uniform::<Ad, 1>(&mut rng, [10]);
    let tracked = values(rms_norm(x.clone().require_grad(), w.clone(), 1e-5));
    assert_eq!(values(rms_norm(x.clone(), w, 1e-5)), tracked, "rms_norm");
    assert_eq!(values(swiglu(x.clone().require_grad())), values(swiglu(x)), "swiglu");
}

fn recorder() -> BinBytesRecorder<FullPrecisionSettings> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
}

#[test]
fn gemm_rms_norm_converts_and_loads_nn_rms_norm_records_both_ways() {
    let device = Default::default();
    let mut rng = rng(6);
    let (gamma, gv) = uniform::<Cpu, 1>(&mut rng, [17]);
    let theirs = RmsNorm { gamma: Param::from_tensor(gamma), epsilon: 3e-4 };
    let ours: GemmRmsNorm<Cpu> = theirs.clone().into();
    assert_eq!((values(ours.gamma.val()), ours.epsilon), (gv.clone(), 3e-4));
    let back: RmsNorm<Cpu> = ours.clone().into();
    assert_eq!(values(back.gamma.val()), gv);
    let bytes = recorder().record(theirs.clone().into_record(), ()).unwrap();
    // as in nn::RmsNorm, ε is a constant of the module, not of its record: it comes from the config
    let fresh = GemmRmsNormConfig::new(17).with_epsilon(3e-4).init::<Cpu>(&device);
    let loaded = fresh.load_record(recorder().load(bytes.clone(), &device).unwrap());
    assert_eq!((values(loaded.gamma.val()), loaded.epsilon), (gv.clone(), 3e-4));
    assert_eq!(recorder().record(loaded.into_record(), ()).unwrap(), bytes, "the same bytes back out");
    let ours_bytes = recorder().record(ours.clone().into_record(), ()).unwrap();
    let into_theirs =
        RmsNormConfig::new(17).init::<Cpu>(&device).load_record(recorder().load(ours_bytes, &device).unwrap());
    assert_eq!(values(into_theirs.gamma.val()), gv);
    let (x, _) = uniform::<Cpu, 3>(&mut rng, [2, 37, 17]);
    assert_band("GemmRmsNorm vs nn::RmsNorm", &values(ours.forward(x.clone())), &values(theirs.forward(x)), F32_BAND);
    assert_eq!(format!("{ours}"), format!("{theirs}").replace("RmsNorm", "GemmRmsNorm"));
    let config = GemmRmsNormConfig::new(8);
    assert_eq!(config.epsilon, RmsNormConfig::new(8).epsilon);
    assert_eq!(values(config.init::<Cpu>(&device).gamma.val()), vec![1.0; 8], "gamma starts at ones");
}

/// burn's `SwiGlu` and a down `Linear` of explicit weights (`bias`: on every projection, or
/// on the gate only).
fn burn_mlp(rng: &mut rand::rngs::StdRng, d: usize, f: usize, bias: Option<bool>) -> (SwiGlu<Cpu>, Linear<Cpu>) {
    let mut linear = |i: usize, o: usize, with_bias: bool| Linear {
        weight: Param::from_tensor(uniform::<Cpu, 2>(rng, [i, o]).0),
        bias: with_bias.then(|| Param::from_tensor(uniform::<Cpu, 1>(rng, [o]).0)),
    };
    let all = bias == Some(true);
    let swiglu = SwiGlu { linear_inner: linear(d, f, bias.is_some()), linear_outer: linear(d, f, all) };
    (swiglu, linear(f, d, all))
}

#[test]
fn swiglu_mlp_from_burns_modules_keeps_the_weights_and_their_forward() {
    let mut rng = rng(7);
    let (d, f) = (12, 17);
    for bias in [None, Some(true), Some(false)] {
        let (swiglu_, down) = burn_mlp(&mut rng, d, f, bias);
        let ours = GemmSwiGluMlp::from_burn(swiglu_.clone(), down.clone());
        assert_eq!((ours.gate_up.weight.dims(), ours.d_hidden()), ([d, 2 * f], f));
        let (x, _) = uniform::<Cpu, 3>(&mut rng, [2, 37, d]);
        let want =
            down.forward(silu(swiglu_.linear_inner.forward(x.clone())) * swiglu_.linear_outer.forward(x.clone()));
        assert_band(&format!("GemmSwiGluMlp bias {bias:?}"), &values(ours.forward(x)), &values(want), F32_BAND);
        // back to burn's modules: the same weights, exactly (a missing gate/up bias as zeros)
        let (s2, down2) = ours.into_burn();
        let w = |l: &Linear<Cpu>| values(l.weight.val());
        let b = |l: &Linear<Cpu>| l.bias.as_ref().map(|b| values(b.val()));
        assert_eq!(w(&s2.linear_inner), w(&swiglu_.linear_inner));
        assert_eq!(w(&s2.linear_outer), w(&swiglu_.linear_outer));
        assert_eq!((w(&down2), b(&down2)), (w(&down), b(&down)));
        assert_eq!(b(&s2.linear_inner), b(&swiglu_.linear_inner));
        let zeros_if_filled = b(&swiglu_.linear_outer).or_else(|| bias.map(|_| vec![0.0; f]));
        assert_eq!(b(&s2.linear_outer), zeros_if_filled);
    }
}

#[test]
fn swiglu_mlp_config_initialises_as_burns_modules() {
    let device = Default::default();
    let init = Initializer::Constant { value: 0.25 };
    let ours = GemmSwiGluMlpConfig::new(6, 10).with_initializer(init.clone()).init::<Cpu>(&device);
    assert_eq!(GemmSwiGluMlpConfig::new(6, 10).initializer, SwiGluConfig::new(6, 10).initializer);
    assert_eq!(GemmSwiGluMlpConfig::new(6, 10).bias, SwiGluConfig::new(6, 10).bias);
    let theirs = SwiGluConfig::new(6, 10).with_initializer(init.clone()).init::<Cpu>(&device);
    let down = LinearConfig::new(10, 6).with_bias(false).with_initializer(init).init::<Cpu>(&device);
    let (s, d) = ours.clone().into_burn();
    assert_eq!(values(s.linear_inner.weight.val()), values(theirs.linear_inner.weight.val()));
    assert_eq!(values(s.linear_outer.weight.val()), values(theirs.linear_outer.weight.val()));
    assert_eq!(values(d.weight.val()), values(down.weight.val()));
    assert!(ours.gate_up.bias.is_none() && ours.down.bias.is_none());
}

#[test]
fn swiglu_mlp_records_round_trip() {
    let device = Default::default();
    let mut rng = rng(8);
    let (s, down) = burn_mlp(&mut rng, 5, 3, Some(true));
    let ours = GemmSwiGluMlp::from_burn(s, down);
    let bytes = recorder().record(ours.clone().into_record(), ()).unwrap();
    let fresh = GemmSwiGluMlpConfig::new(5, 3).with_bias(true).init::<Cpu>(&device);
    let loaded = fresh.load_record(recorder().load(bytes.clone(), &device).unwrap());
    assert_eq!(values(loaded.gate_up.weight.val()), values(ours.gate_up.weight.val()));
    assert_eq!(recorder().record(loaded.into_record(), ()).unwrap(), bytes);
}

#[test]
#[should_panic(expected = "weight has 5 elements but x's last dimension is 6: x shape [2, 6]")]
fn rms_norm_with_the_wrong_weight_length_panics_at_the_call() {
    let d = Default::default();
    let _ = rms_norm(Tensor::<Cpu, 2>::ones([2, 6], &d), Tensor::<Cpu, 1>::ones([5], &d), 1e-5);
}

#[test]
#[should_panic(expected = "eps = 0 is not a finite positive f32")]
fn rms_norm_with_zero_eps_panics_at_the_call() {
    let d = Default::default();
    let _ = rms_norm(Tensor::<Cpu, 2>::ones([2, 6], &d), Tensor::<Cpu, 1>::ones([6], &d), 0.0);
}

#[test]
#[should_panic(expected = "the last dimension 7 is odd; gate/up must be [.., 2f]: shape [3, 7]")]
fn swiglu_with_an_odd_width_panics_at_the_call() {
    let _ = swiglu(Tensor::<Cpu, 2>::ones([3, 7], &Default::default()));
}

#[test]
#[should_panic(expected = "cos [4, 3] and sin [4, 3] do not fit x [1, 2, 5, 6]: both must be [T, d/2] with T ≥ t = 5")]
fn rope_with_short_tables_panics_at_the_call() {
    let d = Default::default();
    let x = Tensor::<Cpu, 4>::ones([1, 2, 5, 6], &d);
    let _ = rope(x, Tensor::ones([4, 3], &d), Tensor::ones([4, 3], &d), RopeStyle::RotateHalf);
}
