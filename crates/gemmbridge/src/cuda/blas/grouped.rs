//! cuBLAS's grouped batched GEMM (`cublasGemmGroupedBatchedEx`, cuBLAS 12.5 and later): GEMMs
//! of different shapes in one call. The shapes, leading dimensions, operations and scalars are
//! host arrays; the operand pointers are device arrays, written into the stream's scratch
//! region with one host-to-device copy in stream order (from pageable memory: the driver
//! copies it to a staging buffer before the call returns, so nothing of the host's is read
//! later; CUDA's API synchronization notes allow it to wait for the stream to do so, which a
//! pinned ring would avoid at the price of pinned allocations, which synchronise the device).
//! Such a copy cannot be captured into a CUDA graph: a call during a capture is refused.

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUstream;

use super::gemm::{compute_type, cuda_dtype, op, BlasGemm};
use super::handle::BlasHandle;
use crate::cuda::device::{refuse_if_capturing, DeviceState, Needs};
use crate::cuda::status;
use crate::error::{Error, Result};

impl BlasHandle {
    /// The GEMMs `gemms` (each a single column-major GEMM, one precision whose input and output
    /// types are the same: f32, tf32, f16 or bf16) as one `cublasGemmGroupedBatchedEx` on
    /// `stream`: each run of consecutive GEMMs alike in shape, leading dimensions, operations
    /// and scalars one cuBLAS group (its problems batched), the rest groups of one.
    ///
    /// # Errors
    /// [`Error::NotCapturable`] while `stream` is being captured; [`Error::Unsupported`] for
    /// more GEMMs than the scratch region holds pointers for, or mixed precisions;
    /// [`Error::Cublas`], [`Error::Driver`].
    ///
    /// # Safety
    /// The addresses are valid for their GEMMs and the outputs do not overlap anything else
    /// of the call; `stream` is a live stream of this context.
    pub unsafe fn gemm_grouped(&mut self, dev: &mut DeviceState, gemms: &[BlasGemm], stream: CUstream) -> Result<()> {
        let Some(first) = gemms.first() else { return Ok(()) };
        let count = gemms.len();
        let describe = || format!("{count} GEMMs of {} in one cublasGemmGroupedBatchedEx", first.precision);
        refuse_if_capturing(stream, Needs::HostCopy("copy cuBLAS's grouped pointer arrays"), describe)?;
        let precision = first.precision;
        if gemms.iter().any(|g| g.precision != precision || g.call.batch != 1) {
            return Err(Error::Unsupported { backend: "cuBLAS grouped batched GEMM", what: describe() });
        }
        self.bind(dev, stream, &describe)?;
        let ws = dev.workspaces.get(stream, &describe)?;
        // A, B and C pointers, one array after another
        let ptrs: Vec<u64> = [|g: &BlasGemm| g.first, |g: &BlasGemm| g.second, |g: &BlasGemm| g.c]
            .iter()
            .flat_map(|f| gemms.iter().map(f))
            .collect();
        let bytes = std::mem::size_of_val(ptrs.as_slice());
        if bytes > ws.scratch_bytes {
            let what = format!("{count} groups (their pointers exceed the {}-byte scratch)", ws.scratch_bytes);
            return Err(Error::Unsupported { backend: "cuBLAS grouped batched GEMM", what });
        }
        // SAFETY: the scratch region belongs to `stream`'s workspace and holds `bytes`; the copy
        // is ordered before the GEMMs that read it on the same stream.
        unsafe { cudarc::driver::result::memcpy_htod_async(ws.scratch, &ptrs, stream) }
            .map_err(status::driver("cuMemcpyHtoDAsync"))?;
        // one cuBLAS group per run of consecutive GEMMs alike in every host parameter
        let (heads, sizes) = runs(gemms);
        let field = |f: fn(&BlasGemm) -> i32| heads.iter().map(|g| f(g)).collect::<Vec<i32>>();
        let (m, n, k) = (field(|g| g.call.m), field(|g| g.call.n), field(|g| g.call.k));
        let (lda, ldb, ldc) = (field(|g| g.call.lda), field(|g| g.call.ldb), field(|g| g.call.ldc));
        let transa: Vec<_> = heads.iter().map(|g| op(g.call.transa)).collect();
        let transb: Vec<_> = heads.iter().map(|g| op(g.call.transb)).collect();
        let alpha: Vec<f32> = heads.iter().map(|g| g.alpha).collect();
        let beta: Vec<f32> = heads.iter().map(|g| g.beta).collect();
        let (ti, to) = (cuda_dtype(precision.input()), cuda_dtype(precision.output()));
        let array = |i: usize| (ws.scratch + (i * count * 8) as u64) as *const *const std::ffi::c_void;
        // SAFETY: the handle is live and bound to `stream`; every host array has an entry per
        // group and the group sizes add up to `count`, the pointer arrays' length; alpha and beta are f32 host scalars per group (the scaling type of the 32F
        // compute types); the device pointer arrays were copied above in stream order; the
        // operands are the caller's contract.
        let s = unsafe {
            cublas_sys::cublasGemmGroupedBatchedEx(
                self.raw,
                transa.as_ptr(),
                transb.as_ptr(),
                m.as_ptr(),
                n.as_ptr(),
                k.as_ptr(),
                alpha.as_ptr() as *const _,
                array(0),
                ti,
                lda.as_ptr(),
                array(1),
                ti,
                ldb.as_ptr(),
                beta.as_ptr() as *const _,
                array(2) as *const *mut std::ffi::c_void,
                to,
                ldc.as_ptr(),
                sizes.len() as i32,
                sizes.as_ptr(),
                compute_type(precision.compute()),
            )
        };
        status::cublas(s, "cublasGemmGroupedBatchedEx", describe)
    }
}

/// The runs of consecutive GEMMs alike in every host parameter of the grouped call (shape,
/// leading dimensions, operations, α, β): each run's first GEMM and its length.
fn runs(gemms: &[BlasGemm]) -> (Vec<&BlasGemm>, Vec<i32>) {
    let alike = |a: &BlasGemm, b: &BlasGemm| {
        let (x, y) = (&a.call, &b.call);
        (x.transa, x.transb, x.m, x.n, x.k, x.lda, x.ldb, x.ldc)
            == (y.transa, y.transb, y.m, y.n, y.k, y.lda, y.ldb, y.ldc)
            && a.alpha.to_bits() == b.alpha.to_bits()
            && a.beta.to_bits() == b.beta.to_bits()
    };
    let (mut heads, mut sizes): (Vec<&BlasGemm>, Vec<i32>) = (Vec::new(), Vec::new());
    for g in gemms {
        match heads.last() {
            Some(h) if alike(h, g) => *sizes.last_mut().expect("a run per head") += 1,
            _ => {
                heads.push(g);
                sizes.push(1);
            }
        }
    }
    (heads, sizes)
}

#[cfg(test)]
#[path = "grouped_tests.rs"]
mod tests;
