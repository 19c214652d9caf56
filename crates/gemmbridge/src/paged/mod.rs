//! A paged KV cache as data: the containers ([`PagedCache`]), the page tables and lengths of a
//! batch of sequences, an append of new key/value rows into their pages ([`PagedAppend`]), the
//! decode attention that reads keys and values through the tables ([`PagedDecode`]), and every
//! rule these must meet, checked on the CPU before anything is launched. [`mod@reference`]
//! holds the float64 definition of paged decode attention.
//!
//! # Layout
//! One container for the keys and one for the values, each `[pages, h_kv, page_size, d]`
//! row-major and contiguous (FlashInfer's "HND" page layout, the one cuDNN's paged attention
//! reads): element `(page, h, slot, e)` at `((page·h_kv + h)·page_size + slot)·d + e`
//! ([`PagedCache::index`]). A page holds `page_size` consecutive positions of one sequence for
//! every key/value head; `page_size` is a power of two from [`MIN_PAGE_SIZE`] to
//! [`MAX_PAGE_SIZE`].
//!
//! A batch of `b` sequences comes with an `int32` page table `[b, table_width]` (row-major,
//! row `n` is sequence `n`'s) and an `int32` length per sequence, `lens[b]`: sequence `n` holds
//! `lens[n]` positions, position `p` at slot `p mod page_size` of page
//! `table[n, p / page_size]`. Every entry of a table lies in `0..pages`, those past a
//! sequence's last page too (cuDNN's paged load may read any entry within the table's width;
//! fill unused entries with any page, 0 for instance), and `lens[n] ≤ table_width·page_size`.
//! Sequences may share pages no append writes (a common prefix, read-only); an append is
//! refused when a page it writes holds live positions of another sequence, or when one
//! sequence's live entries name a page twice ([`PagedAppend::check_index`]). Tables on the
//! device are not read by the host: there these rules are the caller's.
//!
//! # Why the table width is bucketed
//! A cuDNN execution plan for paged attention is built for one batch size, one table width and
//! one maximum key length (`paged_attention_max_seq_len_kv` in cuDNN's frontend: FlashInfer's
//! cuDNN decode path keys its graph cache on exactly these, `flashinfer/cudnn/decode.py`), and
//! building one costs about half a second (FlashInfer's experience), against tens of
//! microseconds for the step it serves. A decoding batch grows by one position per step, so a
//! plan made for its exact maximum would be rebuilt every step. [`bucket_width`] rounds the
//! pages a batch needs up to a power of two: a plan then serves every step until the longest
//! sequence doubles, and a server meets at most `log₂(longest / page_size) + 1` plans per batch
//! size. The maximum key length a plan is built for is the table's capacity,
//! `table_width·page_size` ([`PagedCache::max_len`]), so the two are bucketed together.

mod append;
mod cache;
mod decode;
pub mod reference;

pub use append::{HostIndex, PagedAppend};
pub use cache::PagedCache;
pub use decode::PagedDecode;

use crate::error::{Error, Result};

/// The smallest page size: 16 positions (vLLM's default block size).
pub const MIN_PAGE_SIZE: usize = 16;

/// The largest page size: 256 positions.
pub const MAX_PAGE_SIZE: usize = 256;

/// The largest count, table width or length a description may have: tables, lengths and page
/// indices are `int32`, and cuDNN's tensor descriptors index in 32 bits.
pub const MAX_INDEX: usize = i32::MAX as usize;

/// The table width (pages per sequence) a plan should be built for when the longest sequence
/// of a batch holds `max_len` positions: `⌈max_len / page_size⌉` rounded up to a power of two
/// (1 for `max_len = 0`; saturating). The module documentation says why. A `page_size` of 0 is
/// taken as 1 (such a cache fails [`PagedCache::validate`] anyway).
pub fn bucket_width(max_len: usize, page_size: usize) -> usize {
    let pages = max_len.div_ceil(page_size.max(1)).max(1);
    pages.checked_next_power_of_two().unwrap_or(usize::MAX)
}

/// [`Error::PagedCache`].
fn bad<T>(what: &'static str, detail: String) -> Result<T> {
    Err(Error::PagedCache { what, detail })
}

#[cfg(test)]
mod tests;
