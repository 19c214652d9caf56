//! The grouped matmul of a mixture-of-experts layer on the CPU, forward and backward: against
//! float64 computed here, beside `grouped_matmul_candle` and candle's autograd through it, on
//! odd sizes (an expert of 0 rows among them) and strided views, with the path each call took.

mod common;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::reference::grouped_f64;
use common::{assert_close, f64s, random, rel_err, rng};
use gemmbridge_candle::{grouped_matmul, grouped_matmul_candle, grouped_matmul_served, Served};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Five experts, one of them without rows: R = 30.
const SIZES: [usize; 5] = [3, 0, 17, 1, 9];
const R: usize = 30;
const K: usize = 24;
const N: usize = 40;

/// Asserts `a` within `dtype`'s band of `b` (both tensors).
fn assert_near(what: &str, a: &Tensor, b: &Tensor, dtype: DType) -> Result<()> {
    let e = rel_err(&f64s(a)?, &f64s(b)?);
    assert!(e <= common::band(dtype), "{what}: relative difference {e:e}");
    Ok(())
}

#[test]
fn grouped_matmul_against_float64_on_odd_sizes_and_views() -> Result<()> {
    let mut rng = rng("grouped_matmul_against_float64_on_odd_sizes_and_views");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &dev);
        let w = r(&mut rng, &[SIZES.len(), N, K])?;
        let cases = [
            (r(&mut rng, &[R, K])?, w.clone(), Served::Gemmbridge),
            (r(&mut rng, &[R + 7, K])?.narrow(0, 4, R)?, w.clone(), Served::Gemmbridge), // an offset x
            (r(&mut rng, &[K, R])?.t()?, w.clone(), Served::AfterCopy),                  // a transposed x
            (r(&mut rng, &[R, K])?, r(&mut rng, &[SIZES.len(), K, N])?.transpose(1, 2)?, Served::AfterCopy),
            (r(&mut rng, &[R, K + 6])?.narrow(1, 3, K)?, w.clone(), Served::AfterCopy), // padded rows
        ];
        for (i, (x, w, path)) in cases.iter().enumerate() {
            let what = format!("grouped_matmul case {i} {dtype:?}");
            let dy = Tensor::zeros((R, N), dtype, &dev)?;
            let [want, _, _] = grouped_f64(x, w, &dy, &SIZES)?;
            let (y, served) = grouped_matmul_served(x, w, &SIZES)?;
            assert_eq!((served, y.dims(), y.dtype()), (*path, &[R, N][..], dtype), "{what}");
            assert!(y.is_contiguous(), "{what}");
            assert_close(&what, &y, &want, dtype)?;
            let theirs = grouped_matmul_candle(x, w, &SIZES)?;
            assert_close(&format!("{what}, candle's own"), &theirs, &want, dtype)?;
            assert_near(&format!("{what}: from grouped_matmul_candle"), &y, &theirs, dtype)?;
            assert_eq!(f64s(&grouped_matmul(x, w, &SIZES)?)?, f64s(&y)?, "{what}: grouped_matmul");
        }
    }
    Ok(())
}

#[test]
fn grouped_matmul_falls_back_to_candle() -> Result<()> {
    let mut rng = rng("grouped_matmul_falls_back_to_candle");
    let dev = Device::Cpu;
    // f64: candle's own, against float64
    let x = random(&mut rng, &[R, K], DType::F64, &dev)?;
    let w = random(&mut rng, &[SIZES.len(), N, K], DType::F64, &dev)?;
    let (y, served) = grouped_matmul_served(&x, &w, &SIZES)?;
    assert_eq!((served, y.dims(), y.dtype()), (Served::Candle, &[R, N][..], DType::F64));
    let [want, _, _] = grouped_f64(&x, &w, &Tensor::zeros((R, N), DType::F64, &dev)?, &SIZES)?;
    assert!(rel_err(&f64s(&y)?, &want) <= 1e-12);
    // no rows at all: every expert empty
    let x0 = Tensor::zeros((0, K), DType::F32, &dev)?;
    let w0 = random(&mut rng, &[3, N, K], DType::F32, &dev)?;
    let (y0, served) = grouped_matmul_served(&x0, &w0, &[0, 0, 0])?;
    assert_eq!((served, y0.dims()), (Served::Candle, &[0, N][..]));
    Ok(())
}

