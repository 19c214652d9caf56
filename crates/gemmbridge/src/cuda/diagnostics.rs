//! Measurements of gemmbridge's own host cost against the bare library calls beneath it.

use std::time::Instant;

use super::gpu::{Gpu, RawBuffer, Served};
use super::status;
use crate::error::{Error, Result};
use crate::mapping::column_major_call;
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
    /// [`Error::Unsupported`] when the plan is not cached or the problem has an epilogue;
    /// library errors by name.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bare_host_us(
        &self,
        p: &GemmProblem,
        a: RawBuffer,
        b: RawBuffer,
        c: RawBuffer,
        served: Served,
        batches: usize,
        calls: usize,
    ) -> Result<f64> {
        if p.epilogue() != crate::Epilogue::None {
            return Err(Error::Unsupported { backend: "bare_host_us", what: "epilogues".into() });
        }
        let stream = self.stream().cu_stream();
        let sync = || {
            // SAFETY: a live stream of this context.
            unsafe { cudarc::driver::result::stream::synchronize(stream) }
                .map_err(status::driver("cuStreamSynchronize"))
        };
        let mut st = self.lock();
        let mut times = Vec::with_capacity(batches);
        match served {
            Served::Lt => {
                let ws = self.workspace(&mut st, stream, &|| p.describe())?;
                let key = Gpu::plan_key(p, (a.address, b.address, c.address), None, ws.matmul_bytes);
                let (Some(plan), Some(lt)) = (st.plans.get(&key), st.lt.as_ref()) else {
                    return Err(Error::Unsupported {
                        backend: "bare_host_us",
                        what: "a problem whose plan is not cached".into(),
                    });
                };
                let (first, second) = key.call.operands(a.address, b.address);
                for _ in 0..batches {
                    sync()?;
                    let t = Instant::now();
                    for _ in 0..calls {
                        // SAFETY: the caller's contract; the plan and workspace are this stream's.
                        unsafe {
                            plan.launch(
                                lt,
                                &plan.algo,
                                1.0,
                                first,
                                second,
                                0.0,
                                c.address,
                                None,
                                None,
                                ws.ptr,
                                ws.matmul_bytes,
                                stream as _,
                            )
                        }?;
                    }
                    times.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
                }
            }
            Served::Blas => {
                let call = column_major_call(p);
                let (first, second) = call.operands(a.address, b.address);
                for _ in 0..batches {
                    sync()?;
                    let t = Instant::now();
                    for _ in 0..calls {
                        // SAFETY: the caller's contract.
                        unsafe {
                            self.blas_call(&mut st, &call, p.precision(), 1.0, first, second, 0.0, c.address, stream)
                        }?;
                    }
                    times.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
                }
            }
        }
        sync()?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}
