//! [`GpuFp8::quantize`]: FP8 operands ([`Fp8Tensor`]) made on the GPU from f32/f16/bf16 data by
//! gemmbridge's own kernels, with their scales in the layout cuBLASLt reads. Reads
//! validate → allocate → enqueue (the launch sequence is in the device layer, `fp8_cast.rs`).

use cudarc::driver::sys::CUstream;
use cudarc::driver::DevicePtr;

use super::GpuFp8;
use crate::cuda::api::checks::same_context;
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{enqueue_cast, CastJob, KernelSet, Kernels, Relaxed, RelaxedDrop};
use crate::cuda::library;
use crate::cuda::route::fp8::Fp8Tensor;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::{check_dims, check_support, Fp8Format, Fp8Layout, Scaling, Source};
use crate::grouped::{GroupedOperand, GroupedProblem};

impl GpuFp8<'_> {
    /// Compiles gemmbridge's FP8 kernels now (NVRTC, tens of ms) rather than on the first
    /// [`GpuFp8::quantize`], which a CUDA graph capture then may contain.
    ///
    /// # Errors
    /// [`Error::Fp8`] when the GPU has no FP8 ([`crate::fp8::Fp8Rule::ComputeCapability`]);
    /// [`Error::LibraryNotFound`] without NVRTC; [`Error::Driver`].
    pub fn prepare(&self) -> Result<()> {
        let gpu = self.gpu;
        let (cc, lt_version) = gpu.fp8_platform()?;
        check_support(cc, lt_version, Scaling::Tensor)?;
        gpu.device().bind()?;
        gpu.lock().dev.kernels(gpu.stream().cu_stream(), KernelSet::Fp8).map(|_| ())
    }

    /// Quantises a `[rows, cols]` operand (`cols` = K) into `format` with `scaling`, on
    /// [`Gpu::stream`], with the rounding [`crate::fp8::quantize`] specifies (the GPU's result
    /// is the CPU's, bit for bit). `src` is contiguous: row-major `[rows, cols]` for
    /// [`Source::RowMajor`], `[cols, rows]` for [`Source::Transposed`] (a weight stored
    /// `[K, N]`), of f32, f16 or bf16. Enqueued, not waited for; the result is usable in
    /// stream order. The first call compiles gemmbridge's kernels (NVRTC, tens of ms; or
    /// [`GpuFp8::prepare`] first): a first call inside a graph capture is
    /// [`Error::NotCapturable`]. The output's memory comes from the stream-ordered pool, so a
    /// quantisation can be captured once the kernels exist — with cudarc's event tracking off
    /// (`CudaContext::disable_event_tracking`): with it on, cudarc makes the stream wait for
    /// the source's last write, an event recorded before the capture, which a capture refuses
    /// (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).
    ///
    /// Cost (kernel passes over the source): tensor-wise 2 (amax, then cast, or fused
    /// cast-transpose), row-wise 1 (rows of up to 16384 columns; longer rows' rest is read
    /// twice), 1×128 1, 128×128 1; a transposed source with row or block scales adds a
    /// transpose pass. docs/PERFORMANCE.md gives the measured bandwidth of each.
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::WrongContext`]; [`Error::BufferTooSmall`] when
    /// `src` holds fewer than `rows · cols` elements; [`Error::Fp8`] for an empty operand
    /// ([`crate::fp8::Fp8Rule::Empty`]) or a GPU / cuBLASLt that does not offer the scaling
    /// ([`crate::fp8::Fp8Rule::ComputeCapability`], [`crate::fp8::Fp8Rule::LibraryVersion`]);
    /// [`Error::DimensionTooLarge`] past [`crate::fp8::MAX_ROWS`] rows or columns (or 65535 ·
    /// 64 rows of a transposed source, 65535 · 128 with 128×128 blocks); [`Error::NotCapturable`]
    /// (see above). Later:
    /// [`Error::LibraryNotFound`] without NVRTC, [`Error::Driver`].
    pub fn quantize<T: Element, S: DevicePtr<T>>(
        &self,
        src: &S,
        rows: usize,
        cols: usize,
        source: Source,
        format: Fp8Format,
        scaling: Scaling,
    ) -> Result<Fp8Tensor> {
        let gpu = self.gpu;
        let mut out = gpu.quantize_output::<T, S>(src, rows, cols, source, format, scaling)?;
        let (x, _gx) = src.device_ptr(gpu.stream());
        gpu.with_cast_job::<T, _>(x, &mut out, source, |kernels, job, stream| {
            // SAFETY: `src` holds rows·cols elements (checked), `data` and `scales` were
            // allocated for the layout; all on `stream`, a live stream of the bound context.
            unsafe { enqueue_cast(kernels, job, stream) }
        })?;
        Ok(out)
    }

    /// The operand `operand` of the FP8 grouped product `p` ([`GpuFp8::grouped_gemm`])
    /// quantised one group at a time, each group on its own ([`GpuFp8::quantize`] of that
    /// group's slice: its own amax and scales), into the TN form of
    /// [`GroupedProblem::tn_operand`]: from `src`, the buffer [`Gpu::grouped_gemm`] would take
    /// in that place ([`GroupedOperand::A`]: the forward's `x[rows, K]`, a backward's
    /// `dy[rows, N]`; [`GroupedOperand::B`]: `w[E, N, K]`, the backward weight's `x[rows, K]`;
    /// row-major, rows sorted by group), one operand per group: a forward's `x_e[m_e, K]` and
    /// `w_e[N, K]`, the backward data's `dy_e[m_e, N]` and `w_eᵀ[K, N]`, the backward weight's
    /// `dy_eᵀ[N, m_e]` and `x_eᵀ[K, m_e]` (transposed while they are quantised); `None` where a
    /// group has no rows (a `w` is made for every expert). On [`Gpu::stream`], not waited
    /// for. Cost: one quantisation's launches per group (two kernels per group tensor-wise).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::WrongContext`]; [`Error::BufferTooSmall`] when
    /// `src` holds fewer elements than [`GroupedProblem::lens`] says; as [`GpuFp8::quantize`] for
    /// every group (a scaling the GPU or cuBLASLt does not offer, sizes past its limits).
    /// Later: as [`GpuFp8::quantize`].
    pub fn grouped_quantize<T: Element, S: DevicePtr<T>>(
        &self,
        p: &GroupedProblem,
        operand: GroupedOperand,
        src: &S,
        format: Fp8Format,
        scaling: Scaling,
    ) -> Result<Vec<Option<Fp8Tensor>>> {
        let gpu = self.gpu;
        let len = p.lens()[match operand {
            GroupedOperand::A => 0,
            GroupedOperand::B => 1,
        }];
        gpu.check_source::<T, S>(src, len, 1)?;
        // every group's output allocated (its checks passed) before any cast is enqueued
        let slices: Vec<_> = (0..p.groups()).map(|e| p.tn_operand(operand, e)).collect();
        let mut out = Vec::with_capacity(p.groups());
        for t in &slices {
            out.push(match t {
                Some(t) => Some(gpu.alloc_quantized(t.rows, t.inner, t.source, format, scaling)?),
                None => None,
            });
        }
        let (x, _gx) = src.device_ptr(gpu.stream());
        let elem = T::DTYPE.size_bytes() as u64;
        for (t, q) in slices.iter().zip(&mut out) {
            let (Some(t), Some(q)) = (t, q) else { continue };
            let at = x + t.start as u64 * elem;
            gpu.with_cast_job::<T, _>(at, q, t.source, |kernels, job, stream| {
                // SAFETY: the group's slice lies within `src` (its length checked against the
                // problem's), `q` was allocated for its TN shape; all on `stream`.
                unsafe { enqueue_cast(kernels, job, stream) }
            })?;
        }
        Ok(out)
    }
}

