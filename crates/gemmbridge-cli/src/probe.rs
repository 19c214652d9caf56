//! `gemmbridge probe`: what this machine's cuBLAS does with row-major data.
//!
//! 1. The convention table: the row-major problem `C[M,N] = A[M,K]·B[K,N]` (M=256, K=128,
//!    N=512, f32) is handed to cuBLAS directly (`cublasSgemm` on a handle of the probe's own,
//!    through cudarc, with none of gemmbridge's checks) with all 16 combinations of transa, transb ∈
//!    {N, T}, lda ∈ {K, N}, ldb ∈ {K, M} (first operand B, second A, m=N, n=M, ldc=N). Each
//!    is rejected (status name), a MATCH, or accepted-but-WRONG. Exactly one must match, and
//!    it must be the call gemmbridge's mapping produces.
//! 2. The precision table: every precision the library offers, its error against float64 on a
//!    small problem and its TFLOP/s on a large one.
//! 3. The FP8 table (`probe_fp8.rs`): every FP8 recipe the GPU offers, the same way.
//! 4. The convolution table (`probe_conv.rs`): cuDNN's convolutions per precision.
//! 5. The RMSNorm table (`probe_norm.rs`): what the loaded cuDNN's norm graph takes, one line
//!    per question.
//!
//! `--only` runs some of them. Exit status 1 if any table shows a problem.

use std::sync::Arc;

use anyhow::Context;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::Gpu;
use gemmbridge::mapping::{column_major_call, ColMajorCall};
use gemmbridge::reference::{gemm_rowmajor, max_abs_diff, rel_error};
use gemmbridge::{DType, Element, GemmProblem, Op, Precision};

use crate::random::normal;
use crate::timing;

const M: usize = 256;
const K: usize = 128;
const N: usize = 512;

/// The tables, as `--only` names them.
const TABLES: [&str; 5] = ["convention", "precision", "fp8", "conv", "norm"];

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated tables to run (default: every table): convention, precision, fp8,
    /// conv, norm. An empty list, or one with an empty entry, is refused.
    #[arg(long, default_value = "convention,precision,fp8,conv,norm")]
    only: String,
}

/// The tables `--only` names, checked before a GPU is opened.
///
/// # Errors
/// An unknown table, an empty entry, or no table at all: a probe that runs nothing would
/// report "OK" for a check it never made.
fn parse_only(only: &str) -> anyhow::Result<Vec<&str>> {
    let tables = crate::lists::entries("--only", only)?;
    if let Some(t) = tables.iter().find(|t| !TABLES.contains(t)) {
        anyhow::bail!("--only: unknown table {t:?}; choose from {}", TABLES.join(", "));
    }
    if tables.is_empty() {
        anyhow::bail!("no table to run: give --only with at least one of {}", TABLES.join(", "));
    }
    Ok(tables)
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let tables = parse_only(&args.only)?;
    let gpu = crate::gpu::open("probe")?;
    let info = gpu.info()?;
    println!(
        "probe on {} (sm {}.{}), cuBLAS {}.{}.{}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.cublas_version.0,
        info.cublas_version.1,
        info.cublas_version.2
    );
    let mut ok = true;
    for table in TABLES.iter().filter(|t| tables.contains(t)) {
        println!();
        ok &= match *table {
            "convention" => convention_table(&gpu)?,
            "precision" => precision_table(&gpu)?,
            "fp8" => crate::probe_fp8::table(&gpu)?,
            "conv" => crate::probe_conv::table(&gpu)?,
            _ => crate::probe_norm::table(&gpu)?,
        };
    }
    println!("\nprobe: {}", if ok { "OK" } else { "FAILED" });
    Ok(if ok { 0 } else { 1 })
}

