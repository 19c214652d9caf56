//! Property tests of the paged KV cache ([`PagedCache`]), the append into it
//! ([`PagedAppend`]) and decode attention over it ([`PagedDecode`]): nothing panics or
//! overflows for any sizes, page tables or lengths; a valid cache's counts are exact; and the
//! CPU backend's append, on every problem small enough to run, copies finite rows bit for bit
//! or refuses its index before writing anything.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::cpu;
use gemmbridge::paged::{bucket_width, HostIndex, PagedAppend, PagedCache, PagedDecode, MAX_INDEX};
use gemmbridge::{DType, Element};
use proptest::prelude::*;
use shared::{config, dtype, scalar, size, size_multiple, RUN_ELEMS};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=3, 1 => size()]
}

prop_compose! {
    fn cache()(pages in prop_oneof![1usize..=6, size()], page_size in prop_oneof![Just(16usize), size_multiple(16)],
               heads in dim(), head_dim in prop_oneof![Just(8usize), size_multiple(8)], dtype in dtype(),
               tables in (dim(), dim())) -> PagedCache {
        PagedCache::new(pages, page_size, (heads, head_dim), dtype, tables)
    }
}

prop_compose! {
    fn append()(cache in cache(), seq in dim(), ld in prop::option::of(prop_oneof![0usize..=8, size()])) -> PagedAppend {
        let a = PagedAppend::prefill(cache, seq);
        match ld {
            Some(extra) => a.with_ld(a.row_elems().saturating_add(extra)),
            None => a,
        }
    }
}

fn small(a: &PagedAppend) -> bool {
    a.source_elems() <= RUN_ELEMS && a.cache.container_elems() <= RUN_ELEMS && a.cache.table_elems() <= 64
}

/// Tables and lengths for `a`: small page numbers (sometimes out of range, negative or
/// shared) and lengths near the capacity.
fn index(a: &PagedAppend, seed: u64) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let c = &a.cache;
    let v = shared::values(c.table_elems() + 2 * c.batch, seed);
    let tables =
        v[..c.table_elems()].iter().map(|&x| ((x + 2.0) * c.pages as f32 * 0.3) as i32 - (x > 1.9) as i32).collect();
    let lens = v[c.table_elems()..][..c.batch].iter().map(|&x| ((x + 2.0) / 4.0 * c.max_len() as f32) as i32).collect();
    let new = v[c.table_elems() + c.batch..].iter().map(|&x| ((x + 2.0) / 4.0 * (a.seq + 1) as f32) as i32).collect();
    (tables, lens, new)
}

#[test]
fn problems_run() {
    let n = shared::runnable(append(), |a| a.validate().is_ok() && small(a));
    assert!(n >= 10, "{n} of 1000 appends run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cache_and_decode(c in cache(), heads_q in dim(), scale in scalar(), max_len in size(),
                        tables in prop::collection::vec(prop_oneof![0i32..4, any::<i32>()], 0..8),
                        lens in prop::collection::vec(prop_oneof![0i32..40, any::<i32>()], 0..4)) {
        let _ = (c.describe(), c.page_elems(), c.container_elems(), c.table_elems(), c.max_len(), bucket_width(max_len, c.page_size));
        let _ = (c.for_max_len(max_len).validate(), c.check_tables(&tables));
        let d = PagedDecode::new(c, heads_q).with_scale(scale);
        let _ = (d.describe(), d.query_elems(), d.attention(), d.validate(), d.check_index(&tables, &lens));
        if c.validate().is_ok() {
            prop_assert!(c.container_elems().checked_mul(c.dtype.size_bytes()).is_some_and(|b| b <= isize::MAX as usize));
            prop_assert!(c.table_elems() <= MAX_INDEX && c.max_len() <= MAX_INDEX);
            prop_assert!(c.index(c.pages - 1, c.heads_kv - 1, c.page_size - 1, c.head_dim - 1) < c.container_elems());
            if d.validate().is_ok() {
                prop_assert!(d.attention().validate().is_ok());
            }
        }
        if bucket_width(max_len, c.page_size) < usize::MAX {
            prop_assert!(bucket_width(max_len, c.page_size).is_power_of_two());
        }
    }

    #[test]
    fn append_problem(a in append(), seed in any::<u64>(), with_new in any::<bool>()) {
        let _ = (a.describe(), a.row_elems(), a.tokens(), a.source_elems(), a.bytes_moved());
        // no buffers: refused before anything is allocated or written
        with_elem!(a.cache.dtype, T => {
            let (mut k, mut v): (Vec<T>, Vec<T>) = (Vec::new(), Vec::new());
            let index = HostIndex { tables: &[], lens: &[], new_lens: None };
            let r = cpu::paged_append::<T>(&a, (&[], &[]), (&mut k, &mut v), &index);
            prop_assert!(r.is_err());
        });
        if a.validate().is_err() || !small(&a) {
            return Ok(());
        }
        let c = a.cache;
        prop_assert!(a.source_index(c.batch - 1, a.seq - 1, c.heads_kv - 1, c.head_dim - 1) < a.source_elems());
        let (tables, lens, new) = index(&a, seed);
        let index = HostIndex { tables: &tables, lens: &lens, new_lens: with_new.then_some(&new[..]) };
        let checked = a.check_index(&index);
        with_elem!(c.dtype, T => {
            let (kn, vn): (Vec<T>, Vec<T>) = (shared::buf(a.source_elems(), seed), shared::buf(a.source_elems(), seed + 1));
            let k0: Vec<T> = shared::buf(c.container_elems(), seed + 2);
            let (mut k, mut v) = (k0.clone(), k0.clone());
            let r = cpu::paged_append(&a, (&kn, &vn), (&mut k, &mut v), &index);
            prop_assert_eq!(r.is_ok(), checked.is_ok(), "{}: {:?}", a.describe(), r);
            prop_assert!(shared::finite(&k) && shared::finite(&v));
            if r.is_err() {
                prop_assert!(k.iter().zip(&k0).all(|(x, y)| x.to_f32().to_bits() == y.to_f32().to_bits()), "written on error");
            }
        });
    }
}

#[test]
fn f32_caches_are_refused() {
    let c = PagedCache::new(1, 16, (1, 8), DType::F32, (1, 1));
    assert!(c.validate().is_err());
}
