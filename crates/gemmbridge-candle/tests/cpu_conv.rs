//! `conv2d` on the CPU: candle's own convolution (gemmbridge has no CPU convolution, so every
//! CPU call is `Served::Candle`), forward, fused bias and ReLU and candle's autograd, against
//! gemmbridge's float64 convolution references, on shapes with stride, padding, dilation and
//! groups and on strided views; and the named errors every path gives for bad input.

mod common;
#[path = "common/conv.rs"]
mod conv_case;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::{f64s, random, rel_err, rng};
use conv_case::{db_f64, forward_f64, Case};
use gemmbridge::conv::reference;
use gemmbridge_candle::{conv2d, conv2d_candle, conv2d_served, Conv2dParams, ConvAct, Served};
use rand::rngs::StdRng;

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// The band of `dtype` against float64: f64 1e-12, else the common bands.
fn band(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        1e-12
    } else {
        common::band(dtype)
    }
}

/// Asserts `got` within `dtype`'s band of the float64 `want`.
fn assert_close(what: &str, got: &Tensor, want: &[f64], dtype: DType) -> Result<()> {
    let e = rel_err(&f64s(got)?, want);
    assert!(e <= band(dtype), "{what} ({dtype:?}): relative error {e:e} above {:e}", band(dtype));
    Ok(())
}

/// Shapes with every feature: odd sizes, stride, padding, dilation, groups, depthwise, 1×1,
/// a non-square kernel.
const CASES: [Case; 7] = [
    Case::new([2, 3, 9, 11], [5, 3, 3], Conv2dParams::new(0, 1, 1, 1)),
    Case::new([2, 4, 10, 9], [6, 3, 3], Conv2dParams::new(1, 2, 1, 1)),
    Case::new([1, 4, 11, 12], [4, 3, 2], Conv2dParams::new(2, 1, 2, 1)),
    Case::new([2, 6, 8, 7], [4, 3, 3], Conv2dParams::new(1, 1, 1, 2)),
    Case::new([2, 6, 9, 9], [6, 3, 3], Conv2dParams::new(1, 2, 1, 6)), // depthwise
    Case::new([3, 8, 5, 6], [7, 1, 1], Conv2dParams::new(0, 1, 1, 1)), // 1×1
    Case::new([1, 6, 13, 10], [6, 5, 2], Conv2dParams::new(1, 3, 2, 3)),
];

/// x (a transposed view of a `[n, c, w, h]` tensor where `strided`), w and a bias for `case`.
fn inputs(rng: &mut StdRng, case: &Case, dtype: DType, strided: bool) -> Result<[Tensor; 3]> {
    let [n, c, h, iw] = case.x;
    let x = if strided {
        random(rng, &[n, c, iw, h], dtype, &Device::Cpu)?.transpose(2, 3)?
    } else {
        random(rng, &case.x, dtype, &Device::Cpu)?
    };
    let w = random(rng, &case.w_dims(), dtype, &Device::Cpu)?;
    let b = random(rng, &[case.krs[0]], dtype, &Device::Cpu)?;
    Ok([x, w, b])
}

#[test]
fn cpu_conv2d_forward_against_float64() -> Result<()> {
    let mut rng = rng("cpu_conv2d_forward_against_float64");
    for dtype in DTYPES {
        for (i, case) in CASES.iter().enumerate() {
            let strided = i % 2 == 1;
            let [x, w, _] = inputs(&mut rng, case, dtype, strided)?;
            assert_eq!(x.is_contiguous(), !strided);
            let what = format!("case {i} {case:?} {dtype:?}");
            let p = case.problem();
            let want = reference::forward(&p, &f64s(&x)?, &f64s(&w)?);
            let (y, served) = conv2d_served(&x, &w, None, ConvAct::None, case.params)?;
            assert_eq!((served, y.dims()), (Served::Candle, &p.y_dims()[..]), "{what}");
            assert_eq!(y.dtype(), dtype, "{what}");
            assert_close(&what, &y, &want, dtype)?;
            assert_eq!(f64s(&y)?, f64s(&conv2d_candle(&x, &w, None, ConvAct::None, case.params)?)?, "{what}");
        }
    }
    Ok(())
}

