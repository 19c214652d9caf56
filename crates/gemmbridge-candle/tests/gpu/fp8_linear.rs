//! `fp8_linear` on a Hopper GPU (compute capability 9.0, cuBLASLt ≥ 12.9: row-wise and block
//! scales), with the `cuda` feature: gemmbridge's quantisation kernels and FP8 GEMM on candle's
//! CUDA tensors (outputs filled with NaN first), against float64 within 1.5× the recipe's own
//! error (its emulation: both operands quantised by `gemmbridge::fp8::quantize`, the product in
//! float64), beside the CPU path and candle's own bf16 product, for odd and large row counts;
//! the weight's bytes and scales against the CPU's; the backward.
use crate::common::{band, f64s, random, rel_err, rng};
use crate::fp8_ref::{emulated, exact};
use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge_candle::{fp8_linear, fp8_linear_served, Fp8Scaling, Fp8Weight, Served};

const SCALINGS: [Fp8Scaling; 2] = [Fp8Scaling::RowWise, Fp8Scaling::Block];

/// A CUDA device with a stream of its own; the adapter's CUDA outputs start as NaN.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda_with_stream(0)
}

/// The recipe's emulation (x and w quantised by gemmbridge's CPU quantisation, the product in
/// float64) and the float64 product of the unquantised values, both with the bias.
fn references(x: &Tensor, w: &Tensor, b: Option<&Tensor>, scaling: Fp8Scaling) -> Result<[Vec<f64>; 2]> {
    Ok([emulated(x, w, b, scaling)?, exact(x, w, b)?])
}

/// The band of an FP8 GEMM's output against its emulation, gemmbridge's own (`gemmbridge::fp8`:
/// bf16/f16 outputs within 1e-2, f32 within 1e-3: cuBLASLt's FP8 accumulation is not the
/// CPU's f32 sum).
fn fp8_band(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-3
    } else {
        1e-2
    }
}

