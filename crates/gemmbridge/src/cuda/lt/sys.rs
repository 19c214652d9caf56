//! Small safe wrappers over cudarc's raw cuBLASLt bindings: statuses by name, owned handle,
//! descriptors, layouts and preferences that are destroyed on drop, and the type maps.

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::sys as lt;

use crate::cuda::device::Pool;

use crate::dtype::{Compute, DType};
use crate::error::{Error, Result};
use crate::layout::Op;

pub(crate) use lt::cublasLtMatmulDescAttributes_t as DescAttr;

/// `Ok` for `CUBLAS_STATUS_SUCCESS`, otherwise [`Error::Cublas`] naming the status and the call.
pub(crate) fn check(s: lt::cublasStatus_t, operation: &'static str) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        // The enum's Debug form is its C name, e.g. CUBLAS_STATUS_NOT_SUPPORTED.
        Err(Error::Cublas { operation, status: format!("{s:?}"), problem: String::new() })
    }
}

/// An owned cuBLASLt handle.
pub(crate) struct LtHandle(pub lt::cublasLtHandle_t, Option<usize>);

/// Handles of dropped engines, by device.
static POOL: Pool<lt::cublasLtContext> = Pool::new();

impl LtHandle {
    /// A handle for the current context: one from device `pool`'s [`Pool`] or a new one;
    /// `pool` is `Some(ordinal)` for a primary context, `None` otherwise (the handle is then
    /// destroyed on drop). The library is loaded (checked by the caller).
    pub fn new(pool: Option<usize>) -> Result<LtHandle> {
        let (h, _) = POOL.take_or_create(pool, || {
            let mut h = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the library is loaded (checked by the caller).
            check(unsafe { lt::cublasLtCreate(&mut h) }, "cublasLtCreate")?;
            Ok(h)
        })?;
        Ok(LtHandle(h, pool))
    }
}

impl Drop for LtHandle {
    /// Back to its pool, or destroyed (which synchronises the device: cuBLASLt's
    /// documentation of `cublasLtDestroy`). The work enqueued with it has finished.
    fn drop(&mut self) {
        POOL.release(self.1, self.0, |h| {
            // SAFETY: created in new, destroyed once.
            let _ = unsafe { lt::cublasLtDestroy(h) };
        });
    }
}

/// An owned matmul descriptor.
pub(crate) struct Desc(pub lt::cublasLtMatmulDesc_t);
/// An owned matrix layout.
pub(crate) struct Layout(pub lt::cublasLtMatrixLayout_t);
/// An owned matmul preference.
pub(crate) struct Pref(pub lt::cublasLtMatmulPreference_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatmulDescDestroy(self.0) };
    }
}
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatrixLayoutDestroy(self.0) };
    }
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatmulPreferenceDestroy(self.0) };
    }
}

impl Desc {
    /// A descriptor for `compute` with f32 scalars (α, β).
    pub fn new(compute: Compute) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(
            unsafe { lt::cublasLtMatmulDescCreate(&mut d, lt_compute(compute), lt::cudaDataType::CUDA_R_32F) },
            "cublasLtMatmulDescCreate",
        )?;
        Ok(Desc(d))
    }

    /// Sets one attribute.
    ///
    /// # Safety
    /// `T` is the type the attribute takes (cublasLtMatmulDescAttributes_t documentation).
    pub unsafe fn set<T>(&self, attr: DescAttr, v: &T) -> Result<()> {
        // SAFETY: v points to a value of the size passed, of the attribute's type (caller).
        check(
            unsafe { lt::cublasLtMatmulDescSetAttribute(self.0, attr, v as *const T as *const c_void, size_of::<T>()) },
            "cublasLtMatmulDescSetAttribute",
        )
    }
}