#[test]
fn cpu_conv2d_fused_bias_and_relu() -> Result<()> {
    let mut rng = rng("cpu_conv2d_fused_bias_and_relu");
    for dtype in DTYPES {
        for (i, case) in CASES.iter().enumerate() {
            let [x, w, b] = inputs(&mut rng, case, dtype, false)?;
            for (bias, act) in [(Some(&b), ConvAct::Relu), (Some(&b), ConvAct::None), (None, ConvAct::Relu)] {
                let what = format!("case {i} bias {} {act:?} {dtype:?}", bias.is_some());
                let want = forward_f64(case, [&x, &w], bias, act)?;
                let (y, served) = conv2d_served(&x, &w, bias, act, case.params)?;
                assert_eq!(served, Served::Candle, "{what}");
                assert_close(&what, &y, &want, dtype)?;
                if act == ConvAct::Relu {
                    // the activation ran: no negative output, and some zeros
                    let got = f64s(&y)?;
                    assert!(got.iter().all(|&v| v >= 0.0) && got.contains(&0.0), "{what}");
                }
            }
        }
    }
    Ok(())
}

/// Cases whose backward candle's autograd takes: `stride > 1` only where the height and the
/// width leave one remainder modulo the stride (see `cpu_conv2d_backward_candles_stride_limit`).
const BWD_CASES: [Case; 5] = [
    Case::new([2, 3, 9, 11], [5, 3, 3], Conv2dParams::new(1, 1, 1, 1)),
    Case::new([2, 4, 10, 8], [6, 3, 3], Conv2dParams::new(1, 2, 1, 1)),
    Case::new([1, 4, 11, 12], [4, 3, 2], Conv2dParams::new(2, 1, 2, 2)),
    Case::new([2, 6, 9, 9], [6, 3, 3], Conv2dParams::new(1, 2, 1, 6)), // depthwise
    Case::new([2, 6, 12, 11], [3, 2, 3], Conv2dParams::new(0, 3, 2, 3)),
];

#[test]
fn cpu_conv2d_backward_against_float64() -> Result<()> {
    // loss = Σ y·r: dy = r, g = r where y > 0 for ReLU; dx, dw from the float64 backwards
    let mut rng = rng("cpu_conv2d_backward_against_float64");
    for dtype in DTYPES {
        for (i, case) in BWD_CASES.iter().enumerate() {
            for act in [ConvAct::None, ConvAct::Relu] {
                let what = format!("case {i} {case:?} {act:?} {dtype:?}");
                let [x, w, b] = inputs(&mut rng, case, dtype, i % 2 == 0)?;
                let (xv, wv, bv) = (Var::from_tensor(&x)?, Var::from_tensor(&w)?, Var::from_tensor(&b)?);
                let p = case.problem();
                let r = random(&mut rng, &p.y_dims(), dtype, &Device::Cpu)?;
                let y = conv2d(xv.as_tensor(), wv.as_tensor(), Some(bv.as_tensor()), act, case.params)?;
                let grads = y.mul(&r)?.sum_all()?.backward()?;
                // candle's ReLU derivative: 1 where the pre-activation is ≥ 0 (in f16 it is
                // exactly 0 now and then, where the rounded sum cancels the bias)
                let pre =
                    f64s(&conv2d(xv.as_tensor(), wv.as_tensor(), Some(bv.as_tensor()), ConvAct::None, case.params)?)?;
                let g: Vec<f64> = pre
                    .iter()
                    .zip(f64s(&r)?)
                    .map(|(&z, r)| if act == ConvAct::Relu && z < 0.0 { 0.0 } else { r })
                    .collect();
                let db = db_f64(&p, &g);
                let get = |v: &Var, name: &str| grads.get(v).cloned().unwrap_or_else(|| panic!("{what}: no {name}"));
                assert_close(
                    &format!("{what}: dx"),
                    &get(&xv, "dx"),
                    &reference::backward_data(&p, &f64s(&w)?, &g),
                    dtype,
                )?;
                assert_close(
                    &format!("{what}: dw"),
                    &get(&wv, "dw"),
                    &reference::backward_filter(&p, &f64s(&x)?, &g),
                    dtype,
                )?;
                assert_close(&format!("{what}: db"), &get(&bv, "db"), &db, dtype)?;
            }
        }
    }
    Ok(())
}

#[test]
fn cpu_conv2d_backward_candles_stride_limit() -> Result<()> {
    // candle 0.11's conv2d backward takes one output padding for both axes: with stride 2, a
    // height and a width of different parities make its dx the wrong width (documented on
    // `conv2d_served`); the forward is fine
    let dev = Device::Cpu;
    let xv = Var::from_tensor(&Tensor::ones((1, 2, 7, 8), DType::F32, &dev)?)?;
    let w = Tensor::ones((2, 2, 3, 3), DType::F32, &dev)?;
    let y = conv2d(xv.as_tensor(), &w, None, ConvAct::None, Conv2dParams::new(1, 2, 1, 1))?;
    assert_eq!(y.dims(), [1, 2, 4, 4]);
    let e = y.sum_all()?.backward().expect_err("candle's backward took different remainders");
    assert!(e.to_string().contains("shape mismatch"), "{e}");
    Ok(())
}

