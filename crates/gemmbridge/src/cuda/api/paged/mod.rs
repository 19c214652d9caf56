//! The entry point of the append into a paged KV cache on gemmbridge's own kernel
//! (`device/kernels/paged.cu`): the problem and every buffer checked (context, size,
//! alignment, overlap), host tables and lengths checked and then copied in stream order, device
//! ones taken as the caller's contract or copied back and checked first; then one launch on
//! [`Gpu::stream`].

mod decode;

use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{refuse_if_capturing, AppendLaunch, KernelSet, Needs, SCRATCH_BYTES};
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::paged::{HostIndex, PagedAppend};

/// A call's page table and lengths, for [`GpuPaged::append`] and [`GpuPaged::decode`]: on
/// the host ([`PageIndex::host`], checked and copied), or on the device ([`PageIndex::device`],
/// the caller's contract, capturable; [`PageIndex::device_checked`], copied back and checked
/// first, for debugging). A decode reads no new lengths: it refuses them
/// ([`Error::PagedCache`]).
#[derive(Clone, Copy)]
pub struct PageIndex<'a>(pub(super) Index<'a>);

#[derive(Clone, Copy)]
pub(super) enum Index<'a> {
    Host(HostIndex<'a>),
    Device {
        tables: &'a dyn DevicePtr<i32>,
        lens: &'a dyn DevicePtr<i32>,
        new_lens: Option<&'a dyn DevicePtr<i32>>,
        check: bool,
    },
}

impl<'a> PageIndex<'a> {
    /// Tables and lengths on the host: checked against the problem
    /// ([`PagedAppend::check_index`]: entries within the container, lengths within the tables,
    /// no page written that another sequence's live entries hold or named twice in one row's;
    /// [`PagedDecode::check_index`](crate::paged::PagedDecode::check_index) for a decode) before
    /// anything is enqueued, then copied in stream
    /// order into the stream's staging region (pageable copies the driver stages before
    /// returning; at most 1 MiB together: [`Error::Unsupported`] beyond). Such a call cannot be
    /// captured into a CUDA graph ([`Error::NotCapturable`]); device tables can.
    pub fn host(index: HostIndex<'a>) -> PageIndex<'a> {
        PageIndex(Index::Host(index))
    }

    /// Tables `[batch, table_width]`, lengths `[batch]` and, optionally, the rows each sequence
    /// appends `[batch]` (`None`: `seq` each), `int32`, already on the device: read by the
    /// kernel in stream order, no host copy, no synchronisation, capturable (one graph replayed
    /// every step, the caller updating the buffers between replays). Their buffers are checked
    /// (context, size, no overlap with the containers); their values cannot be without a
    /// synchronisation ([`PageIndex::device_checked`] does that).
    ///
    /// # Safety
    /// When the call runs, the values meet [`PagedAppend::check_index`]'s rules (an append) or
    /// [`PagedDecode::check_index`](crate::paged::PagedDecode::check_index)'s (a decode: every entry in `0..pages`, every length from 1
    /// to the table's capacity). The append's kernel never writes outside the containers
    /// whatever they are (a row whose position falls past the table, or whose entry falls
    /// outside `0..pages`, is skipped, and a count is never taken past `seq`), but two places
    /// writing one page race, and rows written into a page another sequence holds (or one
    /// sequence's row naming a page twice) overwrite live keys and values. cuDNN's paged load has no such guard: an entry or a
    /// length out of range makes it read outside the containers.
    pub unsafe fn device(
        tables: &'a dyn DevicePtr<i32>,
        lens: &'a dyn DevicePtr<i32>,
        new_lens: Option<&'a dyn DevicePtr<i32>>,
    ) -> PageIndex<'a> {
        PageIndex(Index::Device { tables, lens, new_lens, check: false })
    }

