//! Every GEMM of the training layers goes through [`gemm`]: the call itself, between the
//! calls of the GEMM observer when one is set, autotuned first when a tuning step is running.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::{Extras, RawBuffer, RawOperands};
use crate::cuda::call::Scale;
use crate::cuda::lt::tune::{TuneOptions, TuneReport};
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

/// Which side of a GEMM a call of the GEMM observer is on
/// ([`Mlp::set_gemm_observer`](super::Mlp::set_gemm_observer)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmMark {
    /// Just before the GEMM is enqueued.
    Before,
    /// Just after it was enqueued (not run: nothing waits for the GPU).
    After,
}

/// A function called on the host around every GEMM the training layers enqueue, with the
/// layer, the GEMM's role and the side ([`Mlp::set_gemm_observer`](super::Mlp::set_gemm_observer)).
pub type GemmObserver = Box<dyn FnMut(usize, GemmRole, GemmMark) -> Result<()> + Send + Sync>;

/// The GEMM observer and the tuning state.
#[derive(Default)]
pub(super) struct Instruments {
    pub observer: Option<GemmObserver>,
    pub tune: Option<(TuneOptions, Vec<Tuned>)>,
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

/// Enqueues `call` on [`Gpu::stream`]: tuned first in a tuning step, between the observer's
/// calls when one is set.
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
        // the Gpu's own stream, which GpuTuning::gemm_raw synchronises before returning.
        let (report, sig, tactic) = unsafe {
            gpu.tune().gemm_raw(
                p,
                Scale::new(1.0, beta),
                RawOperands { a: ra, b: rb, c: rc, c_in: None, bias, aux },
                *opts,
            )
        }?;
        tuned.push((layer, role, report, sig, tactic));
    }
    observed(ins, (layer, role), || gpu.gemm_fused(p, Scale::new(1.0, beta), a, b, c, extras))
}

/// Runs `launch` (one GEMM enqueued on [`Gpu::stream`]) between the observer's two calls when
/// one is set.
pub(super) fn observed(
    ins: &mut Instruments,
    (layer, role): (usize, GemmRole),
    launch: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if let Some(o) = ins.observer.as_mut() {
        o(layer, role, GemmMark::Before)?;
    }
    launch()?;
    if let Some(o) = ins.observer.as_mut() {
        o(layer, role, GemmMark::After)?;
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
