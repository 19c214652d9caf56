//! The entry point of decode attention over a paged KV cache on cuDNN (SDPA whose keys and
//! values two paged cache loads read through the page table, `dnn/attention/paged.rs`): the
//! problem and every buffer checked (dtype, context, size, alignment, overlap), host tables and
//! lengths checked and then copied in stream order, device ones taken as the caller's contract
//! or copied back and checked first; then the plan (once per bucketed shape) and one launch on
//! [`Gpu::stream`].

use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};

use super::GpuPaged;
use super::{Index, PageIndex};
use crate::cuda::api::attention::span;
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{refuse_if_capturing, Needs, Relaxed, SCRATCH_BYTES};
use crate::cuda::dnn::attention::{AttnBuffers, AttnCall, AttnOp, PagedShape};
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::paged::{HostIndex, PagedDecode};

/// Bytes host tables and lengths take in the staging region: the table, then the lengths from
/// the next 16-byte boundary.
pub(crate) fn staged_bytes(op: &PagedDecode) -> usize {
    let c = &op.cache;
    4 * c.table_elems().next_multiple_of(4) + 4 * c.batch.next_multiple_of(4)
}

/// The checks of the problem and of the index that need no device: the problem's rules, the
/// element type, no new lengths, host tables and lengths (and their size in the staging
/// region).
pub(crate) fn check_call(op: &PagedDecode, dtype: crate::DType, index: &PageIndex) -> Result<()> {
    op.validate()?;
    if dtype != op.cache.dtype {
        return Err(Error::DTypeMismatch { operand: Which::Paged("q"), expected: op.cache.dtype, got: dtype });
    }
    let new_lens = match index.0 {
        Index::Host(h) => h.new_lens.is_some(),
        Index::Device { new_lens, .. } => new_lens.is_some(),
    };
    if new_lens {
        return Err(Error::PagedCache {
            what: "a decode reads no new lengths",
            detail: format!("new lengths given ({})", op.describe()),
        });
    }
    if let Index::Host(h) = index.0 {
        op.check_index(h.tables, h.lens)?;
        let bytes = staged_bytes(op);
        if bytes > SCRATCH_BYTES {
            return Err(Error::Unsupported {
                backend: "the paged decode with host tables",
                what: format!(
                    "tables and lengths of {bytes} bytes, above the {SCRATCH_BYTES}-byte staging region (copy them to \
                     the device: PageIndex::device_checked) ({})",
                    op.describe()
                ),
            });
        }
    }
    Ok(())
}

/// A decode call's checked buffers: `o` (written), then q, the two containers and the device
/// table and lengths (read, in that order; none for host tables).
struct Spans {
    o: Span,
    read: Vec<Span>,
}

