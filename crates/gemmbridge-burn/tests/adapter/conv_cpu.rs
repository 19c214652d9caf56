//! `conv2d` and `GemmConv2d` on burn's NdArray backend (CPU, runs in CI): the fallback path
//! (burn's convolution) and the adapter's own autodiff node, forward, bias + ReLU and the
//! gradients of x, the filter and the bias against gemmbridge's float64 references at odd
//! shapes (3 and 17 channels, strides, padding, dilation, groups, depthwise); asymmetric
//! padding; the module's conversions from and to burn's `nn::conv::Conv2d` keep every weight;
//! bad shapes panic at the call.
//!
//! Inputs come from a seeded `StdRng`, never from NdArray's process-wide generator (the
//! `linear` tests seed that one and compare draws).

use crate::cpu_common::{assert_band, rng, uniform, values, F32_BAND};
use burn::backend::{Autodiff, NdArray};
use burn::module::{Initializer, Module, Param};
use burn::nn::conv::{Conv2d as BurnConv2d, Conv2dConfig};
use burn::nn::PaddingConfig2d;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::ops::{ConvOptions, PaddedConvOptions};
use burn::tensor::Tensor;
use gemmbridge::conv::{reference, Conv2d, ConvLayout};
use gemmbridge::Precision;
use gemmbridge_burn::{conv2d, ConvActivation, GemmConv2d, GemmConv2dConfig};

type Cpu = NdArray<f32>;
type Ad = Autodiff<Cpu>;

/// One test problem: gemmbridge's (NCHW, f64 references) and burn's options for it.
fn case(
    x: [usize; 4],
    [k, r, s]: [usize; 3],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    g: usize,
) -> Conv2d {
    Conv2d::new(x, [k, r, s], Precision::F32)
        .with_stride(stride[0], stride[1])
        .with_pad(pad[0], pad[1])
        .with_dilation(dil[0], dil[1])
        .with_groups(g)
        .with_layout(ConvLayout::Nchw)
}

fn options(p: &Conv2d) -> ConvOptions<2> {
    ConvOptions::new(p.stride, p.pad, p.dilation, p.groups)
}

/// float64 `(y, dx, dw, db)` of `act(x ⋆ w + b)` for the loss `Σ y ⊙ g`.
fn reference_all(p: &Conv2d, [x, w, b, g]: [&[f64]; 4], relu: bool) -> [Vec<f64>; 4] {
    let y = reference::forward_fused(p, x, w, b, relu);
    let gm: Vec<f64> = y.iter().zip(g).map(|(&y, &g)| if !relu || y > 0.0 { g } else { 0.0 }).collect();
    let [n, k, pp, q] = p.y_dims();
    let mut db = vec![0.0; k];
    for (i, v) in gm.iter().enumerate() {
        db[(i / (pp * q)) % k] += v;
    }
    debug_assert_eq!(gm.len(), n * k * pp * q);
    [y.clone(), reference::backward_data(p, w, &gm), reference::backward_filter(p, x, &gm), db]
}

