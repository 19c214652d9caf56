//! FP8 rows of `gemmbridge bench`: `scaled_mm` (`y[m,n] = x[m,k]·w[n,k]ᵀ`, E4M3 operands,
//! bf16 output) per scaling recipe, timed like every other row on operands quantised before
//! the timing starts, as bench/peer.py times `torch._scaled_mm`.

use anyhow::bail;
use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Fp8Options, Fp8Tensor, Gpu};
use gemmbridge::fp8::{Fp8Format, Scaling, Source};

use super::{rotate, Pools};
use crate::row::Row;
use crate::suites::Shape;
use crate::timing;

/// Every recipe name gemmbridge runs (as bench/peer.py names them: the benchmark's default
/// three, then the other block pairings), with its (x, w) scalings.
pub const RECIPES: [(&str, (Scaling, Scaling)); 5] = [
    ("tensorwise", (Scaling::Tensor, Scaling::Tensor)),
    ("rowwise", (Scaling::Row, Scaling::Row)),
    ("block", (Scaling::Block1x128, Scaling::Block128x128)),
    ("block_1x128", (Scaling::Block1x128, Scaling::Block1x128)),
    ("block_128x128_1x128", (Scaling::Block128x128, Scaling::Block1x128)),
];

/// The (x, w) scalings of a recipe name.
pub fn recipe(name: &str) -> anyhow::Result<(Scaling, Scaling)> {
    match RECIPES.iter().find(|(n, _)| *n == name) {
        Some((_, r)) => Ok(*r),
        None => {
            let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
            bail!("unknown scaling {name:?}; choose from {}", names.join(", "))
        }
    }
}

/// `--scalings` (or `--grouped-scalings`, `flag`) parsed: names in order, each once.
pub fn parse_scalings(flag: &str, list: &str) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for s in crate::lists::entries(flag, list)? {
        recipe(s).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        if !out.iter().any(|x| x == s) {
            out.push(s.to_string());
        }
    }
    if out.is_empty() {
        let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
        bail!("no scaling to run: give {flag} with at least one of {}", names.join(", "));
    }
    Ok(out)
}

/// `count` quantised copies of a fresh `[rows, k]` bf16 operand.
fn operands(
    gpu: &Gpu,
    pools: &mut Pools,
    rows: usize,
    k: usize,
    scaling: Scaling,
    count: usize,
) -> anyhow::Result<Vec<Fp8Tensor>> {
    let pool = pools.get::<half::bf16>(gpu.stream())?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let src = rotate(gpu.stream(), pool, rows * k)?;
        out.push(gpu.fp8().quantize(&src, rows, k, Source::RowMajor, Fp8Format::E4M3, scaling)?);
    }
    Ok(out)
}

/// Whether `e` says the GPU or the loaded cuBLASLt does not offer a recipe (the benchmark
/// then skips it with a note rather than stopping).
pub fn not_offered(e: &gemmbridge::Error) -> bool {
    use gemmbridge::fp8::Fp8Rule;
    matches!(e, gemmbridge::Error::Fp8 { rule: Fp8Rule::ComputeCapability | Fp8Rule::LibraryVersion, .. })
}

/// One row per recipe in `scalings` for `shape` (recipes this GPU does not offer are skipped
/// with a note).
pub fn bench(
    gpu: &Gpu,
    pools: &mut Pools,
    shape: Shape,
    scalings: &[String],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let (m, n, k) = shape;
    // as bench/peer.py: as many (x, w) sets as fit 512 MiB of FP8 operands, 1 to 8
    let count = ((512usize << 20) / (m * k + n * k).max(1)).clamp(1, 8);
    let mut y: CudaSlice<half::bf16> = gpu.stream().alloc_zeros(m * n)?;
    let mut out = Vec::new();
    for name in scalings {
        let (xs, ws) = recipe(name)?;
        if let Err(e) =
            gpu.fp8().quantize(&gpu.stream().alloc_zeros::<half::bf16>(1)?, 1, 1, Source::RowMajor, Fp8Format::E4M3, xs)
        {
            if not_offered(&e) {
                eprintln!("note: {name} skipped: {e}");
                continue;
            }
        }
        let x = operands(gpu, pools, m, k, xs, count)?;
        let w = operands(gpu, pools, n, k, ws, count)?;
        let mut i = 0;
        let t = timing::time_gpu(gpu, sampling, &mut || {
            i = (i + 1) % count;
            gpu.fp8().gemm(&x[i], &w[i], &mut y, None, Fp8Options::default())
        })?;
        out.push(Row {
            op: "scaled_mm".into(),
            dtype: "fp8_e4m3".into(),
            m,
            n,
            k,
            batch: 1,
            median_ms: t.median_ms,
            min_ms: t.min_ms,
            tflops: 2.0 * (m * n * k) as f64 / (t.median_ms * 1e-3) / 1e12,
            scaling: Some(name.clone()),
            layout: None,
            tbps: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalings_parse_in_order_once_each() {
        assert_eq!(parse_scalings("--scalings", "rowwise, block,rowwise").unwrap(), ["rowwise", "block"]);
        assert!(parse_scalings("--scalings", "columnwise").unwrap_err().to_string().contains("tensorwise"));
        let e = parse_scalings("--grouped-scalings", "rowwise,,block").unwrap_err().to_string();
        assert!(e.contains("--grouped-scalings \"rowwise,,block\" has an empty entry"), "{e}");
        assert!(parse_scalings("--scalings", " ").unwrap_err().to_string().contains("give --scalings"));
        assert_eq!(recipe("block").unwrap(), (Scaling::Block1x128, Scaling::Block128x128));
    }
}