/// [`crate::fp8_ref::check_recipe`] within `dtype`'s FP8 band of the emulation.
fn check_recipe(what: &str, got: &Tensor, refs: [&[f64]; 2], dtype: DType) -> Result<()> {
    crate::fp8_ref::check_recipe(what, got, refs, fp8_band(dtype)).map(|_| ())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_fp8_linear_both_recipes_odd_and_large_rows() -> Result<()> {
    let mut rng = rng("gpu_fp8_linear_both_recipes_odd_and_large_rows");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    // (rows, in, out): one row, odd rows with K and N off 16, and the staged output rows of
    // block scales (M not a multiple of 16), 1000 and 1031 rows (≥ 1024), N past one 128-block
    let shapes = [(1usize, 200usize, 17usize), (17, 256, 40), (1000, 136, 72), (1031, 384, 130)];
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for scaling in SCALINGS {
            for &(m, k, n) in &shapes {
                let x = random(&mut rng, &[m, k], dtype, &cpu)?;
                let w = random(&mut rng, &[n, k], DType::F32, &cpu)?;
                let b = random(&mut rng, &[n], dtype, &cpu)?;
                let wq = Fp8Weight::quantize(&w.to_device(&dev)?, scaling)?;
                assert!(wq.served(), "{scaling:?}: the GPU or cuBLASLt lacks the recipe (Hopper, cuBLASLt ≥ 12.9)");
                let wq_cpu = Fp8Weight::quantize(&w, scaling)?;
                let (xg, bg) = (x.to_device(&dev)?, b.to_device(&dev)?);
                for bias in [None, Some((&b, &bg))] {
                    let what = format!("gpu {dtype:?} {scaling:?} [{m}, {k}]·[{n}, {k}]ᵀ bias {}", bias.is_some());
                    let (y, served) = fp8_linear_served(&xg, &wq, bias.map(|b| b.1))?;
                    assert_eq!(served, Served::Gemmbridge, "{what}");
                    assert!(y.device().is_cuda() && y.dtype() == dtype && y.dims() == [m, n], "{what}");
                    let refs = references(&x, &w, bias.map(|b| b.0), scaling)?;
                    check_recipe(&what, &y, [&refs[0], &refs[1]], dtype)?;
                    // the CPU path quantises x to the same bits: f32 accumulation apart
                    let on_cpu = fp8_linear(&x, &wq_cpu, bias.map(|b| b.0))?;
                    let e = rel_err(&f64s(&y)?, &f64s(&on_cpu)?);
                    assert!(e <= fp8_band(dtype), "{what}: {e:e} from the CPU path");
                }
                if dtype == DType::BF16 {
                    // candle's own bf16 product on the unquantised weight, for scale
                    let theirs = xg.matmul(&w.to_dtype(dtype)?.t()?.contiguous()?.to_device(&dev)?)?;
                    let e = rel_err(&f64s(&theirs)?, &references(&x, &w, None, scaling)?[1]);
                    println!("candle's CUDA bf16 matmul [{m}, {k}]·[{n}, {k}]ᵀ: {e:.3e} from float64");
                    assert!(e <= band(dtype), "candle's bf16 matmul: {e:e}");
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_fp8_weight_is_the_cpus_bit_for_bit() -> Result<()> {
    let mut rng = rng("gpu_fp8_weight_is_the_cpus_bit_for_bit");
    let dev = gpu()?;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for scaling in SCALINGS {
            // a transposed view of [300, 133]: the weight [133, 300], copied dense on the GPU
            let w = random(&mut rng, &[300, 133], dtype, &Device::Cpu)?;
            let on_gpu = Fp8Weight::quantize(&w.to_device(&dev)?.t()?, scaling)?;
            let on_cpu = Fp8Weight::quantize(&w.t()?, scaling)?;
            assert!(on_gpu.served(), "{scaling:?}: not quantised by the GPU");
            assert_eq!(on_gpu.to_quantized()?, on_cpu.to_quantized()?, "{dtype:?} {scaling:?}");
            let (dg, dc) = (on_gpu.dequantize()?, on_cpu.dequantize()?);
            assert!(dg.device().is_cuda());
            assert_eq!(f64s(&dg)?, f64s(&dc)?, "{dtype:?} {scaling:?}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_fp8_linear_backward_strided_and_offset_x() -> Result<()> {
    let mut rng = rng("gpu_fp8_linear_backward_strided_and_offset_x");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in [DType::BF16, DType::F32] {
        for scaling in SCALINGS {
            let what = format!("gpu backward {dtype:?} {scaling:?}");
            let (x, w, b) = (
                random(&mut rng, &[3, 37, 136], dtype, &cpu)?,
                random(&mut rng, &[72, 136], DType::F32, &cpu)?,
                random(&mut rng, &[72], dtype, &cpu)?,
            );
            let r = random(&mut rng, &[3, 37, 72], dtype, &cpu)?;
            let grads = |dev: &Device| -> Result<(Vec<f64>, Vec<f64>)> {
                let (xv, bv) = (Var::from_tensor(&x.to_device(dev)?)?, Var::from_tensor(&b.to_device(dev)?)?);
                let wq = Fp8Weight::quantize(&w.to_device(dev)?, scaling)?;
                let y = fp8_linear(xv.as_tensor(), &wq, Some(bv.as_tensor()))?;
                let g = y.mul(&r.to_device(dev)?)?.sum_all()?.backward()?;
                let (dx, db) = (g.get(&xv).expect("dx"), g.get(&bv).expect("db"));
                assert_eq!(dx.device().is_cuda(), dev.is_cuda());
                Ok((f64s(dx)?, f64s(db)?))
            };
            let ((dx, db), (dx_cpu, db_cpu)) = (grads(&dev)?, grads(&cpu)?);
            let (ex, eb) = (rel_err(&dx, &dx_cpu), rel_err(&db, &db_cpu));
            assert!(ex <= band(dtype).max(1e-4) && eb <= band(dtype).max(1e-4), "{what}: dx {ex:e}, db {eb:e}");
        }
    }
    // a transposed x on the GPU: copied dense first, the same result
    let x = random(&mut rng, &[136, 19], DType::BF16, &cpu)?.to_device(&dev)?.t()?;
    let wq =
        Fp8Weight::quantize(&random(&mut rng, &[24, 136], DType::BF16, &cpu)?.to_device(&dev)?, Fp8Scaling::Block)?;
    let (y, served) = fp8_linear_served(&x, &wq, None)?;
    assert_eq!(served, Served::AfterCopy);
    let (y2, _) = fp8_linear_served(&x.contiguous()?, &wq, None)?;
    assert_eq!(f64s(&y)?, f64s(&y2)?);
    // x and the bias dense but starting past their storage's first element (6 and 2 bytes
    // past 16-byte alignment): read in place, the same result as fresh copies
    let mut bf = |d: &[usize]| random(&mut rng, d, DType::BF16, &cpu)?.to_device(&dev);
    let xo = bf(&[3 + 19 * 136])?.narrow(0, 3, 19 * 136)?.reshape((19, 136))?;
    let bo = bf(&[25])?.narrow(0, 1, 24)?;
    let (y, served) = fp8_linear_served(&xo, &wq, Some(&bo))?;
    assert_eq!(served, Served::Gemmbridge);
    assert_eq!(f64s(&y)?, f64s(&fp8_linear(&xo.copy()?, &wq, Some(&bo.copy()?))?)?);
    Ok(())
}
