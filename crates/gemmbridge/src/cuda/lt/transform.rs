//! cuBLASLt's matrix transform (`cublasLtMatrixTransform`: `C = α·op(A) + β·op(B)`) as the sum
//! of two row-major matrices of strided rows — the residual add an RMSNorm runs before its
//! norm where cuDNN has no engine for the fused graph.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use super::sys::{check, lt_dtype, Layout, LtHandle};
use crate::dtype::DType;
use crate::error::Result;

/// An owned matrix transform descriptor (f32 scalars, no transposes, host pointers).
struct TransformDesc(lt::cublasLtMatrixTransformDesc_t);

impl Drop for TransformDesc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixTransformDescCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatrixTransformDescDestroy(self.0) };
    }
}

/// Row-major matrices of `rows` rows of `cols` elements of `dtype`, each with its own leading
/// dimension (elements): what [`add`] sums.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// The leading dimensions of the two addends and of the sum.
    pub lds: [usize; 3],
}

/// Enqueues `sum = a + b` on `stream`: the addends converted to f32 (the descriptor's scale
/// type), summed, and the sum converted to `dtype`, as cuBLASLt's documentation of
/// `CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE` describes the transform. A row-major
/// `rows × cols` matrix is the column-major `cols × rows` one with the same leading dimension,
/// which is how cuBLASLt is told of each.
///
/// # Safety
/// `ptrs` (a, b, sum) are device memory of the handle's context holding `r`'s matrices; `sum`
/// overlaps neither addend unless it is the same matrix with the same leading dimension
/// (cuBLASLt allows C in place of A or B); `stream` is live in that context.
///
/// # Errors
/// [`crate::Error::Cublas`] with the status by name: creating the descriptor or a layout, or
/// the transform (e.g. `CUBLAS_STATUS_NOT_SUPPORTED` for a type this cuBLASLt does not take).
pub(crate) unsafe fn add(h: &LtHandle, r: Rows, ptrs: [u64; 3], stream: lt::cudaStream_t) -> Result<()> {
    let mut d = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check(
        unsafe { lt::cublasLtMatrixTransformDescCreate(&mut d, lt::cudaDataType::CUDA_R_32F) },
        "cublasLtMatrixTransformDescCreate",
    )?;
    let desc = TransformDesc(d);
    let layout = |ld: usize| Layout::plain(lt_dtype(r.dtype), r.cols as u64, r.rows as u64, ld as i64);
    let [la, lb, ls] = [layout(r.lds[0])?, layout(r.lds[1])?, layout(r.lds[2])?];
    let one = 1.0f32;
    let [a, b, sum] = ptrs;
    // SAFETY: the function's contract; α and β are f32 host scalars (the descriptor's scale
    // type, host pointer mode by default).
    check(
        unsafe {
            lt::cublasLtMatrixTransform(
                h.0,
                desc.0,
                &one as *const f32 as *const c_void,
                a as *const c_void,
                la.0,
                &one as *const f32 as *const c_void,
                b as *const c_void,
                lb.0,
                sum as *mut c_void,
                ls.0,
                stream,
            )
        },
        "cublasLtMatrixTransform",
    )
}
