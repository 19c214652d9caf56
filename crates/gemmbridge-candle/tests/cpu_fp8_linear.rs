//! `fp8_linear` on the CPU (gemmbridge's FP8 quantisation, an f32 product on the dequantised
//! operands): against float64 within 1.5× the recipe's own error (its emulation: both operands
//! quantised by `gemmbridge::fp8::quantize`, the product in float64), beside that emulation,
//! for row-wise and block scales, with a bias, odd and strided shapes; the weight's bytes and
//! scales against gemmbridge's quantisation; the backward's dx and d(bias); bad input.

mod common;
#[path = "common/fp8.rs"]
mod fp8_ref;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::{band, f64s, random, rel_err, rng};
use fp8_ref::{emulated, exact, f32s, product};
use gemmbridge::fp8::{self, Fp8Format, Source};
use gemmbridge_candle::{fp8_linear, fp8_linear_candle, fp8_linear_served, Fp8Scaling, Fp8Weight, Served};

const SCALINGS: [Fp8Scaling; 2] = [Fp8Scaling::RowWise, Fp8Scaling::Block];

/// [`fp8_ref::check_recipe`] within `dtype`'s band of the emulation.
fn check_recipe(what: &str, got: &Tensor, refs: [&[f64]; 2], dtype: DType) -> Result<f64> {
    fp8_ref::check_recipe(what, got, refs, band(dtype))
}