/// The convention table's operands on the device (padded, see below), its output and the
/// float64 reference.
struct Convention {
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    c: CudaSlice<f32>,
    reference: Vec<f64>,
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn convention_table(gpu: &Gpu) -> anyhow::Result<bool> {
    let a: Vec<f32> = normal(M * K);
    let b: Vec<f32> = normal(K * N);
    let p = GemmProblem::matmul(M, N, K, Precision::F32)?;
    let mut reference = vec![0.0; M * N];
    gemm_rowmajor(&p, 1.0, &wide(&a), &wide(&b), 0.0, &mut reference);
    // Wrong-but-accepted calls read up to (max ld)·(max dim) elements: pad both inputs to
    // 512·512 with more random values so that every call stays inside its allocation.
    let room = N * N;
    let mut a_pad = a.clone();
    a_pad.extend(normal::<f32>(room - a.len()));
    let mut b_pad = b.clone();
    b_pad.extend(normal::<f32>(room - b.len()));
    let s = gpu.stream();
    let mut bufs = Convention {
        a: s.clone_htod(&a_pad)?,
        b: s.clone_htod(&b_pad)?,
        c: s.clone_htod(&vec![f32::NAN; M * N])?,
        reference,
    };
    // batch 1: the strides are never used, so the probe's calls leave them 0
    let ours = ColMajorCall { stride_a: 0, stride_b: 0, stride_c: 0, ..column_major_call(&p) };
    println!("convention table: row-major C[M,N] = A[M,K]·B[K,N], M={M} K={K} N={N}, f32");
    println!("cuBLAS called as cublasSgemm(transa, transb, m=N, n=M, k=K, first=B lda, second=A ldb, C ldc=N)");
    // a cuBLAS handle of the probe's own on the Gpu's stream: the calls are the bare library's
    let blas = CudaBlas::new(s.clone()).context("creating a cuBLAS handle")?;
    println!(
        "{:<6} {:<6} {:>5} {:>5}  {:<36} {:>12} {:>18}",
        "transa", "transb", "lda", "ldb", "result", "max|diff|", "max|diff|/max|ref|"
    );
    let mut matches = Vec::new();
    for transa in [Op::N, Op::T] {
        for transb in [Op::N, Op::T] {
            for lda in [K, N] {
                for ldb in [K, M] {
                    let call = ColMajorCall {
                        transa,
                        transb,
                        m: N as i32,
                        n: M as i32,
                        k: K as i32,
                        lda: lda as i32,
                        stride_a: 0,
                        ldb: ldb as i32,
                        stride_b: 0,
                        ldc: N as i32,
                        stride_c: 0,
                        batch: 1,
                    };
                    let mark = if call == ours { "  ← gemmbridge's mapping" } else { "" };
                    if convention_row((&blas, s), &mut bufs, &call, mark)? {
                        matches.push(call);
                    }
                }
            }
        }
    }
    let ok = matches.len() == 1 && matches[0] == ours;
    println!(
        "{} MATCH{}; gemmbridge's mapping {}",
        matches.len(),
        if matches.len() == 1 { "" } else { "es (expected exactly one)" },
        if matches.contains(&ours) { "is the match" } else { "is NOT a match" }
    );
    Ok(ok)
}

/// One row of the convention table: `call` (α = 1, β = 0; B first, A second) on a NaN-filled
/// C, its result against the reference, printed. Returns whether it matched.
fn convention_row(
    (blas, s): (&CudaBlas, &Arc<CudaStream>),
    bufs: &mut Convention,
    call: &ColMajorCall,
    mark: &str,
) -> anyhow::Result<bool> {
    s.memcpy_htod(&vec![f32::NAN; M * N], &mut bufs.c)?;
    let op = |o: Op| if o == Op::N { cublasOperation_t::CUBLAS_OP_N } else { cublasOperation_t::CUBLAS_OP_T };
    let cfg = GemmConfig {
        transa: op(call.transa),
        transb: op(call.transb),
        m: call.m,
        n: call.n,
        k: call.k,
        alpha: 1.0f32,
        lda: call.lda,
        ldb: call.ldb,
        beta: 0.0,
        ldc: call.ldc,
    };
    // SAFETY: both inputs hold 512·512 elements, more than any of these calls can address
    // ((max ld)·(max dim)); C holds ldc·n = N·M; all three are used on the handle's stream.
    let launched = unsafe { blas.gemm(cfg, &bufs.b, &bufs.a, &mut bufs.c) };
    let (transa, transb, lda, ldb) = (call.transa.to_string(), call.transb.to_string(), call.lda, call.ldb);
    match launched {
        Err(e) => {
            // the status's Debug form is its C name, e.g. CUBLAS_STATUS_INVALID_VALUE
            let result = format!("rejected ({:?})", e.0);
            println!("{transa:<6} {transb:<6} {lda:>5} {ldb:>5}  {result:<36} {:>12} {:>18}{mark}", "-", "-");
            Ok(false)
        }
        Ok(()) => {
            let got = wide(&s.clone_dtoh(&bufs.c)?);
            let (d, r) = max_abs_diff(&got, &bufs.reference);
            let ok = rel_error(&got, &bufs.reference) <= Precision::F32.tolerance();
            let verdict = if ok { "MATCH" } else { "accepted but WRONG" };
            println!("{transa:<6} {transb:<6} {lda:>5} {ldb:>5}  {verdict:<36} {d:>12.3e} {r:>18.3e}{mark}");
            Ok(ok)
        }
    }
}

/// One precision: error on the small problem, TFLOP/s on 8192³.
fn check_precision<TI: Element + DeviceRepr, TO: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    precision: Precision,
) -> anyhow::Result<(f64, f64)> {
    let s = gpu.stream();
    // small: the convention-table shape, as matmul and as linear, fresh inputs each
    let mut worst = 0.0f64;
    for p in [GemmProblem::matmul(M, N, K, precision)?, GemmProblem::linear(M, N, K, precision)?] {
        let a: Vec<TI> = normal(M * K);
        let b: Vec<TI> = normal(K * N);
        let mut reference = vec![0.0; M * N];
        let wide = |v: &[TI]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        gemm_rowmajor(&p, 1.0, &wide(&a), &wide(&b), 0.0, &mut reference);
        let (da, db) = (s.clone_htod(&a)?, s.clone_htod(&b)?);
        let mut dc: CudaSlice<TO> = s.clone_htod(&vec![TO::from_f64(f64::NAN); M * N])?;
        gpu.gemm(&p, 1.0, &da, &db, 0.0, &mut dc)?;
        let got: Vec<f64> = s.clone_dtoh(&dc)?.iter().map(|x| x.to_f64()).collect();
        worst = worst.max(rel_error(&got, &reference));
    }
    // large: 8192³ matmul, timed with CUDA events
    let big = 8192;
    let p = GemmProblem::matmul(big, big, big, precision)?;
    let a = s.clone_htod(&normal::<TI>(big * big))?;
    let b = s.clone_htod(&normal::<TI>(big * big))?;
    let mut c: CudaSlice<TO> = s.alloc_zeros(big * big).context("allocating C")?;
    let t = timing::time_gpu(gpu, timing::Sampling::new(2, 5), &mut || gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c))?;
    Ok((worst, p.flops() / (t.median_ms * 1e-3) / 1e12))
}

