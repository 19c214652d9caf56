//! The CUDA path on a GPU, with the `cuda` feature: each operation on candle's CUDA tensors
//! (a device with its own stream, and one on the per-thread stream), against float64 and beside
//! the CPU path and candle's own CUDA result, on odd shapes and strided views.
#![cfg(feature = "cuda")]

mod common;
#[path = "common/llama.rs"]
mod llama_check;
#[path = "common/sdpa_grad.rs"]
mod sdpa_grad;

/// `conv2d` on the GPU.
#[path = "gpu/conv.rs"]
mod conv;
#[path = "common/conv.rs"]
mod conv_case;
/// `fp8_linear` on the GPU.
#[path = "gpu/fp8_linear.rs"]
mod fp8_linear;
#[path = "common/fp8.rs"]
mod fp8_ref;
/// The grouped matmul on the GPU.
#[path = "gpu/grouped.rs"]
mod grouped;
/// The LLaMA model against candle-transformers on the GPU.
#[path = "gpu/llama.rs"]
mod llama;
#[path = "common/paged.rs"]
mod paged;
/// The paged KV cache on the GPU.
#[path = "gpu/paged.rs"]
mod paged_gpu;
/// RoPE and SwiGLU on the GPU.
#[path = "gpu/rope_swiglu.rs"]
mod rope_swiglu;
/// `sdpa`'s backward on the GPU.
#[path = "gpu/sdpa_backward.rs"]
mod sdpa_backward;
/// `sdpa_varlen` on the GPU.
#[path = "gpu/sdpa_varlen.rs"]
mod sdpa_varlen;

use candle_core::{DType, Device, Result, Tensor, Var};
use common::reference::{linear_f64, matmul_f64, norm_f64, sdpa_f64, EPS};
use common::{assert_close, f64s, random, rel_err, rng};
use gemmbridge_candle::{
    linear_candle, linear_served, matmul_served, rms_norm, rms_norm_candle, rms_norm_served, sdpa_candle, sdpa_served,
    Activation, Served,
};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A CUDA device with a stream of its own (`CudaDevice::new_with_stream`); the adapter's CUDA
/// outputs start as NaN, so that an element left unwritten fails the comparison.
fn gpu() -> Result<Device> {
    gemmbridge_candle::set_poison_outputs(true);
    Device::new_cuda_with_stream(0)
}

