//! The grouped matmul of a mixture-of-experts layer on a GPU, with the `cuda` feature: on
//! candle's CUDA tensors (the adapter's outputs filled with NaN first, so that an element left
//! unwritten fails) against float64, beside candle's own CUDA result through
//! `grouped_matmul_candle` and beside the CPU path, forward and backward, on odd sizes (an
//! expert of 0 rows among them) and strided views.
use crate::common::reference::grouped_f64;
use crate::common::{assert_close, f64s, random, rel_err, rng};
use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge_candle::{grouped_matmul, grouped_matmul_candle, grouped_matmul_served, Served};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Five experts, one of them without rows: R = 30.
const SIZES: [usize; 5] = [3, 0, 17, 1, 9];
const R: usize = 30;
const K: usize = 24;
const N: usize = 40;

/// A CUDA device with a stream of its own; the adapter's CUDA outputs start as NaN.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda_with_stream(0)
}

/// Asserts `a` within `dtype`'s band of `b` (tensors on any device).
fn assert_near(what: &str, a: &Tensor, b: &Tensor, dtype: DType) -> Result<()> {
    let e = rel_err(&f64s(a)?, &f64s(b)?);
    assert!(e <= crate::common::band(dtype), "{what}: relative difference {e:e}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_grouped_matmul_odd_sizes_and_views() -> Result<()> {
    let mut rng = rng("gpu_grouped_matmul_odd_sizes_and_views");
    let dev = gpu()?;
    for dtype in DTYPES {
        // made on the CPU, moved whole; the views are taken on the GPU
        let mut r = |d: &[usize]| random(&mut rng, d, dtype, &Device::Cpu)?.to_device(&dev);
        let w = r(&[SIZES.len(), N, K])?;
        let cases = [
            (r(&[R, K])?, w.clone(), Served::Gemmbridge),
            (r(&[R + 7, K])?.narrow(0, 4, R)?, w.clone(), Served::Gemmbridge), // an offset x
            (r(&[K, R])?.t()?, w.clone(), Served::AfterCopy),                  // a transposed x
            (r(&[R, K])?, r(&[SIZES.len(), K, N])?.transpose(1, 2)?, Served::AfterCopy),
            (r(&[R, K + 6])?.narrow(1, 3, K)?, w.clone(), Served::AfterCopy), // padded rows
        ];
        for (i, (x, w, path)) in cases.iter().enumerate() {
            let what = format!("gpu grouped_matmul case {i} {dtype:?}");
            let [want, _, _] = grouped_f64(x, w, &Tensor::zeros((R, N), dtype, &Device::Cpu)?, &SIZES)?;
            let (y, served) = grouped_matmul_served(x, w, &SIZES)?;
            assert_eq!((served, y.dims(), y.dtype()), (*path, &[R, N][..], dtype), "{what}");
            assert!(y.device().is_cuda() && y.is_contiguous(), "{what}");
            assert_close(&what, &y, &want, dtype)?;
            let theirs = grouped_matmul_candle(x, w, &SIZES)?;
            assert_close(&format!("{what}, candle's own"), &theirs, &want, dtype)?;
            assert_near(&format!("{what}: from grouped_matmul_candle"), &y, &theirs, dtype)?;
            let (xc, wc) = (x.to_device(&Device::Cpu)?, w.to_device(&Device::Cpu)?);
            assert_near(&format!("{what}: from the CPU path"), &y, &grouped_matmul(&xc, &wc, &SIZES)?, dtype)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_grouped_matmul_backward() -> Result<()> {
    let mut rng = rng("gpu_grouped_matmul_backward");
    let dev = gpu()?;
    for dtype in DTYPES {
        let mut r = |d: &[usize]| random(&mut rng, d, dtype, &Device::Cpu)?.to_device(&dev);
        let w = Var::from_tensor(&r(&[SIZES.len(), N, K])?)?;
        // x contiguous (in place), and a transposed Var (copied first; its gradient transposed back)
        let xv = Var::from_tensor(&r(&[R, K])?)?;
        let tv = Var::from_tensor(&r(&[K, R])?)?;
        let xt = tv.as_tensor().t()?;
        let dy = r(&[R, N])?;
        for (x, var, path) in [(xv.as_tensor(), &xv, Served::Gemmbridge), (&xt, &tv, Served::AfterCopy)] {
            let what = format!("gpu grouped_matmul backward {path:?} {dtype:?}");
            let [_, want_dx, want_dw] = grouped_f64(x, w.as_tensor(), &dy, &SIZES)?;
            let (y, served) = grouped_matmul_served(x, w.as_tensor(), &SIZES)?;
            assert_eq!(served, path, "{what}");
            let grads = y.mul(&dy)?.sum_all()?.backward()?;
            let gx = grads.get(var.as_tensor()).expect("dx");
            let gx = if path == Served::AfterCopy { gx.t()? } else { gx.clone() };
            let gw = grads.get(w.as_tensor()).expect("dw");
            assert!(gx.device().is_cuda() && gw.device().is_cuda(), "{what}");
            assert_close(&format!("{what}: dx"), &gx, &want_dx, dtype)?;
            assert_close(&format!("{what}: dw"), gw, &want_dw, dtype)?;
            // the expert without rows gets a gradient of exactly zero (never the NaN poison)
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
#[ignore = "needs a CUDA GPU"]
fn gpu_grouped_matmul_fallback_and_bad_input() -> Result<()> {
    let mut rng = rng("gpu_grouped_matmul_fallback_and_bad_input");
    let dev = gpu()?;
    // f64 on the GPU: candle's own CUDA operations
    let x = random(&mut rng, &[R, K], DType::F64, &Device::Cpu)?;
    let w = random(&mut rng, &[SIZES.len(), N, K], DType::F64, &Device::Cpu)?;
    let (y, served) = grouped_matmul_served(&x.to_device(&dev)?, &w.to_device(&dev)?, &SIZES)?;
    assert_eq!((served, y.dims()), (Served::Candle, &[R, N][..]));
    let [want, _, _] = grouped_f64(&x, &w, &Tensor::zeros((R, N), DType::F64, &Device::Cpu)?, &SIZES)?;
    assert!(rel_err(&f64s(&y)?, &want) <= 1e-12);
    // named errors before anything runs
    let z = |d: &[usize]| Tensor::zeros(d, DType::F32, &dev);
    let (x, w) = (z(&[R, K])?, z(&[SIZES.len(), N, K])?);
    let cases: [(Tensor, Tensor, &[usize], &str); 5] = [
        (x.clone(), w.clone(), &SIZES[..4], "4 group sizes for the E = 5 experts"),
        (x.clone(), w.clone(), &[3, 0, 17, 1, 8], "do not add up to x's R = 30"),
        (z(&[R, K + 1])?, w.clone(), &SIZES, "x's K = 25 is not w's K = 24"),
        (z(&[1, R, K])?, w.clone(), &SIZES, "x must be 2-D"),
        (x.clone(), z(&[N, K])?, &SIZES, "w must be 3-D"),
    ];
    for (x, w, sizes, words) in &cases {
        let e = grouped_matmul(x, w, sizes).expect_err(words).to_string();
        assert!(e.contains("grouped_matmul: ") && e.contains(words), "{words}: {e}");
    }
    Ok(())
}