#[test]
fn cpu_conv2d_empty_batch_runs_candles() -> Result<()> {
    let x = Tensor::zeros((0, 4, 9, 9), DType::F32, &Device::Cpu)?;
    let w = Tensor::zeros((6, 2, 3, 3), DType::F32, &Device::Cpu)?;
    let (y, served) = conv2d_served(&x, &w, None, ConvAct::Relu, Conv2dParams::new(1, 2, 1, 2))?;
    assert_eq!((y.dims(), served), (&[0usize, 6, 5, 5][..], Served::Candle));
    Ok(())
}

/// The error of `conv2d_served` and of `conv2d_candle` on the same input: the same message
/// (its first line: with `RUST_BACKTRACE` set, candle appends the backtrace).
fn refused(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> String {
    let message = |e: candle_core::Error| e.to_string().lines().next().unwrap_or_default().to_string();
    let a = message(conv2d_served(x, w, bias, ConvAct::Relu, params).expect_err("bad input was taken"));
    let b = message(conv2d_candle(x, w, bias, ConvAct::None, params).expect_err("bad input was taken"));
    assert_eq!(a, b);
    a
}

#[test]
fn cpu_conv2d_bad_input_is_named() -> Result<()> {
    let dev = Device::Cpu;
    let t = |d: &[usize]| Tensor::zeros(d, DType::F32, &dev);
    let (x, w, p) = (t(&[2, 4, 8, 8])?, t(&[6, 2, 3, 3])?, Conv2dParams::new(1, 1, 1, 2));
    let cases: [(String, &str); 12] = [
        (refused(&t(&[4, 8, 8])?, &w, None, p), "conv2d: x must be 4-D [n, c, h, w], not [4, 8, 8]"),
        (refused(&x, &t(&[6, 2, 9])?, None, p), "conv2d: w must be 4-D [k, c/groups, r, s], not [6, 2, 9]"),
        (refused(&x, &w, None, Conv2dParams::new(1, 0, 1, 2)), "stride 0, dilation 1 and groups 2 must each be"),
        (refused(&x, &w, None, Conv2dParams::new(1, 1, 0, 2)), "stride 1, dilation 0 and groups 2 must each be"),
        (refused(&x, &w, None, Conv2dParams::new(1, 1, 1, 0)), "stride 1, dilation 1 and groups 0 must each be"),
        (refused(&x, &w, None, Conv2dParams::new(1, 1, 1, 1)), "x [2, 4, 8, 8] has 4 channels, w [6, 2, 3, 3] with groups 1 takes 2 × 1"),
        (refused(&x, &t(&[5, 2, 3, 3])?, None, p), "w [5, 2, 3, 3] has 5 filters, not a multiple of groups 2"),
        (refused(&x, &w, Some(&t(&[1, 6])?), p), "bias must be [6] (one value per filter of w [6, 2, 3, 3]), not [1, 6]"),
        (refused(&x, &t(&[6, 2, 11, 3])?, None, p), "the dilated kernel 11×3 (w [6, 2, 11, 3], dilation 1) is larger than the padded input 10×10"),
        (refused(&x, &w, None, Conv2dParams::new(0, 1, 5, 2)), "the dilated kernel 11×11 (w [6, 2, 3, 3], dilation 5) is larger than the padded input 8×8 (x [2, 4, 8, 8], padding 0)"),
        (refused(&x, &w.to_dtype(DType::F16)?, None, p), "x (F32), w (F16) and bias (None) must share one float dtype"),
        (refused(&x, &t(&[6, 2, 0, 3])?, None, p), "w [6, 2, 0, 3] has no taps"),
    ];
    for (got, want) in cases {
        assert!(got.starts_with("conv2d: ") && got.contains(want), "{got:?} does not name {want:?}");
    }
    let e = refused(&t(&[2, 4, 0, 8])?, &w, None, p);
    assert!(e.contains("x [2, 4, 0, 8] has an empty image"), "{e}");
    // paddings whose output overflows or could never be allocated
    for pad in [usize::MAX, usize::MAX / 2 + 1, 1 << 40] {
        let e = refused(&x, &w, None, Conv2dParams::new(pad, 1, 1, 2));
        assert!(e.starts_with("conv2d: the output [2, 6, ") && e.contains("is too large"), "padding {pad}: {e}");
    }
    let ints = x.to_dtype(DType::U32)?;
    let e = refused(&ints, &w.to_dtype(DType::U32)?, None, p);
    assert!(e.contains("must share one float dtype"), "{e}");
    Ok(())
}
