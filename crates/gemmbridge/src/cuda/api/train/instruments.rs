//! Every GEMM of the training layers goes through [`gemm`]: the call itself, timed with CUDA
//! events when timing is on, autotuned first when a tuning step is running.

use cudarc::driver::{CudaEvent, DevicePtr, DevicePtrMut};

use crate::cuda::api::engine::Gpu;
use crate::cuda::api::operands::{Extras, RawBuffer, RawOperands};
use crate::cuda::call::Scale;
use crate::cuda::lt::tune::{TuneOptions, TuneReport};
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;
use crate::problem::GemmProblem;
use crate::tactics::Tactic;

/// Which GEMM of a step: the layer and its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmRole {
    /// `y = act(x·wᵀ + b)`.
    Forward,
    /// `dw = dpreᵀ·x` (and `db`).
    WeightGrad,
    /// `dx = dpre·w` (and the previous layer's activation backward).
    DataGrad,
    /// `db = ones·dpre`: the bias gradient as a GEMM of its own (FP8 layers, whose weight
    /// gradient GEMM has no bias-gradient epilogue; [`crate::train::fp8`]).
    BiasGrad,
}

/// One tuned GEMM of a step: the layer, its role, cuBLASLt's report and the entry to store in
/// a [`crate::tactics::TacticDb`].
pub type Tuned = (usize, GemmRole, TuneReport, String, Tactic);

/// Timing and tuning state.
#[derive(Default)]
pub(super) struct Instruments {
    pub timing: Option<Vec<(usize, GemmRole, CudaEvent, CudaEvent)>>,
    pub tune: Option<(TuneOptions, Vec<Tuned>)>,
}

fn event(gpu: &Gpu) -> Result<CudaEvent> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    gpu.stream().record_event(flags).map_err(status::driver("cuEventRecord"))
}

/// One GEMM of a training step, as [`gemm`] runs it: `c = a·b (+ β·c)` per `problem` (α = 1)
/// with the epilogue's `extras`, named by its layer and role for the timing and tuning records.
pub(super) struct TrainGemm<'a, T, A, B, C> {
    /// The layer the GEMM belongs to.
    pub layer: usize,
    /// What it computes for that layer.
    pub role: GemmRole,
    /// Shapes, layouts, precision and epilogue.
    pub problem: &'a GemmProblem,
    /// The problem's `A`.
    pub a: &'a A,
    /// The problem's `B`.
    pub b: &'a B,
    /// 1 to accumulate into `c`, 0 to overwrite it.
    pub beta: f32,
    /// The problem's `C`, the output (β = 1 adds to what it holds).
    pub c: &'a mut C,
    /// The epilogue's operands (bias, bias gradient, aux).
    pub extras: Extras<'a, T>,
}

/// Enqueues `call` on [`Gpu::stream`]: tuned first in a tuning step, timed when timing is on.
pub(super) fn gemm<T: Element, A: DevicePtr<T>, B: DevicePtr<T>, C: DevicePtrMut<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    call: TrainGemm<'_, T, A, B, C>,
) -> Result<()> {
    let TrainGemm { layer, role, problem: p, a, b, beta, c, mut extras } = call;
    if let Some((opts, tuned)) = ins.tune.as_mut() {
        let s = gpu.stream();
        let raw = |address, len_bytes| RawBuffer { address, len_bytes };
        let (ra, rb) = (raw(a.device_ptr(s).0, a.num_bytes()), raw(b.device_ptr(s).0, b.num_bytes()));
        let c_len = c.num_bytes();
        let rc = raw(c.device_ptr_mut(s).0, c_len);
        let bias = match (&extras.bias, &mut extras.bias_grad) {
            (Some(v), _) => Some(raw(v.device_ptr(s).0, v.num_bytes())),
            (None, Some(v)) => {
                let len = v.num_bytes();
                Some(raw(v.device_ptr_mut(s).0, len))
            }
            _ => None,
        };
        let aux = match (&extras.aux_in, &mut extras.aux_out) {
            (Some(v), _) => Some(raw(v.device_ptr(s).0, v.num_bytes())),
            (None, Some(v)) => {
                let len = v.num_bytes();
                Some(raw(v.device_ptr_mut(s).0, len))
            }
            _ => None,
        };
        // SAFETY: every address is a live buffer of this context borrowed for this call, on
        // the Gpu's own stream, which autotune_raw synchronises before returning.
        let (report, sig, tactic) = unsafe {
            gpu.autotune_raw(p, Scale::new(1.0, beta), RawOperands { a: ra, b: rb, c: rc, bias, aux }, *opts)
        }?;
        tuned.push((layer, role, report, sig, tactic));
    }
    timed(gpu, ins, (layer, role), || gpu.gemm_fused(p, Scale::new(1.0, beta), a, b, c, extras))
}

/// Runs `launch` (one GEMM enqueued on [`Gpu::stream`]) between two CUDA events when timing
/// is on.
pub(super) fn timed(
    gpu: &Gpu,
    ins: &mut Instruments,
    (layer, role): (usize, GemmRole),
    launch: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let start = if ins.timing.is_some() { Some(event(gpu)?) } else { None };
    launch()?;
    if let (Some(t), Some(start)) = (ins.timing.as_mut(), start) {
        t.push((layer, role, start, event(gpu)?));
    }
    Ok(())
}

/// A `&dyn DevicePtr` as a sized `DevicePtr` (the entry points take sized operands).
pub(super) struct DynRef<'a, T>(pub &'a dyn DevicePtr<T>);

impl<T> DevicePtr<T> for DynRef<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a cudarc::driver::CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        self.0.device_ptr(stream)
    }
}

impl<T> cudarc::driver::DeviceSlice<T> for DynRef<'_, T> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
        self.0.stream()
    }
}
