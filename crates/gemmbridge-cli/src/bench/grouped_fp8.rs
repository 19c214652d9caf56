//! The FP8 grouped rows of `gemmbridge bench` (`--ops grouped_fp8,grouped_fp8_dx,grouped_fp8_dw`):
//! the forward, the backward data and the backward weight of every shape of
//! `bench/grouped.json` through [`GpuFp8::grouped_gemm`], E4M3 operands quantised per group
//! before the timing starts (as bench/grouped_peer.py quantises for
//! `torch._scaled_grouped_mm`), bf16 output, one row per recipe of `--grouped-scalings`
//! (layout `<shape>/<recipe>`), and beside each, op `<op>_dense`, the dense FP8 GEMM of the
//! same total size in the same TN form (all rows as one group: `[Σ m_e, N, K]` against one
//! expert's weight, or the backward weight's inner dimension Σ m_e; same layout), the
//! yardstick where PyTorch has no grouped kernel for the recipe. TFLOP/s count 2·Σ m_e·N·K.

use gemmbridge::cuda::{Fp8Options, Gpu};
use gemmbridge::fp8::Fp8Format;
use gemmbridge::grouped::{GroupedOperand, GroupedProblem};
use gemmbridge::Precision;

use super::grouped::{is_fp8, product, shapes, Shape};
use super::{fp8, rotate, Pools};
use crate::row::Row;
use crate::timing;

/// Every row of the FP8 ops of `ops`: per op, per recipe of `scalings`, per shape; `each` is
/// called with every row as it is made.
pub fn bench(
    gpu: &Gpu,
    ops: &[String],
    scalings: &[String],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let (mut out, mut pools) = (Vec::new(), Pools::default());
    for op in ops.iter().filter(|op| is_fp8(op)) {
        for recipe in scalings {
            for shape in shapes()? {
                for row in rows(gpu, &mut pools, (op, &shape), recipe, sampling)? {
                    each(&row)?;
                    out.push(row);
                }
            }
        }
    }
    Ok(out)
}

/// The two rows of one op, shape and recipe (none where the GPU or cuBLASLt does not offer it).
fn rows(
    gpu: &Gpu,
    pools: &mut Pools,
    (op, shape): (&str, &Shape),
    recipe: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let scalings = fp8::recipe(recipe)?;
    let p = GroupedProblem::new(product(op), &shape.sizes, shape.n, shape.k, Precision::BF16)?;
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let pool = pools.get::<half::bf16>(s)?;
    let (a, b) = (rotate(s, pool, la)?, rotate(s, pool, lb)?);
    let quantize = |p: &GroupedProblem| -> gemmbridge::Result<_> {
        let qa = gpu.fp8().grouped_quantize(p, GroupedOperand::A, &a, Fp8Format::E4M3, scalings.0)?;
        Ok((qa, gpu.fp8().grouped_quantize(p, GroupedOperand::B, &b, Fp8Format::E4M3, scalings.1)?))
    };
    let (qa, qb) = match quantize(&p) {
        Err(e) if fp8::not_offered(&e) => {
            eprintln!("note: {op} {recipe} skipped: {e}");
            return Ok(Vec::new());
        }
        q => q?,
    };
    let mut c = rotate(s, pool, lc)?;
    let opts = Fp8Options::default();
    let t = timing::time_gpu(gpu, sampling, &mut || gpu.fp8().grouped_gemm(&p, &qa, &qb, &mut c, None, opts))?;
    let dims = [p.rows(), p.n(), p.k(), p.groups()];
    let name = format!("{}/{recipe}", shape.name);
    let grouped = Row::timed(op, "fp8_e4m3", dims, &t, 2.0 * p.macs(), name.clone());
    drop((qa, qb));
    // the dense yardstick: every row as one group (the first expert's weight)
    let rows = p.row_start(p.groups());
    let one = GroupedProblem::new(product(op), &[rows], shape.n, shape.k, Precision::BF16)?;
    let (qa, qb) = quantize(&one)?;
    let (Some(da), Some(db)) = (&qa[0], &qb[0]) else { anyhow::bail!("{op} {}: no rows", shape.name) };
    let t = timing::time_gpu(gpu, sampling, &mut || gpu.fp8().gemm(da, db, &mut c, None, opts))?;
    let dense = Row::timed(&format!("{op}_dense"), "fp8_e4m3", dims, &t, 2.0 * p.macs(), name);
    Ok(vec![grouped, dense])
}
