//! The CUDA path of attention's autograd ([`crate::sdpa`], and [`crate::sdpa_varlen`]'s padded
//! batch with its per-sequence lengths): the forward with its softmax statistics kept for the
//! backward, and the backward, both on cuDNN's fused flash-attention engines through
//! gemmbridge, on candle's buffers and stream ([`crate::cuda`]: zero-copy, no host
//! synchronisation; host lengths are checked by gemmbridge, then copied into the call's
//! workspace in stream order).

use std::sync::OnceLock;

use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::{CudaDType, CudaDevice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Result, Storage, Tensor};
use gemmbridge::attention::{Attention, AttnTensor};
use gemmbridge::cuda::{AttnSaved, SeqLens};
use gemmbridge::Element;

use crate::cpu::{keep, wrap};
use crate::cuda::{engine, output};

/// The forward for the problem `p` on q, k, v (their slices and start offsets, in `p`'s
/// strides), with the per-sequence lengths `lens` of a padded variable-length batch where
/// given: `o` dense (`p.required_elems`; a padded batch's padded rows not defined); with a
/// `slot` (an input tracks a gradient) the statistics `lse[b, h_q, s_q]` (f32) are written too
/// and kept there as a tensor on `dev`.
pub(crate) fn forward<T: Element + DeviceRepr + CudaDType>(
    dev: &CudaDevice,
    p: &Attention,
    ([q, k, v], starts): ([&CudaSlice<T>; 3], [usize; 3]),
    lens: Option<SeqLens>,
    slot: Option<&OnceLock<Tensor>>,
) -> Result<CudaSlice<T>> {
    let gpu = engine(dev)?;
    let (q, k, v) = (q.slice(starts[0]..), k.slice(starts[1]..), v.slice(starts[2]..));
    let mut o = output::<T>(dev, p.required_elems(AttnTensor::O))?;
    let Some(slot) = slot else {
        gpu.attention().forward(p, [&q, &k, &v], &mut o, None, lens).map_err(wrap)?;
        return Ok(o);
    };
    let mut lse = output::<f32>(dev, p.stats_elems())?;
    gpu.attention().forward(p, [&q, &k, &v], &mut o, Some(&mut lse), lens).map_err(wrap)?;
    let stats = Storage::Cuda(CudaStorage::wrap_cuda_slice(lse, dev.clone()));
    keep(slot, Tensor::from_storage(stats, (p.b, p.h_q, p.s_q), BackpropOp::none(), false));
    Ok(o)
}

/// The backward for the problem `p` of the operation `op` (named in errors): from q, k, v
/// (their slices and start offsets, in `p`'s strides) and the saved `[o, do, lse]` (candle
/// tensors on `dev`: `o` and `do` contiguous in o's layout with 16-byte aligned starts, `lse`
/// f32 `[b, h_q, s_q]`), with `lens` as [`forward`]'s, the buffer `[dq | dk | dv]`, each part
/// `p.required_elems` long in its tensor's strides (`dk`, `dv` summed over the query heads
/// that share a key/value head); cuDNN's fused backward writes every element (of a padded
/// batch, only the rows within each sequence's lengths are read afterwards).
pub(crate) fn backward<T: Element + DeviceRepr + CudaDType>(
    op: &str,
    dev: &CudaDevice,
    p: &Attention,
    ([q, k, v], starts): ([&CudaSlice<T>; 3], [usize; 3]),
    saved: &[Tensor; 3],
    lens: Option<SeqLens>,
) -> Result<CudaSlice<T>> {
    // read locks beside the ones candle holds on q, k, v: the saved tensors are the forward's
    // output, a gradient and the statistics, never written in place
    let [(o, lo), (d_o, ldo), (lse, llse)] = saved.each_ref().map(|t| t.storage_and_layout());
    let (Storage::Cuda(o), Storage::Cuda(d_o), Storage::Cuda(lse)) = (&*o, &*d_o, &*lse) else {
        candle_core::bail!("{op}: the saved tensors are not on the GPU")
    };
    let o = o.as_cuda_slice::<T>()?.slice(lo.start_offset()..);
    let d_o = d_o.as_cuda_slice::<T>()?.slice(ldo.start_offset()..);
    let lse = lse.as_cuda_slice::<f32>()?.slice(llse.start_offset()..);
    let (q, k, v) = (q.slice(starts[0]..), k.slice(starts[1]..), v.slice(starts[2]..));
    let gpu = engine(dev)?;
    let (nq, nk) = (p.required_elems(AttnTensor::Q), p.required_elems(AttnTensor::K));
    let mut out = output::<T>(dev, nq + nk + p.required_elems(AttnTensor::V))?;
    {
        let (mut dq, mut rest) = out.split_at_mut(nq);
        let (mut dk, mut dv) = rest.split_at_mut(nk);
        let saved = AttnSaved { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, stats: &lse };
        gpu.attention().backward(p, saved, &mut dq, &mut dk, &mut dv, lens).map_err(wrap)?;
    }
    Ok(out)
}
