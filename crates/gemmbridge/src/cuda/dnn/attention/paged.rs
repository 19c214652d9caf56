//! The operation graph of decode attention over a paged KV cache: the forward graph of
//! `graphs.rs` (padding mask by the lengths, no causal mask, no statistics) whose `kᵀ` and `v`
//! are virtual tensors that two paged cache loads gather from the containers through the page
//! table — the graph cudnn-frontend's SDPA node lowers to when it is given page tables
//! (`set_paged_attention_k_table`, `…_v_table`, `…_max_seq_len_kv`; cuDNN 9.5.0 and later).
//!
//! Shapes as cuDNN takes them (cudnn-frontend's paged SDPA): the containers
//! `[pages, h_kv, page_size, d]` dense; the table `[b, 1, width, 1]` int32 (strides
//! `[width, width, 1, 1]`); the loaded `kᵀ[b, h_kv, d, s_kv]` with strides
//! `[h_kv·d·s_kv, d·s_kv, 1, d]` and `v[b, h_kv, s_kv, d]` dense, `s_kv = width·page_size`
//! (the table's capacity, the plan's maximum key length); the q lengths (all 1) and the kv
//! lengths `[b, 1, 1, 1]` int32, both required with page tables.

use super::graphs::{attend, i, io_type, lens, operand, uid};
use crate::attention::{Attention, AttnTensor};
use crate::cuda::dnn::builder::{dense, Builder, Dt};
use crate::error::Result;

/// The containers' geometry a paged plan is built for: pages per container and positions per
/// page (the table's width is `s_kv / page_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PagedShape {
    pub pages: usize,
    pub page_size: usize,
}

/// The table's dimensions and strides: `[b, 1, width, 1]`, one row per sequence.
pub(super) fn table_dims(p: &Attention, shape: PagedShape) -> ([i64; 4], [i64; 4]) {
    let width = i(p.s_kv / shape.page_size);
    ([i(p.b), 1, width, 1], [width, width, 1, 1])
}

/// The decode graph: `o[b, h_q, 1, d]` from `q[b, h_q, 1, d]` and the containers (uids K and
/// V) read through the page table (uids PAGE_TABLE_K and PAGE_TABLE_V), the lengths (uids
/// LEN_Q, LEN_KV) masking the keys past each sequence's length.
pub(super) fn decode(g: &mut Builder, p: &Attention, shape: PagedShape) -> Result<()> {
    let ty = io_type(p);
    let q = operand(g, p, AttnTensor::Q, uid::Q, false)?;
    let o = operand(g, p, AttnTensor::O, uid::O, false)?;
    let lens = lens(g, p)?;
    let (b, h, s, d) = (i(p.b), i(p.h_kv), i(p.s_kv), i(p.d));
    let container = [i(shape.pages), h, i(shape.page_size), d];
    let k_cache = g.io(uid::K, container, dense(container), ty)?;
    let v_cache = g.io(uid::V, container, dense(container), ty)?;
    let (tdims, tstrides) = table_dims(p, shape);
    let k_table = g.io(uid::PAGE_TABLE_K, tdims, tstrides, Dt::CUDNN_DATA_INT32)?;
    let v_table = g.io(uid::PAGE_TABLE_V, tdims, tstrides, Dt::CUDNN_DATA_INT32)?;
    let kt = g.virt([b, h, d, s], [h * d * s, d * s, 1, d], ty)?;
    g.paged_load([k_cache, lens.kv, k_table], kt)?;
    let v = g.virt([b, h, s, d], dense([b, h, s, d]), ty)?;
    g.paged_load([v_cache, lens.kv, v_table], v)?;
    attend(g, p, [q, kt, v, o], Some(lens), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::dnn::attention::{AttnKey, AttnOp};
    use crate::paged::{PagedCache, PagedDecode};
    use crate::DType;

    #[test]
    fn the_table_is_one_row_of_width_entries_per_sequence() {
        let cache = PagedCache::new(100, 16, (2, 128), DType::BF16, (3, 8));
        let p = PagedDecode::new(cache, 16).attention();
        assert_eq!(p.s_kv, 128);
        let (dims, strides) = table_dims(&p, PagedShape { pages: 100, page_size: 16 });
        assert_eq!(dims, [3, 1, 8, 1]);
        assert_eq!(strides, [8, 8, 1, 1]);
    }

    #[test]
    fn steps_inside_one_bucket_share_one_plan_key() {
        let cache = PagedCache::new(1000, 16, (8, 128), DType::BF16, (4, 1));
        let shape = PagedShape { pages: 1000, page_size: 16 };
        let key = |longest: usize| {
            let p = PagedDecode::new(cache.for_max_len(longest), 32).attention();
            AttnKey::new(&p, AttnOp::PagedDecode(shape), 16)
        };
        // 130 to 256 positions: 16 pages of 16 each time
        assert!((130..=256).all(|l| key(l) == key(130)));
        assert_ne!(key(257), key(256), "past the bucket a wider table, another plan");
        let other = AttnOp::PagedDecode(PagedShape { pages: 1001, page_size: 16 });
        let p = PagedDecode::new(cache.for_max_len(130), 32).attention();
        assert_ne!(AttnKey::new(&p, other, 16), key(130), "another container, another plan");
    }
}
