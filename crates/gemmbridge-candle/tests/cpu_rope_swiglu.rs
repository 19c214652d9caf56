//! RoPE (rotate-half and interleaved) and SwiGLU on the CPU, forward and backward: against
//! float64 computed here, beside the `*_candle` fallbacks and candle's autograd through them,
//! on odd shapes and strided views, with the path each call took.

mod common;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::{assert_close, f64s, random, rel_err, rng};
use gemmbridge_candle::{
    rope, rope_candle, rope_i, rope_served, swiglu, swiglu_candle, swiglu_served, RopeStyle, Served,
};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const STYLES: [RopeStyle; 2] = [RopeStyle::RotateHalf, RopeStyle::Interleaved];

/// LLaMA's tables `[rows, d/2]`: `cos(p·θ^(−2i/d))`, `sin(…)` with θ = 10 000, in `dtype`.
fn tables(rows: usize, d: usize, dtype: DType, dev: &Device) -> Result<(Tensor, Tensor)> {
    let half = d / 2;
    let angle = |e: usize| (e / half) as f64 * 10_000f64.powf(-2.0 * (e % half) as f64 / d as f64);
    let cos: Vec<f32> = (0..rows * half).map(|e| angle(e).cos() as f32).collect();
    let sin: Vec<f32> = (0..rows * half).map(|e| angle(e).sin() as f32).collect();
    let t = |v| Tensor::from_vec(v, (rows, half), dev)?.to_dtype(dtype);
    Ok((t(cos)?, t(sin)?))
}

/// RoPE by its definition in float64 on `x[b, h, t, d]`'s values and the tables' (`[T, d/2]`
/// or `[b, T, d/2]`); `sign = −1` rotates by the opposite angles (the backward).
fn rope_ref(x: &[f64], dims: [usize; 4], [cos, sin]: [&Tensor; 2], style: RopeStyle, sign: f64) -> Result<Vec<f64>> {
    let [b, h, t, d] = dims;
    let half = d / 2;
    let (cv, sv) = (f64s(cos)?, f64s(sin)?);
    let at = |tab: &Tensor, n: usize, p: usize, i: usize| {
        let r = tab.dims()[tab.rank() - 2];
        if tab.rank() == 3 {
            (n * r + p) * half + i
        } else {
            p * half + i
        }
    };
    let mut out = x.to_vec();
    for (n, hh, p) in (0..b).flat_map(|n| (0..h).flat_map(move |hh| (0..t).map(move |p| (n, hh, p)))) {
        let base = ((n * h + hh) * t + p) * d;
        for i in 0..half {
            let (c, s) = (cv[at(cos, n, p, i)], sign * sv[at(sin, n, p, i)]);
            let (e1, e2) = match style {
                RopeStyle::RotateHalf => (i, i + half),
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            };
            let (x1, x2) = (x[base + e1], x[base + e2]);
            out[base + e1] = x1 * c - x2 * s;
            out[base + e2] = x2 * c + x1 * s;
        }
    }
    Ok(out)
}

/// [`rope_ref`] of a tensor.
fn rope_f64(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle, sign: f64) -> Result<Vec<f64>> {
    let (b, h, t, d) = x.dims4()?;
    rope_ref(&f64s(x)?, [b, h, t, d], [cos, sin], style, sign)
}

fn sigmoid(g: f64) -> f64 {
    1.0 / (1.0 + (-g).exp())
}

/// SwiGLU in float64 over the rows of `gu[.., 2f]` (values in logical order): `y`, and with
/// `dy` the gradient `dgu` (`[dg | du]` per row).
fn swiglu_ref(gu: &[f64], f: usize, dy: Option<&[f64]>) -> Vec<f64> {
    let mut out = Vec::new();
    for (r, row) in gu.chunks(2 * f).enumerate() {
        let (g, u) = row.split_at(f);
        match dy {
            None => out.extend((0..f).map(|j| g[j] * sigmoid(g[j]) * u[j])),
            Some(dy) => {
                let dy = &dy[r * f..][..f];
                out.extend((0..f).map(|j| dy[j] * u[j] * sigmoid(g[j]) * (1.0 + g[j] * (1.0 - sigmoid(g[j])))));
                out.extend((0..f).map(|j| dy[j] * g[j] * sigmoid(g[j])));
            }
        }
    }
    out
}