impl Gpu {
    /// The GPU's compute capability and the loaded cuBLASLt's version (0 without cuBLASLt).
    pub(crate) fn fp8_platform(&self) -> Result<((i32, i32), usize)> {
        let cc = self.context().compute_capability().map_err(status::driver("cuDeviceGetAttribute"))?;
        Ok((cc, library::cublaslt_version().unwrap_or(0)))
    }

    /// Whether this GPU and the loaded cuBLASLt offer FP8 with `scaling` ([`check_support`];
    /// for callers: [`DeviceInfo::check_fp8`](crate::cuda::DeviceInfo::check_fp8)).
    ///
    /// # Errors
    /// [`Error::Fp8`] with [`crate::fp8::Fp8Rule::ComputeCapability`] or
    /// [`crate::fp8::Fp8Rule::LibraryVersion`]; [`Error::Driver`].
    pub(crate) fn check_fp8(&self, scaling: Scaling) -> Result<()> {
        let (cc, lt_version) = self.fp8_platform()?;
        check_support(cc, lt_version, scaling)
    }

    /// [`GpuFp8::quantize`] of a row-major `src[rows, cols]` into `out`, an operand made before
    /// by [`GpuFp8::quantize`] with those sizes (its format, layout and scaling kept; its data and
    /// scales overwritten in stream order, no allocation but the tensor-wise cast's 4-byte amax
    /// scratch). For callers that quantise the same-shaped activation on every step.
    ///
    /// # Errors
    /// As [`GpuFp8::quantize`]; [`Error::WrongContext`] for `out` of another context.
    pub(crate) fn quantize_into<T: Element>(&self, src: &dyn DevicePtr<T>, out: &mut Fp8Tensor) -> Result<()> {
        let (rows, cols) = (out.layout.rows, out.layout.cols);
        same_context(Which::Source, src.stream(), self.context())?;
        same_context(Which::C, out.data.stream(), self.context())?;
        Error::check_bytes(Which::Source, src.num_bytes(), rows.saturating_mul(cols), T::DTYPE.size_bytes())?;
        let (x, _gx) = src.device_ptr(self.stream());
        self.with_cast_job::<T, _>(x, out, Source::RowMajor, |kernels, job, stream| {
            // SAFETY: `src` holds rows·cols elements (checked); `data` and `scales` were
            // allocated for this layout by `quantize`; all on `stream`, a live stream of the
            // bound context.
            unsafe { enqueue_cast(kernels, job, stream) }
        })
    }

