//! `gemmbridge fp8`: FP8 accuracy beside PyTorch's (`accuracy`) and the bandwidth of the
//! quantisation kernels (`quantize`).

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};
use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Fp8Options, Gpu};
use gemmbridge::fp8::{Fp8Format, Scaling, Source};
use gemmbridge::Element;
use rand::{Rng, SeedableRng};

use crate::bench::fp8::RECIPES;
use crate::timing;

#[derive(clap::Subcommand)]
pub enum Action {
    /// Writes x[M,K] and w[N,K] (f32, with rows of different magnitudes and a few outlier
    /// columns in x) and gemmbridge's bf16 result of every recipe into DIR, and prints each
    /// recipe's error against the float64 product of the unquantised inputs. bench/peer.py
    /// --accuracy DIR then quantises the same inputs with PyTorch and compares.
    Accuracy {
        /// Folder to write (created).
        #[arg(long)]
        dir: String,
        /// Rows of x (M).
        #[arg(long, default_value_t = 512)]
        m: usize,
        /// Rows of w (N).
        #[arg(long, default_value_t = 1024)]
        n: usize,
        /// Columns of x and w (K).
        #[arg(long, default_value_t = 4096)]
        k: usize,
        /// Random seed (printed; a fresh one by default).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Times the quantisation of a ROWS×COLS tensor per source dtype, recipe and layout, as
    /// effective bandwidth beside a device-to-device copy of the source: the bytes a
    /// quantisation must move at least (the source read once, the FP8 data and the f32 scales
    /// written) over the time of the whole call, its allocations, every kernel and the launch
    /// gaps included (a recipe whose kernels read the source twice shows below a copy).
    Quantize {
        /// Rows of the tensor quantised (the operand's M or N).
        #[arg(long, default_value_t = 8192)]
        rows: usize,
        /// Columns (K).
        #[arg(long, default_value_t = 8192)]
        cols: usize,
        /// Timed samples per row (median reported).
        #[arg(long, default_value_t = 20)]
        reps: usize,
    },
}

pub fn run(action: Action) -> anyhow::Result<i32> {
    match action {
        Action::Accuracy { dir, m, n, k, seed } => accuracy(&dir, (m, n, k), seed),
        Action::Quantize { rows, cols, reps } => quantize_bandwidth(rows, cols, reps),
    }
}

fn write_f32(path: &Path, v: &[f32]) -> anyhow::Result<()> {
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
    for x in v {
        f.write_all(&x.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}

/// Inputs whose rows span 2⁻⁴…2⁴ in magnitude, with every 97th column of x ×16 (outlier
/// channels): where tensor-wise, row-wise and block scales differ.
fn inputs(rng: &mut rand::rngs::StdRng, rows: usize, cols: usize, outliers: bool) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let v: f32 = rng.sample(rand_distr::StandardNormal);
            let row = 2f32.powi((r % 9) as i32 - 4);
            let col = if outliers && c % 97 == 0 { 16.0 } else { 1.0 };
            v * row * col
        })
        .collect()
}

