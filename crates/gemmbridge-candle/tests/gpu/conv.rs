//! `conv2d` on a GPU, with the `cuda` feature: cuDNN through gemmbridge's engine on candle's
//! CUDA tensors (the adapter's outputs filled with NaN first, so that an element left
//! unwritten fails), forward, fused bias and ReLU, and the backward (dx, dw, db) through
//! candle's autograd, against gemmbridge's float64 convolution references and beside candle's
//! own CUDA convolution, on shapes with stride, padding, dilation and groups and on strided
//! and offset views.
//!
//! Bands: f32 1e-5 — the engine runs f32 as strict f32 (its cuDNN plans take no tensor-core
//! engine for f32, so no TF32, and the legacy API runs `CUDNN_FMA_MATH`); with TF32 the error
//! would be about 1e-3. f16 and bf16 1e-2 (f32 accumulation, one rounding of each output).
use crate::common::{assert_close, f64s, random, rel_err, rng};
use crate::conv_case::{db_f64, forward_f64, Case};
use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge::conv::reference;
use gemmbridge_candle::{conv2d, conv2d_candle, conv2d_served, Conv2dParams, ConvAct, Served};
use rand::rngs::StdRng;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A CUDA device with a stream of its own; the adapter's CUDA outputs start as NaN.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda_with_stream(0)
}

/// Odd sizes, stride, padding, dilation, groups, depthwise, 1×1, a non-square kernel, and
/// (the last two) strides where `h + 2·padding − dilation·(r − 1) − 1` and its width
/// counterpart leave different remainders (9 and 8 modulo 2, 6 and 10 modulo 3), which
/// candle's own conv2d backward does not take.
const CASES: [Case; 8] = [
    Case::new([2, 3, 9, 11], [5, 3, 3], Conv2dParams::new(0, 1, 1, 1)),
    Case::new([2, 16, 14, 14], [32, 3, 3], Conv2dParams::new(1, 1, 1, 1)),
    Case::new([1, 4, 11, 12], [4, 3, 2], Conv2dParams::new(2, 1, 2, 1)),
    Case::new([2, 6, 8, 7], [4, 3, 3], Conv2dParams::new(1, 1, 1, 2)),
    Case::new([2, 8, 9, 9], [8, 3, 3], Conv2dParams::new(1, 2, 1, 8)), // depthwise
    Case::new([3, 8, 5, 6], [7, 1, 1], Conv2dParams::new(0, 1, 1, 1)), // 1×1
    Case::new([2, 4, 10, 9], [6, 3, 3], Conv2dParams::new(1, 2, 1, 1)),
    Case::new([1, 6, 13, 11], [6, 5, 2], Conv2dParams::new(1, 3, 2, 3)),
];

/// The bias and activation forms: plain, fused bias + ReLU, fused bias, ReLU alone.
const FORMS: [(bool, ConvAct); 4] =
    [(false, ConvAct::None), (true, ConvAct::Relu), (true, ConvAct::None), (false, ConvAct::Relu)];