impl GpuPaged<'_> {
    /// Decode attention over a paged KV cache on cuDNN, on [`Gpu::stream`]: for each sequence
    /// `n`, `o[n, h_q, d]` = softmax(`op.scale`·q·kᵀ)·v over the `lens[n]` keys and values the
    /// page table points to, as [`PagedDecode`] defines it (layout and tables:
    /// [`crate::paged`]); query head `hq` reads key/value head `hq / (h_q / h_kv)` (GQA). `q`
    /// and `o` are `[b, h_q, d]` contiguous, the containers `k_cache` and `v_cache`
    /// `[pages, h_kv, page_size, d]`; element type `T`, the cache's (f16 or bf16; f32 softmax
    /// and accumulation). `o` is overwritten; nothing else is written. The only mask is the
    /// lengths' (no causal mask: for one query row at the end of its sequence it adds nothing).
    ///
    /// A plan is built for the batch size, heads, head dimension, the containers' pages and
    /// page size, and the table width `op.cache.table_width` (its capacity is the plan's
    /// maximum key length): build `op` with [`crate::paged::PagedCache::for_max_len`] and one
    /// plan serves every step until the longest sequence doubles
    /// ([`crate::paged::bucket_width`] says why). The first call of a plan builds it (cuDNN's
    /// best-ranked engine configuration; a measured search or the tactic database as for
    /// [`GpuAttention::forward`](crate::cuda::GpuAttention::forward)); later calls only launch, and with device tables
    /// ([`PageIndex::device`]) can be captured into a CUDA graph and replayed, the caller
    /// updating the tables and lengths between replays. Needs cuDNN 9.5.0 or later (a head
    /// dimension above 128: later than 9.9).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::PagedCache`] ([`PagedDecode::validate`]; host or
    /// checked device tables and lengths, [`PagedDecode::check_index`]; new lengths given);
    /// [`Error::AttentionShape`] (`h_q` not a multiple of `h_kv`, the scale);
    /// [`Error::DTypeMismatch`] for `T` other than the cache's; [`Error::BufferTooSmall`] for
    /// q, o, a container or a device index buffer; [`Error::Misaligned`] for any of them not
    /// 16-byte aligned; [`Error::OutputOverlapsInput`] where o overlaps an input;
    /// [`Error::WrongContext`]; [`Error::NotCapturable`] for a first call of a plan, host
    /// tables or checked device tables inside a capture; [`Error::Unsupported`] for host
    /// tables and lengths above 1 MiB, a cuDNN before 9.5.0, or where no engine takes the
    /// graph; [`Error::LibraryNotFound`] without libcudnn. From cuDNN: [`Error::Cudnn`].
    pub fn decode<T: Element>(
        &self,
        op: &PagedDecode,
        q: &dyn DevicePtr<T>,
        (k_cache, v_cache): (&dyn DevicePtr<T>, &dyn DevicePtr<T>),
        o: &mut dyn DevicePtrMut<T>,
        index: PageIndex<'_>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_call(op, T::DTYPE, &index)?;
        let ctx = gpu.context();
        let device_index: Vec<(Which, &dyn DevicePtr<i32>, usize)> = match index.0 {
            Index::Host(_) => Vec::new(),
            Index::Device { tables, lens, .. } => vec![
                (Which::Paged("page table"), tables, op.cache.table_elems()),
                (Which::Paged("lengths"), lens, op.cache.batch),
            ],
        };
        same_context(Which::Paged("q"), q.stream(), ctx)?;
        same_context(Which::Paged("k cache"), k_cache.stream(), ctx)?;
        same_context(Which::Paged("v cache"), v_cache.stream(), ctx)?;
        for &(w, b, _) in &device_index {
            same_context(w, b.stream(), ctx)?;
        }
        same_context(Which::Paged("o"), o.stream(), ctx)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(6);
        let spans = gpu.decode_spans(op, q, (k_cache, v_cache), o, &device_index, &mut guards)?;
        disjoint(&[spans.o], &spans.read)?;
        if let Index::Device { check: true, .. } = index.0 {
            let check = |h: &HostIndex| op.check_index(h.tables, h.lens);
            gpu.check_on_host(&op.describe(), &spans.read[3..], &check)?;
        }
        let [q, k, v] = [0, 1, 2].map(|i| spans.read[i].addr);
        let mut b = AttnBuffers { q, k, v, o: spans.o.addr, ..Default::default() };
        let host = match index.0 {
            Index::Host(h) => Some(h),
            Index::Device { .. } => {
                (b.table, b.len_kv) = (spans.read[3].addr, spans.read[4].addr);
                None
            }
        };
        let r = gpu.decode_run(op, b, host);
        drop(guards);
        r
    }
}

