//! The device owner: CUDA context, stream and cuBLAS handle, and the GEMM entry points.

use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

use super::{library, status};
use crate::dtype::{Compute, DType, Element, Precision};
use crate::error::{Error, Result, Which};
use crate::layout::Op;
use crate::mapping::{column_major_call, ColMajorCall};
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, BufferDesc};

/// A device buffer given by address, for memory gemmbridge does not own (another framework's
/// tensor storage). Zero-copy: only the address is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBuffer {
    /// Device address of the first element (a `CUdeviceptr`).
    pub address: u64,
    /// Bytes valid from `address` on; checked against what the layout addresses.
    pub len_bytes: usize,
}

/// A cuBLAS handle and the stream it is currently bound to.
struct Handle {
    raw: cublas_sys::cublasHandle_t,
    bound: CUstream,
}

// SAFETY: cuBLAS allows a handle to be used from any host thread as long as no two calls use
// it at once (cuBLAS documentation, "Thread Safety"); the Mutex in Gpu guarantees that.
unsafe impl Send for Handle {}

/// Owns a CUDA context, a stream and one cuBLAS handle, and runs row-major GEMMs.
///
/// # Threads and streams
/// `Gpu` is `Send + Sync`. Every call locks the one cuBLAS handle for the few microseconds it
/// takes to enqueue the GEMM, so calls from several threads are safe but serialise on the
/// host; for parallel host submission use one `Gpu` per thread (each with its own handle and
/// stream). GPU work is never synchronised by gemmbridge: [`Gpu::gemm`] enqueues on
/// [`Gpu::stream`], [`Gpu::gemm_raw`] on the stream the caller passes, and both return as soon
/// as the work is enqueued.
///
/// # Errors at creation
/// [`Error::LibraryNotFound`] when libcuda or libcublas cannot be loaded, [`Error::NoDevice`]
/// when the driver finds no GPU, [`Error::Driver`] / [`Error::Cublas`] for other failures.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Mutex<Handle>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("ordinal", &self.ctx.ordinal()).field("stream", &self.stream.cu_stream()).finish()
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context) with a new non-blocking stream.
    ///
    /// # Errors
    /// See [`Gpu`].
    pub fn new(ordinal: usize) -> Result<Gpu> {
        library::ensure_driver()?;
        let count = CudaContext::device_count().map_err(status::driver("cuInit/cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(Error::NoDevice { detail: "cuDeviceGetCount returned 0".into() });
        }
        let ctx = CudaContext::new(ordinal).map_err(status::driver("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(status::driver("cuStreamCreate"))?;
        Gpu::with_stream(stream)
    }

    /// Uses a stream the caller already has (and its context). Work is enqueued on it in
    /// order with the caller's other work on it.
    ///
    /// # Errors
    /// See [`Gpu`].
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Gpu> {
        library::ensure_driver()?;
        library::ensure_cublas()?;
        let ctx = stream.context().clone();
        ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
        status::cublas(unsafe { cublas_sys::cublasCreate_v2(&mut raw) }, "cublasCreate_v2", String::new)?;
        let handle = Handle { raw, bound: std::ptr::null_mut() };
        let gpu = Gpu { ctx, stream, blas: Mutex::new(handle) };
        {
            let mut h = gpu.lock();
            gpu.bind(&mut h, gpu.stream.cu_stream())?;
        }
        Ok(gpu)
    }

    /// The context everything runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream [`Gpu::gemm`] enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Handle> {
        // A panic while the lock was held cannot leave the handle half-changed (every change
        // is one cuBLAS call), so a poisoned lock is still usable.
        self.blas.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bind(&self, h: &mut Handle, stream: CUstream) -> Result<()> {
        if h.bound != stream || h.bound.is_null() {
            // SAFETY: h.raw is a live handle (created in with_stream, destroyed only in Drop);
            // the caller guarantees `stream` belongs to this context.
            status::cublas(
                unsafe { cublas_sys::cublasSetStream_v2(h.raw, stream as _) },
                "cublasSetStream_v2",
                String::new,
            )?;
            h.bound = stream;
        }
        Ok(())
    }

    /// `C = α·op(A)·op(B) + β·C` on cudarc device memory, enqueued on [`Gpu::stream`].
    ///
    /// - `a`, `b`: stored row-major A and B ([`cudarc::driver::CudaSlice`] or views), element
    ///   type the precision's input dtype, in this `Gpu`'s context;
    /// - `c`: stored C, element type the precision's output dtype, written in place through
    ///   `&mut` (the real storage; never a copy). Padding between rows is not touched.
    ///
    /// BLAS semantics: `β = 0` never reads C (NaN in C does not leak); `k = 0` gives
    /// `C = β·C`; m, n or batch 0 launches nothing. cudarc's own cross-stream event tracking
    /// (if the buffers were last used on another stream) is honoured; no host synchronisation.
    ///
    /// # Errors
    /// Before launching, with no buffer touched: [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`], [`Error::BufferTooSmall`], [`Error::Misaligned`],
    /// [`Error::OutputOverlapsInput`]. From the launch: [`Error::Cublas`].
    pub fn gemm<TI, TO, A, B, C>(&self, p: &GemmProblem, alpha: f32, a: &A, b: &B, beta: f32, c: &mut C) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        for (which, s) in [(Which::A, a.stream()), (Which::B, b.stream()), (Which::C, c.stream())] {
            if s.context() != &self.ctx {
                return Err(Error::WrongContext {
                    operand: which,
                    ordinal: s.context().ordinal(),
                    expected: self.ctx.ordinal(),
                });
            }
        }
        let (la, lb, lc) = (a.num_bytes(), b.num_bytes(), c.num_bytes());
        let (pa, _read_a) = a.device_ptr(&self.stream);
        let (pb, _read_b) = b.device_ptr(&self.stream);
        let (pc, _write_c) = c.device_ptr_mut(&self.stream);
        check_buffers(
            p,
            BufferDesc { address: pa, len_bytes: la, dtype: TI::DTYPE },
            BufferDesc { address: pb, len_bytes: lb, dtype: TI::DTYPE },
            BufferDesc { address: pc, len_bytes: lc, dtype: TO::DTYPE },
        )?;
        let mut h = self.lock();
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        self.bind(&mut h, self.stream.cu_stream())?;
        // SAFETY: the three addresses come from live cudarc allocations of this context whose
        // lengths check_buffers has verified against the layouts; the borrows (and cudarc's
        // read/write events, recorded when the guards drop) keep them alive and ordered
        // until the GEMM is enqueued.
        unsafe { self.launch(&h, p, alpha, pa, pb, beta, pc) }
    }

    /// `C = α·op(A)·op(B) + β·C` on device memory given by address, enqueued on `stream`.
    /// Zero-copy interop with other frameworks' buffers; returns once the GEMM is enqueued.
    ///
    /// Each buffer's element type is the one the precision names (inputs: `precision.input()`,
    /// C: `precision.output()`); lengths are in bytes.
    ///
    /// # Safety
    /// - every address is device memory (or null where the layout addresses nothing) in this
    ///   `Gpu`'s context, valid for `len_bytes` until the GEMM has run on `stream`;
    /// - `stream` is a live stream of this context (or null, the legacy default stream);
    /// - nothing writes A or B, or touches C, concurrently with the GEMM except in stream order.
    ///
    /// # Errors
    /// As [`Gpu::gemm`], all before anything is enqueued, except [`Error::Cublas`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_raw(
        &self,
        p: &GemmProblem,
        alpha: f32,
        a: RawBuffer,
        b: RawBuffer,
        beta: f32,
        c: RawBuffer,
        stream: CUstream,
    ) -> Result<()> {
        let prec = p.precision();
        let desc = |r: RawBuffer, dtype| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype };
        check_buffers(p, desc(a, prec.input()), desc(b, prec.input()), desc(c, prec.output()))?;
        let mut h = self.lock();
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        self.bind(&mut h, stream)?;
        // SAFETY: lengths and alignment checked above; validity and stream ownership are the
        // caller's contract.
        unsafe { self.launch(&h, p, alpha, a.address, b.address, beta, c.address) }
    }

    /// Enqueues the mapped column-major call for a validated problem on the handle's stream.
    ///
    /// # Safety
    /// Buffers checked by `check_buffers` for `p`; `h` bound to the intended stream.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(&self, h: &Handle, p: &GemmProblem, alpha: f32, a: u64, b: u64, beta: f32, c: u64) -> Result<()> {
        if p.is_empty() {
            return Ok(());
        }
        let call = column_major_call(p);
        let (first, second) = call.operands(a, b);
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_colmajor(h, &call, p.precision(), alpha, first, second, beta, c) }
            .map_err(|e| with_problem(e, p))
    }

    /// Runs a column-major cuBLAS GEMM exactly as given, without any of gemmbridge's checks,
    /// on [`Gpu::stream`]. For diagnostics (the convention table of `gemmbridge probe` calls
    /// cuBLAS with deliberately wrong arguments); use [`Gpu::gemm`] for real work.
    ///
    /// `first`/`second` are the column-major call's A and B device addresses.
    ///
    /// # Safety
    /// Every address must be device memory of this context large enough for everything the
    /// call can read or write given its sizes and leading dimensions, as in a direct cuBLAS
    /// call.
    ///
    /// # Errors
    /// [`Error::Cublas`] with the status cuBLAS returned.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_colmajor_unchecked(
        &self,
        call: &ColMajorCall,
        precision: Precision,
        alpha: f32,
        first: u64,
        second: u64,
        beta: f32,
        c: u64,
    ) -> Result<()> {
        let mut h = self.lock();
        self.ctx.bind_to_thread().map_err(status::driver("cuCtxSetCurrent"))?;
        self.bind(&mut h, self.stream.cu_stream())?;
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_colmajor(&h, call, precision, alpha, first, second, beta, c) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_colmajor(
        &self,
        h: &Handle,
        call: &ColMajorCall,
        precision: Precision,
        alpha: f32,
        first: u64,
        second: u64,
        beta: f32,
        c: u64,
    ) -> Result<()> {
        let op = |o: Op| match o {
            Op::N => cublas_sys::cublasOperation_t::CUBLAS_OP_N,
            Op::T => cublas_sys::cublasOperation_t::CUBLAS_OP_T,
        };
        let (ti, to) = (cuda_dtype(precision.input()), cuda_dtype(precision.output()));
        let compute = compute_type(precision.compute());
        let algo = cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let (alpha, beta) = (&alpha as *const f32 as *const _, &beta as *const f32 as *const _);
        let ptr = |v: u64| v as *const std::ffi::c_void;
        let describe = || {
            format!(
                "transa={} transb={} m={} n={} k={} lda={} ldb={} ldc={} batch={} {}",
                call.transa, call.transb, call.m, call.n, call.k, call.lda, call.ldb, call.ldc, call.batch, precision
            )
        };
        // SAFETY: the handle is live and bound; alpha/beta point to f32 host scalars, as the
        // 32F compute types require (cuBLAS documentation, cublasGemmEx, "alpha/beta: host or
        // device pointer ... of the scaling type, CUDA_R_32F for CUBLAS_COMPUTE_32F*"); the
        // buffers are the caller's contract.
        if call.batch == 1 {
            let s = unsafe {
                cublas_sys::cublasGemmEx(
                    h.raw,
                    op(call.transa),
                    op(call.transb),
                    call.m,
                    call.n,
                    call.k,
                    alpha,
                    ptr(first),
                    ti,
                    call.lda,
                    ptr(second),
                    ti,
                    call.ldb,
                    beta,
                    c as *mut std::ffi::c_void,
                    to,
                    call.ldc,
                    compute,
                    algo,
                )
            };
            status::cublas(s, "cublasGemmEx", describe)
        } else {
            let s = unsafe {
                cublas_sys::cublasGemmStridedBatchedEx(
                    h.raw,
                    op(call.transa),
                    op(call.transb),
                    call.m,
                    call.n,
                    call.k,
                    alpha,
                    ptr(first),
                    ti,
                    call.lda,
                    call.stride_a,
                    ptr(second),
                    ti,
                    call.ldb,
                    call.stride_b,
                    beta,
                    c as *mut std::ffi::c_void,
                    to,
                    call.ldc,
                    call.stride_c,
                    call.batch,
                    compute,
                    algo,
                )
            };
            status::cublas(s, "cublasGemmStridedBatchedEx", describe)
        }
    }
}

