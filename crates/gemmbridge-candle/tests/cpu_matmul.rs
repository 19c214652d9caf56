//! matmul and linear on the CPU: against float64 and beside candle's own results, on odd
//! shapes, broadcast batches, transposed and offset views.

mod common;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::reference::{linear_f64, matmul_f64};
use common::{assert_close, band, f64s, random, rel_err, rng};
use gemmbridge_candle::{linear_candle, linear_served, matmul, matmul_served, Activation, Served};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Checks one product against float64 and beside candle's own, and the path it took.
fn check(what: &str, a: &Tensor, b: &Tensor, path: Served) -> Result<()> {
    let (want, dims) = matmul_f64(a, b)?;
    let (got, served) = matmul_served(a, b)?;
    assert_eq!(served, path, "{what}: path");
    assert_eq!(got.dims(), &dims[..], "{what}: shape");
    assert_close(what, &got, &want, a.dtype())?;
    let candle = a.broadcast_matmul(b)?;
    assert_close(&format!("{what}, candle's own"), &candle, &want, a.dtype())?;
    Ok(())
}

#[test]
fn matmul_broadcast_batches_transposes_and_offsets() -> Result<()> {
    let mut rng = rng("matmul_broadcast_batches_transposes_and_offsets");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &dev);
        // plain, odd sizes
        check("7x5·5x9", &r(&mut rng, &[7, 5])?, &r(&mut rng, &[5, 9])?, Served::Gemmbridge)?;
        // b broadcast over a's batch (batch stride 0)
        check("[2,3,7,5]·[5,9]", &r(&mut rng, &[2, 3, 7, 5])?, &r(&mut rng, &[5, 9])?, Served::Gemmbridge)?;
        // a broadcast over b's batch, through a size-1 batch dimension
        check("[1,7,5]·[4,5,3]", &r(&mut rng, &[1, 7, 5])?, &r(&mut rng, &[4, 5, 3])?, Served::Gemmbridge)?;
        // both transposed views (op = T), read in place
        let at = r(&mut rng, &[3, 5, 7])?.transpose(1, 2)?;
        let bt = r(&mut rng, &[3, 9, 5])?.transpose(1, 2)?;
        check("[3,7,5]ᵀ·[3,5,9]ᵀ", &at, &bt, Served::Gemmbridge)?;
        // offset views with a padded leading dimension: columns 2..7 of a [6, 11] matrix
        let a = r(&mut rng, &[6, 11])?.narrow(1, 2, 5)?;
        let b = r(&mut rng, &[2, 5, 13])?.narrow(2, 1, 4)?;
        check("offset views", &a, &b, Served::Gemmbridge)?;
        // a mixed broadcast ([2,1] against [1,4]) has no single batch stride: copied first
        check("[2,1,3,5]·[1,4,5,2]", &r(&mut rng, &[2, 1, 3, 5])?, &r(&mut rng, &[1, 4, 5, 2])?, Served::AfterCopy)?;
        // k = 1 and n = 1
        check("[5,1]·[1,1]", &r(&mut rng, &[5, 1])?, &r(&mut rng, &[1, 1])?, Served::Gemmbridge)?;
    }
    Ok(())
}

#[test]
fn what_gemmbridge_does_not_take_falls_back_to_candle() -> Result<()> {
    let mut rng = rng("what_gemmbridge_does_not_take_falls_back_to_candle");
    let dev = Device::Cpu;
    let a = random(&mut rng, &[4, 3], DType::F64, &dev)?;
    let b = random(&mut rng, &[3, 2], DType::F64, &dev)?;
    let (got, served) = matmul_served(&a, &b)?;
    assert_eq!(served, Served::Candle);
    assert!(rel_err(&f64s(&got)?, &matmul_f64(&a, &b)?.0) < 1e-12);
    // an empty k falls back too (candle's zeros)
    let (e, served) =
        matmul_served(&Tensor::zeros((2, 0), DType::F32, &dev)?, &Tensor::zeros((0, 3), DType::F32, &dev)?)?;
    assert_eq!((served, e.dims()), (Served::Candle, &[2usize, 3][..]));
    // shapes that do not agree are candle's error
    assert!(matmul(&Tensor::zeros((2, 3), DType::F32, &dev)?, &Tensor::zeros((4, 3), DType::F32, &dev)?).is_err());
    Ok(())
}

#[test]
fn matmul_backward_matches_candles() -> Result<()> {
    let mut rng = rng("matmul_backward_matches_candles");
    let dev = Device::Cpu;
    // b is broadcast over the batch: its gradient is summed over it
    let a = Var::from_tensor(&random(&mut rng, &[3, 7, 5], DType::F32, &dev)?)?;
    let b = Var::from_tensor(&random(&mut rng, &[5, 4], DType::F32, &dev)?)?;
    let w = random(&mut rng, &[3, 7, 4], DType::F32, &dev)?; // a weighted sum, so dC is not all ones
    let ours = matmul(a.as_tensor(), b.as_tensor())?.mul(&w)?.sum_all()?.backward()?;
    let theirs = a.as_tensor().broadcast_matmul(b.as_tensor())?.mul(&w)?.sum_all()?.backward()?;
    for (name, v) in [("da", &a), ("db", &b)] {
        let (g, c) = (ours.get(v).unwrap(), theirs.get(v).unwrap());
        assert_eq!(g.dims(), v.dims(), "{name}: shape");
        let e = rel_err(&f64s(g)?, &f64s(c)?);
        assert!(e <= 1e-5, "{name}: {e:e} from candle's gradient");
    }
    Ok(())
}

