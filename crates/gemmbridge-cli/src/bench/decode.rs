//! The decode-attention rows of `gemmbridge bench` (`--ops decode_attn`; `decode_step` rows are
//! `decode_step.rs`'s), f16 and bf16, on
//! cuDNN's paged attention ([`GpuPaged::decode`]): the shapes of `bench/decode.json` (the file
//! `bench/decode_peer.py` reads too), one query row per sequence over keys and values read
//! through page tables, device tables and lengths (as a server's captured step has them), the
//! table width bucketed for the longest sequence. Each sequence's pages are spread over the
//! containers (page `j` of sequence `n` is page `j·b + n`), as an allocator serving many
//! sequences leaves them. A row's m is 1, n the shape's s_kv (the longest sequence), k is d,
//! batch is b, its layout the shape's name; its rate is TB/s of the bytes a call must move
//! ([`Shape::bytes`]: the keys and values each sequence holds, q read, o written; the tables
//! and lengths not counted), the count `bench/decode_peer.py` uses too.

use cudarc::driver::DeviceRepr;
use gemmbridge::cuda::{Gpu, PageIndex};
use gemmbridge::paged::PagedDecode;
use gemmbridge::{DType, Element, Precision};

use super::decode_shapes::{shapes, Shape};
use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The decode ops: attention alone, and the layer's whole step (`decode_step.rs`).
pub const OPS: [&str; 2] = ["decode_attn", super::decode_step::OP];

/// Every row: per f16/bf16 dtype of `dtypes`, per shape, per op of `ops`; `each` is called with
/// every row as it is made. A row the loaded cuDNN does not serve is skipped, named.
pub fn bench(
    gpu: &Gpu,
    ops: &[String],
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let (steps, ops): (Vec<String>, Vec<String>) = ops.iter().cloned().partition(|o| o == super::decode_step::OP);
    if !steps.is_empty() {
        rows.extend(super::decode_step::bench(gpu, dtypes, sampling, each)?);
    }
    if ops.is_empty() {
        return Ok(rows);
    }
    for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
        for shape in shapes()? {
            let p = shape.problem(precision.input())?;
            let new = match p.cache.dtype {
                DType::F16 => shape_rows::<half::f16>(gpu, &shape, &p, name, &ops, sampling)?,
                _ => shape_rows::<half::bf16>(gpu, &shape, &p, name, &ops, sampling)?,
            };
            for row in new {
                each(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn shape_rows<T: Element + DeviceRepr>(
    gpu: &Gpu,
    shape: &Shape,
    p: &PagedDecode,
    dtype: &str,
    ops: &[String],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let s = gpu.stream();
    let (q, k, v) = (
        s.clone_htod(&normal::<T>(p.query_elems()))?,
        s.clone_htod(&normal::<T>(p.cache.container_elems()))?,
        s.clone_htod(&normal::<T>(p.cache.container_elems()))?,
    );
    let mut o = s.clone_htod(&normal::<T>(p.query_elems()))?;
    let (tables, lens) = (s.clone_htod(&shape.tables(p))?, s.clone_htod(&shape.lens())?);
    s.synchronize()?;
    let mut rows = Vec::new();
    for op in ops {
        let timed = match op.as_str() {
            "decode_attn" => timing::time_gpu(gpu, sampling, &mut || {
                // SAFETY: the tables and lengths passed PagedDecode::check_index in
                // Shape::problem and are not changed.
                let index = unsafe { PageIndex::device(&tables, &lens, None) };
                gpu.paged().decode(p, &q, (&k, &v), &mut o, index)
            }),
            other => anyhow::bail!("unknown decode op {other:?}"),
        };
        let t = match timed {
            Err(e) if super::attn::unsupported(&e) => {
                eprintln!("{op} {}: skipped: {e}", p.describe());
                continue;
            }
            other => other?,
        };
        let bytes = shape.bytes(p.cache.dtype.size_bytes());
        let dims = [1, shape.s_kv, shape.d, shape.b];
        rows.push(Row::bandwidth(op, dtype, dims, &t, bytes, shape.name.clone()));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_is_a_valid_problem_with_tables_in_range() {
        let all = shapes().unwrap();
        assert_eq!(all.iter().map(|s| s.b).collect::<Vec<_>>(), [1, 8, 64, 64]);
        for s in &all {
            let p = s.problem(DType::BF16).unwrap();
            assert_eq!(p.cache.max_len(), 4096, "{}", s.name);
            let mut t = s.tables(&p);
            t.sort_unstable();
            assert_eq!(t, (0..p.cache.pages as i32).collect::<Vec<_>>(), "{}: every page once", s.name);
        }
        let ragged = &all[3];
        assert_eq!(ragged.lens().len(), 64);
        assert!(ragged.lens().iter().all(|&l| (256..=4096).contains(&l)));
    }

    #[test]
    fn the_bytes_are_the_held_keys_and_values_q_and_o() {
        let s =
            Shape { name: "x".into(), b: 2, h_q: 4, h_kv: 2, d: 8, s_kv: 64, page_size: 16, lens: Some(vec![10, 30]) };
        // k and v: 2·40·2·8 = 1280 elements; q and o: 2·2·4·8 = 128
        assert_eq!(s.bytes(2), (1280.0 + 128.0) * 2.0);
        let p = s.problem(DType::F16).unwrap();
        assert_eq!(s.tables(&p), [0, 2, 4, 6, 1, 3, 5, 7]);
    }
}