impl Gpu {
    /// Every buffer's span (its size and its 16-byte alignment checked), their guards pushed
    /// to `guards`.
    fn decode_spans<'g, T: Element>(
        &'g self,
        op: &PagedDecode,
        q: &'g dyn DevicePtr<T>,
        (k_cache, v_cache): (&'g dyn DevicePtr<T>, &'g dyn DevicePtr<T>),
        o: &'g mut dyn DevicePtrMut<T>,
        device_index: &[(Which, &'g dyn DevicePtr<i32>, usize)],
        guards: &mut Vec<SyncOnDrop<'g>>,
    ) -> Result<Spans> {
        let (s, e, c) = (self.stream(), T::DTYPE.size_bytes(), &op.cache);
        let mut read = Vec::with_capacity(5);
        let inputs = [
            (Which::Paged("q"), q, op.query_elems()),
            (Which::Paged("k cache"), k_cache, c.container_elems()),
            (Which::Paged("v cache"), v_cache, c.container_elems()),
        ];
        for (w, b, n) in inputs {
            let (addr, g) = b.device_ptr(s);
            guards.push(g);
            read.push(span(w, addr, b.num_bytes(), n, e)?);
        }
        for &(w, b, n) in device_index {
            let (addr, g) = b.device_ptr(s);
            guards.push(g);
            read.push(span(w, addr, b.num_bytes(), n, 4)?);
        }
        let bytes = o.num_bytes();
        let (addr, g) = o.device_ptr_mut(s);
        guards.push(g);
        let o = span(Which::Paged("o"), addr, bytes, op.query_elems(), e)?;
        Ok(Spans { o, read })
    }

    /// Plans (on first use) and launches one checked decode; host tables and lengths are
    /// copied into the stream's staging region first, under the same hold of the lock
    /// (refused inside a capture).
    fn decode_run(&self, op: &PagedDecode, b: AttnBuffers, host: Option<HostIndex>) -> Result<()> {
        let p = op.attention();
        let shape = PagedShape { pages: op.cache.pages, page_size: op.cache.page_size };
        let stream = self.stream().cu_stream();
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        let aop = AttnOp::PagedDecode(shape);
        let mut call = AttnCall { problem: &p, op: aop, buffers: b, host_lens: None, workspace: (0, 0), stream };
        let planned = st.libs.dnn.as_ref().is_some_and(|d| d.attention_planned(&call));
        let needs = if !planned {
            Some(Needs::Plan("plan a paged decode (cuDNN operation graph and engine choice)"))
        } else {
            host.is_some()
                .then_some(Needs::HostCopy("copy host page tables and lengths (pass them with PageIndex::device)"))
        };
        if let Some(needs) = needs {
            refuse_if_capturing(stream, needs, || op.describe())?;
        }
        // Planning may allocate and load kernels: allowed while another thread captures in
        // global mode.
        let _relaxed = if planned { None } else { Some(Relaxed::enter()?) };
        let ctx = self.context();
        st.libs.ensure_dnn(ctx.is_primary().then(|| ctx.ordinal()))?;
        let ws = st.dev.workspaces.get(stream, &|| op.describe())?;
        call.workspace = (ws.ptr, ws.matmul_bytes);
        if let Some(h) = host {
            let tables = ws.scratch;
            let lens = tables + 4 * op.cache.table_elems().next_multiple_of(4) as u64;
            for (at, src) in [(tables, h.tables), (lens, h.lens)] {
                // SAFETY: the staging region belongs to this stream's workspace and holds
                // staged_bytes (checked ≤ its size by check_call); the slices have the lengths
                // check_index checked; a pageable copy is staged before this returns, in stream
                // order before the launch that reads it, under this one hold of the lock.
                unsafe { cudarc::driver::result::memcpy_htod_async(at, src, stream) }
                    .map_err(status::driver("cuMemcpyHtoDAsync"))?;
            }
            (call.buffers.table, call.buffers.len_kv) = (tables, lens);
        }
        let dnn = st.libs.dnn.as_mut().expect("created above");
        // SAFETY: every address was checked by the entry point against the problem's sizes
        // (16-byte aligned, of this context, q and the containers apart from o) and is
        // borrowed until this returns, or lies in this stream's staging region; the workspace
        // is this stream's; the stream is the Gpu's own, live.
        unsafe { dnn.attention(&call, &mut || Ok(())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paged::PagedCache;
    use crate::DType;

    fn decode() -> PagedDecode {
        PagedDecode::new(PagedCache::new(40, 16, (2, 64), DType::BF16, (3, 4)), 8)
    }

    #[test]
    fn host_tables_and_lengths_are_staged_from_16_byte_boundaries() {
        // 12 entries (48 bytes), then 3 lengths padded to 4
        assert_eq!(staged_bytes(&decode()), 48 + 16);
        let wide = PagedDecode::new(decode().cache.with_tables(3, 5), 8);
        assert_eq!(staged_bytes(&wide), 64 + 16);
    }

    #[test]
    fn bad_calls_are_named_before_any_device_work() {
        let op = decode();
        let tables: Vec<i32> = (0..12).collect();
        let lens = [1, 64, 7];
        let ok = PageIndex::host(HostIndex { tables: &tables, lens: &lens, new_lens: None });
        check_call(&op, DType::BF16, &ok).unwrap();
        let e = check_call(&op, DType::F16, &ok).unwrap_err();
        assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
        let counts = [1, 1, 1];
        let with_counts = PageIndex::host(HostIndex { tables: &tables, lens: &lens, new_lens: Some(&counts) });
        let e = check_call(&op, DType::BF16, &with_counts).unwrap_err();
        assert!(matches!(e, Error::PagedCache { what: "a decode reads no new lengths", .. }), "{e}");
        let long = [1, 65, 7];
        let e =
            check_call(&op, DType::BF16, &PageIndex::host(HostIndex { tables: &tables, lens: &long, new_lens: None }))
                .unwrap_err();
        assert!(e.to_string().contains("lens[1] = 65"), "{e}");
        let empty = [1, 0, 7];
        let e =
            check_call(&op, DType::BF16, &PageIndex::host(HostIndex { tables: &tables, lens: &empty, new_lens: None }))
                .unwrap_err();
        assert!(matches!(e, Error::PagedCache { what: "a length is below 1", .. }), "{e}");
        let mut past = tables.clone();
        past[5] = 40;
        let e =
            check_call(&op, DType::BF16, &PageIndex::host(HostIndex { tables: &past, lens: &lens, new_lens: None }))
                .unwrap_err();
        assert!(e.to_string().contains("table[1, 1] = 40"), "{e}");
        let gqa = PagedDecode::new(op.cache, 3);
        let e = check_call(&gqa, DType::BF16, &ok).unwrap_err();
        assert!(matches!(e, Error::AttentionShape { .. }), "{e}");
        let big = PagedDecode::new(PagedCache::new(1 << 20, 16, (1, 64), DType::BF16, (512, 1024)), 1);
        let (t, l) = (vec![0i32; 512 * 1024], vec![1i32; 512]);
        let e = check_call(&big, DType::BF16, &PageIndex::host(HostIndex { tables: &t, lens: &l, new_lens: None }))
            .unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    }
}
