//! `gemmbridge probe`'s convolution table: per precision, cuDNN's forward, both backwards
//! and the fused forward against float64 on a small problem with stride, padding and groups
//! (worst error of the four), and the forward's TFLOP/s on ResNet-50's 3×3 convolution at
//! 56×56 (N = 32, C = K = 64, NHWC).

use cudarc::driver::DeviceRepr;
use gemmbridge::conv::{reference, Conv2d, ConvActivation};
use gemmbridge::cuda::Gpu;
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Precision};

use crate::random::normal;
use crate::timing;

fn check<T: Element + DeviceRepr>(gpu: &Gpu, precision: Precision) -> anyhow::Result<(f64, f64)> {
    let s = gpu.stream();
    let p = Conv2d::new([3, 12, 15, 13], [16, 3, 3], precision).with_stride(2, 1).with_pad(1, 1).with_groups(2);
    let [lx, lw, ly] = p.lens();
    let (x, w, dy, b) = (normal::<T>(lx), normal::<T>(lw), normal::<T>(ly), normal::<T>(p.k));
    let wide = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let (xd, wd, dyd, bd) = (s.clone_htod(&x)?, s.clone_htod(&w)?, s.clone_htod(&dy)?, s.clone_htod(&b)?);
    let nan = |n: usize| s.clone_htod(&vec![T::from_f64(f64::NAN); n]);
    let (mut y, mut yf, mut dx, mut dw) = (nan(ly)?, nan(ly)?, nan(lx)?, nan(lw)?);
    gpu.conv().forward(&p, &xd, &wd, &mut y)?;
    gpu.conv().fused(&p, &xd, &wd, &bd, ConvActivation::Relu, &mut yf)?;
    gpu.conv().backward_data(&p, &wd, &dyd, &mut dx)?;
    gpu.conv().backward_filter(&p, &xd, &dyd, &mut dw)?;
    let got = |v| -> anyhow::Result<Vec<f64>> { Ok(wide(&s.clone_dtoh(v)?)) };
    let errors = [
        rel_error(&got(&y)?, &reference::forward(&p, &wide(&x), &wide(&w))),
        rel_error(&got(&yf)?, &reference::forward_fused(&p, &wide(&x), &wide(&w), &wide(&b), true)),
        rel_error(&got(&dx)?, &reference::backward_data(&p, &wide(&w), &wide(&dy))),
        rel_error(&got(&dw)?, &reference::backward_filter(&p, &wide(&x), &wide(&dy))),
    ];
    let worst = errors.iter().copied().fold(0.0, f64::max);
    let big = Conv2d::new([32, 64, 56, 56], [64, 3, 3], precision).with_pad(1, 1);
    let [lx, lw, ly] = big.lens();
    let (bx, bw, mut by) =
        (s.clone_htod(&normal::<T>(lx))?, s.clone_htod(&normal::<T>(lw))?, s.clone_htod(&normal::<T>(ly))?);
    let t = timing::time_gpu(gpu, timing::Sampling::new(3, 10), &mut || gpu.conv().forward(&big, &bx, &bw, &mut by))?;
    Ok((worst, 2.0 * big.macs() / (t.median_ms * 1e-3) / 1e12))
}

/// Prints the table; whether every precision is within its band.
pub fn table(gpu: &Gpu) -> anyhow::Result<bool> {
    let version = gemmbridge::cuda::cudnn_version();
    let Some(version) = version else {
        println!("convolution table: libcudnn cannot be loaded here; skipped (install cuDNN 9 to run it)");
        return Ok(true);
    };
    println!(
        "convolution table (cuDNN {version}): worst error vs float64 of forward, fused bias+ReLU and both \
         backwards (N=3 C=12 15×13 K=16 3×3, stride 2×1, pad 1, 2 groups), TFLOP/s of the forward at N=32 \
         C=K=64 56×56 3×3 NHWC"
    );
    println!("{:<10} {:>12} {:>10} {:>10}  verdict", "precision", "rel error", "band", "TFLOP/s");
    let mut ok = true;
    for precision in [Precision::F32, Precision::TF32, Precision::F16, Precision::BF16] {
        let (err, tflops) = match precision.input() {
            DType::F32 => check::<f32>(gpu, precision)?,
            DType::F16 => check::<half::f16>(gpu, precision)?,
            _ => check::<half::bf16>(gpu, precision)?,
        };
        let good = err <= precision.tolerance();
        ok &= good;
        println!(
            "{:<10} {err:>12.3e} {:>10.0e} {tflops:>10.1}  {}",
            precision.name(),
            precision.tolerance(),
            if good { "ok" } else { "WRONG" }
        );
    }
    Ok(ok)
}
