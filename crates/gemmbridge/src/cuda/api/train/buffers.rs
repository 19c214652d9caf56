//! [`Mlp`]'s activation and gradient buffers for one token count, allocated (stream-ordered)
//! when the token count changes.

use cudarc::driver::{CudaSlice, DeviceRepr};

use crate::cuda::api::engine::Gpu;
use crate::cuda::device::Relaxed;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;

/// Activations and gradients for one token count.
pub(super) struct Buffers<T> {
    pub tokens: usize,
    /// Per layer: its output `act(pre)`, `[tokens, out]`.
    pub out: Vec<CudaSlice<T>>,
    /// Per GELU layer: the pre-activation, `[tokens, ld]`
    /// ([`Placements::pre_ld`](super::placement::Placements::pre_ld)).
    pub pre: Vec<Option<CudaSlice<T>>>,
    /// Per layer: the gradient of its output, or of its pre-activation where the next layer's
    /// GEMM or a kernel has applied the activation's backward (`[tokens, out]`). The last
    /// layer has one only when it has an activation (the caller's dy is left untouched).
    pub grad: Vec<Option<CudaSlice<T>>>,
    /// FP8 layers with a bias: `[tokens]` ones, the bias gradient GEMM's `A`.
    pub ones: Option<CudaSlice<T>>,
}

/// `n` elements (at least one) of T from the stream-ordered pool, uninitialised.
pub(super) fn alloc<T: Element + DeviceRepr>(gpu: &Gpu, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every buffer allocated here is written before it is read (the forward writes
    // outputs and pre-activations, the backward gradients) — except the accumulate-mode
    // gradients, which are zeroed at creation (`alloc_zeros` in Mlp::build).
    let _relaxed = Relaxed::enter()?;
    unsafe { gpu.stream().alloc::<T>(n.max(1)) }.map_err(status::driver("cuMemAllocAsync"))
}