#[test]
fn rope_against_float64_on_odd_shapes_and_views() -> Result<()> {
    let mut rng = rng("rope_against_float64_on_odd_shapes_and_views");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        let (c6, s6) = tables(45, 6, dtype, &dev)?; // T = 45 > t: rows past t unread
        let (c128, s128) = tables(50, 128, dtype, &dev)?;
        let (c128, s128) = (c128.narrow(0, 7, 37)?, s128.narrow(0, 7, 37)?); // positions 7..44
        let (c3d, s3d) = (c6.unsqueeze(0)?, s6.unsqueeze(0)?); // one table per sequence, b = 1
        let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &dev);
        let cases = [
            (r(&mut rng, &[2, 5, 37, 6])?, [&c6, &s6], Served::Gemmbridge),
            (r(&mut rng, &[2, 5, 37, 10])?.narrow(3, 2, 6)?, [&c6, &s6], Served::Gemmbridge), // padded rows
            (r(&mut rng, &[2, 37, 5, 6])?.transpose(1, 2)?, [&c6, &s6], Served::AfterCopy),   // [b, t, h, d]
            (r(&mut rng, &[1, 5, 37, 128])?, [&c128, &s128], Served::Gemmbridge),             // b·h odd
            (r(&mut rng, &[1, 5, 37, 6])?, [&c3d, &s3d], Served::Gemmbridge),
            (r(&mut rng, &[1, 1, 1, 6])?, [&c6, &s6], Served::Gemmbridge),
        ];
        for (k, (x, [c, s], path)) in cases.iter().enumerate() {
            for style in STYLES {
                let what = format!("rope case {k} {style:?} {dtype:?}");
                let want = rope_f64(x, c, s, style, 1.0)?;
                let (y, served) = rope_served(x, c, s, style)?;
                assert_eq!((served, y.dims(), y.dtype()), (*path, x.dims(), dtype), "{what}");
                assert!(y.is_contiguous(), "{what}");
                assert_close(&what, &y, &want, dtype)?;
                let theirs = rope_candle(x, c, s, style)?;
                assert!(theirs.is_contiguous(), "{what}");
                assert_close(&format!("{what}, candle's own"), &theirs, &want, dtype)?;
                let e = rel_err(&f64s(&y)?, &f64s(&theirs)?);
                assert!(e <= common::band(dtype), "{what}: {e:e} from rope_candle");
                let public = if style == RopeStyle::RotateHalf { rope(x, c, s)? } else { rope_i(x, c, s)? };
                assert_eq!(f64s(&public)?, f64s(&y)?, "{what}: rope/rope_i");
            }
        }
    }
    Ok(())
}

#[test]
fn rope_falls_back_to_candle_where_gemmbridge_has_no_rope() -> Result<()> {
    let mut rng = rng("rope_falls_back_to_candle_where_gemmbridge_has_no_rope");
    let dev = Device::Cpu;
    let (c, s) = tables(37, 6, DType::F64, &dev)?;
    // f64 (computed in f64), a head dimension past gemmbridge's 512, tables per sequence with
    // b > 1, an empty x
    let (cw, sw) = tables(37, 514, DType::F32, &dev)?;
    let per_seq = (
        Tensor::stack(&[&c.narrow(0, 0, 37)?, &c.narrow(0, 0, 37)?.sqr()?], 0)?,
        Tensor::stack(&[&s.narrow(0, 0, 37)?, &s.narrow(0, 0, 37)?.sqr()?], 0)?,
    );
    let cases = [
        (random(&mut rng, &[2, 5, 37, 6], DType::F64, &dev)?, c.clone(), s.clone(), 1e-12),
        (random(&mut rng, &[1, 2, 37, 514], DType::F32, &dev)?, cw, sw, 1e-5),
        (random(&mut rng, &[2, 3, 37, 6], DType::BF16, &dev)?, per_seq.0, per_seq.1, 1e-2),
        (random(&mut rng, &[2, 5, 0, 6], DType::F32, &dev)?, c.clone(), s.clone(), 0.0),
    ];
    for (k, (x, c, s, band)) in cases.iter().enumerate() {
        for style in STYLES {
            let (y, served) = rope_served(x, c, s, style)?;
            assert_eq!((served, y.dims(), y.dtype()), (Served::Candle, x.dims(), x.dtype()), "case {k}");
            if y.elem_count() > 0 {
                let e = rel_err(&f64s(&y)?, &rope_f64(x, c, s, style, 1.0)?);
                assert!(e <= *band, "case {k} {style:?}: {e:e}");
            }
        }
    }
    // f64 tables with an f32 x: served, the tables rounded to f32
    let x = random(&mut rng, &[2, 5, 37, 6], DType::F32, &dev)?;
    let (y, served) = rope_served(&x, &c, &s, RopeStyle::RotateHalf)?;
    assert_eq!(served, Served::Gemmbridge);
    assert_close("rope with f64 tables", &y, &rope_f64(&x, &c, &s, RopeStyle::RotateHalf, 1.0)?, DType::F32)
}

