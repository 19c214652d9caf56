//! The CUDA path of [`crate::sdpa_varlen`]: the padded variable-length batch
//! ([`crate::attention_varlen_op`]) on cuDNN's fused flash-attention engines through
//! gemmbridge, forward (with its softmax statistics kept for the backward) and backward, on
//! candle's buffers and stream. The per-sequence lengths go as host values
//! (`SeqLens::host`: checked by gemmbridge, then copied into the call's workspace in stream
//! order); nothing waits for the GPU.

use std::sync::OnceLock;

use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::{CudaDType, CudaDevice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Result, Storage, Tensor};
use gemmbridge::attention::AttnTensor;
use gemmbridge::cuda::{AttnSaved, SeqLens};
use gemmbridge::Element;

use crate::attention_bwd::keep;
use crate::attention_varlen_op::VarlenPlan;
use crate::cpu::wrap;
use crate::cuda::{engine, output};

/// The forward on the padded q, k, v (their slices and start offsets, dense BSHD): `o` dense
/// `[b, s_q, h_q, d]`; with a `slot`, the statistics `lse[b, h_q, s_q]` (f32) too, kept there
/// as a tensor on `dev`. Padded rows of `o` and `lse` are not defined.
pub(crate) fn forward<T: Element + DeviceRepr + CudaDType>(
    dev: &CudaDevice,
    plan: &VarlenPlan,
    ([q, k, v], starts): ([&CudaSlice<T>; 3], [usize; 3]),
    slot: Option<&OnceLock<Tensor>>,
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (q, k, v) = (q.slice(starts[0]..), k.slice(starts[1]..), v.slice(starts[2]..));
    let lens = Some(SeqLens::host(&plan.len_q, &plan.len_kv));
    let mut o = output::<T>(dev, p.required_elems(AttnTensor::O))?;
    let Some(slot) = slot else {
        gpu.attention_forward(p, [&q, &k, &v], &mut o, None, lens).map_err(wrap)?;
        return Ok(o);
    };
    let mut lse = output::<f32>(dev, p.stats_elems())?;
    gpu.attention_forward(p, [&q, &k, &v], &mut o, Some(&mut lse), lens).map_err(wrap)?;
    let stats = Storage::Cuda(CudaStorage::wrap_cuda_slice(lse, dev.clone()));
    keep(slot, Tensor::from_storage(stats, (p.b, p.h_q, p.s_q), BackpropOp::none(), false));
    Ok(o)
}

/// The backward on the padded q, k, v (slices and start offsets, dense BSHD) and the saved
/// `[o, do, lse]` (candle tensors on `dev`: `o` and `do` contiguous `[b, s_q, h_q, d]` with
/// 16-byte aligned starts, `lse` f32 `[b, h_q, s_q]`): the buffer `[dq | dk | dv]`, each part
/// dense BSHD (`dk`, `dv` summed over the query heads sharing a key/value head). Only the
/// rows within each sequence's lengths are read afterwards.
pub(crate) fn backward<T: Element + DeviceRepr + CudaDType>(
    dev: &CudaDevice,
    plan: &VarlenPlan,
    ([q, k, v], starts): ([&CudaSlice<T>; 3], [usize; 3]),
    saved: &[Tensor; 3],
) -> Result<CudaSlice<T>> {
    // read locks beside candle's on q, k, v: the saved tensors are the forward's output, a
    // gradient and the statistics, never written in place
    let [(o, lo), (d_o, ldo), (lse, llse)] = saved.each_ref().map(|t| t.storage_and_layout());
    let (Storage::Cuda(o), Storage::Cuda(d_o), Storage::Cuda(lse)) = (&*o, &*d_o, &*lse) else {
        candle_core::bail!("sdpa_varlen backward: the saved tensors are not on the GPU")
    };
    let o = o.as_cuda_slice::<T>()?.slice(lo.start_offset()..);
    let d_o = d_o.as_cuda_slice::<T>()?.slice(ldo.start_offset()..);
    let lse = lse.as_cuda_slice::<f32>()?.slice(llse.start_offset()..);
    let (q, k, v) = (q.slice(starts[0]..), k.slice(starts[1]..), v.slice(starts[2]..));
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (nq, nk) = (p.required_elems(AttnTensor::Q), p.required_elems(AttnTensor::K));
    let mut out = output::<T>(dev, nq + nk + p.required_elems(AttnTensor::V))?;
    {
        let (mut dq, mut rest) = out.split_at_mut(nq);
        let (mut dk, mut dv) = rest.split_at_mut(nk);
        let saved = AttnSaved { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, stats: &lse };
        let lens = Some(SeqLens::host(&plan.len_q, &plan.len_kv));
        gpu.attention_backward(p, saved, &mut dq, &mut dk, &mut dv, lens).map_err(wrap)?;
    }
    Ok(out)
}
