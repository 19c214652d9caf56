//! The grouped-GEMM rows of `gemmbridge bench` (`--ops grouped,grouped_dx,grouped_dw`): the
//! mixture-of-experts shapes of `bench/grouped.json` (the file `bench/grouped_peer.py` reads
//! too), through [`Gpu::grouped_gemm`], f16 and bf16: the forward `y = x·w[e]ᵀ` (grouped), the
//! backward data `dx = dy·w[e]` (grouped_dx) and the backward weight `dw[e] = dy[e]ᵀ·x[e]`
//! (grouped_dw). A row's m is the total rows Σ m_e, n and k the layer's, batch the number of
//! experts E, its layout the shape's name; its TFLOP/s counts 2·Σ m_e·N·K. `--grouped-backend`
//! forces how the engine runs them ([`GroupedBackend`]); a shape the forced backend does not
//! apply to is skipped with a note.

use cudarc::driver::DeviceRepr;
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::streams::GroupedBackend;
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::{DType, Element, Precision};

use super::{rotate, Pools};
use crate::row::Row;
use crate::timing;

/// The grouped ops: the forward, the backward data, the backward weight, then the same three
/// in FP8.
pub const OPS: [&str; 6] = ["grouped", "grouped_dx", "grouped_dw", "grouped_fp8", "grouped_fp8_dx", "grouped_fp8_dw"];

/// The product of an op of [`OPS`].
pub fn product(op: &str) -> GroupedOp {
    match op.strip_prefix("grouped_fp8").or(op.strip_prefix("grouped")) {
        Some("_dx") => GroupedOp::BackwardData,
        Some("_dw") => GroupedOp::BackwardWeight,
        _ => GroupedOp::Forward,
    }
}

/// Whether an op of [`OPS`] is an FP8 one (its rows per recipe, not per dtype).
pub fn is_fp8(op: &str) -> bool {
    op.starts_with("grouped_fp8")
}

/// `--grouped-backend` parsed: `None` for "auto".
pub fn parse_backend(s: &str) -> anyhow::Result<Option<GroupedBackend>> {
    Ok(match s {
        "auto" => None,
        "strided" => Some(GroupedBackend::StridedBatch),
        "pool" => Some(GroupedBackend::StreamPool),
        "cublas-grouped" => Some(GroupedBackend::GroupedBatched),
        "cudnn" => Some(GroupedBackend::Cudnn),
        other => {
            anyhow::bail!("unknown grouped backend {other:?}; choose auto, strided, cublas-grouped, cudnn or pool")
        }
    })
}

/// One shape of `bench/grouped.json`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Shape {
    pub name: String,
    pub e: usize,
    pub n: usize,
    pub k: usize,
    /// Rows per expert (`e` of them).
    pub sizes: Vec<usize>,
}

/// The shapes of `bench/grouped.json`.
pub fn shapes() -> anyhow::Result<Vec<Shape>> {
    let shapes: Vec<Shape> = super::suite_shapes(include_str!("../../../../bench/grouped.json"), "bench/grouped.json")?;
    for s in &shapes {
        anyhow::ensure!(
            s.sizes.len() == s.e,
            "bench/grouped.json: {} has {} sizes for E {}",
            s.name,
            s.sizes.len(),
            s.e
        );
    }
    Ok(shapes)
}

/// Every row of the ops of `ops` but the FP8 ones ([`super::grouped_fp8::bench`] makes
/// theirs): per op, per f16/bf16 dtype of `dtypes`, per shape; `each` is called with every row
/// as it is made. The engine's grouped backend is set beforehand (`--grouped-backend`).
pub fn bench(
    gpu: &Gpu,
    ops: &[String],
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let (mut rows, mut pools) = (Vec::new(), Pools::default());
    for op in ops.iter().filter(|op| !is_fp8(op)) {
        for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
            for shape in shapes()? {
                let p = GroupedProblem::new(product(op), &shape.sizes, shape.n, shape.k, *precision)?;
                if let Err(e) = gpu.plans().grouped_backend(&p) {
                    eprintln!("  {op} {} {name}: skipped ({e})", shape.name);
                    continue;
                }
                let row = match p.precision().input() {
                    DType::F16 => row::<half::f16>(gpu, &mut pools, (op, &shape, &p), name, sampling)?,
                    _ => row::<half::bf16>(gpu, &mut pools, (op, &shape, &p), name, sampling)?,
                };
                each(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// One grouped row of `op` (an op of [`OPS`] but the FP8 ones) for `shape` in `precision`,
/// timed as [`bench`] times it (fresh random buffers from `pools`).
pub fn row<T: Element + DeviceRepr>(
    gpu: &Gpu,
    pools: &mut Pools,
    (op, shape, p): (&str, &Shape, &GroupedProblem),
    dtype: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<Row> {
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let pool = pools.get::<T>(s)?;
    let (x, w) = (rotate(s, pool, la)?, rotate(s, pool, lb)?);
    let mut y = rotate(s, pool, lc)?;
    let t = timing::time_gpu(gpu, sampling, &mut || gpu.grouped_gemm(p, &x, &w, &mut y, None))?;
    let dims = [p.rows(), p.n(), p.k(), p.groups()];
    Ok(Row::timed(op, dtype, dims, &t, 2.0 * p.macs(), shape.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_names_its_shapes_and_they_are_valid_problems() {
        let shapes = shapes().unwrap();
        assert_eq!(shapes.len(), 8);
        for s in &shapes {
            let p = GroupedProblem::new(GroupedOp::Forward, &s.sizes, s.n, s.k, Precision::BF16).unwrap();
            let tokens = if s.name.starts_with("dsv3-16k") { 131072 } else { 32768 };
            assert_eq!(p.rows(), tokens, "{}", s.name);
        }
        let products = [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight];
        assert_eq!(OPS.map(product), [products, products].concat()[..]);
        assert_eq!(OPS.map(is_fp8), [false, false, false, true, true, true]);
        assert_eq!(parse_backend("pool").unwrap(), Some(GroupedBackend::StreamPool));
        assert!(parse_backend("fast").is_err());
    }
}
