//! gemmbridge's kernel of the FP8 attention backward's scales (`attn_bwd_scales` in
//! `kernels/fp8.cu`): one thread, launched on the call's stream just before cuDNN's graph.

use cudarc::driver::sys::CUstream;

use super::kernels::{arg, Kernels};
use crate::error::Result;

/// The launch of gemmbridge's kernel `attn_bwd_scales` (`kernels/fp8.cu`) for one call: it reads
/// the dequantisation scales of q, k, v, o and do and writes the graph's 7 scales into the call's
/// scalars and the gradients' dequantisation scales into their tensors — the f32 operations of
/// `crate::attention::fp8::backward_scales` in its order.
pub(crate) struct AttnBwdScales {
    /// The scales' addresses of q, k, v, o, do (one f32 each).
    inputs: [u64; 5],
    /// The scales' addresses of dq, dk, dv (one f32 each).
    grads: [u64; 3],
    /// The attention scale, d, the dS rows summed into one dk/dv row (`h_q/h_kv · s_q`), s_kv,
    /// the gradients' format's largest value and smallest subnormal.
    numbers: [f32; 6],
}

impl AttnBwdScales {
    /// The job of the scales at `inputs` and `grads` with the kernel's `numbers`.
    pub fn new(inputs: [u64; 5], grads: [u64; 3], numbers: [f32; 6]) -> AttnBwdScales {
        AttnBwdScales { inputs, grads, numbers }
    }

    /// The kernel's numbers (see the field).
    #[cfg(test)]
    pub fn numbers(&self) -> [f32; 6] {
        self.numbers
    }

    /// Enqueues the kernel (one thread) on `stream`, its 11 f32 of scalars at `out` (the last 4,
    /// the absolute maxima, are cuDNN's to write).
    ///
    /// # Safety
    /// `out` holds 11 f32 and every address of the job one f32, all of the kernels' context;
    /// `stream` is a live stream of that context, which is current.
    pub unsafe fn enqueue(&self, k: &Kernels, out: u64, stream: CUstream) -> Result<()> {
        let [mut sq, mut sk, mut sv, mut so, mut sdo] = self.inputs;
        let [mut scale, mut d, mut rows, mut skv, mut f, mut u] = self.numbers;
        let (mut out, [mut gq, mut gk, mut gv]) = (out, self.grads);
        let mut args = [
            arg(&mut sq),
            arg(&mut sk),
            arg(&mut sv),
            arg(&mut so),
            arg(&mut sdo),
            arg(&mut scale),
            arg(&mut d),
            arg(&mut rows),
            arg(&mut skv),
            arg(&mut f),
            arg(&mut u),
            arg(&mut out),
            arg(&mut gq),
            arg(&mut gk),
            arg(&mut gv),
        ];
        // SAFETY: the arguments are the kernel's parameters in order (5 pointers, 6 f32, 4
        // pointers); the addresses are the caller's contract.
        unsafe { k.launch("attn_bwd_scales_f32", (1, 1, 1), 1, stream, &mut args) }
    }
}