fn precision_table(gpu: &Gpu) -> anyhow::Result<bool> {
    println!("precision table: error ‖out−ref‖/‖ref‖ vs float64 at M={M} K={K} N={N} (matmul and linear, worst), TFLOP/s at 8192³ matmul");
    println!(
        "{:<10} {:<6} {:<14} {:<6} {:>12} {:>10} {:>10}  verdict",
        "precision", "input", "compute", "output", "rel error", "band", "TFLOP/s"
    );
    let mut ok = true;
    for precision in Precision::ALL {
        let (err, tflops) = match (precision.input(), precision.output()) {
            (DType::F32, _) => check_precision::<f32, f32>(gpu, precision)?,
            (DType::F16, DType::F16) => check_precision::<half::f16, half::f16>(gpu, precision)?,
            (DType::F16, _) => check_precision::<half::f16, f32>(gpu, precision)?,
            (DType::BF16, DType::BF16) => check_precision::<half::bf16, half::bf16>(gpu, precision)?,
            (DType::BF16, _) => check_precision::<half::bf16, f32>(gpu, precision)?,
            (other, _) => anyhow::bail!("probe does not know dtype {other}"),
        };
        let good = err <= precision.tolerance();
        ok &= good;
        println!(
            "{:<10} {:<6} {:<14} {:<6} {:>12.3e} {:>10.0e} {:>10.1}  {}",
            precision.name(),
            precision.input().name(),
            precision.compute().to_string(),
            precision.output().name(),
            err,
            precision.tolerance(),
            tflops,
            if good { "ok" } else { "WRONG" }
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::parse_only;

    #[test]
    fn only_names_at_least_one_known_table() {
        assert_eq!(parse_only("fp8, conv").unwrap(), ["fp8", "conv"]);
        for blank in ["", " "] {
            let e = parse_only(blank).unwrap_err().to_string();
            assert_eq!(e, "no table to run: give --only with at least one of convention, precision, fp8, conv, norm");
        }
        for list in [",", "fp8,", "fp8,,conv"] {
            let e = parse_only(list).unwrap_err().to_string();
            assert_eq!(e, format!("--only {list:?} has an empty entry: give comma-separated names"));
        }
        assert!(parse_only("fp9").unwrap_err().to_string().starts_with("--only: unknown table \"fp9\""));
    }
}