    /// The same device buffers as [`PageIndex::device`], copied back to the host and checked
    /// as host ones are before the launch: safe, at the price of a synchronisation of
    /// [`Gpu::stream`] per call (for debugging a runtime; not capturable,
    /// [`Error::NotCapturable`]).
    pub fn device_checked(
        tables: &'a dyn DevicePtr<i32>,
        lens: &'a dyn DevicePtr<i32>,
        new_lens: Option<&'a dyn DevicePtr<i32>>,
    ) -> PageIndex<'a> {
        PageIndex(Index::Device { tables, lens, new_lens, check: true })
    }
}

/// The checked spans of a call's buffers: the two containers (written), the two sources and
/// the device index buffers (read: tables, lengths, then the counts if given).
struct Spans {
    written: [Span; 2],
    read: Vec<Span>,
}

/// Bytes host tables and lengths take in the staging region: the table, then the lengths and
/// the counts, each from a 16-byte boundary.
fn host_bytes(op: &PagedAppend, h: &HostIndex) -> usize {
    let c = &op.cache;
    let lens = 4 * c.batch.next_multiple_of(4);
    4 * c.table_elems().next_multiple_of(4) + lens + if h.new_lens.is_some() { lens } else { 0 }
}

/// The device index buffers of a call (none for host tables): tables, lengths, then the counts
/// if given, each with its name and the `i32` elements it must hold.
fn index_buffers<'a>(op: &PagedAppend, index: &PageIndex<'a>) -> Vec<(Which, &'a dyn DevicePtr<i32>, usize)> {
    let c = &op.cache;
    match index.0 {
        Index::Host(_) => Vec::new(),
        Index::Device { tables, lens, new_lens, .. } => {
            let mut v =
                vec![(Which::Paged("page table"), tables, c.table_elems()), (Which::Paged("lengths"), lens, c.batch)];
            if let Some(n) = new_lens {
                v.push((Which::Paged("new lengths"), n, c.batch));
            }
            v
        }
    }
}

/// The paged KV cache operations of one [`Gpu`] ([`Gpu::paged`]): appending keys and values through a page
/// table ([`GpuPaged::append`]) and decode attention over it ([`GpuPaged::decode`]), each enqueued on
/// [`Gpu::stream`].
#[derive(Clone, Copy, Debug)]
pub struct GpuPaged<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The paged KV cache operations ([`GpuPaged`]).
    pub fn paged(&self) -> GpuPaged<'_> {
        GpuPaged { gpu: self }
    }
}