#[test]
fn linear_fuses_bias_and_activation() -> Result<()> {
    let mut rng = rng("linear_fuses_bias_and_activation");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        for act in [Activation::None, Activation::Relu, Activation::Gelu] {
            let x = random(&mut rng, &[2, 5, 11], dtype, &dev)?;
            let w = random(&mut rng, &[7, 11], dtype, &dev)?;
            let b = random(&mut rng, &[7], dtype, &dev)?;
            for bias in [None, Some(&b)] {
                let what = format!("linear {act:?} bias {}", bias.is_some());
                let want = linear_f64(&x, &w, bias, act)?;
                let (got, served) = linear_served(&x, &w, bias, act)?;
                assert_eq!((served, got.dims()), (Served::Gemmbridge, &[2usize, 5, 7][..]), "{what}");
                assert_close(&what, &got, &want, dtype)?;
                // candle's own layer, in the same dtype
                let c = linear_candle(&x, &w, bias, act)?;
                assert_close(&format!("{what}, candle's own"), &c, &want, dtype)?;
            }
        }
        // x whose rows do not merge into one stride (a transposed batch): copied first
        let x = random(&mut rng, &[5, 2, 11], dtype, &dev)?.transpose(0, 1)?;
        let w = random(&mut rng, &[3, 11], dtype, &dev)?;
        let (got, served) = linear_served(&x, &w, None, Activation::Relu)?;
        assert_eq!(served, Served::AfterCopy);
        assert_close("linear, transposed x", &got, &linear_f64(&x, &w, None, Activation::Relu)?, dtype)?;
    }
    Ok(())
}

/// loss = Σ y·r, so that dL/dy = r; the float64 reference is candle's autograd through its
/// own layer on float64 copies of the same values. Each gradient is within its type's band of
/// float64 or no worse than 1.5× the error of candle's own layer in the same type: a
/// half-precision GELU backward reads the pre-activation stored in that type, and a bias
/// gradient summed over few rows of mixed sign can cancel, so that the storage alone reaches
/// the band (seen for bf16 db: 1.6e-2 here against candle's own 3.1e-2; 1.17e-2 against 9.5e-3).
#[test]
fn linear_backward_against_float64() -> Result<()> {
    let mut rng = rng("linear_backward_against_float64");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        for act in [Activation::None, Activation::Relu, Activation::Gelu] {
            for with_bias in [false, true] {
                let what = format!("linear backward {act:?} bias {with_bias} {dtype:?}");
                let (x, w, b) = loop {
                    let x = Var::from_tensor(&random(&mut rng, &[2, 5, 11], dtype, &dev)?)?;
                    let w = Var::from_tensor(&random(&mut rng, &[7, 11], dtype, &dev)?)?;
                    let b = Var::from_tensor(&random(&mut rng, &[7], dtype, &dev)?)?;
                    // ReLU's derivative at exactly 0 is a convention (ours 0, as PyTorch's; candle's
                    // 1): drawn again where a pre-activation is exactly 0, which half types hit
                    let z = linear_f64(&x, &w, with_bias.then(|| b.as_tensor()), Activation::None)?;
                    if act != Activation::Relu || z.iter().all(|&v| v != 0.0) {
                        break (x, w, b);
                    }
                };
                let r = random(&mut rng, &[2, 5, 7], dtype, &dev)?;
                let bias = with_bias.then(|| b.as_tensor());
                let (y, served) = linear_served(x.as_tensor(), w.as_tensor(), bias, act)?;
                assert_eq!(served, Served::Gemmbridge, "{what}");
                let ours = y.mul(&r)?.sum_all()?.backward()?;
                // candle's own layer in the same type, on the same values
                let own = |v: &Var| Var::from_tensor(v.as_tensor());
                let (xc, wc, bc) = (own(&x)?, own(&w)?, own(&b)?);
                let yc = linear_candle(xc.as_tensor(), wc.as_tensor(), with_bias.then(|| bc.as_tensor()), act)?;
                let candles = yc.mul(&r)?.sum_all()?.backward()?;
                let f64v = |v: &Var| Var::from_tensor(&v.as_tensor().to_dtype(DType::F64)?);
                let (x64, w64, b64) = (f64v(&x)?, f64v(&w)?, f64v(&b)?);
                let y64 = linear_candle(x64.as_tensor(), w64.as_tensor(), with_bias.then(|| b64.as_tensor()), act)?;
                let want = y64.mul(&r.to_dtype(DType::F64)?)?.sum_all()?.backward()?;
                let mut pairs = vec![("dx", &x, &x64, &xc), ("dw", &w, &w64, &wc)];
                if with_bias {
                    pairs.push(("db", &b, &b64, &bc));
                }
                for (name, v, v64, vc) in pairs {
                    let g = ours.get(v).unwrap_or_else(|| panic!("{what}: no {name}"));
                    assert_eq!(g.dims(), v.dims(), "{what}: {name} shape");
                    let want = f64s(want.get(v64).unwrap())?;
                    let (e, e_candle) = (rel_err(&f64s(g)?, &want), rel_err(&f64s(candles.get(vc).unwrap())?, &want));
                    let bar = band(dtype).max(1.5 * e_candle);
                    assert!(e <= bar, "{what}: {name} relative error {e:e} above {bar:e} (candle's own {e_candle:e})");
                }
                assert_eq!(ours.get(&b).is_some(), with_bias, "{what}: db only with a bias");
            }
        }
    }
    Ok(())
}
