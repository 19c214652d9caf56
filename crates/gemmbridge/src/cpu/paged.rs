//! The append into a paged KV cache on the CPU: [`crate::paged::PagedAppend`]'s copy over host
//! slices, the reference the GPU kernel (`cuda/device/kernels/paged.cu`) equals bit for bit (a
//! copy: every element written is a source element's bits).

use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::paged::{HostIndex, PagedAppend};

/// Appends `k_new` and `v_new` (`[b, seq, h_kv, d]`, token rows `op.ld` apart) into the
/// containers `k_cache` and `v_cache` (`[pages, h_kv, page_size, d]` each) at each sequence's
/// length, through the page table, as [`PagedAppend`] defines it; nothing else of the
/// containers is written and the lengths are not changed.
///
/// # Errors
/// Before anything is written: [`Error::PagedCache`] ([`PagedAppend::validate`],
/// [`PagedAppend::check_index`]: the tables, the lengths, the counts, a page written that
/// another sequence holds or a row naming one page twice); [`Error::DTypeMismatch`] for `T` other than the cache's element type;
/// [`Error::BufferTooSmall`] for a source below [`PagedAppend::source_elems`] or a container
/// below [`crate::paged::PagedCache::container_elems`].
pub fn paged_append<T: Element>(
    op: &PagedAppend,
    (k_new, v_new): (&[T], &[T]),
    (k_cache, v_cache): (&mut [T], &mut [T]),
    index: &HostIndex,
) -> Result<()> {
    op.validate()?;
    let c = &op.cache;
    if T::DTYPE != c.dtype {
        return Err(Error::DTypeMismatch { operand: Which::Paged("k cache"), expected: c.dtype, got: T::DTYPE });
    }
    let e = T::DTYPE.size_bytes();
    for (w, len, need) in [
        (Which::Paged("new k"), k_new.len(), op.source_elems()),
        (Which::Paged("new v"), v_new.len(), op.source_elems()),
        (Which::Paged("k cache"), k_cache.len(), c.container_elems()),
        (Which::Paged("v cache"), v_cache.len(), c.container_elems()),
    ] {
        Error::check_len(w, len, need, e)?;
    }
    op.check_index(index)?;
    let d = c.head_dim;
    for n in 0..c.batch {
        let len = index.lens[n] as usize;
        for i in 0..op.new_rows(index, n) {
            let (page, slot) = c.locate(index.tables, n, len + i);
            for h in 0..c.heads_kv {
                let (src, dst) = (op.source_index(n, i, h, 0), c.index(page, h, slot, 0));
                k_cache[dst..dst + d].copy_from_slice(&k_new[src..src + d]);
                v_cache[dst..dst + d].copy_from_slice(&v_new[src..src + d]);
            }
        }
    }
    Ok(())
}
