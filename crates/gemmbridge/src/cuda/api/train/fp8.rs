//! The GEMMs of [`super::Mlp`]'s FP8 mode: each operand quantised on [`Gpu::stream`] just
//! before its GEMM ([`crate::train::fp8`] gives the table of which operand is which), the GEMM
//! on cuBLASLt's FP8 mode ([`GpuFp8::gemm`]), the bias gradient as a high-precision GEMM.
//! The quantised operands live in the stream-ordered pool and are freed, in stream order,
//! when the call returns.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use super::instruments::{gemm, observed, GemmRole, Instruments, TrainGemm};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::cuda::route::fp8::Fp8Options;
use crate::dtype::Element;
use crate::error::Result;
use crate::fp8::Source;
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::train::fp8::Fp8Training;
use crate::train::LinearSpec;

/// One FP8 layer's fixed facts for a step: the recipe, the layer, its index, the tokens and
/// the tensors' precision.
#[derive(Clone, Copy)]
pub(super) struct Fp8Step {
    pub recipe: Fp8Training,
    pub layer: usize,
    pub spec: LinearSpec,
    pub tokens: usize,
    /// The tensors' own precision (bf16 or f16), that of the bias-gradient GEMM.
    pub precision: Precision,
}

/// One FP8 layer's forward operands ([`layer_forward`]): its input, parameters and outputs.
pub(super) struct LayerForward<'a, T, H> {
    /// The input `h[tokens, in]`.
    pub h: &'a H,
    /// The weight `w[out, in]`.
    pub w: &'a CudaSlice<T>,
    /// The bias `b[out]`, if the layer has one.
    pub b: Option<&'a CudaSlice<T>>,
    /// GELU layers: the pre-activation `[tokens, out]` the GEMM writes.
    pub pre: Option<&'a mut CudaSlice<T>>,
    /// The layer's output `act(pre)`, `[tokens, out]`.
    pub out: &'a mut CudaSlice<T>,
}

/// One FP8 layer's gradient operands ([`weight_grads`]): the pre-activation's gradient, the
/// layer's input and the gradients written.
pub(super) struct WeightGrads<'a, T, G, H> {
    /// The pre-activation's gradient `g[tokens, out]`.
    pub g: &'a G,
    /// The layer's input `h[tokens, in]`.
    pub h: &'a H,
    /// 1 to accumulate into the gradients, 0 to overwrite them.
    pub beta: f32,
    /// The weight gradient `dw[out, in]`.
    pub dw: &'a mut CudaSlice<T>,
    /// Layers with a bias: the bias gradient `db[out]` and the `[tokens]` ones it is summed with.
    pub db: Option<(&'a mut CudaSlice<T>, &'a CudaSlice<T>)>,
}

/// `out[tokens, out] = h[tokens, in]·w[out, in]ᵀ (+ b)`.
pub(super) fn forward<T: Element, H: DevicePtr<T>, O: DevicePtrMut<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    st: Fp8Step,
    h: &H,
    w: &CudaSlice<T>,
    b: Option<&CudaSlice<T>>,
    out: &mut O,
) -> Result<()> {
    let (r, l) = (st.recipe, st.spec);
    let hq = gpu.fp8().quantize(h, st.tokens, l.in_features, Source::RowMajor, r.activations, r.x_scaling)?;
    let wq = gpu.fp8().quantize(w, l.out_features, l.in_features, Source::RowMajor, r.activations, r.w_scaling)?;
    let bias = b.map(|b| b as &dyn DevicePtr<T>);
    observed(ins, (st.layer, GemmRole::Forward), || gpu.fp8().gemm(&hq, &wq, out, bias, Fp8Options::default()))
}

/// `dw[out, in] = gᵀ·h` (`β·dw +` with β = 1 to accumulate) and, with `db`, the bias
/// gradient `db[out] = ones[1, tokens]·g` in the step's `precision` (same β), where
/// `g[tokens, out]` is the pre-activation's gradient and `h[tokens, in]` the layer's input.
pub(super) fn weight_grads<T: Element, G: DevicePtr<T>, H: DevicePtr<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    st: Fp8Step,
    grads: WeightGrads<'_, T, G, H>,
) -> Result<()> {
    let WeightGrads { g, h, beta, dw, db } = grads;
    let (r, l, tokens) = (st.recipe, st.spec, st.tokens);
    let gt = gpu.fp8().quantize(g, l.out_features, tokens, Source::Transposed, r.gradients, r.x_scaling)?;
    let ht = gpu.fp8().quantize(h, l.in_features, tokens, Source::Transposed, r.activations, r.w_scaling)?;
    let opts = Fp8Options { beta, ..Fp8Options::default() };
    observed(ins, (st.layer, GemmRole::WeightGrad), || gpu.fp8().gemm(&gt, &ht, dw, None, opts))?;
    if let Some((db, ones)) = db {
        let p = GemmProblem::matmul(1, l.out_features, tokens, st.precision)?;
        let (layer, role) = (st.layer, GemmRole::BiasGrad);
        gemm(gpu, ins, TrainGemm { layer, role, problem: &p, a: ones, b: g, beta, c: db, extras: Extras::default() })?;
    }
    Ok(())
}

/// `out[tokens, in] = g[tokens, out]·w[out, in]`.
pub(super) fn data_grad<T: Element, G: DevicePtr<T>, O: DevicePtrMut<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    st: Fp8Step,
    g: &G,
    w: &CudaSlice<T>,
    out: &mut O,
) -> Result<()> {
    let (r, l) = (st.recipe, st.spec);
    let gq = gpu.fp8().quantize(g, st.tokens, l.out_features, Source::RowMajor, r.gradients, r.x_scaling)?;
    let wt = gpu.fp8().quantize(w, l.in_features, l.out_features, Source::Transposed, r.activations, r.w_scaling)?;
    observed(ins, (st.layer, GemmRole::DataGrad), || gpu.fp8().gemm(&gq, &wt, out, None, Fp8Options::default()))
}

/// Layer `st.layer`'s forward: the FP8 GEMM into `pre` (GELU layers; a kernel then writes the
/// activation into `out`) or into `out` (ReLU, applied in place by a kernel; the identity).
pub(super) fn layer_forward<T: Element, H: DevicePtr<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    st: Fp8Step,
    io: LayerForward<'_, T, H>,
) -> Result<()> {
    let LayerForward { h, w, b, pre, out } = io;
    let (act, n, s) = (st.spec.activation, st.tokens * st.spec.out_features, gpu.stream());
    match pre {
        Some(pre) => {
            forward(gpu, ins, st, h, w, b, pre)?;
            let (pp, _g1) = pre.device_ptr(s);
            let (po, _g2) = out.device_ptr_mut(s);
            // SAFETY: pre and out hold n elements of T (allocated for the token count), apart.
            unsafe { gpu.enqueue_act(act, T::DTYPE, pp, po, n) }
        }
        None => {
            forward(gpu, ins, st, h, w, b, out)?;
            let (po, _g) = out.device_ptr_mut(s);
            // SAFETY: out holds n elements of T; ReLU in place, the identity does nothing.
            unsafe { gpu.enqueue_act(act, T::DTYPE, po, po, n) }
        }
    }
}
