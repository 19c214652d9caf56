//! The launch row's paged-decode fields: the host cost of one tiny bf16 paged decode (1
//! sequence, 8 query heads over 1 key/value head of 128, 256 keys in pages of 16, device
//! tables and lengths) — with the same output every call (`decode_host_us`), and as an adapter
//! calls it, a new output buffer every call (`decode_host_fresh_out_us`; all of them allocated
//! before, so the allocation is not timed). Host µs per call, medians over batches as the GEMM
//! fields are.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Gpu, PageIndex};
use gemmbridge::DType;

use super::decode_shapes::Shape;
use crate::random::normal;

const BATCH: usize = 256;
const BATCHES: usize = 40;

/// `(decode_host_us, decode_host_fresh_out_us)`; `None` where the loaded cuDNN does not serve
/// the decode (named on stderr).
pub fn measure(gpu: &Gpu) -> anyhow::Result<Option<(f64, f64)>> {
    let shape = Shape { name: "launch".into(), b: 1, h_q: 8, h_kv: 1, d: 128, s_kv: 256, page_size: 16, lens: None };
    let p = shape.problem(DType::BF16)?;
    let s = gpu.stream();
    let q = s.clone_htod(&normal::<half::bf16>(p.query_elems()))?;
    let k = s.clone_htod(&normal::<half::bf16>(p.cache.container_elems()))?;
    let v = s.clone_htod(&normal::<half::bf16>(p.cache.container_elems()))?;
    let (tables, lens) = (s.clone_htod(&shape.tables(&p))?, s.clone_htod(&shape.lens())?);
    let mut outs: Vec<CudaSlice<half::bf16>> =
        (0..BATCH * BATCHES).map(|_| s.alloc_zeros(p.query_elems())).collect::<Result<_, _>>()?;
    let call = |o: &mut CudaSlice<half::bf16>| {
        // SAFETY: the tables and lengths passed PagedDecode::check_index in Shape::problem and
        // are not changed.
        let index = unsafe { PageIndex::device(&tables, &lens, None) };
        gpu.paged().decode(&p, &q, (&k, &v), o, index)
    };
    for _ in 0..20 {
        if let Err(e) = call(&mut outs[0]) {
            if matches!(e, gemmbridge::Error::Unsupported { .. }) {
                eprintln!("launch: the paged decode fields skipped: {e}");
                return Ok(None);
            }
            return Err(e.into());
        }
    }
    let (mut same, mut fresh) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    for b in 0..BATCHES {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..BATCH {
            call(&mut outs[0])?;
        }
        same.push(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        s.synchronize()?;
        let t = Instant::now();
        for o in outs[b * BATCH..(b + 1) * BATCH].iter_mut() {
            call(o)?;
        }
        fresh.push(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
    }
    s.synchronize()?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Some((median(same), median(fresh))))
}