    /// Runs `f` with the FP8 kernels (compiled on first use) and the cast of the `T` source at
    /// `x` into `out` (its format and layout) on [`Gpu::stream`], the context bound and the
    /// lock held; the output's stream guards are held until `f` returns (the caller holds the
    /// source's).
    fn with_cast_job<T: Element, R>(
        &self,
        x: u64,
        out: &mut Fp8Tensor,
        source: Source,
        f: impl FnOnce(&Kernels, &CastJob, CUstream) -> Result<R>,
    ) -> Result<R> {
        self.device().bind()?;
        let s = self.stream();
        let mut st = self.lock();
        let kernels = st.dev.kernels(s.cu_stream(), KernelSet::Fp8)?;
        let (format, layout) = (out.format, out.layout);
        let (q, _gq) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut *out.data, s);
        let (sc, _gs) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut *out.scales, s);
        let job = CastJob { src: x, dtype: T::DTYPE, source, format, layout, data: q, scales: sc };
        f(kernels, &job, s.cu_stream())
    }

    /// [`GpuFp8::quantize`]'s checks, then its output allocated (data not yet written).
    fn quantize_output<T: Element, S: DevicePtr<T>>(
        &self,
        src: &S,
        rows: usize,
        cols: usize,
        source: Source,
        format: Fp8Format,
        scaling: Scaling,
    ) -> Result<Fp8Tensor> {
        self.check_source::<T, S>(src, rows, cols)?;
        self.alloc_quantized(rows, cols, source, format, scaling)
    }

    /// `src` of this context, holding at least `rows · cols` elements.
    fn check_source<T: Element, S: DevicePtr<T>>(&self, src: &S, rows: usize, cols: usize) -> Result<()> {
        same_context(Which::Source, src.stream(), self.context())?;
        Error::check_bytes(Which::Source, src.num_bytes(), rows.saturating_mul(cols), T::DTYPE.size_bytes())
    }

    /// The checks of a `[rows, cols]` quantisation's sizes and platform, then its output
    /// allocated from the stream-ordered pool (data not yet written).
    fn alloc_quantized(
        &self,
        rows: usize,
        cols: usize,
        source: Source,
        format: Fp8Format,
        scaling: Scaling,
    ) -> Result<Fp8Tensor> {
        check_dims(rows, cols)?;
        // the kernels' second grid dimension (at most 65535 CTAs) covers 64 rows per CTA for a
        // transposed source and 128 for 128×128 blocks (`device/fp8_cast.rs`)
        let rows_per_cta = match (source, scaling) {
            (Source::Transposed, _) => Some(64),
            (_, Scaling::Block128x128) => Some(128),
            _ => None,
        };
        if let Some(per) = rows_per_cta {
            let max = 65535 * per;
            if rows > max {
                return Err(Error::DimensionTooLarge { what: "rows of this quantisation's grid", value: rows, max });
            }
        }
        let (cc, lt_version) = self.fp8_platform()?;
        check_support(cc, lt_version, scaling)?;
        let layout = Fp8Layout::new(rows, cols, scaling);
        let s = self.stream();
        let _relaxed = Relaxed::enter()?; // stream-ordered allocations
                                          // SAFETY: every byte of `data` is written by the cast kernels (padding included).
        let data = unsafe { s.alloc::<u8>(layout.data_len()) }.map_err(status::driver("cuMemAllocAsync"))?;
        // every kernel writes every scale; the 128×128 path zeroes the K padding first
        // SAFETY: as above.
        let scales = unsafe { s.alloc::<f32>(layout.scale_len()) }.map_err(status::driver("cuMemAllocAsync"))?;
        Ok(Fp8Tensor { data: RelaxedDrop::new(data), scales: RelaxedDrop::new(scales), layout, format })
    }
}
