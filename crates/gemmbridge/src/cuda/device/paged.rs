//! The launch of the append into a paged KV cache (`kernels/paged.cu`): planned on the host
//! ([`AppendLaunch::plan`]: the instance, 16-byte accesses where every source row and the
//! containers allow them, and the grid), then enqueued on a raw stream; the entry point
//! (`cuda/api/paged.rs`) checks every buffer, and host tables and lengths, first.

use cudarc::driver::sys::CUstream;

use super::kernels::{arg, Kernels};
use crate::error::Result;
use crate::paged::PagedAppend;

/// Threads per CTA (the kernel's `__launch_bounds__`).
const THREADS: usize = 256;
/// Most CTAs of the grid-stride loop: 8 per SM of a 132-SM H100 or H200, 2048 threads each.
const MAX_CTAS: usize = 1056;

/// One append over checked buffers: the problem and the device addresses (`new_lens` 0 where
/// every sequence appends `seq` rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppendLaunch<'a> {
    pub op: &'a PagedAppend,
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub tables: u64,
    pub lens: u64,
    pub new_lens: u64,
}

/// What an append runs: the kernel, elements per thread and access, and the grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppendPlan {
    pub kernel: &'static str,
    /// Elements a thread moves per access: 8 (16 bytes) or 1.
    pub width: usize,
    pub grid: (u32, u32, u32),
}

impl AppendLaunch<'_> {
    /// The 8-wide instance where both sources and both containers are 16-byte aligned and `ld`
    /// is a multiple of 8 elements (the head dimension is, by the cache's rules), else the
    /// scalar one; a grid of one thread per unit, at most [`MAX_CTAS`] CTAs.
    pub fn plan(&self) -> AppendPlan {
        let wide = self.op.ld.is_multiple_of(8)
            && [self.k_new, self.v_new, self.k_cache, self.v_cache].iter().all(|a| a.is_multiple_of(16));
        let (kernel, width) = if wide { ("paged_append_v8_b2", 8) } else { ("paged_append_b2", 1) };
        let items = self.op.tokens().saturating_mul(self.op.row_elems() / width);
        AppendPlan { kernel, width, grid: (items.div_ceil(THREADS).clamp(1, MAX_CTAS) as u32, 1, 1) }
    }

    /// Enqueues the append on `stream`.
    ///
    /// # Safety
    /// The problem passed [`PagedAppend::validate`]; `k_new` and `v_new` hold
    /// [`PagedAppend::source_elems`] 2-byte elements, `k_cache` and `v_cache`
    /// [`crate::paged::PagedCache::container_elems`], `tables` `batch·table_width` `i32`,
    /// `lens` (and `new_lens` when not 0) `batch` `i32`, all device memory of `k`'s context, the
    /// containers overlapping nothing else; `stream` is a live stream of that context, which is
    /// current. (The values of the tables and lengths are not part of the contract: rows they
    /// place outside the table or the containers are not written.)
    pub unsafe fn enqueue(&self, k: &Kernels, stream: CUstream) -> Result<()> {
        let (op, plan) = (self.op, self.plan());
        let c = &op.cache;
        let (mut k_new, mut v_new, mut k_cache, mut v_cache) = (self.k_new, self.v_new, self.k_cache, self.v_cache);
        let (mut tables, mut lens, mut new_lens) = (self.tables, self.lens, self.new_lens);
        let mut ld = op.ld as i64;
        // every value below 2³¹ (PagedAppend::validate: seq, the counts and the table's entries)
        let [mut seq, mut batch, mut heads, mut d, mut shift, mut width, mut pages] =
            [op.seq, c.batch, c.heads_kv, c.head_dim, c.page_size.trailing_zeros() as usize, c.table_width, c.pages]
                .map(|v| v as i32);
        let mut args = [
            arg(&mut k_new),
            arg(&mut v_new),
            arg(&mut k_cache),
            arg(&mut v_cache),
            arg(&mut tables),
            arg(&mut lens),
            arg(&mut new_lens),
            arg(&mut ld),
            arg(&mut seq),
            arg(&mut batch),
            arg(&mut heads),
            arg(&mut d),
            arg(&mut shift),
            arg(&mut width),
            arg(&mut pages),
        ];
        // SAFETY: the arguments are paged.cu's parameters in order (seven addresses, ld as long
        // long, seven int); the 8-wide instance only where every access is 16-byte aligned; the
        // buffers are the caller's contract.
        unsafe { k.launch(plan.kernel, plan.grid, THREADS as u32, stream, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::paged::PagedCache;

    fn plan(op: &PagedAppend, k_new: u64) -> AppendPlan {
        let l = AppendLaunch {
            op,
            k_new,
            v_new: 0x2000,
            k_cache: 0x10000,
            v_cache: 0x20000,
            tables: 0,
            lens: 0,
            new_lens: 0,
        };
        l.plan()
    }

    #[test]
    fn the_8_wide_instance_where_every_access_is_aligned() {
        // decoding 64 sequences, 8 heads of 128: 64·8·16 units of 16 bytes, 32 CTAs
        let c = PagedCache::new(4096, 16, (8, 128), DType::BF16, (64, 256));
        let p = plan(&PagedAppend::decode(c), 0x1000);
        assert_eq!(p, AppendPlan { kernel: "paged_append_v8_b2", width: 8, grid: (32, 1, 1) });
        // the key heads of a fused QKV row (h_q = 32): ld 6144, 16-byte aligned views
        assert_eq!(plan(&PagedAppend::decode(c).with_ld(6144), 0x1000 + 32 * 128 * 2).width, 8);
        // a source one element off, or an ld not a multiple of 8: scalar
        assert_eq!(plan(&PagedAppend::decode(c), 0x1002).kernel, "paged_append_b2");
        assert_eq!(plan(&PagedAppend::decode(c).with_ld(1025), 0x1000).width, 1);
        // a long prefill: at most MAX_CTAS CTAs of a grid-stride loop
        assert_eq!(plan(&PagedAppend::prefill(c.with_tables(1, 512), 8192), 0x1000).grid.0 as usize, MAX_CTAS);
    }
}