impl Layout {
    /// A single column-major `rows × cols` matrix of the library type `dtype` (FP8 included)
    /// with leading dimension `ld` (elements).
    pub fn plain(dtype: lt::cudaDataType, rows: u64, cols: u64, ld: i64) -> Result<Layout> {
        let mut l = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { lt::cublasLtMatrixLayoutCreate(&mut l, dtype, rows, cols, ld) }, "cublasLtMatrixLayoutCreate")?;
        Ok(Layout(l))
    }

    /// A column-major `rows × cols` layout of `dtype` with leading dimension `ld`, and for
    /// `batch > 1` the batch count and stride (elements).
    pub fn new(dtype: DType, rows: i32, cols: i32, ld: i32, batch: i32, stride: i64) -> Result<Layout> {
        // sizes are non-negative i32s from the mapping
        let l = Layout::plain(lt_dtype(dtype), rows as u64, cols as u64, ld as i64)?;
        if batch > 1 {
            let set = |attr, v: *const c_void, n| {
                // SAFETY: v points to a value of n bytes of the attribute's type (i32 count, i64 stride).
                check(
                    unsafe { lt::cublasLtMatrixLayoutSetAttribute(l.0, attr, v, n) },
                    "cublasLtMatrixLayoutSetAttribute",
                )
            };
            use lt::cublasLtMatrixLayoutAttribute_t as L;
            set(L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch as *const i32 as _, 4)?;
            set(L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride as *const i64 as _, 8)?;
        }
        Ok(l)
    }
}

impl Pref {
    /// A preference allowing `workspace` bytes, with the alignment (bytes) of A, B and C/D.
    pub fn new(workspace: usize, [a, b, c]: [u32; 3]) -> Result<Pref> {
        let mut pr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { lt::cublasLtMatmulPreferenceCreate(&mut pr) }, "cublasLtMatmulPreferenceCreate")?;
        let pref = Pref(pr);
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let set = |attr, v: *const c_void, n| {
            // SAFETY: v points to n bytes of the attribute's type (u64 bytes, u32 alignments).
            check(
                unsafe { lt::cublasLtMatmulPreferenceSetAttribute(pref.0, attr, v, n) },
                "cublasLtMatmulPreferenceSetAttribute",
            )
        };
        let ws = workspace as u64;
        set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as _, 8)?;
        for (attr, v) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c),
        ] {
            set(attr, v as *const u32 as _, 4)?;
        }
        Ok(pref)
    }
}

/// cuBLASLt's heuristic for one matmul (`cublasLtMatmulAlgoGetHeuristic`): up to `want`
/// (clamped to 1..=32) algorithms it marks usable, best first, as (opaque data, workspace
/// bytes). Layouts in the order A, B, C, D.
///
/// # Errors
/// [`Error::Cublas`] naming the status.
pub(crate) fn heuristic(
    h: &LtHandle,
    desc: &Desc,
    [a, b, c, d]: [&Layout; 4],
    pref: &Pref,
    want: usize,
) -> Result<Vec<([u64; 8], usize)>> {
    let want = want.clamp(1, 32);
    // SAFETY: cublasLtMatmulHeuristicResult_t is plain data; zeroed is a valid value.
    let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; want];
    let mut found = 0;
    // SAFETY: every descriptor is live; results has `want` slots.
    check(
        unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                h.0,
                desc.0,
                a.0,
                b.0,
                c.0,
                d.0,
                pref.0,
                want as i32,
                results.as_mut_ptr(),
                &mut found,
            )
        },
        "cublasLtMatmulAlgoGetHeuristic",
    )?;
    Ok(results[..found.clamp(0, want as i32) as usize]
        .iter()
        .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|r| (r.algo.data, r.workspaceSize))
        .collect())
}

/// Whether cuBLASLt accepts the algorithm `data` for one matmul (`cublasLtMatmulAlgoCheck`),
/// and the workspace it needs. Layouts in the order A, B, C, D.
pub(crate) fn algo_check(h: &LtHandle, desc: &Desc, [a, b, c, d]: [&Layout; 4], data: [u64; 8]) -> Option<usize> {
    let algo = lt::cublasLtMatmulAlgo_t { data };
    // SAFETY: zeroed heuristic result is valid plain data; descriptors are live.
    let mut r: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    let s = unsafe { lt::cublasLtMatmulAlgoCheck(h.0, desc.0, a.0, b.0, c.0, d.0, &algo, &mut r) };
    (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(r.workspaceSize)
}

pub(crate) fn lt_dtype(d: DType) -> lt::cudaDataType {
    match d {
        DType::F32 => lt::cudaDataType::CUDA_R_32F,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
    }
}

pub(crate) fn lt_compute(c: Compute) -> lt::cublasComputeType_t {
    match c {
        Compute::F32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Compute::Tf32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
    }
}

pub(crate) fn lt_op(o: Op) -> cudarc::cublas::sys::cublasOperation_t {
    match o {
        Op::N => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        Op::T => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
    }
}
