//! [`GpuDecodeStep`]: the layer's decode step ([`crate::layer::DecodeStep`]) on the GPU over a
//! paged KV cache it owns, every launch in stream order with the step's page tables, positions
//! and lengths in device buffers, so that one captured CUDA graph serves every step.

use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::steps::{self, NormForward};
use super::{zeros, Params};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::cuda::api::paged::PageIndex;
use crate::cuda::call::Scale;
use crate::cuda::device::{capture_graph, copy_pitched, refuse_if_capturing, Needs, Pitched, Relaxed, RelaxedDrop};
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layer::reference::Weights;
use crate::layer::{DecodeStep, LayerGemms, Proj};
use crate::layer_ops::{Positions, RopeDirection};
use crate::paged::PagedCache;

/// The step's activations (`b` tokens), the cache's containers and the index buffers.
struct StepBufs<T> {
    h1: CudaSlice<T>,
    /// `qkv[b, (h_q + 2·h_kv)·hd]` after RoPE.
    qkv: CudaSlice<T>,
    /// q copied out of `qkv`, `[b, h_q, hd]` contiguous (what the paged decode reads).
    q: CudaSlice<T>,
    o: CudaSlice<T>,
    x2: CudaSlice<T>,
    h2: CudaSlice<T>,
    gu: CudaSlice<T>,
    act: CudaSlice<T>,
    y: CudaSlice<T>,
    /// The key and value containers `[pages, h_kv, page_size, hd]`.
    k_cache: CudaSlice<T>,
    v_cache: CudaSlice<T>,
    /// The page table `[b, table_width]`.
    tables: CudaSlice<i32>,
    /// Each sequence's held length before the step: RoPE's position and the append's length.
    held: CudaSlice<i32>,
    /// `held + 1`: the lengths attention reads after the append.
    lens: CudaSlice<i32>,
}

/// One LLaMA-style layer's decode step on the GPU ([`DecodeStep`] defines it): `b` sequences,
/// one new token each, RMSNorm, the fused QKV GEMM (M = b), RoPE at each sequence's position,
/// the k and v rows appended into the paged cache ([`GpuPaged::append`](crate::cuda::GpuPaged::append)), paged decode
/// attention over the lengths after the append ([`GpuPaged::decode`](crate::cuda::GpuPaged::decode)), the O GEMM with the
/// residual (β = 1), RMSNorm, the gate/up GEMM, SwiGLU and the down GEMM with the residual —
/// 11 launches, one of them a pitched copy of q out of the fused projection's output (the paged
/// decode reads q contiguous).
///
/// The step owns its weights, activations, the cache's two containers and three device index
/// buffers: the page table, the held lengths (RoPE's positions and the append's lengths) and
/// the lengths after the append. The caller writes the index between steps, from the host,
/// checked ([`GpuDecodeStep::set_index`]; [`GpuDecodeStep::advance`] adds one position to
/// every sequence): the lengths advance by small host-to-device copies in stream order, not
/// on the device, so that every value the step reads has passed the host checks. A step reads
/// the index when it runs, so one step captured into a CUDA graph ([`GpuDecodeStep::capture`])
/// is replayed for every later step; the plans (GEMMs, the norms, cuDNN's paged attention with
/// the cache's bucketed table width) are made at construction and never rebuilt. A sequence
/// that outgrows the table's capacity needs a step built for a wider bucket.
///
/// ```no_run
/// use gemmbridge::cuda::layer::GpuDecodeStep;
/// use gemmbridge::cuda::Gpu;
/// use gemmbridge::half::bf16;
/// use gemmbridge::layer::reference::Weights;
/// use gemmbridge::layer::{DecodeStep, DecoderLayer};
/// use gemmbridge::paged::PagedCache;
///
/// let gpu = Gpu::new(0)?;
/// let l = DecoderLayer::llama3_8b();
/// let cache = PagedCache::new(64 * 256, 16, (8, 128), l.dtype, (64, 1)).for_max_len(4096);
/// let mut step = GpuDecodeStep::<bf16>::new(&gpu, DecodeStep::new(l, cache), &Weights::from_fn(&l, |_, _| 0.01)?)?;
/// let tables: Vec<i32> = (0..64 * 256).collect();
/// step.set_index(&gpu, &tables, &[0; 64])?;
/// let x = gpu.stream().alloc_zeros::<bf16>(64 * l.d_model)?;
/// // SAFETY: x, the step's buffers and cudarc's buffers are used on the Gpu's stream only.
/// unsafe { gpu.context().disable_event_tracking() };
/// let graph = step.capture(&gpu, &x)?;
/// for _ in 0..16 {
///     graph.launch()?; // y in step.output()
///     step.advance(&gpu)?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuDecodeStep<T: Element> {
    step: DecodeStep,
    gemms: LayerGemms,
    // every device buffer is freed with the thread's capture mode relaxed (as the layer's)
    w: RelaxedDrop<Params<T>>,
    bufs: RelaxedDrop<StepBufs<T>>,
    /// The host copy of the index last written: tables and held lengths.
    host: (Vec<i32>, Vec<i32>),
}