#[test]
fn conv2d_forward_bias_relu_and_gradients_equal_float64() {
    let mut rng = rng(11);
    let cases = [
        // 3 channels, stride 2, padding 1, on an odd image
        (case([2, 3, 9, 10], [5, 3, 3], [2, 2], [1, 1], [1, 1], 1), true, ConvActivation::Relu),
        // depthwise 17 channels, dilation 2, padding 2
        (case([1, 17, 7, 8], [17, 3, 3], [1, 1], [2, 2], [2, 2], 17), true, ConvActivation::Identity),
        // two groups, a 2×3 kernel, mixed stride, padding and dilation, no bias, ReLU
        (case([3, 6, 8, 9], [4, 2, 3], [2, 1], [0, 1], [1, 2], 2), false, ConvActivation::Relu),
        // 17 → 3 channels, 1×1 kernel, stride 2
        (case([2, 17, 5, 6], [3, 1, 1], [2, 2], [0, 0], [1, 1], 1), true, ConvActivation::Relu),
    ];
    for (p, with_bias, act) in cases {
        let what = p.describe();
        let (x, xv) = uniform::<Ad, 4>(&mut rng, p.x_dims());
        let (w, wv) = uniform::<Ad, 4>(&mut rng, p.w_dims());
        let (b, bv) = uniform::<Ad, 1>(&mut rng, [p.k]);
        let (g, gv) = uniform::<Ad, 4>(&mut rng, p.y_dims());
        let bv = if with_bias { bv } else { vec![0.0; p.k] };
        let relu = act == ConvActivation::Relu;
        let [y_ref, dx_ref, dw_ref, db_ref] = reference_all(&p, [&xv, &wv, &bv, &gv], relu);
        let (x, w, b) = (x.require_grad(), w.require_grad(), b.require_grad());
        let y = conv2d(x.clone(), w.clone(), with_bias.then(|| b.clone()), options(&p), act);
        assert_eq!(y.dims(), p.y_dims(), "{what}: output shape");
        assert_band(&format!("{what}: y"), &values(y.clone()), &y_ref, F32_BAND);
        if relu {
            assert!(values(y.clone()).iter().all(|&v| v >= 0.0), "{what}: ReLU output");
        }
        let grads = (y * g).sum().backward();
        assert_band(&format!("{what}: dx"), &values(x.grad(&grads).unwrap()), &dx_ref, F32_BAND);
        assert_band(&format!("{what}: dw"), &values(w.grad(&grads).unwrap()), &dw_ref, F32_BAND);
        match with_bias {
            true => assert_band(&format!("{what}: db"), &values(b.grad(&grads).unwrap()), &db_ref, F32_BAND),
            false => assert!(b.grad(&grads).is_none(), "{what}: no bias, no gradient"),
        }
    }
}

#[test]
fn only_the_gradients_asked_for_are_computed() {
    let mut rng = rng(12);
    let p = case([2, 3, 6, 7], [4, 3, 3], [1, 1], [1, 1], [1, 1], 1);
    let (x, xv) = uniform::<Ad, 4>(&mut rng, p.x_dims());
    let (w, wv) = uniform::<Ad, 4>(&mut rng, p.w_dims());
    let (g, gv) = uniform::<Ad, 4>(&mut rng, p.y_dims());
    let [_, _, dw_ref, _] = reference_all(&p, [&xv, &wv, &[0.0; 4], &gv], false);
    // x is an input (no gradient), w a parameter
    let w = w.require_grad();
    let y = conv2d(x.clone(), w.clone(), None, options(&p), ConvActivation::Identity);
    let grads = (y * g).sum().backward();
    assert!(x.grad(&grads).is_none(), "x was not tracked");
    assert_band("dw", &values(w.grad(&grads).unwrap()), &dw_ref, F32_BAND);
}

#[test]
fn asymmetric_padding_pads_first_and_equals_float64() {
    let mut rng = rng(13);
    // top 0, left 2, bottom 1, right 1 on a 3-channel 5×6 image, stride 2, dilation [1, 2]
    let (top, left, bottom, right) = (0, 2, 1, 1);
    let [n, c, h, wd] = [2, 3, 5, 6];
    let padded = case([n, c, h + top + bottom, wd + left + right], [4, 3, 2], [2, 2], [0, 0], [1, 2], 1);
    let (x, xv) = uniform::<Ad, 4>(&mut rng, [n, c, h, wd]);
    let (w, wv) = uniform::<Ad, 4>(&mut rng, padded.w_dims());
    let (b, bv) = uniform::<Ad, 1>(&mut rng, [4]);
    let (g, gv) = uniform::<Ad, 4>(&mut rng, padded.y_dims());
    // x padded in float64, then a convolution without padding
    let [_, _, ph, pw] = padded.x_dims();
    let mut xp = vec![0.0; padded.lens()[0]];
    for (i, v) in xv.iter().enumerate() {
        let (row, col, nc) = ((i / wd) % h, i % wd, i / (h * wd));
        xp[(nc * ph + row + top) * pw + col + left] = *v;
    }
    let [y_ref, dxp_ref, dw_ref, db_ref] = reference_all(&padded, [&xp, &wv, &bv, &gv], true);
    let dx_ref: Vec<f64> =
        (0..xv.len()).map(|i| dxp_ref[((i / (h * wd)) * ph + (i / wd) % h + top) * pw + i % wd + left]).collect();
    let opts = PaddedConvOptions::asymmetric([2, 2], [top, left], [bottom, right], [1, 2], 1);
    let (x, w, b) = (x.require_grad(), w.require_grad(), b.require_grad());
    let y = conv2d(x.clone(), w.clone(), Some(b.clone()), opts, ConvActivation::Relu);
    assert_band("y", &values(y.clone()), &y_ref, F32_BAND);
    let grads = (y * g).sum().backward();
    assert_band("dx", &values(x.grad(&grads).unwrap()), &dx_ref, F32_BAND);
    assert_band("dw", &values(w.grad(&grads).unwrap()), &dw_ref, F32_BAND);
    assert_band("db", &values(b.grad(&grads).unwrap()), &db_ref, F32_BAND);
}

