//! [`Mlp`]'s GEMM observer ([`Mlp::set_gemm_observer`]) and step autotuning
//! ([`Mlp::autotune`]), over the state `instruments.rs` keeps.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::instruments::{GemmObserver, Tuned};
use super::mlp::Mlp;
use crate::cuda::api::engine::Gpu;
use crate::cuda::lt::tune::TuneOptions;
use crate::dtype::Element;
use crate::error::Result;
use crate::train::GradMode;

/// The layers' GEMM observer and tuning.
impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Sets a function that the layers call on the host just before and just after they
    /// enqueue each GEMM of [`Mlp::forward`], [`Mlp::backward`] and [`Mlp::autotune`] (every
    /// GEMM of a step, FP8 ones included), with the layer, the GEMM's
    /// [`GemmRole`](super::GemmRole) and the side ([`GemmMark`](super::GemmMark)); `None`
    /// removes it (the default). It runs outside the engine's lock, so it may enqueue work of
    /// its own on [`Gpu::stream`]: a CUDA event recorded on each side times the GEMM on the
    /// GPU (events cost host time), a profiler range marks it. An error it returns ends the
    /// step's call with that error (what is enqueued stays enqueued).
    pub fn set_gemm_observer(&mut self, observer: Option<GemmObserver>) {
        self.ins.observer = observer;
    }

    /// Autotunes every GEMM of one training step at this token count ([`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)
    /// per GEMM, with the step's own buffers: `x`, `dy` and, if given, `dx` as a step would
    /// use them), running the step as it goes. Tuned algorithms are used by every later call
    /// of the same problems on `gpu`; the returned entries can be stored in a
    /// [`crate::tactics::TacticDb`]. Gradients are overwritten. Synchronises the stream
    /// once per GEMM and takes seconds.
    ///
    /// # Errors
    /// As [`Mlp::forward`] and [`Mlp::backward`]; as [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw).
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