impl<T: Element> std::fmt::Debug for GpuDecodeStep<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecodeStep").field("step", &self.step).field("held", &self.host.1).finish()
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecodeStep<T> {
    /// Uploads `weights` (rounded to T), allocates every buffer and the cache's containers
    /// (zeros), and runs one step on zeros so that every plan exists and every kernel is
    /// compiled; then the containers are zeroed and the index is the construction's: sequence
    /// `n`'s table row holds pages `n, n + b, n + 2b, …` (modulo the pages), every held length
    /// 0. Waits for the stream.
    ///
    /// # Errors
    /// As [`DecodeStep::validate`]; [`Weights::check`]; [`Error::DTypeMismatch`] when T is not
    /// the layer's dtype; [`crate::Error::PagedCache`] for fewer pages than sequences (each
    /// sequence writes its own page); from the planning step, as [`Gpu::gemm_fused`],
    /// [`Gpu::rms_norm_forward`], [`Gpu::rope`], [`GpuPaged::append`](crate::cuda::GpuPaged::append), [`GpuPaged::decode`](crate::cuda::GpuPaged::decode)
    /// (e.g. [`Error::Unsupported`] where cuDNN has no paged attention); [`Error::Driver`].
    pub fn new(gpu: &Gpu, step: DecodeStep, weights: &Weights) -> Result<GpuDecodeStep<T>> {
        step.validate()?;
        weights.check(&step.layer)?;
        step.layer.check_element::<T>()?;
        let (l, c, b) = (step.layer, step.cache, step.cache.batch);
        let gemms = l.gemms(step.tokens(), l.precision())?;
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?;
        let w = Params::upload(gpu, weights)?;
        let bufs = StepBufs {
            h1: zeros(gpu, b * l.d_model)?,
            qkv: zeros(gpu, b * l.qkv_width())?,
            q: zeros(gpu, b * l.q_width())?,
            o: zeros(gpu, b * l.q_width())?,
            x2: zeros(gpu, b * l.d_model)?,
            h2: zeros(gpu, b * l.d_model)?,
            gu: zeros(gpu, b * 2 * l.ffn)?,
            act: zeros(gpu, b * l.ffn)?,
            y: zeros(gpu, b * l.d_model)?,
            k_cache: zeros(gpu, c.container_elems())?,
            v_cache: zeros(gpu, c.container_elems())?,
            tables: zeros(gpu, c.table_elems())?,
            held: zeros(gpu, b)?,
            lens: zeros(gpu, b)?,
        };
        let host = (Vec::new(), Vec::new());
        let mut me = GpuDecodeStep { step, gemms, w: RelaxedDrop::new(w), bufs: RelaxedDrop::new(bufs), host };
        me.set_index(gpu, &first_tables(&c), &vec![0; b])?;
        let stand_in: CudaSlice<T> = zeros(gpu, b * l.d_model)?;
        me.run(gpu, &stand_in)?;
        s.memset_zeros(&mut me.bufs.k_cache).map_err(status::driver("cuMemsetD8Async"))?;
        s.memset_zeros(&mut me.bufs.v_cache).map_err(status::driver("cuMemsetD8Async"))?;
        s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        Ok(me)
    }

    /// The step's description.
    pub fn step(&self) -> &DecodeStep {
        &self.step
    }

    /// The page table and held lengths last written (host copies).
    pub fn index(&self) -> (&[i32], &[i32]) {
        (&self.host.0, &self.host.1)
    }

    /// The last step's output `y[b, d]` (valid until the next step).
    pub fn output(&self) -> &CudaSlice<T> {
        &self.bufs.y
    }

    /// The key and value containers `[pages, h_kv, page_size, hd]` ([`crate::paged`]'s layout).
    pub fn caches(&self) -> (&CudaSlice<T>, &CudaSlice<T>) {
        (&self.bufs.k_cache, &self.bufs.v_cache)
    }

    /// The containers, to fill them (a prefill's keys and values, [`GpuPaged::append`](crate::cuda::GpuPaged::append)).
    /// Their addresses never change, so a captured step stays valid.
    pub fn caches_mut(&mut self) -> (&mut CudaSlice<T>, &mut CudaSlice<T>) {
        let b = &mut *self.bufs;
        (&mut b.k_cache, &mut b.v_cache)
    }

    /// Writes the index the next steps read: the page table `[b, table_width]` and each
    /// sequence's held length before the step (its new token's position), checked by
    /// [`DecodeStep::check_index`] first, then copied in stream order (pageable copies the
    /// driver stages before this returns; no host wait). Call it between steps or replays.
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] from the check, nothing written; [`Error::NotCapturable`]
    /// inside a capture; [`Error::Driver`].
    pub fn set_index(&mut self, gpu: &Gpu, tables: &[i32], held: &[i32]) -> Result<()> {
        self.step.check_index(tables, held)?;
        gpu.device().bind()?;
        let needs = Needs::HostCopy("copy a decode step's index from the host (write it between replays)");
        refuse_if_capturing(gpu.stream().cu_stream(), needs, || self.step.describe())?;
        let s = gpu.stream();
        let after: Vec<i32> = held.iter().map(|&p| p + 1).collect();
        let b = &mut *self.bufs;
        s.memcpy_htod(tables, &mut b.tables).map_err(status::driver("cuMemcpyHtoDAsync"))?;
        s.memcpy_htod(held, &mut b.held).map_err(status::driver("cuMemcpyHtoDAsync"))?;
        s.memcpy_htod(&after, &mut b.lens).map_err(status::driver("cuMemcpyHtoDAsync"))?;
        self.host = (tables.to_vec(), held.to_vec());
        Ok(())
    }

    /// Every sequence one position further (after a step appended its token): as
    /// [`GpuDecodeStep::set_index`] with the same tables and each held length plus one.
    ///
    /// # Errors
    /// As [`GpuDecodeStep::set_index`] (a sequence whose next position is past its table's
    /// pages, or whose next page is another's, is named; nothing is written).
    pub fn advance(&mut self, gpu: &Gpu) -> Result<()> {
        let (tables, held) = std::mem::take(&mut self.host);
        let next: Vec<i32> = held.iter().map(|&p| p.saturating_add(1)).collect();
        let r = self.set_index(gpu, &tables, &next);
        if r.is_err() {
            self.host = (tables, held);
        }
        r
    }

    /// Enqueues one step on `x[b, d]` (sequence `n`'s new token in row `n`) with the index last
    /// written: `y` in [`GpuDecodeStep::output`], each sequence's k and v written at its held
    /// length. The held lengths are not advanced ([`GpuDecodeStep::advance`]). No host wait, no
    /// device allocation.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] for `x` shorter than `b·d`; as the entries it calls (after
    /// construction only `x` from another context or overlapping the step's buffers can be
    /// refused).
    pub fn run<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X) -> Result<()> {
        let (l, t) = (self.step.layer, self.step.tokens());
        let want = t.b * l.d_model * T::DTYPE.size_bytes();
        if x.num_bytes() < want {
            let detail = format!("{} bytes, expected {want} ({} tokens of {})", x.num_bytes(), t.b, l.d_model);
            return Err(Error::DecoderShape { what: "the input x is too short", detail });
        }
        let lt = (&l, t);
        let b = &mut *self.bufs;
        steps::norm_forward(gpu, lt, NormForward { x, weight: &self.w.norm1, h: &mut b.h1, rstd: None })?;
        self.project(gpu, Proj::Qkv, x)?;
        self.attend(gpu)?;
        self.project(gpu, Proj::O, x)?;
        let b = &mut *self.bufs;
        steps::norm_forward(gpu, lt, NormForward { x: &b.x2, weight: &self.w.norm2, h: &mut b.h2, rstd: None })?;
        self.project(gpu, Proj::GateUp, x)?;
        let b = &mut *self.bufs;
        steps::swiglu_forward(gpu, lt, &b.gu, &mut b.act)?;
        self.project(gpu, Proj::Down, x)
    }

    /// One step captured into a CUDA graph on [`Gpu::stream`] (thread-local capture mode):
    /// replaying it runs [`GpuDecodeStep::run`] on the same `x` buffer with the index current
    /// at the replay (write x's rows and the index between replays). cudarc's event tracking
    /// must be off, as for any capture of cudarc buffers.
    ///
    /// # Errors
    /// [`Error::NotCapturable`] with event tracking on; as [`GpuDecodeStep::run`];
    /// [`Error::Driver`] from the capture.
    pub fn capture<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X) -> Result<CudaGraph> {
        if gpu.context().is_event_tracking() {
            return Err(Error::NotCapturable {
                action: "capture with cudarc's event tracking on (CudaContext::disable_event_tracking)",
                problem: self.step.describe(),
            });
        }
        let graph = capture_graph(gpu.stream(), || self.run(gpu, x))?;
        graph.ok_or_else(|| Error::NotCapturable { action: "capture an empty step", problem: self.step.describe() })
    }

    /// RoPE at the held positions, the append, q copied out, and the paged decode into `o`.
    fn attend(&mut self, gpu: &Gpu) -> Result<()> {
        let (l, st) = (self.step.layer, self.step);
        let b = &mut *self.bufs;
        let rope = l.rope_problem(st.tokens());
        let held: &dyn DevicePtr<i32> = &b.held;
        gpu.rope(&rope, RopeDirection::Forward, &mut b.qkv, Positions::Given(held), None)?;
        let [_, ok, ov] = l.qkv_offsets();
        let (k, v) = (b.qkv.slice(ok..), b.qkv.slice(ov..));
        // SAFETY: the index buffers hold values set_index checked (DecodeStep::check_index:
        // entries within the container, held + 1 within the capacity, no page written twice).
        let index = unsafe { PageIndex::device(&b.tables, &b.held, None) };
        gpu.paged().append(&st.append(), (&k, &v), (&mut b.k_cache, &mut b.v_cache), index)?;
        copy_q(gpu, &st, &b.qkv, &mut b.q)?;
        // SAFETY: as above; lens = held + 1 ≥ 1, within the capacity.
        let index = unsafe { PageIndex::device(&b.tables, &b.lens, None) };
        gpu.paged().decode(&st.attention(), &b.q, (&b.k_cache, &b.v_cache), &mut b.o, index)
    }

    /// One projection: `qkv = h1·w_qkvᵀ`, `x2 = x + o·w_oᵀ`, `gu = h2·w_gate_upᵀ` or
    /// `y = x2 + act·w_downᵀ` (the residual as the GEMM's separate C, β = 1).
    fn project(&mut self, gpu: &Gpu, p: Proj, x: &dyn DevicePtr<T>) -> Result<()> {
        let b = &mut *self.bufs;
        let (input, c_in, out, w): (&CudaSlice<T>, Option<&dyn DevicePtr<T>>, &mut CudaSlice<T>, _) = match p {
            Proj::Qkv => (&b.h1, None, &mut b.qkv, &self.w.qkv),
            Proj::O => (&b.o, Some(x), &mut b.x2, &self.w.o),
            Proj::GateUp => (&b.h2, None, &mut b.gu, &self.w.gate_up),
            Proj::Down => (&b.act, Some(&b.x2), &mut b.y, &self.w.down),
        };
        let (scale, ex) = match c_in {
            Some(c) => (Scale::new(1.0, 1.0), Extras { c_in: Some(c), ..Extras::default() }),
            None => (Scale::PRODUCT, Extras::default()),
        };
        gpu.gemm_fused(&self.gemms.fwd[p as usize], scale, input, w, out, ex)
    }
}