#[test]
fn grouped_matmul_backward_against_float64_and_candle_autograd() -> Result<()> {
    let mut rng = rng("grouped_matmul_backward_against_float64_and_candle_autograd");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        let w = Var::from_tensor(&random(&mut rng, &[SIZES.len(), N, K], dtype, &dev)?)?;
        // x contiguous (in place), and a transposed Var (copied first; its gradient transposed back)
        let xv = Var::from_tensor(&random(&mut rng, &[R, K], dtype, &dev)?)?;
        let tv = Var::from_tensor(&random(&mut rng, &[K, R], dtype, &dev)?)?;
        let xt = tv.as_tensor().t()?;
        let dy = random(&mut rng, &[R, N], dtype, &dev)?;
        for (x, var, path) in [(xv.as_tensor(), &xv, Served::Gemmbridge), (&xt, &tv, Served::AfterCopy)] {
            let what = format!("grouped_matmul backward {path:?} {dtype:?}");
            let [_, want_dx, want_dw] = grouped_f64(x, w.as_tensor(), &dy, &SIZES)?;
            let (y, served) = grouped_matmul_served(x, w.as_tensor(), &SIZES)?;
            assert_eq!(served, path, "{what}");
            let grads = y.mul(&dy)?.sum_all()?.backward()?;
            let gx = grads.get(var.as_tensor()).expect("dx");
            let gx = if path == Served::AfterCopy { gx.t()? } else { gx.clone() };
            let gw = grads.get(w.as_tensor()).expect("dw");
            assert_eq!((gx.dims(), gw.dims()), (&[R, K][..], &[SIZES.len(), N, K][..]), "{what}");
            assert_close(&format!("{what}: dx"), &gx, &want_dx, dtype)?;
            assert_close(&format!("{what}: dw"), gw, &want_dw, dtype)?;
            // the expert without rows gets a gradient of exactly zero
            assert!(f64s(&gw.get(1)?)?.iter().all(|&v| v == 0.0), "{what}: dw of the empty expert");
            let theirs = grouped_matmul_candle(x, w.as_tensor(), &SIZES)?.mul(&dy)?.sum_all()?.backward()?;
            let tx = theirs.get(var.as_tensor()).expect("candle's dx");
            let tx = if path == Served::AfterCopy { tx.t()? } else { tx.clone() };
            assert_near(&format!("{what}: dx from candle's autograd"), &gx, &tx, dtype)?;
            let tw = theirs.get(w.as_tensor()).expect("candle's dw");
            assert_near(&format!("{what}: dw from candle's autograd"), gw, tw, dtype)?;
        }
    }
    Ok(())
}

#[test]
fn grouped_matmul_refuses_bad_input_by_name() -> Result<()> {
    let dev = Device::Cpu;
    let z = |d: &[usize]| Tensor::zeros(d, DType::F32, &dev);
    let (x, w) = (z(&[R, K])?, z(&[SIZES.len(), N, K])?);
    let cases: [(Tensor, Tensor, &[usize], &str); 6] = [
        (x.clone(), w.clone(), &SIZES[..4], "4 group sizes for the E = 5 experts"),
        (x.clone(), w.clone(), &[3, 0, 17, 1, 8], "do not add up to x's R = 30"),
        (z(&[R, K + 1])?, w.clone(), &SIZES, "x's K = 25 is not w's K = 24"),
        (z(&[1, R, K])?, w.clone(), &SIZES, "x must be 2-D"),
        (x.clone(), z(&[N, K])?, &SIZES, "w must be 3-D"),
        (x.clone(), w.to_dtype(DType::F16)?, &SIZES, "x is F32 but w is F16"),
    ];
    for (x, w, sizes, words) in &cases {
        for r in [grouped_matmul(x, w, sizes), grouped_matmul_candle(x, w, sizes)] {
            let e = r.expect_err(words).to_string();
            assert!(e.contains("grouped_matmul: ") && e.contains(words), "{words}: {e}");
        }
    }
    Ok(())
}