/// burn's `Conv2d` with weights from `rng` (not from NdArray's generator).
fn burn_conv(
    rng: &mut rand::rngs::StdRng,
    ch: [usize; 2],
    kernel: [usize; 2],
    groups: usize,
    bias: bool,
) -> BurnConv2d<Cpu> {
    let (w, _) = uniform::<Cpu, 4>(rng, [ch[1], ch[0] / groups, kernel[0], kernel[1]]);
    BurnConv2d {
        weight: Param::from_tensor(w),
        bias: bias.then(|| Param::from_tensor(uniform::<Cpu, 1>(rng, [ch[1]]).0)),
        stride: [2, 1],
        kernel_size: kernel,
        dilation: [1, 2],
        groups,
        padding: PaddingConfig2d::Same,
    }
}

fn recorder() -> BinBytesRecorder<FullPrecisionSettings> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
}

#[test]
fn gemm_conv2d_converts_and_loads_nn_conv2d_records_both_ways() {
    let device = Default::default();
    let mut rng = rng(14);
    let theirs = burn_conv(&mut rng, [6, 4], [4, 3], 2, true);
    let (wv, bv) = (values(theirs.weight.val()), values(theirs.bias.as_ref().unwrap().val()));
    let ours: GemmConv2d<Cpu> = theirs.clone().into();
    assert_eq!((values(ours.weight.val()), values(ours.bias.as_ref().unwrap().val())), (wv.clone(), bv.clone()));
    assert_eq!((ours.stride, ours.kernel_size, ours.dilation, ours.groups), ([2, 1], [4, 3], [1, 2], 2));
    let back: BurnConv2d<Cpu> = ours.clone().into();
    assert_eq!(values(back.weight.val()), wv);
    assert_eq!(back.padding, PaddingConfig2d::Same);
    // records: burn's loads into ours and back, byte for byte
    let bytes = recorder().record(theirs.clone().into_record(), ()).unwrap();
    let fresh =
        GemmConv2dConfig::new([6, 4], [4, 3]).with_groups(2).with_initializer(Initializer::Zeros).init::<Cpu>(&device);
    let loaded = fresh.load_record(recorder().load(bytes.clone(), &device).unwrap());
    assert_eq!(values(loaded.weight.val()), wv);
    assert_eq!(recorder().record(loaded.into_record(), ()).unwrap(), bytes, "the same bytes back out");
    // forward equals burn's, `Same` padding with an even kernel (asymmetric), odd sizes
    for dims in [[2, 6, 9, 7], [1, 6, 4, 5]] {
        let (x, _) = uniform::<Cpu, 4>(&mut rng, dims);
        let want = values(theirs.forward(x.clone()));
        assert_band("GemmConv2d vs nn::Conv2d", &values(ours.forward(x.clone())), &want, F32_BAND);
        let relu: Vec<f64> = want.iter().map(|v| v.max(0.0)).collect();
        assert_band("forward_relu", &values(ours.forward_relu(x)), &relu, F32_BAND);
    }
    assert_eq!(format!("{ours}"), format!("{theirs}").replace("Conv2d", "GemmConv2d"));
}