/// The construction's page table: sequence `n`'s row holds pages `n, n + b, n + 2b, …` modulo
/// the pages (each sequence's first page its own where there are at least `b` pages).
fn first_tables(c: &PagedCache) -> Vec<i32> {
    let (b, w) = (c.batch, c.table_width);
    (0..c.table_elems()).map(|i| ((i % w * b + i / w) % c.pages) as i32).collect()
}

/// The copy of q's heads of every row of `qkv[b, (h_q + 2·h_kv)·hd]` (at `src`) into
/// `q[b, h_q·hd]` (at `dst`), in bytes of `elem`.
fn q_copy(st: &DecodeStep, (src, dst): (u64, u64), elem: usize) -> Pitched {
    let (l, rows) = (&st.layer, st.cache.batch);
    Pitched {
        src,
        src_pitch: l.qkv_width() * elem,
        src_slice: rows * l.qkv_width() * elem,
        dst,
        dst_pitch: l.q_width() * elem,
        dst_slice: rows * l.q_width() * elem,
        width_bytes: l.q_width() * elem,
        height: rows,
        depth: 1,
    }
}

/// [`q_copy`] enqueued on the Gpu's stream (one pitched device-to-device copy).
fn copy_q<T: Element>(gpu: &Gpu, st: &DecodeStep, qkv: &CudaSlice<T>, q: &mut CudaSlice<T>) -> Result<()> {
    let s = gpu.stream();
    let (src, _gs) = qkv.device_ptr(s);
    let (dst, _gd) = q.device_ptr_mut(s);
    let c = q_copy(st, (src, dst), T::DTYPE.size_bytes());
    gpu.device().bind()?;
    // SAFETY: both are the step's own buffers of this context, qkv holding b rows of
    // qkv_width and q b rows of q_width elements (allocated so in GpuDecodeStep::new), distinct;
    // the stream is the Gpu's own, live.
    unsafe { copy_pitched(&c, s.cu_stream()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::DecoderLayer;
    use crate::DType;

    fn step(pages: usize, batch: usize) -> DecodeStep {
        let l = DecoderLayer::new(72, (4, 2), 64, 88, DType::BF16);
        DecodeStep::new(l, PagedCache::new(pages, 16, (2, 64), DType::BF16, (batch, 4)))
    }

    #[test]
    fn the_first_tables_give_each_sequence_its_own_page_and_pass_the_checks() {
        let st = step(12, 3);
        let t = first_tables(&st.cache);
        assert_eq!(t, [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]);
        st.check_index(&t, &[0; 3]).unwrap();
        // fewer pages than sequences: two sequences write one page, named
        let small = step(2, 3);
        let e = small.check_index(&first_tables(&small.cache), &[0; 3]).unwrap_err();
        assert!(e.to_string().contains("write one page"), "{e}");
    }

    #[test]
    fn q_is_copied_as_b_rows_of_its_heads() {
        let st = step(12, 3);
        let c = q_copy(&st, (4096, 65536), 2);
        // rows of (4 + 2·2)·64 = 512 elements, q the first 256 of each
        assert_eq!((c.src, c.src_pitch, c.dst, c.dst_pitch), (4096, 1024, 65536, 512));
        assert_eq!((c.width_bytes, c.height, c.depth), (512, 3, 1));
        assert_eq!((c.src_slice, c.dst_slice), (3 * 1024, 3 * 512));
    }
}
