//! RMSNorm (forward, backward) and SDPA on the CPU: against float64 and beside candle's own
//! results, on odd shapes and strided views.

mod common;

use candle_core::{DType, Device, Result, Var};
use common::reference::{norm_f64, sdpa_f64, sdpa_loops, EPS};
use common::{assert_close, f64s, random, rel_err, rng};
use gemmbridge_candle::{rms_norm, rms_norm_candle, rms_norm_served, sdpa_candle, sdpa_served, Served};

#[test]
fn rms_norm_forward_and_backward_against_float64() -> Result<()> {
    let mut rng = rng("rms_norm_forward_and_backward_against_float64");
    let dev = Device::Cpu;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // rows of a wider tensor (a padded row stride, read in place), and a transposed batch
        // (copied first)
        let wide = random(&mut rng, &[3, 5, 40], dtype, &dev)?.narrow(2, 3, 37)?;
        let twisted = random(&mut rng, &[5, 3, 37], dtype, &dev)?.transpose(0, 1)?;
        for (x, path) in [(wide, Served::Gemmbridge), (twisted, Served::AfterCopy)] {
            let w = Var::from_tensor(&random(&mut rng, &[37], dtype, &dev)?)?;
            let xv = Var::from_tensor(&x)?;
            let dy = random(&mut rng, &[3, 5, 37], dtype, &dev)?;
            let (fwd, bwd) = norm_f64(&x, w.as_tensor(), &f64s(&dy)?)?;
            let (y, served) = rms_norm_served(&x, w.as_tensor(), EPS)?;
            assert_eq!((served, y.dims()), (path, x.dims()));
            assert_close("rms_norm y", &y, &fwd.y, dtype)?;
            assert_close("rms_norm y, candle's own", &rms_norm_candle(&x, w.as_tensor(), EPS)?, &fwd.y, dtype)?;
            // the backward: Σ y·dy, so that dL/dy = dy
            let grads = rms_norm(xv.as_tensor(), w.as_tensor(), EPS)?.mul(&dy)?.sum_all()?.backward()?;
            assert_close("rms_norm dx", grads.get(&xv).unwrap(), &bwd.dx, dtype)?;
            assert_close("rms_norm dw", grads.get(&w).unwrap(), &bwd.dw, dtype)?;
            if dtype == DType::F32 {
                // beside candle's autograd through its own operations
                let theirs = rms_norm_candle(xv.as_tensor(), w.as_tensor(), EPS)?.mul(&dy)?.sum_all()?.backward()?;
                for (name, v) in [("dx", xv.as_tensor()), ("dw", w.as_tensor())] {
                    let e = rel_err(&f64s(grads.get(v).unwrap())?, &f64s(theirs.get(v).unwrap())?);
                    assert!(e <= 1e-5, "{name}: {e:e} from candle's autograd");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn rms_norm_of_a_gradient_that_is_a_broadcast() -> Result<()> {
    // sum_all's gradient reaches the norm as a stride-0 broadcast of ones: copied contiguous
    let mut rng = rng("rms_norm_of_a_gradient_that_is_a_broadcast");
    let dev = Device::Cpu;
    let x = Var::from_tensor(&random(&mut rng, &[4, 9], DType::F32, &dev)?)?;
    let w = random(&mut rng, &[9], DType::F32, &dev)?;
    let grads = rms_norm(x.as_tensor(), &w, EPS)?.sum_all()?.backward()?;
    let (_, bwd) = norm_f64(x.as_tensor(), &w, &[1.0; 36])?;
    assert_close("dx", grads.get(&x).unwrap(), &bwd.dx, DType::F32)
}

#[test]
fn sdpa_gqa_causal_odd_lengths_and_views() -> Result<()> {
    let mut rng = rng("sdpa_gqa_causal_odd_lengths_and_views");
    let dev = Device::Cpu;
    for dtype in [DType::F16, DType::BF16] {
        for causal in [false, true] {
            // q as a [b, s, h, d] projection transposed to [b, h, s, d]: read in place
            let q = random(&mut rng, &[2, 5, 4, 16], dtype, &dev)?.transpose(1, 2)?;
            let k = random(&mut rng, &[2, 2, 7, 16], dtype, &dev)?;
            let v = random(&mut rng, &[2, 2, 7, 16], dtype, &dev)?;
            let want = sdpa_f64(&q, &k, &v, causal)?;
            let (o, served) = sdpa_served(&q, &k, &v, causal, None)?;
            assert_eq!((served, o.dims()), (Served::Gemmbridge, &[2usize, 4, 5, 16][..]), "causal {causal}");
            assert_close(&format!("sdpa causal {causal}"), &o, &want, dtype)?;
            assert_close(
                &format!("sdpa causal {causal}, candle's own"),
                &sdpa_candle(&q, &k, &v, causal, None)?,
                &want,
                dtype,
            )?;
            // the definition, written out, agrees with gemmbridge's float64 reference
            assert!(rel_err(&sdpa_loops(&q, &k, &v, causal, 0.25)?, &want) < 1e-12);
        }
    }
    Ok(())
}

#[test]
fn sdpa_falls_back_where_gemmbridge_has_no_attention() -> Result<()> {
    let mut rng = rng("sdpa_falls_back_where_gemmbridge_has_no_attention");
    let dev = Device::Cpu;
    // f32 (gemmbridge's attention is f16/bf16), and a head dimension that is not a multiple of 8
    for (dtype, d) in [(DType::F32, 16), (DType::BF16, 12)] {
        let q = random(&mut rng, &[1, 2, 3, d], dtype, &dev)?;
        let k = random(&mut rng, &[1, 1, 6, d], dtype, &dev)?;
        let v = random(&mut rng, &[1, 1, 6, d], dtype, &dev)?;
        let (o, served) = sdpa_served(&q, &k, &v, true, Some(0.3))?;
        assert_eq!(served, Served::Candle);
        let want = sdpa_loops(&q, &k, &v, true, 0.3)?;
        assert_close("sdpa fallback", &o, &want, dtype)?;
    }
    Ok(())
}

#[test]
fn a_bad_eps_or_scale_is_refused_on_every_path() -> Result<()> {
    let mut rng = rng("a_bad_eps_or_scale_is_refused_on_every_path");
    let dev = Device::Cpu;
    // bf16 is served, f64 falls back to candle: both refuse, naming the value
    for dtype in [DType::BF16, DType::F64] {
        let x = random(&mut rng, &[3, 16], dtype, &dev)?;
        let w = random(&mut rng, &[16], dtype, &dev)?;
        for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = rms_norm_served(&x, &w, eps).expect_err("a bad eps was served");
            assert!(e.to_string().contains(&format!("eps = {eps:?} is not finite and positive")), "{e}");
        }
        rms_norm_served(&x, &w, 1e-6)?;
        let q = random(&mut rng, &[1, 2, 3, 16], dtype, &dev)?;
        let k = random(&mut rng, &[1, 1, 5, 16], dtype, &dev)?;
        for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = sdpa_served(&q, &k, &k, false, Some(scale)).expect_err("a bad scale was served");
            assert!(e.to_string().contains(&format!("scale = {scale:?} is not finite and positive")), "{e}");
        }
        sdpa_served(&q, &k, &k, false, Some(0.25))?;
    }
    Ok(())
}
