//! The one `cublasLtMatmul` of this crate: dense plans ([`super::plan::Plan::launch`]) and FP8
//! plans ([`super::fp8::Fp8Plan::launch`]) set their own pointer attributes, then launch here.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use super::sys::{check, Desc, Layout, LtHandle};
use crate::cuda::device::Workspace;
use crate::error::Result;

/// A cuBLASLt algorithm as stored (opaque 64 bytes), with what running it needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Algorithm {
    /// cublasLtMatmulAlgo_t's opaque data.
    pub data: [u64; 8],
    /// Workspace it needs, in bytes.
    pub workspace: usize,
}

/// One matmul's descriptor, layouts and addresses: `D = α·op(A)·op(B) + β·C`.
pub(crate) struct Matmul<'a> {
    pub desc: &'a Desc,
    /// A, B, C and D (the same layout twice where C is D).
    pub layouts: [&'a Layout; 4],
    /// A, B, C and D.
    pub ptrs: [u64; 4],
}

/// Enqueues `m` with `algo`, the scalars `(α, β)` and the stream's workspace `ws` on `stream`.
///
/// # Safety
/// Every address is valid for its layout (checked by the caller), the descriptor's pointer
/// attributes (bias, aux, scales) are set for this call, `ws` is used by nothing else on
/// another stream, and `stream` belongs to the handle's context.
pub(crate) unsafe fn matmul(
    h: &LtHandle,
    m: &Matmul,
    algo: &Algorithm,
    (alpha, beta): (f32, f32),
    ws: &Workspace,
    stream: lt::cudaStream_t,
) -> Result<()> {
    let a = lt::cublasLtMatmulAlgo_t { data: algo.data };
    let ptr = |v: u64| v as *const c_void;
    let [la, lb, lc, ld] = m.layouts;
    let [pa, pb, pc, pd] = m.ptrs;
    // SAFETY: the function's contract; α and β are f32 host scalars (scale type 32F).
    check(
        unsafe {
            lt::cublasLtMatmul(
                h.0,
                m.desc.0,
                &alpha as *const f32 as *const c_void,
                ptr(pa),
                la.0,
                ptr(pb),
                lb.0,
                &beta as *const f32 as *const c_void,
                ptr(pc),
                lc.0,
                pd as *mut c_void,
                ld.0,
                &a,
                ws.ptr as *mut c_void,
                ws.matmul_bytes,
                stream,
            )
        },
        "cublasLtMatmul",
    )
}
