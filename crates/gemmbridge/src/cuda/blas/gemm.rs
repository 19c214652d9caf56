//! The cuBLAS launches: the `cublasGemmEx` / `cublasGemmStridedBatchedEx` of a column-major
//! call ([`BlasGemm`], lowered from a [`crate::cuda::call::GemmCall`] by the routing floor)
//! and `cublasAxpyEx` ([`Axpy`]).

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUstream;

use super::handle::BlasHandle;
use crate::cuda::call::GemmCall;
use crate::cuda::device::DeviceState;
use crate::cuda::status;
use crate::dtype::{Compute, DType};
use crate::error::Result;
use crate::layout::Op;
use crate::mapping::ColMajorCall;
use crate::precision::Precision;

/// One column-major GEMM: the call, its precision, scalars and operands by address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlasGemm {
    pub call: ColMajorCall,
    pub precision: Precision,
    pub alpha: f32,
    pub beta: f32,
    pub first: u64,
    pub second: u64,
    pub c: u64,
}

impl BlasGemm {
    /// The cuBLAS form of a routed call: its column-major call, operands in cuBLAS's order.
    pub fn of(r: &GemmCall) -> BlasGemm {
        let (first, second) = r.cm.operands(r.abc.0, r.abc.1);
        let (precision, c) = (r.problem.precision(), r.abc.2);
        BlasGemm { call: r.cm, precision, alpha: r.alpha, beta: r.beta, first, second, c }
    }
}

/// One `y += α·x` over `n` contiguous elements of `dtype` by address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Axpy {
    pub dtype: DType,
    pub n: usize,
    pub alpha: f32,
    pub x: u64,
    pub y: u64,
}

impl BlasHandle {
    /// Binds the handle to `stream` (and its workspace) if needed, then one GemmEx call.
    ///
    /// # Safety
    /// The addresses are valid for the call; `stream` is a live stream of this context.
    pub unsafe fn gemm(&mut self, dev: &mut DeviceState, g: &BlasGemm, stream: CUstream) -> Result<()> {
        self.bind(dev, stream, &|| format!("{:?}", g.call))?;
        // SAFETY: forwarded.
        unsafe { launch(self, g) }
    }

    /// `a.y[i] += a.alpha·a.x[i]` for `a.n` contiguous elements of `a.dtype`
    /// (`cublasAxpyEx`, computed in f32: alpha and the execution type are `CUDA_R_32F` for
    /// every dtype, as cuBLAS's table for `cublasAxpyEx` offers them), on `stream`.
    ///
    /// # Safety
    /// `x` and `y` are device addresses valid for `n` elements, not overlapping; `stream` is a
    /// live stream of this context.
    pub unsafe fn axpy(&mut self, dev: &mut DeviceState, a: &Axpy, stream: CUstream) -> Result<()> {
        let Axpy { dtype, n, alpha, x, y } = *a;
        let describe = || format!("axpy of {n} {dtype} elements");
        self.bind(dev, stream, &describe)?;
        let t = cuda_dtype(dtype);
        let f32t = cublas_sys::cudaDataType::CUDA_R_32F;
        // SAFETY: live handle bound to `stream`; alpha points to an f32 host scalar (alpha type
        // CUDA_R_32F); the vectors are the caller's contract; n fits i64 (a usize length).
        let s = unsafe {
            cublas_sys::cublasAxpyEx_64(
                self.raw,
                n as i64,
                &alpha as *const f32 as *const _,
                f32t,
                x as *const _,
                t,
                1,
                y as *mut _,
                t,
                1,
                f32t,
            )
        };
        status::cublas(s, "cublasAxpyEx_64", describe)
    }
}

/// cuBLAS's operation for `o`.
pub(super) fn op(o: Op) -> cublas_sys::cublasOperation_t {
    match o {
        Op::N => cublas_sys::cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublas_sys::cublasOperation_t::CUBLAS_OP_T,
    }
}

/// One cuBLAS GemmEx / GemmStridedBatchedEx call.
///
/// # Safety
/// Live handle bound to the intended stream; addresses valid for the call.
unsafe fn launch(h: &BlasHandle, g: &BlasGemm) -> Result<()> {
    let BlasGemm { call, precision, alpha, beta, first, second, c } = *g;
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
    // SAFETY: the handle is live and bound; alpha/beta point to f32 host scalars, as the 32F
    // compute types require (cuBLAS documentation, cublasGemmEx: alpha and beta are of the
    // scaling type, CUDA_R_32F for CUBLAS_COMPUTE_32F*); the buffers are the caller's contract.
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

pub(super) fn cuda_dtype(d: DType) -> cublas_sys::cudaDataType {
    match d {
        DType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
        DType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
    }
}

/// The cuBLAS compute type; values per cublas_api.h (32F = 68, FAST_TF32 = 77), taken from
/// cudarc's generated enum rather than written as numbers (docs/BACKGROUND.md §2: a wrong
/// number gives NOT_SUPPORTED).
pub(super) fn compute_type(c: Compute) -> cublas_sys::cublasComputeType_t {
    match c {
        Compute::F32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Compute::Tf32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
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
