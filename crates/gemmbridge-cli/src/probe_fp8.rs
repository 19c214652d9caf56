//! `gemmbridge probe`'s FP8 table: every recipe gemmbridge offers, its error against the
//! float64 product of the dequantised operands (what the GPU should compute exactly, up to
//! its accumulation and the bf16 output) and against the float64 product of the unquantised
//! inputs (what quantisation costs), and its TFLOP/s at 8192³.

use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Fp8Options, Gpu};
use gemmbridge::fp8::{dequantize, Fp8Format, Source};
use gemmbridge::reference::rel_error;
use gemmbridge::Error;

use crate::bench::fp8::RECIPES;
use crate::random::normal;
use crate::timing;

const M: usize = 256;
const N: usize = 512;
const K: usize = 384;

/// y = x·wᵀ in f64 for row-major x [m,k], w [n,k].
fn product(x: &[f64], w: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
        }
    }
    y
}

/// (error vs the dequantised product, error vs the unquantised product, TFLOP/s at 8192³).
fn check(gpu: &Gpu, name: &str, wf: Fp8Format) -> Result<(f64, f64, f64), Error> {
    let (xs, ws) = crate::bench::fp8::recipe(name).expect("a known recipe");
    let s = gpu.stream();
    let (xh, wh): (Vec<f32>, Vec<f32>) = (normal(M * K), normal(N * K));
    let up =
        |v: &[f32]| s.clone_htod(v).map_err(|e| Error::Driver { operation: "cuMemcpyHtoD", status: format!("{e:?}") });
    let x = gpu.fp8().quantize(&up(&xh)?, M, K, Source::RowMajor, Fp8Format::E4M3, xs)?;
    let w = gpu.fp8().quantize(&up(&wh)?, N, K, Source::RowMajor, wf, ws)?;
    let mut y: CudaSlice<half::bf16> = s.clone_htod(&vec![half::bf16::NAN; M * N]).expect("upload");
    gpu.fp8().gemm(&x, &w, &mut y, None, Fp8Options::default())?;
    let got: Vec<f64> = s.clone_dtoh(&y).expect("download").iter().map(|v| v.to_f64()).collect();
    let deq = product(&dequantize(&x.to_host()?)?, &dequantize(&w.to_host()?)?, (M, N, K));
    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let exact = product(&wide(&xh), &wide(&wh), (M, N, K));
    let big = 8192;
    let xb = gpu.fp8().quantize(
        &s.clone_htod(&normal::<half::bf16>(big * big)).expect("upload"),
        big,
        big,
        Source::RowMajor,
        Fp8Format::E4M3,
        xs,
    )?;
    let wb = gpu.fp8().quantize(
        &s.clone_htod(&normal::<half::bf16>(big * big)).expect("upload"),
        big,
        big,
        Source::RowMajor,
        wf,
        ws,
    )?;
    let mut yb: CudaSlice<half::bf16> = s.alloc_zeros(big * big).expect("alloc");
    let t = timing::time_gpu(gpu, timing::Sampling::new(2, 5), &mut || {
        gpu.fp8().gemm(&xb, &wb, &mut yb, None, Fp8Options::default())
    })
    .map_err(|e| Error::Driver { operation: "timing", status: e.to_string() })?;
    Ok((rel_error(&got, &deq), rel_error(&got, &exact), 2.0 * (big as f64).powi(3) / (t.median_ms * 1e-3) / 1e12))
}

/// Prints the table; false if a recipe the GPU offers computes wrongly.
pub fn table(gpu: &Gpu) -> anyhow::Result<bool> {
    println!("FP8 table: x e4m3 [M={M}, K={K}], w [N={N}, K], bf16 output; error vs float64 of the dequantised operands (band 1e-2) and of the unquantised inputs; TFLOP/s at 8192³");
    println!("{:<22} {:<5} {:>12} {:>14} {:>10}  verdict", "recipe", "w", "vs dequant.", "vs unquant.", "TFLOP/s");
    let mut ok = true;
    let cases = RECIPES.iter().map(|(n, _)| (*n, Fp8Format::E4M3)).chain([("tensorwise", Fp8Format::E5M2)]);
    for (name, wf) in cases {
        match check(gpu, name, wf) {
            Ok((deq, exact, tflops)) => {
                let good = deq <= 1e-2;
                ok &= good;
                println!(
                    "{name:<22} {wf:<5} {deq:>12.3e} {exact:>14.3e} {tflops:>10.1}  {}",
                    if good { "ok" } else { "WRONG" }
                );
            }
            Err(e @ Error::Fp8 { .. }) => println!("{name:<22} {wf:<5} not offered here: {e}"),
            Err(e) => {
                ok = false;
                println!("{name:<22} {wf:<5} FAILED: {e}");
            }
        }
    }
    Ok(ok)
}
