//! RoPE and SwiGLU on a GPU, with the `cuda` feature: each on candle's CUDA tensors (the
//! adapter's outputs filled with NaN first) against float64, beside candle's own CUDA result
//! through the `*_candle` fallbacks and beside the CPU path (gemmbridge's layer kernels and its
//! CPU backend compute the same operations in the same order: equal bits), forward and
//! backward, on odd shapes and strided views.
use crate::common::{assert_close, f64s, random, rel_err, rng};
use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge_candle::{rope_candle, rope_served, swiglu_candle, swiglu_served, RopeStyle, Served};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const STYLES: [RopeStyle; 2] = [RopeStyle::RotateHalf, RopeStyle::Interleaved];

/// A CUDA device with a stream of its own; the adapter's CUDA outputs start as NaN.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda_with_stream(0)
}

/// LLaMA's tables `[rows, d/2]` (θ = 10 000) in `dtype`, on the CPU.
fn tables(rows: usize, d: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
    let half = d / 2;
    let angle = |e: usize| (e / half) as f64 * 10_000f64.powf(-2.0 * (e % half) as f64 / d as f64);
    let cos: Vec<f32> = (0..rows * half).map(|e| angle(e).cos() as f32).collect();
    let sin: Vec<f32> = (0..rows * half).map(|e| angle(e).sin() as f32).collect();
    let t = |v| Tensor::from_vec(v, (rows, half), &Device::Cpu)?.to_dtype(dtype);
    Ok((t(cos)?, t(sin)?))
}

