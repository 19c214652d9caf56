//! The float64 definition of paged decode attention, for tests: the keys and values gathered
//! through the page tables into contiguous per-sequence tensors ([`gather`]), then
//! [`crate::attention::reference::forward`] on them ([`decode`]) with the lengths as its
//! padding mask.
//!
//! # Panics
//! Every function panics, naming the rule, on a cache or problem that its `validate` refuses,
//! on tables or lengths that [`PagedDecode::check_index`] refuses, or on slices of the wrong
//! length (these are test references, not an API that returns errors).

use super::{PagedCache, PagedDecode};
use crate::attention::reference;

/// A container's positions gathered per sequence: `[b, h_kv, max_len, d]` contiguous (BHSD,
/// `max_len` = [`PagedCache::max_len`]), position `p < lens[n]` of sequence `n` from slot
/// `p mod page_size` of page `table[n, p / page_size]`; positions past `lens[n]` are 0.
///
/// # Panics
/// As the module says; `container` must hold [`PagedCache::container_elems`] values.
pub fn gather(cache: &PagedCache, container: &[f64], tables: &[i32], lens: &[i32]) -> Vec<f64> {
    expect(cache.validate(), "cache");
    expect(cache.check_tables(tables), "tables");
    expect(cache.check_lens("lens", lens, 0), "lengths");
    assert_eq!(container.len(), cache.container_elems(), "paged::reference::gather: the container's length");
    let (h_kv, len, d) = (cache.heads_kv, cache.max_len(), cache.head_dim);
    let mut out = vec![0.0; cache.batch * h_kv * len * d];
    for (n, &held) in lens.iter().enumerate() {
        for p in 0..held as usize {
            let (page, slot) = cache.locate(tables, n, p);
            for h in 0..h_kv {
                let dst = ((n * h_kv + h) * len + p) * d;
                let src = cache.index(page, h, slot, 0);
                out[dst..dst + d].copy_from_slice(&container[src..src + d]);
            }
        }
    }
    out
}

/// Paged decode attention in float64: `o[b, h_q, d]` (contiguous) from the queries `q[b, h_q,
/// d]` (contiguous) and the key and value containers through `tables` and `lens` (each
/// `lens[n] ≥ 1`), as [`PagedDecode`] defines it: the contiguous forward of
/// [`PagedDecode::attention`] over the [`gather`]ed keys and values, query lengths 1, key
/// lengths `lens`.
///
/// # Panics
/// As the module says.
pub fn decode(p: &PagedDecode, q: &[f64], (k, v): (&[f64], &[f64]), tables: &[i32], lens: &[i32]) -> Vec<f64> {
    expect(p.validate(), "problem");
    expect(p.check_index(tables, lens), "tables or lengths");
    assert_eq!(q.len(), p.query_elems(), "paged::reference::decode: q's length");
    let (kc, vc) = (gather(&p.cache, k, tables, lens), gather(&p.cache, v, tables, lens));
    let ones = vec![1i32; p.cache.batch];
    reference::forward(&p.attention(), q, &kc, &vc, Some((&ones, lens))).o
}

fn expect(r: crate::error::Result<()>, what: &str) {
    if let Err(e) = r {
        panic!("paged::reference: the {what}: {e}");
    }
}