#[test]
fn fp8_linear_within_the_recipes_error_on_odd_shapes() -> Result<()> {
    let mut rng = rng("fp8_linear_within_the_recipes_error_on_odd_shapes");
    let cpu = Device::Cpu;
    // (x's dims, out): one row, 17 rows with K = 200 (not a multiple of 16 or 128), a 3-D x
    // with more than one 128-block of outputs and of K
    let shapes: [(&[usize], usize); 3] = [(&[1, 200], 17), (&[17, 256], 40), (&[2, 5, 300], 130)];
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for scaling in SCALINGS {
            for (i, &(xd, n)) in shapes.iter().enumerate() {
                let k = xd[xd.len() - 1];
                let x = random(&mut rng, xd, dtype, &cpu)?;
                let w = random(&mut rng, &[n, k], DType::F32, &cpu)?;
                let b = random(&mut rng, &[n], dtype, &cpu)?;
                let wq = Fp8Weight::quantize(&w, scaling)?;
                for bias in [None, Some(&b)] {
                    let what = format!("{dtype:?} {scaling:?} case {i} bias {}", bias.is_some());
                    let (y, served) = fp8_linear_served(&x, &wq, bias)?;
                    assert_eq!(served, Served::Gemmbridge, "{what}");
                    assert_eq!((y.dtype(), &y.dims()[..xd.len() - 1]), (dtype, &xd[..xd.len() - 1]), "{what}");
                    assert_eq!(y.dims()[xd.len() - 1], n, "{what}");
                    let (emu, ex) = (emulated(&x, &w, bias, scaling)?, exact(&x, &w, bias)?);
                    check_recipe(&what, &y, [&emu, &ex], dtype)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn the_two_recipes_quantise_differently_and_each_call_follows_its_own() -> Result<()> {
    // x and w whose magnitudes change along K from one 128-block to the next, by 10⁵ in
    // opposite directions: one scale per row puts x's small block and w's other blocks into
    // E4M3's subnormals, a scale per block does not; the recipes' results then differ by more
    // than the band that pins each call to its own recipe
    let mut rng = rng("the_two_recipes_quantise_differently_and_each_call_follows_its_own");
    let (m, n, k) = (9usize, 140usize, 384usize);
    let ramp = |small: bool| {
        let v: Vec<f32> = (0..k)
            .map(|c| {
                if c / 128 == 1 {
                    if small {
                        1e-5
                    } else {
                        1e5
                    }
                } else {
                    1.0
                }
            })
            .collect();
        Tensor::from_vec(v, k, &Device::Cpu)
    };
    let x = random(&mut rng, &[m, k], DType::F32, &Device::Cpu)?.broadcast_mul(&ramp(true)?)?.to_dtype(DType::BF16)?;
    let w = random(&mut rng, &[n, k], DType::F32, &Device::Cpu)?.broadcast_mul(&ramp(false)?)?;
    let ex = exact(&x, &w, None)?;
    let emu: Vec<Vec<f64>> = SCALINGS.iter().map(|&s| emulated(&x, &w, None, s)).collect::<Result<_>>()?;
    let apart = rel_err(&emu[0], &emu[1]);
    assert!(apart > 2.0 * band(DType::BF16), "the recipes' emulations are only {apart:e} apart");
    let mut errors = Vec::new();
    for (s, e) in SCALINGS.iter().zip(&emu) {
        let y = fp8_linear(&x, &Fp8Weight::quantize(&w, *s)?, None)?;
        errors.push(check_recipe(&format!("ramped {s:?}"), &y, [e, &ex], DType::BF16)?);
    }
    // block scales follow the ramp that a row's single scale cannot
    assert!(errors[1] < 0.5 * errors[0], "block {:e} not below row-wise {:e}", errors[1], errors[0]);
    Ok(())
}

#[test]
fn the_weight_holds_gemmbridges_quantisation_bit_for_bit() -> Result<()> {
    let mut rng = rng("the_weight_holds_gemmbridges_quantisation_bit_for_bit");
    for dtype in [DType::F32, DType::BF16] {
        for scaling in SCALINGS {
            // a transposed view: quantised from its logical [out, in] order
            let w = random(&mut rng, &[300, 133], dtype, &Device::Cpu)?.t()?;
            let (n, k) = w.dims2()?;
            let wq = Fp8Weight::quantize(&w, scaling)?;
            assert_eq!((wq.out_features(), wq.in_features(), wq.scaling()), (133, 300, scaling));
            assert!(wq.served());
            let want = fp8::quantize(&f32s(&w)?, n, k, Source::RowMajor, Fp8Format::E4M3, scaling.w_scaling()).unwrap();
            let got = wq.to_quantized()?;
            assert_eq!(got.layout.scaling, scaling.w_scaling());
            assert_eq!(got, want, "{dtype:?} {scaling:?}");
            let deq: Vec<f64> = fp8::dequantize(&want).unwrap().into_iter().map(|v| v as f32 as f64).collect();
            let d = wq.dequantize()?;
            assert_eq!((d.dims(), d.dtype()), (&[n, k][..], DType::F32));
            assert_eq!(f64s(&d)?, deq, "{dtype:?} {scaling:?}");
            // within E4M3's rounding (half of 2⁻³ relative, or below the group's smallest step)
            let e = rel_err(&deq, &f64s(&w)?);
            assert!(e > 1e-3 && e < 0.0625, "{dtype:?} {scaling:?}: dequantised weight {e:e} from w");
        }
    }
    Ok(())
}

#[test]
fn strided_x_is_copied_offsets_are_read_in_place_and_empty_rows_give_an_empty_output() -> Result<()> {
    let mut rng = rng("strided_x_is_copied_offsets_are_read_in_place_and_empty_rows_give_an_empty_output");
    let w = random(&mut rng, &[24, 40], DType::F32, &Device::Cpu)?;
    let wq = Fp8Weight::quantize(&w, Fp8Scaling::Block)?;
    let x = random(&mut rng, &[40, 6], DType::BF16, &Device::Cpu)?.t()?;
    let (y, served) = fp8_linear_served(&x, &wq, None)?;
    assert_eq!(served, Served::AfterCopy);
    let (y2, served2) = fp8_linear_served(&x.contiguous()?, &wq, None)?;
    assert_eq!(served2, Served::Gemmbridge);
    assert_eq!(f64s(&y)?, f64s(&y2)?);
    // x and the bias dense but starting past their storage's first element: read in place
    let xo = random(&mut rng, &[3 + 6 * 40], DType::BF16, &Device::Cpu)?.narrow(0, 3, 240)?.reshape((6, 40))?;
    let bo = random(&mut rng, &[25], DType::BF16, &Device::Cpu)?.narrow(0, 1, 24)?;
    assert!(xo.is_contiguous() && xo.layout().start_offset() == 3);
    let (y, served) = fp8_linear_served(&xo, &wq, Some(&bo))?;
    assert_eq!(served, Served::Gemmbridge);
    assert_eq!(f64s(&y)?, f64s(&fp8_linear(&xo.copy()?, &wq, Some(&bo.copy()?))?)?);
    let empty = Tensor::zeros((3, 0, 40), DType::BF16, &Device::Cpu)?;
    let (e, served) = fp8_linear_served(&empty, &wq, None)?;
    assert_eq!((e.dims(), served), (&[3, 0, 24][..], Served::Candle));
    Ok(())
}

#[test]
fn the_candle_fallback_is_x_times_the_dequantised_weight() -> Result<()> {
    let mut rng = rng("the_candle_fallback_is_x_times_the_dequantised_weight");
    let (x, w, b) = (
        random(&mut rng, &[2, 7, 48], DType::F32, &Device::Cpu)?,
        random(&mut rng, &[33, 48], DType::F32, &Device::Cpu)?,
        random(&mut rng, &[33], DType::F32, &Device::Cpu)?,
    );
    let wq = Fp8Weight::quantize(&w, Fp8Scaling::RowWise)?;
    let want = product(&f64s(&x)?, &f64s(&wq.dequantize()?)?, Some(&f64s(&b)?), (33, 48));
    let got = fp8_linear_candle(&x, &wq, Some(&b))?;
    let e = rel_err(&f64s(&got)?, &want);
    assert!(e <= band(DType::F32), "fallback: {e:e}");
    Ok(())
}

#[test]
fn backward_gives_dx_through_the_dequantised_weight_and_the_bias_gradient() -> Result<()> {
    let mut rng = rng("backward_gives_dx_through_the_dequantised_weight_and_the_bias_gradient");
    let cpu = Device::Cpu;
    for dtype in [DType::BF16, DType::F32] {
        for scaling in SCALINGS {
            let (rows, n, k) = ([3usize, 11usize], 36usize, 136usize);
            let x = Var::from_tensor(&random(&mut rng, &[rows[0], rows[1], k], dtype, &cpu)?)?;
            let b = Var::from_tensor(&random(&mut rng, &[n], dtype, &cpu)?)?;
            let wq = Fp8Weight::quantize(&random(&mut rng, &[n, k], DType::F32, &cpu)?, scaling)?;
            let r = random(&mut rng, &[rows[0], rows[1], n], dtype, &cpu)?;
            let what = format!("{dtype:?} {scaling:?}");
            for with_bias in [false, true] {
                let y = fp8_linear(x.as_tensor(), &wq, with_bias.then(|| b.as_tensor()))?;
                let grads = y.mul(&r)?.sum_all()?.backward()?;
                // dx = r·W (the dequantised weight), in float64
                let (rv, wd) = (f64s(&r)?, f64s(&wq.dequantize()?)?);
                let mut want = vec![0f64; rows[0] * rows[1] * k];
                for (i, row) in want.chunks_mut(k).enumerate() {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = (0..n).map(|j| rv[i * n + j] * wd[j * k + c]).sum();
                    }
                }
                let dx = grads.get(&x).unwrap_or_else(|| panic!("{what}: no dx"));
                assert_eq!(dx.dims(), x.dims());
                let e = rel_err(&f64s(dx)?, &want);
                assert!(e <= band(dtype), "{what}: dx {e:e}");
                match grads.get(&b) {
                    Some(db) => {
                        assert!(with_bias, "{what}: a bias gradient without a bias");
                        let want: Vec<f64> = (0..n).map(|j| rv.chunks(n).map(|row| row[j]).sum()).collect();
                        let e = rel_err(&f64s(db)?, &want);
                        assert!(e <= band(dtype), "{what}: db {e:e}");
                    }
                    None => assert!(!with_bias, "{what}: no bias gradient"),
                }
            }
        }
    }
    Ok(())
}

/// The error's message, which must name the values at fault.
fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
    format!("{}", r.expect_err("an error was expected"))
}

#[test]
fn bad_input_is_refused_by_name_before_anything_runs() -> Result<()> {
    let cpu = Device::Cpu;
    let w = Tensor::ones((5, 8), DType::F32, &cpu)?;
    let wq = Fp8Weight::quantize(&w, Fp8Scaling::RowWise)?;
    let cases: Vec<(String, &[&str])> = vec![
        (message(Fp8Weight::quantize(&Tensor::ones(8, DType::F32, &cpu)?, Fp8Scaling::RowWise)), &["[out, in]", "[8]"]),
        (message(Fp8Weight::quantize(&w.to_dtype(DType::F64)?, Fp8Scaling::Block)), &["F64"]),
        (
            message(Fp8Weight::quantize(&Tensor::ones((0, 8), DType::F32, &cpu)?, Fp8Scaling::Block)),
            &["[0, 8]", "empty"],
        ),
        (message(Fp8Weight::quantize(&w.affine(0.0, f64::NAN)?, Fp8Scaling::RowWise)), &["40 NaN or infinite"]),
        (message(Fp8Weight::quantize(&(&w / 0.0)?, Fp8Scaling::Block)), &["40 NaN or infinite"]),
        (message(fp8_linear(&Tensor::ones((3, 7), DType::BF16, &cpu)?, &wq, None)), &["is 7", "[5, 8]"]),
        (message(fp8_linear(&Tensor::ones((3, 8), DType::F64, &cpu)?, &wq, None)), &["F64"]),
        (message(fp8_linear(&Tensor::new(1f32, &cpu)?, &wq, None)), &["rank"]),
        (
            message(fp8_linear(
                &Tensor::ones((3, 8), DType::BF16, &cpu)?,
                &wq,
                Some(&Tensor::ones(6, DType::BF16, &cpu)?),
            )),
            &["[5]", "[6]"],
        ),
        (
            message(fp8_linear(
                &Tensor::ones((3, 8), DType::BF16, &cpu)?,
                &wq,
                Some(&Tensor::ones(5, DType::F32, &cpu)?),
            )),
            &["BF16", "F32"],
        ),
    ];
    for (i, (msg, want)) in cases.iter().enumerate() {
        for w in *want {
            assert!(msg.contains(w), "case {i}: {msg:?} does not name {w:?}");
        }
    }
    // one infinite value among finite ones is counted
    let mut v = vec![0.5f32; 40];
    v[17] = f32::INFINITY;
    let one = Tensor::from_vec(v, (5, 8), &cpu)?.to_dtype(DType::BF16)?;
    assert!(message(Fp8Weight::quantize(&one, Fp8Scaling::RowWise)).contains("1 NaN or infinite"));
    Ok(())
}