/// RoPE by its definition in float64 (tables `[T, d/2]`); `sign = −1` for the backward.
fn rope_f64(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle, sign: f64) -> Result<Vec<f64>> {
    let (b, h, t, d) = x.dims4()?;
    let (half, xv, cv, sv) = (d / 2, f64s(x)?, f64s(cos)?, f64s(sin)?);
    let mut out = xv.clone();
    for row in 0..b * h * t {
        let (p, base) = (row % t, row * d);
        for i in 0..half {
            let (c, s) = (cv[p * half + i], sign * sv[p * half + i]);
            let (e1, e2) = if style == RopeStyle::RotateHalf { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (x1, x2) = (xv[base + e1], xv[base + e2]);
            out[base + e1] = x1 * c - x2 * s;
            out[base + e2] = x2 * c + x1 * s;
        }
    }
    Ok(out)
}

/// SwiGLU in float64 over the rows of `gu[.., 2f]`: `y`, or with `dy` the gradient `dgu`.
fn swiglu_f64(gu: &[f64], f: usize, dy: Option<&[f64]>) -> Vec<f64> {
    let sig = |g: f64| 1.0 / (1.0 + (-g).exp());
    let mut out = Vec::new();
    for (r, row) in gu.chunks(2 * f).enumerate() {
        let (g, u) = row.split_at(f);
        match dy {
            None => out.extend((0..f).map(|j| g[j] * sig(g[j]) * u[j])),
            Some(dy) => {
                let dy = &dy[r * f..][..f];
                out.extend((0..f).map(|j| dy[j] * u[j] * sig(g[j]) * (1.0 + g[j] * (1.0 - sig(g[j])))));
                out.extend((0..f).map(|j| dy[j] * g[j] * sig(g[j])));
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_rope_forward_odd_shapes_and_views() -> Result<()> {
    let mut rng = rng("gpu_rope_forward_odd_shapes_and_views");
    let dev = gpu()?;
    for dtype in DTYPES {
        let (c6, s6) = tables(45, 6, dtype)?;
        let (c128, s128) = tables(50, 128, dtype)?;
        let (c128, s128) = (c128.narrow(0, 7, 37)?, s128.narrow(0, 7, 37)?);
        let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &Device::Cpu);
        let cases = [
            (r(&mut rng, &[2, 5, 37, 6])?, [&c6, &s6], Served::Gemmbridge),
            (r(&mut rng, &[2, 5, 37, 10])?.narrow(3, 2, 6)?, [&c6, &s6], Served::Gemmbridge),
            (r(&mut rng, &[2, 37, 5, 6])?.transpose(1, 2)?, [&c6, &s6], Served::AfterCopy),
            (r(&mut rng, &[1, 5, 37, 128])?, [&c128, &s128], Served::Gemmbridge),
            (r(&mut rng, &[3, 8, 1, 128])?, [&c128, &s128], Served::Gemmbridge), // one token (decoding)
        ];
        for (k, (x, [c, s], path)) in cases.iter().enumerate() {
            // moved with its strides kept; the tables' offsets too
            let (xg, cg, sg) = (x.to_device(&dev)?, c.to_device(&dev)?, s.to_device(&dev)?);
            for style in STYLES {
                let what = format!("gpu rope case {k} {style:?} {dtype:?}");
                let (y, served) = rope_served(&xg, &cg, &sg, style)?;
                assert_eq!((served, y.dims()), (*path, x.dims()), "{what}");
                assert!(y.device().is_cuda() && y.is_contiguous(), "{what}");
                assert_close(&what, &y, &rope_f64(&x.contiguous()?, c, s, style, 1.0)?, dtype)?;
                let (cpu, _) = rope_served(x, c, s, style)?;
                assert_eq!(f64s(&y)?, f64s(&cpu)?, "{what}: the CPU path's bits");
                let theirs = rope_candle(&xg, &cg, &sg, style)?;
                let e = rel_err(&f64s(&y)?, &f64s(&theirs)?);
                assert!(e <= crate::common::band(dtype), "{what}: {e:e} from candle's CUDA rope_candle");
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_rope_backward_and_fallback() -> Result<()> {
    let mut rng = rng("gpu_rope_backward_and_fallback");
    let dev = gpu()?;
    for dtype in DTYPES {
        let (c, s) = tables(37, 64, dtype)?;
        let (cg, sg) = (c.to_device(&dev)?, s.to_device(&dev)?);
        for style in STYLES {
            let what = format!("gpu rope backward {style:?} {dtype:?}");
            let x = random(&mut rng, &[2, 37, 5, 64], dtype, &Device::Cpu)?; // [b, t, h, d]
            let dy = random(&mut rng, &[2, 5, 37, 64], dtype, &Device::Cpu)?;
            let xv = Var::from_tensor(&x.to_device(&dev)?)?;
            let xt = xv.as_tensor().transpose(1, 2)?;
            let (y, served) = rope_served(&xt, &cg, &sg, style)?;
            assert_eq!(served, Served::AfterCopy, "{what}");
            let grads = y.mul(&dy.to_device(&dev)?)?.sum_all()?.backward()?;
            let dx = grads.get(&xv).expect("dx").transpose(1, 2)?;
            assert!(dx.device().is_cuda());
            assert_close(&what, &dx, &rope_f64(&dy, &c, &s, style, -1.0)?, dtype)?;
            if dtype == DType::F32 {
                let theirs = rope_candle(&xt, &cg, &sg, style)?.mul(&dy.to_device(&dev)?)?.sum_all()?.backward()?;
                let e = rel_err(&f64s(grads.get(&xv).unwrap())?, &f64s(theirs.get(&xv).unwrap())?);
                assert!(e <= 1e-5, "{what}: {e:e} from candle's CUDA autograd");
            }
        }
    }
    // f64: candle's own operations on the GPU
    let x = random(&mut rng, &[2, 5, 37, 6], DType::F64, &Device::Cpu)?;
    let (c, s) = tables(37, 6, DType::F64)?;
    let (y, served) =
        rope_served(&x.to_device(&dev)?, &c.to_device(&dev)?, &s.to_device(&dev)?, RopeStyle::RotateHalf)?;
    assert_eq!(served, Served::Candle);
    assert!(rel_err(&f64s(&y)?, &rope_f64(&x, &c, &s, RopeStyle::RotateHalf, 1.0)?) <= 1e-12);
    // tables that do not fit: refused before anything runs
    let e = rope_served(
        &x.to_device(&dev)?,
        &c.to_device(&dev)?,
        &s.narrow(1, 0, 2)?.to_device(&dev)?,
        RopeStyle::Interleaved,
    )
    .expect_err("tables that do not fit were taken");
    assert!(e.to_string().starts_with("rope: cos [37, 3] and sin [37, 2] do not fit"), "{e}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_swiglu_forward_and_backward() -> Result<()> {
    let mut rng = rng("gpu_swiglu_forward_and_backward");
    let dev = gpu()?;
    for dtype in DTYPES {
        for f in [3, 17, 1024] {
            let what = format!("gpu swiglu f {f} {dtype:?}");
            let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &Device::Cpu);
            let cases = [
                (r(&mut rng, &[3, 37, 2 * f])?, Served::Gemmbridge),
                (r(&mut rng, &[3, 37, 2 * f + 5])?.narrow(2, 1, 2 * f)?, Served::Gemmbridge),
                (r(&mut rng, &[37, 3, 2 * f])?.transpose(0, 1)?, Served::AfterCopy),
            ];
            for (k, (gu, path)) in cases.iter().enumerate() {
                let gg = gu.to_device(&dev)?;
                let (y, served) = swiglu_served(&gg)?;
                assert_eq!((served, y.dims()), (*path, &[3usize, 37, f][..]), "{what} case {k}");
                assert_close(&format!("{what} case {k}"), &y, &swiglu_f64(&f64s(gu)?, f, None), dtype)?;
                assert_eq!(f64s(&y)?, f64s(&swiglu_served(gu)?.0)?, "{what} case {k}: the CPU path's bits");
                let e = rel_err(&f64s(&y)?, &f64s(&swiglu_candle(&gg)?)?);
                assert!(e <= crate::common::band(dtype), "{what} case {k}: {e:e} from candle's CUDA swiglu_candle");
            }
            // the backward, in place on padded rows of a wider Var
            let wide = Var::from_tensor(&r(&mut rng, &[3, 37, 2 * f + 5])?.to_device(&dev)?)?;
            let gu = wide.as_tensor().narrow(2, 1, 2 * f)?;
            let dy = r(&mut rng, &[3, 37, f])?;
            let grads = swiglu_served(&gu)?.0.mul(&dy.to_device(&dev)?)?.sum_all()?.backward()?;
            let g = grads.get(&wide).expect("dgu");
            let want = swiglu_f64(&f64s(&gu)?, f, Some(&f64s(&dy)?));
            assert_close(&format!("{what}: dgu"), &g.narrow(2, 1, 2 * f)?, &want, dtype)?;
            if dtype == DType::F32 {
                let theirs = swiglu_candle(&gu)?.mul(&dy.to_device(&dev)?)?.sum_all()?.backward()?;
                let e = rel_err(&f64s(g)?, &f64s(theirs.get(&wide).unwrap())?);
                assert!(e <= 1e-5, "{what}: {e:e} from candle's CUDA autograd");
            }
        }
    }
    Ok(())
}