#[test]
fn rope_backward_against_float64_and_candle_autograd() -> Result<()> {
    let mut rng = rng("rope_backward_against_float64_and_candle_autograd");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        let (c, s) = tables(37, 6, dtype, &dev)?;
        let cv = Var::from_tensor(&c)?; // the tables get no gradient
        for style in STYLES {
            let what = format!("rope backward {style:?} {dtype:?}");
            // x contiguous (served in place), and a [b, t, h, d] Var transposed (copied first)
            let xv = Var::from_tensor(&random(&mut rng, &[2, 5, 37, 6], dtype, &dev)?)?;
            let tv = Var::from_tensor(&random(&mut rng, &[2, 37, 5, 6], dtype, &dev)?)?;
            let dy = random(&mut rng, &[2, 5, 37, 6], dtype, &dev)?;
            let want = rope_f64(&dy, &c, &s, style, -1.0)?;
            let xt = tv.as_tensor().transpose(1, 2)?;
            for (x, var, path) in [(xv.as_tensor(), &xv, Served::Gemmbridge), (&xt, &tv, Served::AfterCopy)] {
                let (y, served) = rope_served(x, cv.as_tensor(), &s, style)?;
                assert_eq!(served, path, "{what}");
                let grads = y.mul(&dy)?.sum_all()?.backward()?;
                assert!(grads.get(&cv).is_none(), "{what}: a gradient for cos");
                let dx = grads.get(var).expect("dx").clone();
                let dx = if var.dims() == x.dims() { dx } else { dx.transpose(1, 2)? };
                assert_close(&format!("{what}: dx {path:?}"), &dx, &want, dtype)?;
                if dtype == DType::F32 {
                    let theirs = rope_candle(x, &c, &s, style)?.mul(&dy)?.sum_all()?.backward()?;
                    let e = rel_err(&f64s(grads.get(var).unwrap())?, &f64s(theirs.get(var).unwrap())?);
                    assert!(e <= 1e-5, "{what}: {e:e} from candle's autograd");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn rope_gradient_by_finite_differences_in_float64() -> Result<()> {
    // L(x) = Σ rope(x)·r; its gradient from the served backward against central differences of
    // the float64 definition (b·h = 3: the duplicated key head of an odd count)
    let mut rng = rng("rope_gradient_by_finite_differences_in_float64");
    let dev = Device::Cpu;
    let dims = [1, 3, 4, 6];
    let (c, s) = tables(4, 6, DType::F32, &dev)?;
    for style in STYLES {
        let x = Var::from_tensor(&random(&mut rng, &dims, DType::F32, &dev)?)?;
        let r = random(&mut rng, &dims, DType::F32, &dev)?;
        let y = match style {
            RopeStyle::RotateHalf => rope(x.as_tensor(), &c, &s)?,
            RopeStyle::Interleaved => rope_i(x.as_tensor(), &c, &s)?,
        };
        let grads = y.mul(&r)?.sum_all()?.backward()?;
        let (x64, r64) = (f64s(x.as_tensor())?, f64s(&r)?);
        let loss = |v: &[f64]| -> Result<f64> {
            Ok(rope_ref(v, dims, [&c, &s], style, 1.0)?.iter().zip(&r64).map(|(a, b)| a * b).sum())
        };
        let eps = 1e-3;
        let mut fd = Vec::with_capacity(x64.len());
        for k in 0..x64.len() {
            let (mut up, mut down) = (x64.clone(), x64.clone());
            up[k] += eps;
            down[k] -= eps;
            fd.push((loss(&up)? - loss(&down)?) / (2.0 * eps));
        }
        assert_close(&format!("rope dx {style:?} by differences"), grads.get(&x).unwrap(), &fd, DType::F32)?;
    }
    Ok(())
}

#[test]
fn rope_refuses_tables_that_do_not_fit_on_every_path() -> Result<()> {
    let dev = Device::Cpu;
    for dtype in [DType::F32, DType::F64] {
        let z = |d: &[usize]| Tensor::zeros(d, dtype, &dev);
        let x = z(&[2, 5, 37, 6])?;
        let bad_tables = [
            (z(&[37, 3])?, z(&[37, 4])?, "cos [37, 3] and sin [37, 4] do not fit x [2, 5, 37, 6]"),
            (z(&[36, 3])?, z(&[36, 3])?, "cos [36, 3] and sin [36, 3] do not fit"), // T < t
            (z(&[3, 37, 3])?, z(&[3, 37, 3])?, "do not fit"),                       // b = 3, not 2
            (z(&[37, 3])?, z(&[2, 37, 3])?, "do not fit"),                          // 2-D and 3-D
        ];
        for (c, s, msg) in &bad_tables {
            for e in [
                rope_served(&x, c, s, RopeStyle::RotateHalf).err(),
                rope_candle(&x, c, s, RopeStyle::Interleaved).err(),
            ] {
                let e = e.expect("tables that do not fit were taken").to_string();
                assert!(e.starts_with("rope: ") && e.contains(msg), "{e}");
            }
        }
        let odd = rope(&z(&[1, 1, 4, 5])?, &z(&[4, 2])?, &z(&[4, 2])?).expect_err("an odd d was taken");
        assert!(odd.to_string().contains("d = 5 even"), "{odd}");
        let flat = rope(&z(&[5, 37, 6])?, &z(&[37, 3])?, &z(&[37, 3])?).expect_err("a 3-D x was taken");
        assert!(flat.to_string().contains("rope: x must be [b, h, t, d], not [5, 37, 6]"), "{flat}");
    }
    let ints = Tensor::zeros((1, 1, 4, 6), DType::U32, &dev)?;
    let c = Tensor::zeros((4, 3), DType::F32, &dev)?;
    let e = rope(&ints, &c, &c).expect_err("a u32 x was taken");
    assert!(e.to_string().contains("rope: x, cos and sin must be of float dtypes"), "{e}");
    Ok(())
}

#[test]
fn swiglu_against_float64_on_odd_widths_and_views() -> Result<()> {
    let mut rng = rng("swiglu_against_float64_on_odd_widths_and_views");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        for f in [3, 17] {
            let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &dev);
            let cases = [
                (r(&mut rng, &[3, 37, 2 * f])?, Served::Gemmbridge),
                (r(&mut rng, &[3, 37, 2 * f + 5])?.narrow(2, 1, 2 * f)?, Served::Gemmbridge), // padded rows
                (r(&mut rng, &[37, 3, 2 * f])?.transpose(0, 1)?, Served::AfterCopy),          // rows that do not merge
                (r(&mut rng, &[3, 2 * f, 37])?.transpose(1, 2)?, Served::AfterCopy),          // a strided last dim
                (r(&mut rng, &[2 * f])?, Served::Gemmbridge),
            ];
            for (k, (gu, path)) in cases.iter().enumerate() {
                let what = format!("swiglu case {k} f {f} {dtype:?}");
                let want = swiglu_ref(&f64s(gu)?, f, None);
                let (y, served) = swiglu_served(gu)?;
                let mut dims = gu.dims().to_vec();
                *dims.last_mut().unwrap() = f;
                assert_eq!((served, y.dims(), y.dtype()), (*path, &dims[..], dtype), "{what}");
                assert!(y.is_contiguous(), "{what}");
                assert_close(&what, &y, &want, dtype)?;
                let theirs = swiglu_candle(gu)?;
                assert_close(&format!("{what}, candle's own"), &theirs, &want, dtype)?;
                let e = rel_err(&f64s(&y)?, &f64s(&theirs)?);
                assert!(e <= common::band(dtype), "{what}: {e:e} from swiglu_candle");
                assert_eq!(f64s(&swiglu(gu)?)?, f64s(&y)?, "{what}: swiglu");
            }
        }
    }
    Ok(())
}

#[test]
fn swiglu_falls_back_and_refuses_odd_widths() -> Result<()> {
    let mut rng = rng("swiglu_falls_back_and_refuses_odd_widths");
    let dev = Device::Cpu;
    let gu = random(&mut rng, &[3, 37, 34], DType::F64, &dev)?;
    let (y, served) = swiglu_served(&gu)?;
    assert_eq!((served, y.dims()), (Served::Candle, &[3usize, 37, 17][..]));
    assert!(rel_err(&f64s(&y)?, &swiglu_ref(&f64s(&gu)?, 17, None)) <= 1e-12);
    for empty in [&[0usize, 6][..], &[4, 0]] {
        let (y, served) = swiglu_served(&Tensor::zeros(empty, DType::F32, &dev)?)?;
        assert_eq!((served, y.dims()), (Served::Candle, &[empty[0], empty[1] / 2][..]));
    }
    for dtype in [DType::BF16, DType::F64] {
        let e = swiglu_served(&Tensor::zeros((3, 7), dtype, &dev)?).expect_err("an odd width was taken");
        assert!(e.to_string().contains("swiglu: gu must be [.., 2·f] with an even last dimension, not [3, 7]"), "{e}");
        let e = swiglu_candle(&Tensor::zeros((), dtype, &dev)?).expect_err("a scalar was taken");
        assert!(e.to_string().starts_with("swiglu: "), "{e}");
    }
    let e = swiglu(&Tensor::zeros((2, 4), DType::U32, &dev)?).expect_err("u32 was taken");
    assert!(e.to_string().contains("swiglu: gu must be of a float dtype"), "{e}");
    Ok(())
}

#[test]
fn swiglu_backward_against_float64_and_candle_autograd() -> Result<()> {
    let mut rng = rng("swiglu_backward_against_float64_and_candle_autograd");
    let dev = Device::Cpu;
    for dtype in DTYPES {
        for f in [3, 17] {
            let what = format!("swiglu backward f {f} {dtype:?}");
            // a dense Var, and padded rows of a wider Var (read in place; dgu padded the same way)
            let dense = Var::from_tensor(&random(&mut rng, &[3, 37, 2 * f], dtype, &dev)?)?;
            let wide = Var::from_tensor(&random(&mut rng, &[3, 37, 2 * f + 5], dtype, &dev)?)?;
            let padded = wide.as_tensor().narrow(2, 1, 2 * f)?;
            let dy = random(&mut rng, &[3, 37, f], dtype, &dev)?;
            for (gu, var) in [(dense.as_tensor(), &dense), (&padded, &wide)] {
                let (y, served) = swiglu_served(gu)?;
                assert_eq!(served, Served::Gemmbridge, "{what}");
                let grads = y.mul(&dy)?.sum_all()?.backward()?;
                let g = grads.get(var).expect("dgu");
                let dgu = if var.dims() == gu.dims() { g.clone() } else { g.narrow(2, 1, 2 * f)? };
                let want = swiglu_ref(&f64s(gu)?, f, Some(&f64s(&dy)?));
                assert_close(&format!("{what}: dgu"), &dgu, &want, dtype)?;
                if var.dims() != gu.dims() {
                    // the padding's gradient is zero (candle's narrow backward), never NaN
                    let pad = Tensor::cat(&[g.narrow(2, 0, 1)?, g.narrow(2, 2 * f + 1, 4)?], 2)?;
                    assert!(f64s(&pad)?.iter().all(|v| *v == 0.0), "{what}: padding");
                }
                if dtype == DType::F32 {
                    let theirs = swiglu_candle(gu)?.mul(&dy)?.sum_all()?.backward()?;
                    let e = rel_err(&f64s(g)?, &f64s(theirs.get(var).unwrap())?);
                    assert!(e <= 1e-5, "{what}: {e:e} from candle's autograd");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn swiglu_gradient_by_finite_differences_in_float64() -> Result<()> {
    let mut rng = rng("swiglu_gradient_by_finite_differences_in_float64");
    let dev = Device::Cpu;
    let gu = Var::from_tensor(&(random(&mut rng, &[5, 6], DType::F32, &dev)? * 3.0)?)?;
    let r = random(&mut rng, &[5, 3], DType::F32, &dev)?;
    let grads = swiglu(gu.as_tensor())?.mul(&r)?.sum_all()?.backward()?;
    let (g64, r64) = (f64s(gu.as_tensor())?, f64s(&r)?);
    let loss = |v: &[f64]| swiglu_ref(v, 3, None).iter().zip(&r64).map(|(a, b)| a * b).sum::<f64>();
    let eps = 1e-5;
    let fd: Vec<f64> = (0..g64.len())
        .map(|k| {
            let (mut up, mut down) = (g64.clone(), g64.clone());
            up[k] += eps;
            down[k] -= eps;
            (loss(&up) - loss(&down)) / (2.0 * eps)
        })
        .collect();
    assert_close("swiglu dgu by differences", grads.get(&gu).unwrap(), &fd, DType::F32)
}

#[test]
fn a_nan_left_in_an_output_never_passes() -> Result<()> {
    // the CPU path starts its outputs (and RoPE's scratch) as NaN; one element left unwritten
    // makes the comparison infinite
    let mut rng = rng("a_nan_left_in_an_output_never_passes");
    let dev = Device::Cpu;
    let x = random(&mut rng, &[1, 3, 5, 6], DType::F32, &dev)?;
    let (c, s) = tables(5, 6, DType::F32, &dev)?;
    let mut y = f64s(&rope(&x, &c, &s)?)?;
    let want = rope_f64(&x, &c, &s, RopeStyle::RotateHalf, 1.0)?;
    assert!(rel_err(&y, &want) <= 1e-5);
    y[17] = f64::NAN;
    assert_eq!(rel_err(&y, &want), f64::INFINITY);
    Ok(())
}
