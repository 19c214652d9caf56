//! `gemmbridge firstcall`: what the first GEMM of a fresh process costs, with and without
//! `Gpu::prewarm`. Run it as its own process (each run measures one process's first call).

use std::time::Instant;

use anyhow::Context;
use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Extras, Scale};
use gemmbridge::Epilogue;

use crate::ops::{precision_of, problem};
use crate::random::normal;

#[derive(clap::Args)]
pub struct Args {
    /// Prewarm the problem before the first call.
    #[arg(long)]
    prewarm: bool,
    /// Op: matmul, linear, linear_bias, linear_bias_gelu.
    #[arg(long, default_value = "linear_bias")]
    op: String,
    /// Dtype: f16 or bf16 (or f32, tf32 for matmul/linear).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// m,n,k.
    #[arg(long, default_value = "4096,4096,4096")]
    shape: String,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let dims: Vec<usize> =
        args.shape.split(',').map(|v| v.trim().parse()).collect::<Result<_, _>>().context("--shape m,n,k")?;
    let [m, n, k] = dims[..] else { anyhow::bail!("--shape needs three numbers m,n,k") };
    let prec = precision_of(&args.dtype).ok_or_else(|| anyhow::anyhow!("unknown dtype {}", args.dtype))?;
    let p = problem(&args.op, (m, n, k), prec)?;
    let t = Instant::now();
    let gpu = crate::gpu::open("firstcall")?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let s = gpu.stream();
    // buffers of the input/output type (f32 for f32/tf32, else the half type)
    macro_rules! go {
        ($t:ty) => {{
            let x: CudaSlice<$t> = s.clone_htod(&normal::<$t>(m * k))?;
            let w: CudaSlice<$t> = s.clone_htod(&normal::<$t>(k * n))?;
            let bias: CudaSlice<$t> = s.clone_htod(&normal::<$t>(n))?;
            let mut c: CudaSlice<$t> = s.alloc_zeros(m * n)?;
            s.synchronize()?;
            let t = Instant::now();
            if args.prewarm {
                gpu.prewarm(&[p])?;
            }
            let prewarm_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut call = || -> anyhow::Result<f64> {
                let t = Instant::now();
                let extras =
                    Extras { bias: (p.epilogue() != Epilogue::None).then_some(&bias as _), ..Extras::default() };
                gpu.gemm_fused(&p, Scale::PRODUCT, &x, &w, &mut c, extras)?;
                s.synchronize()?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            };
            let first_ms = call()?;
            let second_ms = call()?;
            (prewarm_ms, first_ms, second_ms)
        }};
    }
    let (prewarm_ms, first_ms, second_ms) = match prec.input() {
        gemmbridge::DType::F32 => go!(f32),
        gemmbridge::DType::F16 => go!(half::f16),
        _ => go!(half::bf16),
    };
    println!(
        "{}",
        serde_json::json!({"op": "firstcall", "gemm": args.op, "dtype": args.dtype, "m": m, "n": n, "k": k,
            "prewarm": args.prewarm, "open_ms": open_ms, "prewarm_ms": prewarm_ms,
            "first_ms": first_ms, "second_ms": second_ms})
    );
    Ok(0)
}