fn with_problem(e: Error, p: &GemmProblem) -> Error {
    match e {
        Error::Cublas { operation, status, problem } => {
            Error::Cublas { operation, status, problem: format!("{problem}; row-major {}", p.describe()) }
        }
        other => other,
    }
}

fn cuda_dtype(d: DType) -> cublas_sys::cudaDataType {
    match d {
        DType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
        DType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
    }
}

/// The cuBLAS compute type; values per cublas_api.h (32F = 68, FAST_TF32 = 77), taken from
/// cudarc's generated enum rather than written as numbers (docs/BACKGROUND.md §2: a wrong
/// number gives NOT_SUPPORTED).
fn compute_type(c: Compute) -> cublas_sys::cublasComputeType_t {
    match c {
        Compute::F32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Compute::Tf32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let h = self.blas.get_mut().unwrap_or_else(|p| p.into_inner());
        if !h.raw.is_null() && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the handle was created in with_stream and is destroyed once, here. A
            // failure cannot be reported from Drop and leaks only the handle.
            let _ = unsafe { cublas_sys::cublasDestroy_v2(h.raw) };
            h.raw = std::ptr::null_mut();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_type_constants_match_cublas_api_h() {
        // cublas_api.h: CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77
        assert_eq!(compute_type(Compute::F32) as u32, 68);
        assert_eq!(compute_type(Compute::Tf32) as u32, 77);
        // library_types.h: CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14
        assert_eq!(cuda_dtype(DType::F32) as u32, 0);
        assert_eq!(cuda_dtype(DType::F16) as u32, 2);
        assert_eq!(cuda_dtype(DType::BF16) as u32, 14);
    }
}
