//! The FP8 grouped rows of `gemmbridge bench` (`--ops grouped_fp8`): the forward of every
//! shape of `bench/grouped.json` through [`Gpu::grouped_fp8_gemm`], E4M3 operands quantised per
//! group before the timing starts (as bench/grouped_peer.py quantises for
//! `torch._scaled_grouped_mm`), bf16 output, one row per recipe of `--grouped-scalings`
//! (layout `<shape>/<recipe>`), and beside each, op grouped_fp8_dense, the dense FP8 GEMM of
//! the same total size (`[Σ m_e, N, K]`, one expert's weight; same layout), the yardstick where
//! PyTorch has no grouped kernel for the recipe. TFLOP/s count 2·Σ m_e·N·K.

use gemmbridge::cuda::{Fp8Options, Gpu};
use gemmbridge::fp8::{Fp8Format, Source};
use gemmbridge::grouped::{GroupedOp, GroupedOperand, GroupedProblem};
use gemmbridge::Precision;

use super::grouped::Shape;
use super::{fp8, rotate, Pools};
use crate::row::Row;
use crate::timing;

/// The two rows of one shape and recipe (none where the GPU or cuBLASLt does not offer it).
pub fn rows(
    gpu: &Gpu,
    pools: &mut Pools,
    shape: &Shape,
    recipe: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let (xs, ws) = fp8::recipe(recipe)?;
    let p = GroupedProblem::new(GroupedOp::Forward, &shape.sizes, shape.n, shape.k, Precision::BF16)?;
    let s = gpu.stream();
    let [lx, lw, ly] = p.lens();
    let pool = pools.get::<half::bf16>(s)?;
    let (x, w) = (rotate(s, pool, lx)?, rotate(s, pool, lw)?);
    let qx = match gpu.grouped_quantize(&p, GroupedOperand::X, &x, Fp8Format::E4M3, xs) {
        Err(e) if fp8::not_offered(&e) => {
            eprintln!("note: grouped_fp8 {recipe} skipped: {e}");
            return Ok(Vec::new());
        }
        q => q?,
    };
    let qw: Vec<_> =
        gpu.grouped_quantize(&p, GroupedOperand::W, &w, Fp8Format::E4M3, ws)?.into_iter().flatten().collect();
    drop((x, w));
    let mut y = rotate(s, pool, ly)?;
    let opts = Fp8Options::default();
    let t = timing::time_gpu(gpu, sampling, &mut || gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y, None, opts))?;
    let dims = [p.rows(), p.n(), p.k(), p.groups()];
    let name = format!("{}/{recipe}", shape.name);
    let grouped = Row::timed("grouped_fp8", "fp8_e4m3", dims, &t, 2.0 * p.macs(), name.clone());
    drop(qx);
    // the dense yardstick: all rows against expert 0's weight
    let xd = rotate(s, pool, lx)?;
    let xq = gpu.quantize(&xd, p.rows(), p.k(), Source::RowMajor, Fp8Format::E4M3, xs)?;
    drop(xd);
    let t = timing::time_gpu(gpu, sampling, &mut || gpu.fp8_gemm(&xq, &qw[0], &mut y, None, opts))?;
    let dense = Row::timed("grouped_fp8_dense", "fp8_e4m3", dims, &t, 2.0 * p.macs(), name);
    Ok(vec![grouped, dense])
}