impl GpuPaged<'_> {
    /// Appends a step's new key and value rows into a paged KV cache on [`Gpu::stream`]:
    /// `k_new`, `v_new` (`[b, seq, h_kv, d]`, token rows `op.ld` apart, so views of a fused
    /// QKV projection's output are read in place) written into the containers `k_cache`,
    /// `v_cache` (`[pages, h_kv, page_size, d]`) at each sequence's length through the page
    /// table, as [`PagedAppend`] defines it (layout and tables: [`crate::paged`]). Element type
    /// `T` (f16 or bf16, the cache's); a copy, so the result equals [`crate::cpu::paged_append`]'s
    /// bit for bit. Nothing else of the containers is written; the lengths are not changed
    /// (the caller advances them). 16-byte accesses where both sources are 16-byte aligned and
    /// `op.ld` a multiple of 8.
    ///
    /// The first call compiles the kernel (NVRTC, once per process and device); make one before
    /// capturing a graph.
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::PagedCache`] ([`PagedAppend::validate`]; host or
    /// checked device tables and lengths, [`PagedAppend::check_index`]);
    /// [`Error::DTypeMismatch`] for `T` other than the cache's; [`Error::BufferTooSmall`] for a
    /// source, a container or a device index buffer; [`Error::Misaligned`] for a container not
    /// 16-byte aligned (cuDNN's paged attention needs it); [`Error::OutputOverlapsInput`] where
    /// a container overlaps the other or any input; [`Error::WrongContext`];
    /// [`Error::NotCapturable`] for a first call, host tables or checked device tables inside a
    /// capture; [`Error::Unsupported`] for host tables and lengths above 1 MiB;
    /// [`Error::LibraryNotFound`] without NVRTC; [`Error::Driver`].
    pub fn append<T: Element>(
        &self,
        op: &PagedAppend,
        (k_new, v_new): (&dyn DevicePtr<T>, &dyn DevicePtr<T>),
        (k_cache, v_cache): (&mut dyn DevicePtrMut<T>, &mut dyn DevicePtrMut<T>),
        index: PageIndex<'_>,
    ) -> Result<()> {
        let gpu = self.gpu;
        op.validate()?;
        if T::DTYPE != op.cache.dtype {
            return Err(Error::DTypeMismatch {
                operand: Which::Paged("k cache"),
                expected: op.cache.dtype,
                got: T::DTYPE,
            });
        }
        if let Index::Host(h) = index.0 {
            op.check_index(&h)?;
            let bytes = host_bytes(op, &h);
            if bytes > SCRATCH_BYTES {
                return Err(Error::Unsupported {
                    backend: "the paged append with host tables",
                    what: format!(
                        "tables and lengths of {bytes} bytes, above the {SCRATCH_BYTES}-byte staging region (copy them \
                         to the device: PageIndex::device_checked) ({})",
                        op.describe()
                    ),
                });
            }
        }
        let ctx = gpu.context();
        let device_index = index_buffers(op, &index);
        same_context(Which::Paged("new k"), k_new.stream(), ctx)?;
        same_context(Which::Paged("new v"), v_new.stream(), ctx)?;
        for &(w, b, _) in &device_index {
            same_context(w, b.stream(), ctx)?;
        }
        same_context(Which::Paged("k cache"), k_cache.stream(), ctx)?;
        same_context(Which::Paged("v cache"), v_cache.stream(), ctx)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(7);
        let spans = gpu.spans(op, (k_new, v_new), (k_cache, v_cache), &device_index, &mut guards)?;
        disjoint(&spans.written, &spans.read)?;
        if let Index::Device { check: true, .. } = index.0 {
            gpu.check_on_host(&op.describe(), &spans.read[2..], &|h| op.check_index(h))?;
        }
        let r = gpu.enqueue_append(op, &spans, index);
        drop(guards);
        r
    }
}

impl Gpu {
    /// Every buffer's span (its size checked; the containers' alignment too), their guards
    /// pushed to `guards`.
    fn spans<'g, T: Element>(
        &'g self,
        op: &PagedAppend,
        (k_new, v_new): (&'g dyn DevicePtr<T>, &'g dyn DevicePtr<T>),
        (k_cache, v_cache): (&'g mut dyn DevicePtrMut<T>, &'g mut dyn DevicePtrMut<T>),
        device_index: &[(Which, &'g dyn DevicePtr<i32>, usize)],
        guards: &mut Vec<SyncOnDrop<'g>>,
    ) -> Result<Spans> {
        let (s, e, c) = (self.stream(), T::DTYPE.size_bytes(), &op.cache);
        let mut container = |w: Which, b: &'g mut dyn DevicePtrMut<T>| -> Result<Span> {
            let bytes = b.num_bytes();
            let (addr, g) = b.device_ptr_mut(s);
            guards.push(g);
            let span = Span::sized(w, addr, bytes, c.container_elems(), e)?;
            if !addr.is_multiple_of(16) {
                return Err(Error::Misaligned { operand: w, address: addr, align: 16 });
            }
            Ok(span)
        };
        let written = [container(Which::Paged("k cache"), k_cache)?, container(Which::Paged("v cache"), v_cache)?];
        let mut read = Vec::with_capacity(5);
        for (w, b) in [(Which::Paged("new k"), k_new), (Which::Paged("new v"), v_new)] {
            let (addr, g) = b.device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, addr, b.num_bytes(), op.source_elems(), e)?);
        }
        for &(w, b, n) in device_index {
            let (addr, g) = b.device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, addr, b.num_bytes(), n, 4)?);
        }
        Ok(Spans { written, read })
    }

    /// Copies device tables and lengths (`index`: their checked spans: tables, lengths, then
    /// the counts if given) back to the host after the stream's work before them, and checks
    /// them with `check` (`problem` names the call in errors). Synchronises [`Gpu::stream`].
    pub(super) fn check_on_host(
        &self,
        problem: &str,
        index: &[Span],
        check: &dyn Fn(&HostIndex) -> Result<()>,
    ) -> Result<()> {
        let stream = self.stream().cu_stream();
        self.device().bind()?;
        let needs = Needs::HostCopy("copy device page tables back to check them (PageIndex::device_checked)");
        refuse_if_capturing(stream, needs, || problem.to_string())?;
        let mut host: Vec<Vec<i32>> = index.iter().map(|s| vec![0i32; s.bytes / 4]).collect();
        for (dst, span) in host.iter_mut().zip(index) {
            // SAFETY: `span` is a checked device buffer of this context holding `dst.len()` i32
            // (its guard is held by the caller); the stream is the Gpu's own, and is
            // synchronised below before `dst` is read.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, span.addr, stream) }
                .map_err(status::driver("cuMemcpyDtoHAsync"))?;
        }
        // SAFETY: the Gpu's own live stream, its context bound.
        unsafe { cudarc::driver::result::stream::synchronize(stream) }
            .map_err(status::driver("cuStreamSynchronize"))?;
        let h = HostIndex { tables: &host[0], lens: &host[1], new_lens: host.get(2).map(|v| v.as_slice()) };
        check(&h)
    }

    /// Enqueues the append over checked buffers: host tables and lengths copied into the
    /// stream's staging region first (refused inside a capture), under one hold of the lock.
    fn enqueue_append(&self, op: &PagedAppend, spans: &Spans, index: PageIndex<'_>) -> Result<()> {
        let stream = self.stream().cu_stream();
        self.device().bind()?;
        let mut st = self.lock();
        // compiled on the first call (never inside a capture), taken again for the launch below
        st.dev.kernels(stream, KernelSet::Paged)?;
        let [k_cache, v_cache] = spans.written.map(|s| s.addr);
        let mut launch = AppendLaunch {
            op,
            k_new: spans.read[0].addr,
            v_new: spans.read[1].addr,
            k_cache,
            v_cache,
            tables: 0,
            lens: 0,
            new_lens: 0,
        };
        match index.0 {
            Index::Device { new_lens, .. } => {
                (launch.tables, launch.lens) = (spans.read[2].addr, spans.read[3].addr);
                launch.new_lens = if new_lens.is_some() { spans.read[4].addr } else { 0 };
            }
            Index::Host(h) => {
                let needs = Needs::HostCopy("copy host page tables and lengths (pass them with PageIndex::device)");
                refuse_if_capturing(stream, needs, || op.describe())?;
                let ws = st.dev.workspaces.get(stream, &|| op.describe())?;
                let c = &op.cache;
                launch.tables = ws.scratch;
                launch.lens = ws.scratch + 4 * c.table_elems().next_multiple_of(4) as u64;
                let copies = [(launch.tables, h.tables), (launch.lens, h.lens)];
                let counts = h.new_lens.map(|n| (launch.lens + 4 * c.batch.next_multiple_of(4) as u64, n));
                for (at, src) in copies.into_iter().chain(counts) {
                    // SAFETY: the staging region belongs to this stream's workspace and holds
                    // host_bytes (checked ≤ its size); the slices have the lengths checked by
                    // check_index; a pageable copy is staged before this returns, in stream
                    // order before the kernel that reads it, under this one hold of the lock.
                    unsafe { cudarc::driver::result::memcpy_htod_async(at, src, stream) }
                        .map_err(status::driver("cuMemcpyHtoDAsync"))?;
                }
                launch.new_lens = counts.map_or(0, |(at, _)| at);
            }
        }
        let kernels = st.dev.kernels(stream, KernelSet::Paged)?;
        // SAFETY: every buffer was checked by the entry point (context, size, the containers
        // 16-byte aligned and apart from everything else) and is borrowed until this returns;
        // the host index lies in the stream's staging region; the stream is the Gpu's own.
        unsafe { launch.enqueue(kernels, stream) }
    }
}