/// x, w and a bias for `case`, contiguous, on `dev`.
fn inputs(rng: &mut StdRng, case: &Case, dtype: DType, dev: &Device) -> Result<[Tensor; 3]> {
    Ok([
        random(rng, &case.x, dtype, dev)?,
        random(rng, &case.w_dims(), dtype, dev)?,
        random(rng, &[case.krs[0]], dtype, dev)?,
    ])
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_conv2d_forward_and_fused_against_float64() -> Result<()> {
    let mut rng = rng("gpu_conv2d_forward_and_fused_against_float64");
    let dev = gpu()?;
    for dtype in DTYPES {
        for (i, case) in CASES.iter().enumerate() {
            let [x, w, b] = inputs(&mut rng, case, dtype, &dev)?;
            for (with_bias, act) in FORMS {
                let what = format!("gpu conv2d case {i} {case:?} bias {with_bias} {act:?} {dtype:?}");
                let bias = with_bias.then_some(&b);
                let expected = forward_f64(case, [&x, &w], bias, act)?;
                let (y, served) = conv2d_served(&x, &w, bias, act, case.params)?;
                assert_eq!((served, y.dims()), (Served::Gemmbridge, &case.problem().y_dims()[..]), "{what}");
                assert!(y.device().is_cuda() && y.dtype() == dtype, "{what}");
                assert_close(&what, &y, &expected, dtype)?;
                // candle's own CUDA convolution, bias and relu on the same tensors
                let theirs = conv2d_candle(&x, &w, bias, act, case.params)?;
                assert_close(&format!("{what}: candle's CUDA conv2d"), &theirs, &expected, dtype)?;
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_conv2d_strided_and_offset_inputs() -> Result<()> {
    let mut rng = rng("gpu_conv2d_strided_and_offset_inputs");
    let dev = gpu()?;
    let case = Case::new([2, 6, 11, 9], [8, 3, 3], Conv2dParams::new(1, 2, 1, 2));
    let [n, c, h, iw] = case.x;
    let [k, cg, r, s] = case.w_dims();
    for dtype in DTYPES {
        let r_ = |rng: &mut StdRng, d: &[usize]| random(rng, d, dtype, &dev);
        let [x, w, b] = inputs(&mut rng, &case, dtype, &dev)?;
        // views read in place (contiguous from a start offset) and views copied first
        let x_offset = r_(&mut rng, &[n + 3, c, h, iw])?.narrow(0, 3, n)?;
        let x_transposed = r_(&mut rng, &[n, c, iw, h])?.transpose(2, 3)?;
        let w_offset = r_(&mut rng, &[k + 5, cg, r, s])?.narrow(0, 5, k)?;
        let b_offset = r_(&mut rng, &[k + 1])?.narrow(0, 1, k)?;
        let b_strided = r_(&mut rng, &[k, 2])?.narrow(1, 1, 1)?.squeeze(1)?;
        let cases = [
            ([&x_offset, &w], &b, Served::Gemmbridge),
            ([&x, &w_offset], &b_offset, Served::Gemmbridge),
            ([&x_transposed, &w], &b, Served::AfterCopy),
            ([&x, &w.transpose(2, 3)?.contiguous()?.transpose(2, 3)?], &b_strided, Served::AfterCopy),
        ];
        for (j, ([xv, wv], bv, path)) in cases.into_iter().enumerate() {
            let what = format!("gpu conv2d view {j} {dtype:?}");
            let dense = xv.is_contiguous() && wv.is_contiguous() && bv.is_contiguous();
            assert_eq!(dense, path == Served::Gemmbridge, "{what}");
            let (y, served) = conv2d_served(xv, wv, Some(bv), ConvAct::Relu, case.params)?;
            assert_eq!(served, path, "{what}");
            assert_close(&what, &y, &forward_f64(&case, [xv, wv], Some(bv), ConvAct::Relu)?, dtype)?;
        }
    }
    Ok(())
}

/// The float64 gradients of `loss = Σ y·dy` for `y = act(x ⋆ w + b)`, given the forward's `y`:
/// `g = dy` (0 where ReLU's `y ≤ 0`), then `dx`, `dw` and `db = Σ_{n, p, q} g`.
fn grads_f64(case: &Case, [x, w]: [&Tensor; 2], (y, dy): (&Tensor, &Tensor), act: ConvAct) -> Result<[Vec<f64>; 3]> {
    let p = case.problem();
    let g: Vec<f64> =
        f64s(y)?.iter().zip(f64s(dy)?).map(|(&y, d)| if act == ConvAct::Relu && y <= 0.0 { 0.0 } else { d }).collect();
    let db = db_f64(&p, &g);
    Ok([reference::backward_data(&p, &f64s(w)?, &g), reference::backward_filter(&p, &f64s(x)?, &g), db])
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_conv2d_backward_against_float64() -> Result<()> {
    let mut rng = rng("gpu_conv2d_backward_against_float64");
    let dev = gpu()?;
    for dtype in DTYPES {
        for (i, case) in CASES.iter().enumerate() {
            for (with_bias, act) in FORMS {
                let what = format!("gpu conv2d backward case {i} {case:?} bias {with_bias} {act:?} {dtype:?}");
                let [x, w, b] = inputs(&mut rng, case, dtype, &dev)?;
                let (xv, wv, bv) = (Var::from_tensor(&x)?, Var::from_tensor(&w)?, Var::from_tensor(&b)?);
                let bias = with_bias.then(|| bv.as_tensor());
                // every other case: x as a strided view of the Var (copied by the call, the
                // gradient flowing back through the copy)
                let (xt, path) = if i % 2 == 1 {
                    (xv.as_tensor().transpose(2, 3)?.contiguous()?.transpose(2, 3)?, Served::AfterCopy)
                } else {
                    (xv.as_tensor().clone(), Served::Gemmbridge)
                };
                let (y, served) = conv2d_served(&xt, wv.as_tensor(), bias, act, case.params)?;
                assert_eq!(served, path, "{what}");
                let dy = random(&mut rng, y.dims(), dtype, &dev)?;
                let grads = y.mul(&dy)?.sum_all()?.backward()?;
                let [dx, dw, db] = grads_f64(case, [xv.as_tensor(), wv.as_tensor()], (&y, &dy), act)?;
                let get = |v: &Var, name: &str| grads.get(v).cloned().unwrap_or_else(|| panic!("{what}: no {name}"));
                for (name, v, want) in [("dx", &xv, dx), ("dw", &wv, dw)] {
                    let g = get(v, name);
                    assert!(g.device().is_cuda() && g.dims() == v.dims(), "{what}: {name}");
                    assert_close(&format!("{what}: {name}"), &g, &want, dtype)?;
                }
                if with_bias {
                    assert_close(&format!("{what}: db"), &get(&bv, "db"), &db, dtype)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_conv2d_fallbacks_and_bad_input() -> Result<()> {
    let mut rng = rng("gpu_conv2d_fallbacks_and_bad_input");
    let dev = gpu()?;
    let case = CASES[3];
    // f64: candle's own CUDA convolution
    let [x, w, b] = inputs(&mut rng, &case, DType::F64, &dev)?;
    let (y, served) = conv2d_served(&x, &w, Some(&b), ConvAct::Relu, case.params)?;
    assert_eq!(served, Served::Candle);
    let e = rel_err(&f64s(&y)?, &forward_f64(&case, [&x, &w], Some(&b), ConvAct::Relu)?);
    assert!(e <= 1e-12, "f64 on candle's CUDA conv2d: {e:e}");
    // an empty batch: nothing to run
    let x0 = Tensor::zeros((0, 6, 8, 7), DType::F32, &dev)?;
    let w32 = w.to_dtype(DType::F32)?;
    let (y, served) = conv2d_served(&x0, &w32, None, ConvAct::None, case.params)?;
    assert_eq!((y.dims(), served), (&[0usize, 4, 8, 7][..], Served::Candle));
    // bad input: refused by name before anything is launched, as on the CPU
    let x32 = x.to_dtype(DType::F32)?;
    let bad = [
        (conv2d(&x32, &w32, None, ConvAct::None, Conv2dParams::new(1, 1, 1, 1)), "has 6 channels"),
        (conv2d(&x32, &w32, None, ConvAct::None, Conv2dParams::new(1, 0, 1, 2)), "stride 0"),
        (conv2d(&x32.flatten_to(1)?, &w32, None, ConvAct::None, case.params), "x must be 4-D"),
        (conv2d(&x32, &w32, Some(&x32), ConvAct::Relu, case.params), "bias must be [4]"),
        (conv2d(&x32, &w32, None, ConvAct::None, Conv2dParams::new(0, 1, 9, 2)), "larger than the padded input"),
    ];
    for (r, want) in bad {
        let e = r.expect_err("bad input was taken").to_string();
        assert!(e.starts_with("conv2d: ") && e.contains(want), "{e:?} does not name {want:?}");
    }
    Ok(())
}