fn accuracy(dir: &str, (m, n, k): (usize, usize, usize), seed: Option<u64>) -> anyhow::Result<i32> {
    if m == 0 || n == 0 || k == 0 {
        bail!("--m, --n and --k must be positive");
    }
    let gpu = crate::gpu::open("fp8 accuracy")?;
    let seed = seed.unwrap_or_else(|| rand::rng().random());
    println!("seed {seed}: x [{m}, {k}], w [{n}, {k}], f32");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let x = inputs(&mut rng, m, k, true);
    let w = inputs(&mut rng, n, k, false);
    let dir = Path::new(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_f32(&dir.join("x.f32"), &x)?;
    write_f32(&dir.join("w.f32"), &w)?;
    // float64 reference of the unquantised inputs: y = x·wᵀ
    let (xd, wd): (Vec<f64>, Vec<f64>) = (x.iter().map(|&v| v as f64).collect(), w.iter().map(|&v| v as f64).collect());
    let mut want = vec![0.0f64; m * n];
    // SAFETY: row-major x [m,k] (strides k,1), wᵀ as w [n,k] read with strides (1,k), y [m,n].
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            xd.as_ptr(),
            k as isize,
            1,
            wd.as_ptr(),
            1,
            k as isize,
            0.0,
            want.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    let s = gpu.stream();
    let (xg, wg): (CudaSlice<f32>, CudaSlice<f32>) = (s.clone_htod(&x)?, s.clone_htod(&w)?);
    let mut names = Vec::new();
    println!("{:<22} {:>12}", "recipe", "rel. error");
    for (name, (xs, ws)) in RECIPES {
        let xq = match gpu.fp8().quantize(&xg, m, k, Source::RowMajor, Fp8Format::E4M3, xs) {
            Err(e) if crate::bench::fp8::not_offered(&e) => {
                println!("{name:<22} not offered here: {e}");
                continue;
            }
            other => other?,
        };
        let wq = gpu.fp8().quantize(&wg, n, k, Source::RowMajor, Fp8Format::E4M3, ws)?;
        let mut y: CudaSlice<half::bf16> = s.alloc_zeros(m * n)?;
        gpu.fp8().gemm(&xq, &wq, &mut y, None, Fp8Options::default())?;
        let got: Vec<f32> = s.clone_dtoh(&y)?.iter().map(|v| v.to_f32()).collect();
        s.synchronize()?;
        let e = gemmbridge::reference::rel_error(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want);
        println!("{name:<22} {e:>12.4e}");
        write_f32(&dir.join(format!("ours_{name}.f32")), &got)?;
        names.push(name);
    }
    let meta = serde_json::json!({"m": m, "n": n, "k": k, "seed": seed, "recipes": names});
    std::fs::write(dir.join("meta.json"), serde_json::to_string(&meta)? + "\n")?;
    println!("wrote {} (compare with: python3 bench/peer.py --accuracy {})", dir.display(), dir.display());
    Ok(0)
}

fn quantize_rows<T: Element + cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    (rows, cols): (usize, usize),
    reps: usize,
    copy_gbs: f64,
) -> anyhow::Result<()> {
    let s = gpu.stream();
    let src: CudaSlice<T> = s.clone_htod(&crate::random::normal::<T>(rows * cols))?;
    let sampling = timing::Sampling::new(3, reps);
    let row = |src: &str, layout: &str, scaling: &str, what: &str, ms: f64, bytes: u64| {
        let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{src:<5} {layout:<11} {scaling:<8} {what:<20} {ms:>10.4} {gbs:>9.0} {:>7.0}%",
            gbs / copy_gbs * 100.0
        );
    };
    for source in [Source::RowMajor, Source::Transposed] {
        for scaling in [Scaling::Tensor, Scaling::Row, Scaling::Block1x128, Scaling::Block128x128] {
            let quantize = || gpu.fp8().quantize(&src, rows, cols, source, Fp8Format::E4M3, scaling);
            // the least a quantisation moves: the source once, the FP8 data and the scales
            let layout = quantize()?.layout();
            let elem = std::mem::size_of::<T>() as u64;
            let bytes = (rows * cols) as u64 * elem + layout.data_len() as u64 + 4 * layout.scale_len() as u64;
            let t = timing::time_gpu(gpu, sampling, &mut || quantize().map(drop))?;
            row(T::DTYPE.name(), &format!("{source:?}"), scaling.name(), "whole call", t.median_ms, bytes);
        }
    }
    Ok(())
}

fn quantize_bandwidth(rows: usize, cols: usize, reps: usize) -> anyhow::Result<i32> {
    if rows == 0 || cols == 0 || !(1..=10_000).contains(&reps) {
        bail!("--rows and --cols must be positive and --reps between 1 and 10000");
    }
    if rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).is_none() {
        bail!("--rows {rows} × --cols {cols} f32 elements do not fit in memory's address range");
    }
    let gpu = crate::gpu::open("fp8 quantize")?;
    let s = gpu.stream();
    // the reference: a device-to-device copy of the f32 source, read + write bytes
    let a: CudaSlice<f32> = s.alloc_zeros(rows * cols)?;
    let mut b: CudaSlice<f32> = s.alloc_zeros(rows * cols)?;
    let sampling = timing::Sampling::new(3, reps);
    let t = timing::time_gpu(&gpu, sampling, &mut || s.memcpy_dtod(&a, &mut b))?;
    let copy_gbs = 2.0 * (rows * cols * 4) as f64 / (t.median_ms * 1e-3) / 1e9;
    println!("[{rows}, {cols}] tensor; device-to-device copy of the f32 source: {copy_gbs:.0} GB/s (read + write)");
    println!(
        "{:<5} {:<11} {:<8} {:<20} {:>10} {:>9} {:>8}",
        "src", "layout", "scaling", "timed", "ms", "GB/s", "of copy"
    );
    quantize_rows::<f32>(&gpu, (rows, cols), reps, copy_gbs)?;
    quantize_rows::<half::f16>(&gpu, (rows, cols), reps, copy_gbs)?;
    quantize_rows::<half::bf16>(&gpu, (rows, cols), reps, copy_gbs)?;
    Ok(0)
}
