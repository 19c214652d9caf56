//! Measurements of gemmbridge's own host cost against the bare library calls beneath it.

use std::time::Instant;

use super::engine::Gpu;
use super::operands::RawOperands;
use crate::cuda::blas::BlasGemm;
use crate::cuda::call::Scale;
use crate::cuda::lt::plan::{LtOperands, PlanKey};
use crate::cuda::route::Served;
use crate::cuda::status;
use crate::error::{Error, Result};
use crate::mapping::{column_major_call, ColMajorCall};
use crate::precision::Precision;
use crate::problem::GemmProblem;

impl Gpu {
    /// Host time per call, in µs, of the bare library call beneath gemmbridge for `p`
    /// (`cublasLtMatmul` with the cached plan for [`Served::Lt`], `cublasGemmEx` for
    /// [`Served::Blas`]), with no validation, no lookup and the lock taken once: the floor
    /// gemmbridge's own cost is measured against. Median over `batches` batches of `calls`
    /// calls each, timed on the host clock without waiting for the GPU (keep `calls` below the
    /// launch-queue depth), on [`Gpu::stream`]. The plan must exist (make one call first).
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw`] with `stream` = [`Gpu::stream`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the plan is not cached or the problem has an epilogue (the
    /// epilogue operands of `ops` are not used); library errors by name.
    pub unsafe fn bare_host_us(
        &self,
        p: &GemmProblem,
        ops: RawOperands,
        served: Served,
        batches: usize,
        calls: usize,
    ) -> Result<f64> {
        let (a, b, c) = (ops.a, ops.b, ops.c);
        if p.epilogue() != crate::Epilogue::None {
            return Err(Error::Unsupported { backend: "bare_host_us", what: "epilogues".into() });
        }
        let stream = self.stream().cu_stream();
        let sync = || {
            // SAFETY: a live stream of this context.
            unsafe { cudarc::driver::result::stream::synchronize(stream) }
                .map_err(status::driver("cuStreamSynchronize"))
        };
        let call = column_major_call(p);
        let (first, second) = call.operands(a.address, b.address);
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut times = Vec::with_capacity(batches);
        let mut time_batches = |launch: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            for _ in 0..batches {
                sync()?;
                let t = Instant::now();
                for _ in 0..calls {
                    launch()?;
                }
                times.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
            }
            Ok(())
        };
        match served {
            Served::Lt => {
                let ws = st.dev.workspaces.get(stream, &|| p.describe())?;
                let ops = LtOperands { first, second, c: c.address, bias: None, aux: None };
                let lt = st.libs.lt.as_ref();
                let sm_count = lt.map_or(0, |lt| lt.sm_count);
                let key = PlanKey { sm_count, ..PlanKey::of(p, call, &ops, ws.matmul_bytes) };
                let (Some(plan), Some(lt)) = (lt.and_then(|lt| lt.plans.get(&key)), lt) else {
                    return Err(Error::Unsupported {
                        backend: "bare_host_us",
                        what: "a problem whose plan is not cached".into(),
                    });
                };
                // SAFETY: the caller's contract; the plan and workspace are this stream's.
                time_batches(&mut || unsafe {
                    plan.launch(&lt.handle, &plan.algo, (1.0, 0.0), &ops, &ws, stream as _)
                })?;
            }
            Served::Blas => {
                let g = BlasGemm { call, precision: p.precision(), alpha: 1.0, beta: 0.0, first, second, c: c.address };
                let (blas, dev) = (&mut st.libs.blas, &mut st.dev);
                // SAFETY: the caller's contract.
                time_batches(&mut || unsafe { blas.gemm(dev, &g, stream) })?;
            }
        }
        sync()?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Runs a column-major cuBLAS GEMM exactly as given, without any of gemmbridge's checks,
    /// on [`Gpu::stream`]. For diagnostics (the convention table of `gemmbridge probe` calls
    /// cuBLAS with deliberately wrong arguments); use [`Gpu::gemm`] for real work.
    ///
    /// The addresses are the column-major call's A and B (`first`, `second`) and C.
    ///
    /// # Safety
    /// Every address must be device memory of this context large enough for everything the
    /// call can read or write given its sizes and leading dimensions, as in a direct cuBLAS
    /// call.
    ///
    /// # Errors
    /// [`Error::Cublas`] with the status cuBLAS returned.
    pub unsafe fn gemm_colmajor_unchecked(
        &self,
        call: &ColMajorCall,
        precision: Precision,
        scale: Scale,
        [first, second, c]: [u64; 3],
    ) -> Result<()> {
        let mut guard = self.lock();
        self.device().bind()?;
        let st = &mut *guard;
        let (alpha, beta) = (scale.alpha, scale.beta);
        let g = BlasGemm { call: *call, precision, alpha, beta, first, second, c };
        // SAFETY: forwarded from the caller.
        unsafe { st.libs.blas.gemm(&mut st.dev, &g, self.stream().cu_stream()) }
    }
}
