//! The attention backward with dq, dk and dv written into one fused buffer, interleaved as a
//! fused projection's output holds q, k and v, so that the projection's backward is one GEMM
//! on it.

use cudarc::driver::DevicePtrMut;

use super::GpuAttention;
use super::{check_problem, span, AttnSaved, SeqLens};
use crate::attention::{check_packed, Attention, AttnTensor};
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::dnn::attention::AttnOp;
use crate::dtype::Element;
use crate::error::{Result, Which};

impl GpuAttention<'_> {
    /// [`GpuAttention::backward`] with the three gradients in one buffer `dqkv`: `dq`
    /// starts `offsets[0]` elements into it, `dk` `offsets[1]`, `dv` `offsets[2]`, each
    /// strided as `p.layouts` says for q, k, v — a fused projection's layout (each token's row
    /// holds dq's heads, then dk's, then dv's; [`crate::layer::DecoderLayer::attention`]), so
    /// that `dqkv·w_qkv` and `dqkvᵀ·h` are one GEMM each. The views' byte ranges overlap, but
    /// no element is shared ([`check_packed`]: one row stride, each view's heads in a column
    /// band of its own); elements of `dqkv` that belong to no view are not written.
    ///
    /// # Errors
    /// As [`GpuAttention::backward`]; [`crate::Error::AttentionShape`] where the views could
    /// share elements; [`crate::Error::BufferTooSmall`] / [`crate::Error::Misaligned`] naming
    /// the gradient whose view does not fit in `dqkv` or does not start 16-byte aligned;
    /// [`crate::Error::OutputOverlapsInput`] where `dqkv`'s span meets an input.
    pub fn backward_packed<T: Element>(
        &self,
        p: &Attention,
        saved: AttnSaved<T>,
        dqkv: &mut dyn DevicePtrMut<T>,
        offsets: [usize; 3],
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_problem::<T>(p, lens)?;
        check_packed(p, offsets)?;
        let (ctx, s) = (gpu.context(), gpu.stream());
        same_context(Which::AttnStats, saved.stats.stream(), ctx)?;
        same_context(Which::AttnDq, dqkv.stream(), ctx)?;
        let elem = T::DTYPE.size_bytes();
        let mut guards = Vec::with_capacity(10);
        let mut read = gpu.saved_spans(p, saved, &mut guards)?;
        let bytes = dqkv.num_bytes();
        let (base, g) = dqkv.device_ptr_mut(s);
        guards.push(g);
        let mut views = [0u64; 3];
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let grads = [(Which::AttnDq, AttnTensor::Q), (Which::AttnDk, AttnTensor::K), (Which::AttnDv, AttnTensor::V)];
        for (i, (w, t)) in grads.into_iter().enumerate() {
            let skip = offsets[i].saturating_mul(elem);
            let at = base.saturating_add(skip as u64);
            let v = span(w, at, bytes.saturating_sub(skip), p.required_elems(t), elem)?;
            (views[i], lo, hi) = (at, lo.min(at), hi.max(at + v.bytes as u64));
        }
        // the three views as one written span: apart from every input
        let whole = Span { which: Which::AttnDq, addr: lo, bytes: hi.saturating_sub(lo) as usize };
        let (mut b, host) = gpu.lens_buffers(p, lens, &mut guards, &mut read)?;
        disjoint(&[whole], &read)?;
        (b.q, b.k, b.v, b.o, b.d_o, b.stats) =
            (read[0].addr, read[1].addr, read[2].addr, read[3].addr, read[4].addr, read[5].addr);
        [b.dq, b.dk, b.dv] = views;
        let r = gpu.attention_run(p, AttnOp::Backward, b, host, None);
        drop(guards);
        r
    }
}
