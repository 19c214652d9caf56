//! [`Mlp`]'s activation and gradient buffers for one token count, allocated (stream-ordered)
//! when the token count changes.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::mlp::Mlp;
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::Relaxed;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;
use crate::train::Activation;

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

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Allocates the activation and gradient buffers for `tokens` unless they exist.
    pub(super) fn ensure_buffers(&mut self, gpu: &Gpu, tokens: usize) -> Result<()> {
        if self.bufs.as_ref().is_some_and(|b| b.tokens == tokens) {
            return Ok(());
        }
        self.bufs = None; // freed in stream order before the new ones are allocated
        let (last, places) = (self.layers.len() - 1, self.placements());
        let _relaxed = Relaxed::enter()?;
        let ones = match self.fp8.is_some() && self.layers.iter().any(|l| l.bias) {
            true => Some(
                gpu.stream()
                    .clone_htod(&vec![T::from_f32(1.0); tokens])
                    .map_err(status::driver("cuMemcpyHtoDAsync"))?,
            ),
            false => None,
        };
        let mut b = Buffers { tokens, out: Vec::new(), pre: Vec::new(), grad: Vec::new(), ones };
        for (i, l) in self.layers.iter().enumerate() {
            let n = tokens * l.out_features;
            b.out.push(alloc(gpu, n)?);
            let ld = places.pre_ld(l);
            let pre = l.activation.saves_pre().then(|| alloc(gpu, tokens * ld)).transpose()?;
            b.pre.push(pre);
            let needs_grad = i < last || l.activation != Activation::None;
            b.grad.push(if needs_grad { Some(alloc(gpu, n)?) } else { None });
        }
        self.bufs = Some(b);
        Ok(())
    }
}