#[test]
fn gemm_conv2d_padding_kinds_and_config_match_burns() {
    let device = Default::default();
    let mut rng = rng(15);
    for padding in
        [PaddingConfig2d::Valid, PaddingConfig2d::Explicit(1, 2, 1, 2), PaddingConfig2d::Explicit(0, 1, 2, 0)]
    {
        let mut theirs = burn_conv(&mut rng, [3, 17], [3, 3], 1, false);
        theirs.padding = padding.clone();
        let ours = GemmConv2d::from(theirs.clone());
        let (x, _) = uniform::<Cpu, 4>(&mut rng, [2, 3, 8, 9]);
        let want = values(theirs.forward(x.clone()));
        assert_band(&format!("{padding:?}"), &values(ours.forward(x)), &want, F32_BAND);
    }
    let config = GemmConv2dConfig::new([4, 6], [3, 3]).with_initializer(Initializer::Constant { value: 0.5 });
    let ours = config.init::<Cpu>(&device);
    let theirs =
        Conv2dConfig::new([4, 6], [3, 3]).with_initializer(Initializer::Constant { value: 0.5 }).init::<Cpu>(&device);
    assert_eq!(ours.weight.dims(), [6, 4, 3, 3]);
    assert_eq!(values(ours.weight.val()), values(theirs.weight.val()));
    assert_eq!(values(ours.bias.unwrap().val()), values(theirs.bias.unwrap().val()));
    let default = GemmConv2dConfig::new([1, 1], [1, 1]);
    let burns = Conv2dConfig::new([1, 1], [1, 1]);
    assert_eq!(
        (default.stride, default.dilation, default.groups, default.bias),
        (burns.stride, burns.dilation, burns.groups, burns.bias)
    );
    assert_eq!(default.padding, burns.padding);
}

fn zeros<const D: usize>(shape: [usize; D]) -> Tensor<Cpu, D> {
    Tensor::zeros(shape, &Default::default())
}

#[test]
#[should_panic(expected = "x [2, 6, 5, 5] has 6 channels, weight [4, 4, 3, 3] with groups 1 takes 4 × 1")]
fn channels_that_do_not_fit_panic_with_the_shapes() {
    conv2d(
        zeros([2, 6, 5, 5]),
        zeros([4, 4, 3, 3]),
        None,
        ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
        ConvActivation::Identity,
    );
}

#[test]
#[should_panic(expected = "bias must be [4] (one value per filter of weight [4, 3, 3, 3]), not [3]")]
fn a_bias_of_the_wrong_length_panics() {
    let o = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
    conv2d(zeros([1, 3, 5, 5]), zeros([4, 3, 3, 3]), Some(zeros([3])), o, ConvActivation::Relu);
}

#[test]
#[should_panic(
    expected = "the dilated kernel 5×3 (weight [2, 3, 3, 3], dilation [2, 1]) is larger than the padded input 4×6"
)]
fn a_kernel_larger_than_the_input_panics() {
    let o = ConvOptions::new([1, 1], [0, 1], [2, 1], 1);
    conv2d(zeros([1, 3, 4, 4]), zeros([2, 3, 3, 3]), None, o, ConvActivation::Identity);
}

#[test]
#[should_panic(expected = "weight [6, 2, 3, 3] has 6 filters, not a multiple of groups 4")]
fn filters_not_a_multiple_of_the_groups_panic() {
    let o = ConvOptions::new([1, 1], [1, 1], [1, 1], 4);
    conv2d(zeros([1, 8, 4, 4]), zeros([6, 2, 3, 3]), None, o, ConvActivation::Identity);
}

#[test]
#[should_panic(expected = "stride [0, 1], dilation [1, 1] and groups 1 must each be at least 1")]
fn a_zero_stride_panics() {
    let o = ConvOptions { stride: [0, 1], padding: [0, 0], dilation: [1, 1], groups: 1 };
    conv2d(zeros([1, 3, 4, 4]), zeros([2, 3, 3, 3]), None, o, ConvActivation::Identity);
}
