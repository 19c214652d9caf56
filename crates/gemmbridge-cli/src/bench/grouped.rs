//! The grouped-GEMM rows of `gemmbridge bench` (`--ops grouped`): the mixture-of-experts
//! shapes of `bench/grouped.json` (the file `bench/grouped_peer.py` reads too), the forward
//! `y = x·w[e]ᵀ` through [`Gpu::grouped_gemm`], f16 and bf16. A row's m is the total rows
//! Σ m_e, n and k the layer's, batch the number of experts E, its layout the shape's name; its
//! TFLOP/s counts 2·Σ m_e·N·K.

use anyhow::Context;
use cudarc::driver::DeviceRepr;
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::{DType, Element, Precision};

use super::{rotate, Pools};
use crate::row::Row;
use crate::timing;

/// The grouped ops: the forward.
pub const OPS: [&str; 1] = ["grouped"];

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
    #[derive(serde::Deserialize)]
    struct Suite {
        shapes: Vec<Shape>,
    }
    let suite: Suite =
        serde_json::from_str(include_str!("../../../../bench/grouped.json")).context("bench/grouped.json")?;
    for s in &suite.shapes {
        anyhow::ensure!(
            s.sizes.len() == s.e,
            "bench/grouped.json: {} has {} sizes for E {}",
            s.name,
            s.sizes.len(),
            s.e
        );
    }
    Ok(suite.shapes)
}

/// Every row: per f16/bf16 dtype of `dtypes`, per shape; `each` is called with every row as it
/// is made.
pub fn bench(
    gpu: &Gpu,
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let (mut rows, mut pools) = (Vec::new(), Pools::default());
    for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
        for shape in shapes()? {
            let p = GroupedProblem::new(GroupedOp::Forward, &shape.sizes, shape.n, shape.k, *precision)?;
            let row = match p.precision().input() {
                DType::F16 => row::<half::f16>(gpu, &mut pools, (&shape, &p), name, sampling)?,
                _ => row::<half::bf16>(gpu, &mut pools, (&shape, &p), name, sampling)?,
            };
            each(&row)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

fn row<T: Element + DeviceRepr>(
    gpu: &Gpu,
    pools: &mut Pools,
    (shape, p): (&Shape, &GroupedProblem),
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
    Ok(Row::timed("grouped", dtype, dims, &t, 2.0 * p.macs(), shape.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_names_its_shapes_and_they_are_valid_problems() {
        let shapes = shapes().unwrap();
        assert_eq!(shapes.len(), 6);
        for s in &shapes {
            let p = GroupedProblem::new(GroupedOp::Forward, &s.sizes, s.n, s.k, Precision::BF16).unwrap();
            assert_eq!(p.rows(), 32768, "{}", s.name);
        }
    }
}
