//! The decode-step rows of `gemmbridge bench` (`--ops decode_step`): one LLaMA-3-8B layer's
//! decode step ([`GpuDecodeStep`], bf16) on the shapes of `bench/decode.json` that give every
//! sequence one length (b 1, 8, 64 at 4096 keys): each sequence holds `s_kv − 1` positions, so
//! the step's attention reads `s_kv` keys and values after its append; pages and tables as the
//! decode_attn rows lay them out (`decode.rs`). Each call replays one CUDA graph holding the
//! whole step (the index is not advanced between calls: every call appends at the same
//! position, as far as timing goes the same step). A row's m is 1, n the shape's s_kv, k the
//! model width, batch b, layout [`LAYOUT`]; its rate is TB/s of the bytes a step must move
//! ([`DecodeStep::bytes`]: the layer's weights and the keys and values read; activations,
//! tables and lengths not counted), the count `bench/decode_step_peer.py` uses too.

use cudarc::driver::CudaSlice;
use gemmbridge::cuda::layer::GpuDecodeStep;
use gemmbridge::cuda::Gpu;
use gemmbridge::half::bf16;
use gemmbridge::layer::{DecodeStep, DecoderLayer};
use gemmbridge::paged::{bucket_width, PagedCache};
use gemmbridge::{DType, Precision};

use super::decode_shapes::{shapes, Shape};
use super::decoder::synthetic_weights;
use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The op.
pub const OP: &str = "decode_step";

/// The rows' layout label (the peer's): the layer and the page size.
pub const LAYOUT: &str = "llama3-8b-p16";

/// A shape's step (LLaMA 3 8B's layer; the shape's heads must be the layer's), its tables
/// (page `j` of sequence `n` is page `j·b + n`, as [`Shape::tables`]) and held lengths
/// (`s_kv − 1` each); checked.
pub fn step_for(shape: &Shape) -> anyhow::Result<(DecodeStep, Vec<i32>, Vec<i32>)> {
    let l = DecoderLayer::llama3_8b();
    if (shape.h_q, shape.h_kv, shape.d) != (l.heads_q, l.heads_kv, l.head_dim) {
        anyhow::bail!(
            "decode step shape {}: heads {}/{}×{} are not LLaMA 3 8B's",
            shape.name,
            shape.h_q,
            shape.h_kv,
            shape.d
        );
    }
    let width = bucket_width(shape.s_kv, shape.page_size);
    let (b, ps) = (shape.b, shape.page_size);
    let cache = PagedCache::new(b * width, ps, (l.heads_kv, l.head_dim), DType::BF16, (b, width));
    let step = DecodeStep::new(l, cache);
    let tables: Vec<i32> = (0..b * width).map(|i| ((i % width) * b + i / width) as i32).collect();
    let held = vec![shape.s_kv as i32 - 1; b];
    step.validate()?;
    step.check_index(&tables, &held)?;
    Ok((step, tables, held))
}

/// Every row: per shape of one length, with bf16 in `dtypes` (the layer's only dtype here);
/// `each` is called with every row as it is made. A step the loaded libraries cannot run
/// ([`gemmbridge::Error::Unsupported`]) is reported and its row skipped.
pub fn bench(
    gpu: &Gpu,
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    if !dtypes.iter().any(|(n, _)| n == "bf16") {
        eprintln!("{OP} rows: skipped (they run in bf16, and --dtypes does not name it)");
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    for shape in shapes()?.into_iter().filter(|s| s.lens.is_none()) {
        let (step, tables, held) = step_for(&shape)?;
        let l = step.layer;
        let mut st = match GpuDecodeStep::<bf16>::new(gpu, step, &synthetic_weights(&l)?) {
            Err(e @ gemmbridge::Error::Unsupported { .. }) => {
                eprintln!("{OP} {}: skipped: {e}", step.describe());
                continue;
            }
            other => other?,
        };
        let s = gpu.stream();
        let (k, v) = st.caches_mut();
        s.memcpy_htod(&normal::<bf16>(step.cache.container_elems()), k)?;
        s.memcpy_htod(&normal::<bf16>(step.cache.container_elems()), v)?;
        st.set_index(gpu, &tables, &held)?;
        let x: CudaSlice<bf16> = s.clone_htod(&normal(shape.b * l.d_model))?;
        let graph = st.capture(gpu, &x)?;
        let t = timing::time_gpu(gpu, sampling, &mut || graph.launch())?;
        let lens: Vec<i32> = held.iter().map(|&h| h + 1).collect();
        let dims = [1, shape.s_kv, l.d_model, shape.b];
        let row = Row::bandwidth(OP, "bf16", dims, &t, step.bytes(&lens), LAYOUT.to_string());
        each(&row)?;
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_of_one_length_is_a_step_at_4096_keys() {
        let all: Vec<Shape> = shapes().unwrap().into_iter().filter(|s| s.lens.is_none()).collect();
        assert_eq!(all.iter().map(|s| s.b).collect::<Vec<_>>(), [1, 8, 64]);
        for s in &all {
            let (step, tables, held) = step_for(s).unwrap();
            assert_eq!(step.cache.max_len(), 4096, "{}", s.name);
            assert_eq!(held, vec![4095; s.b]);
            assert_eq!(tables, s.tables(&step.attention()));
        }
        // b 64: 436 MB of weights and 1.07 GB of keys and values
        let (step, _, held) = step_for(&all[2]).unwrap();
        let lens: Vec<i32> = held.iter().map(|&h| h + 1).collect();
        assert!((step.weight_bytes() / 1e6 - 436.2).abs() < 0.1, "{}", step.weight_bytes());
        assert!((step.kv_bytes(&lens) / 1e9 - 1.074).abs() < 0.001, "{}", step.kv_bytes(&lens));
    }

    #[test]
    fn a_shape_with_other_heads_is_refused() {
        let mut s = shapes().unwrap().remove(0);
        s.h_q = 16;
        assert!(step_for(&s).unwrap_err().to_string().contains("not LLaMA 3 8B's"));
    }
}