/// `t` made on the CPU, moved to `dev`.
fn on(t: &Tensor, dev: &Device) -> Result<Tensor> {
    t.to_device(dev)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_matmul_broadcast_transposes_offsets() -> Result<()> {
    let mut rng = rng("gpu_matmul_broadcast_transposes_offsets");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in DTYPES {
        let r = |rng: &mut _, d: &[usize]| random(rng, d, dtype, &cpu);
        let cases = [
            (r(&mut rng, &[2, 3, 37, 29])?, r(&mut rng, &[29, 41])?, Served::Gemmbridge),
            (
                r(&mut rng, &[3, 29, 37])?.transpose(1, 2)?,
                r(&mut rng, &[3, 41, 29])?.transpose(1, 2)?,
                Served::Gemmbridge,
            ),
            (
                r(&mut rng, &[37, 40])?.narrow(1, 3, 29)?,
                r(&mut rng, &[2, 29, 50])?.narrow(2, 5, 41)?,
                Served::Gemmbridge,
            ),
            (r(&mut rng, &[2, 1, 7, 5])?, r(&mut rng, &[1, 4, 5, 9])?, Served::AfterCopy),
        ];
        for (i, (a, b, path)) in cases.into_iter().enumerate() {
            let (want, _) = matmul_f64(&a, &b)?;
            let (got, served) = matmul_served(&on(&a, &dev)?, &on(&b, &dev)?)?;
            assert_eq!(served, path, "case {i} {dtype:?}");
            assert!(got.device().is_cuda());
            assert_close(&format!("gpu matmul case {i}"), &got, &want, dtype)?;
            let (cpu_path, _) = matmul_served(&a, &b)?;
            let e = rel_err(&f64s(&got)?, &f64s(&cpu_path)?);
            assert!(e <= common::band(dtype), "case {i} {dtype:?}: {e:e} from the CPU path");
            // candle's own CUDA matmul takes only some strided layouts (not offset rows): dense copies
            let candle = on(&a, &dev)?.contiguous()?.broadcast_matmul(&on(&b, &dev)?.contiguous()?)?;
            assert_close(&format!("candle's CUDA matmul case {i}"), &candle, &want, dtype)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_matmul_backward_on_the_per_thread_stream() -> Result<()> {
    let mut rng = rng("gpu_matmul_backward_on_the_per_thread_stream");
    gemmbridge_candle::set_poison_outputs(true);
    let dev = Device::new_cuda(0)?; // candle's default: the calling thread's per-thread stream
    let a = Var::from_tensor(&random(&mut rng, &[3, 17, 13], DType::F32, &dev)?)?;
    let b = Var::from_tensor(&random(&mut rng, &[13, 11], DType::F32, &dev)?)?;
    let w = random(&mut rng, &[3, 17, 11], DType::F32, &dev)?;
    let ours = gemmbridge_candle::matmul(a.as_tensor(), b.as_tensor())?.mul(&w)?.sum_all()?.backward()?;
    let theirs = a.as_tensor().broadcast_matmul(b.as_tensor())?.mul(&w)?.sum_all()?.backward()?;
    for v in [&a, &b] {
        let e = rel_err(&f64s(ours.get(v).unwrap())?, &f64s(theirs.get(v).unwrap())?);
        assert!(e <= 1e-5, "{e:e} from candle's gradient");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_linear_fused_bias_and_activation() -> Result<()> {
    let mut rng = rng("gpu_linear_fused_bias_and_activation");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in DTYPES {
        for act in [Activation::None, Activation::Relu, Activation::Gelu] {
            let x = random(&mut rng, &[3, 19, 40], dtype, &cpu)?;
            let w = random(&mut rng, &[24, 40], dtype, &cpu)?;
            let b = random(&mut rng, &[24], dtype, &cpu)?;
            let want = linear_f64(&x, &w, Some(&b), act)?;
            let (xg, wg, bg) = (on(&x, &dev)?, on(&w, &dev)?, on(&b, &dev)?);
            let (got, served) = linear_served(&xg, &wg, Some(&bg), act)?;
            assert_eq!(served, Served::Gemmbridge);
            assert_close(&format!("gpu linear {act:?}"), &got, &want, dtype)?;
            // candle's own layer on the GPU, in the same dtype
            let c = linear_candle(&xg, &wg, Some(&bg), act)?;
            assert_close(&format!("candle's CUDA linear {act:?}"), &c, &want, dtype)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_rms_norm_forward_and_backward() -> Result<()> {
    let mut rng = rng("gpu_rms_norm_forward_and_backward");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in DTYPES {
        // padded rows: copied contiguous first (cuDNN's norm graph takes dense rows only)
        let x = random(&mut rng, &[3, 7, 136], dtype, &cpu)?.narrow(2, 0, 128)?;
        let w = random(&mut rng, &[128], dtype, &cpu)?;
        let dy = random(&mut rng, &[3, 7, 128], dtype, &cpu)?;
        let (fwd, bwd) = norm_f64(&x, &w, &f64s(&dy)?)?;
        // moved to the GPU with its strides kept; a Var of it is a dense copy
        let padded = on(&x, &dev)?;
        let (xg, wg) = (Var::from_tensor(&padded)?, Var::from_tensor(&on(&w, &dev)?)?);
        let (y, served) = rms_norm_served(&padded, wg.as_tensor(), EPS)?;
        assert_eq!(served, Served::AfterCopy);
        assert_eq!(rms_norm_served(xg.as_tensor(), wg.as_tensor(), EPS)?.1, Served::Gemmbridge);
        assert_close("gpu rms_norm y", &y, &fwd.y, dtype)?;
        let theirs = rms_norm_candle(xg.as_tensor(), wg.as_tensor(), EPS)?;
        assert_close("candle's CUDA rms_norm y", &theirs, &fwd.y, dtype)?;
        let grads = rms_norm(xg.as_tensor(), wg.as_tensor(), EPS)?.mul(&on(&dy, &dev)?)?.sum_all()?.backward()?;
        assert_close("gpu rms_norm dx", grads.get(&xg).unwrap(), &bwd.dx, dtype)?;
        assert_close("gpu rms_norm dw", grads.get(&wg).unwrap(), &bwd.dw, dtype)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sdpa_gqa_causal() -> Result<()> {
    let mut rng = rng("gpu_sdpa_gqa_causal");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in [DType::F16, DType::BF16] {
        for causal in [false, true] {
            let q = random(&mut rng, &[2, 77, 8, 64], dtype, &cpu)?.transpose(1, 2)?; // [b, s, h, d] in place
            let k = random(&mut rng, &[2, 2, 77, 64], dtype, &cpu)?;
            let v = random(&mut rng, &[2, 2, 77, 64], dtype, &cpu)?;
            let want = sdpa_f64(&q, &k, &v, causal)?;
            let (o, served) = sdpa_served(&on(&q, &dev)?, &on(&k, &dev)?, &on(&v, &dev)?, causal, None)?;
            assert_eq!(served, Served::Gemmbridge);
            assert_close(&format!("gpu sdpa causal {causal}"), &o, &want, dtype)?;
            let theirs = sdpa_candle(&on(&q, &dev)?, &on(&k, &dev)?, &on(&v, &dev)?, causal, None)?;
            assert_close(&format!("candle's CUDA sdpa causal {causal}"), &theirs, &want, dtype)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_matmul_from_two_host_threads_on_per_thread_streams() -> Result<()> {
    // one candle device on the per-thread stream, used from two threads: each call goes on the
    // calling thread's stream, in order with candle's own work there
    gemmbridge_candle::set_poison_outputs(true);
    let dev = Device::new_cuda(0)?;
    let run = |name: &'static str, dev: Device| -> Result<()> {
        let mut rng = rng(name);
        let a = random(&mut rng, &[4, 33, 65], DType::BF16, &Device::Cpu)?;
        let b = random(&mut rng, &[65, 17], DType::BF16, &Device::Cpu)?;
        let (want, _) = matmul_f64(&a, &b)?;
        for _ in 0..20 {
            let (got, served) = matmul_served(&on(&a, &dev)?, &on(&b, &dev)?)?;
            assert_eq!(served, Served::Gemmbridge);
            assert_close(name, &got, &want, DType::BF16)?;
        }
        Ok(())
    };
    let other = {
        let dev = dev.clone();
        std::thread::spawn(move || run("gpu_matmul_other_thread", dev))
    };
    run("gpu_matmul_this_thread", dev)?;
    other.join().expect("the other thread panicked")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_linear_backward_against_float64() -> Result<()> {
    // loss = Σ y·r; the float64 reference is candle's autograd through its own layer on the CPU
    let mut rng = rng("gpu_linear_backward_against_float64");
    let (cpu, dev) = (Device::Cpu, gpu()?);
    for dtype in DTYPES {
        for act in [Activation::None, Activation::Relu, Activation::Gelu] {
            let what = format!("gpu linear backward {act:?} {dtype:?}");
            let (x, w, b) = (
                random(&mut rng, &[3, 19, 40], dtype, &cpu)?,
                random(&mut rng, &[24, 40], dtype, &cpu)?,
                random(&mut rng, &[24], dtype, &cpu)?,
            );
            let r = random(&mut rng, &[3, 19, 24], dtype, &cpu)?;
            let gv = |t: &Tensor| Var::from_tensor(&on(t, &dev)?);
            let (xg, wg, bg) = (gv(&x)?, gv(&w)?, gv(&b)?);
            let (y, served) = linear_served(xg.as_tensor(), wg.as_tensor(), Some(bg.as_tensor()), act)?;
            assert_eq!(served, Served::Gemmbridge, "{what}");
            let ours = y.mul(&on(&r, &dev)?)?.sum_all()?.backward()?;
            let cv = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F64)?);
            let (x64, w64, b64) = (cv(&x)?, cv(&w)?, cv(&b)?);
            let y64 = linear_candle(x64.as_tensor(), w64.as_tensor(), Some(b64.as_tensor()), act)?;
            let want = y64.mul(&r.to_dtype(DType::F64)?)?.sum_all()?.backward()?;
            for (name, v, v64) in [("dx", &xg, &x64), ("dw", &wg, &w64), ("db", &bg, &b64)] {
                let g = ours.get(v).unwrap_or_else(|| panic!("{what}: no {name}"));
                assert!(g.device().is_cuda());
                assert_close(&format!("{what}: {name}"), g, &f64s(want.get(v64).unwrap())?, dtype)?;
            }
        }
    }
    Ok(())
}
