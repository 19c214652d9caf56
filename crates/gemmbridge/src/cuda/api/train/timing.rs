//! [`Mlp`]'s GEMM timing ([`Mlp::set_gemm_timing`], [`Mlp::gemm_breakdown`]) and step
//! autotuning ([`Mlp::autotune`]), over the state `instruments.rs` keeps.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::instruments::{GemmRole, Tuned};
use super::mlp::Mlp;
use crate::cuda::api::engine::Gpu;
use crate::cuda::lt::tune::TuneOptions;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;
use crate::train::GradMode;

/// The layers' GEMM timing and tuning.
impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Turns GEMM timing on or off: while on, CUDA events are recorded around every GEMM the
    /// layers enqueue, and [`Mlp::gemm_ms`] sums them. Off by default (events cost host time).
    pub fn set_gemm_timing(&mut self, on: bool) {
        self.ins.timing = on.then(Vec::new);
    }

    /// Milliseconds the GEMMs enqueued since the last call took on the GPU (waits for them);
    /// 0 with timing off.
    ///
    /// # Errors
    /// [`crate::Error::Driver`].
    pub fn gemm_ms(&mut self) -> Result<f64> {
        Ok(self.gemm_breakdown()?.iter().map(|g| g.2).sum())
    }

    /// Each GEMM enqueued since the last call, in order: its layer, its role and its GPU
    /// time in ms (waits for them); empty with timing off.
    ///
    /// # Errors
    /// [`crate::Error::Driver`].
    pub fn gemm_breakdown(&mut self) -> Result<Vec<(usize, GemmRole, f64)>> {
        let Some(t) = self.ins.timing.as_mut() else { return Ok(Vec::new()) };
        let mut out = Vec::with_capacity(t.len());
        for (layer, role, a, b) in t.drain(..) {
            b.synchronize().map_err(status::driver("cuEventSynchronize"))?;
            out.push((layer, role, f64::from(a.elapsed_ms(&b).map_err(status::driver("cuEventElapsedTime"))?)));
        }
        Ok(out)
    }

    /// Autotunes every GEMM of one training step at this token count ([`Gpu::autotune_raw`]
    /// per GEMM, with the step's own buffers: `x`, `dy` and, if given, `dx` as a step would
    /// use them), running the step as it goes. Tuned algorithms are used by every later call
    /// of the same problems on `gpu`; the returned entries can be stored in a
    /// [`crate::tactics::TacticDb`]. Gradients are overwritten. Synchronises the stream
    /// once per GEMM and takes seconds.
    ///
    /// # Errors
    /// As [`Mlp::forward`] and [`Mlp::backward`]; as [`Gpu::autotune_raw`].
    pub fn autotune<X, D, DX>(
        &mut self,
        gpu: &Gpu,
        x: &X,
        tokens: usize,
        dy: &D,
        dx: Option<&mut DX>,
        opts: TuneOptions,
    ) -> Result<Vec<Tuned>>
    where
        X: DevicePtr<T>,
        D: DevicePtr<T>,
        DX: DevicePtrMut<T>,
    {
        self.ins.tune = Some((opts, Vec::new()));
        let r = self.forward(gpu, x, tokens, true).and_then(|()| self.backward(gpu, x, dy, dx, GradMode::Overwrite));
        let tuned = self.ins.tune.take().map(|t| t.1).unwrap_or_default();
        r.map(|()| tuned)
    }
}
