//! The served path of [`crate::sdpa_varlen`]: packed sequences as gemmbridge's padded
//! variable-length batch, forward and backward as candle custom operations.
//!
//! gemmbridge's attention takes variable-length batches as a padded batch with per-sequence
//! lengths (`Attention::with_var_len`; cuDNN's padding mask, no mask tensor), not as packed
//! rows. So the packed `q[total_q, h_q, d]` is scattered into a zeroed `[b, s_q, h_q, d]`
//! (`s_q` = `max_seqlen_q`, at least 1) by candle's `index_add` with the row map `row_q[r] =
//! n·s_q + (r − cu_q[n])` for the rows `r` of sequence `n`, and k, v likewise into `[b, s_kv,
//! h_kv, d]`; the engine runs on the padded tensors (BSHD, contiguous) with the lengths, and
//! `o` is gathered back by `index_select` with the same map. candle's autograd carries the
//! gradients through both copies (the gradient of `index_add`'s source is an `index_select`
//! of the padded gradient, which reads only real rows, and that of `index_select` an
//! `index_add` into zeros), so the padded rows' values, defined or not, never reach a
//! gradient.
//!
//! An empty sequence is given the engine as one query row and one key row of zeros (the
//! engine takes lengths from 1): that row's output is gathered by nobody, and as its output
//! gradient is zero it adds exactly zero to the sequence's `dk` and `dv`.
//!
//! The lengths reach the engine from the host (`SeqLens::host` on CUDA: checked again, then
//! copied in stream order), as do the row maps (two `u32` tensors made on the inputs' device).

use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use gemmbridge::attention::Attention;

use crate::attention_bwd::{cpu_backward, cpu_forward, dense_aligned, grads_shape, split_grads, Grads};
use crate::attention_varlen_batch::{Causal, Packing};
use crate::cpu::by_dtype;

/// The padded problem and the lengths the engine is given.
#[derive(Clone, Debug)]
pub(crate) struct VarlenPlan {
    /// `b` sequences of `s_q` (`s_kv`) rows, BSHD, per-sequence lengths, the mask and scale.
    pub problem: Attention,
    /// Each sequence's query rows for the engine (at least 1: see the module documentation).
    pub len_q: Vec<i32>,
    /// Each sequence's key rows for the engine (at least 1).
    pub len_kv: Vec<i32>,
}

impl VarlenPlan {
    /// The lengths as the CPU backend takes them.
    pub fn lens(&self) -> Option<(&[i32], &[i32])> {
        Some((&self.len_q, &self.len_kv))
    }

    /// The lengths as the CUDA engine takes them: host values (checked again, then copied in
    /// stream order; nothing waits for the GPU).
    #[cfg(feature = "cuda")]
    pub fn seq_lens(&self) -> Option<gemmbridge::cuda::SeqLens<'_>> {
        Some(gemmbridge::cuda::SeqLens::host(&self.len_q, &self.len_kv))
    }
}

/// The padded problem for checked lengths, or `None` where gemmbridge does not serve it
/// (`dtype` other than f16/bf16, `d` not a multiple of 8 up to 256, no query rows at all,
/// sizes past its limits).
pub(crate) fn plan(
    pk: &Packing,
    (h_q, h_kv, d): (usize, usize, usize),
    mask: Causal,
    scale: Option<f32>,
    dtype: DType,
) -> Option<VarlenPlan> {
    let b = pk.b();
    if b == 0 || pk.cu_q[b] == 0 {
        return None;
    }
    // the padded extents: the longest sequence rounded up to a power of two, within the bounds
    // given — memory and work follow the batch, and one plan serves every batch whose longest
    // sequence stays within the same power of two
    let longest = |which: usize| (0..b).map(|n| [pk.lens(n).0, pk.lens(n).1][which]).max().unwrap_or(0);
    let bucket = |which: usize| longest(which).max(1).next_power_of_two().min(pk.max[which]).max(1);
    let (s_q, s_kv) = (bucket(0), bucket(1));
    let elem = crate::plan::element(dtype)?;
    let mut p = Attention::new(b, (h_q, h_kv), (s_q, s_kv), d, elem).with_mask(mask.mask()).with_var_len(true);
    if let Some(s) = scale {
        p = p.with_scale(s);
    }
    p.validate().ok()?;
    // the padded row maps index rows of b·s: within u32 (the sizes' limit is i32::MAX)
    u32::try_from(b.checked_mul(s_q.max(s_kv))?).ok()?;
    let engine_len = |n: usize, which: usize| {
        let l = pk.lens(n);
        i32::try_from([l.0, l.1][which].max(1)).ok()
    };
    let len_q = (0..b).map(|n| engine_len(n, 0)).collect::<Option<Vec<_>>>()?;
    let len_kv = (0..b).map(|n| engine_len(n, 1)).collect::<Option<Vec<_>>>()?;
    p.check_lengths(&len_q, &len_kv).ok()?;
    Some(VarlenPlan { problem: p, len_q, len_kv })
}

/// `row[r]`: the padded row (`n·s + i`) of packed row `r`, the `i`-th of sequence `n`.
fn row_map(cu: &[u32], s: usize) -> Vec<u32> {
    let mut rows = Vec::with_capacity(cu[cu.len() - 1] as usize);
    for n in 0..cu.len() - 1 {
        // fits in u32: `plan` checked b·s
        let base = (n * s) as u32;
        rows.extend((0..cu[n + 1] - cu[n]).map(|i| base + i));
    }
    rows
}

/// The forward on contiguous packed `q`, `k`, `v` (autograd through candle's copies and the
/// engine's operation): `o[total_q, h_q, d]`.
pub(crate) fn run([q, k, v]: [&Tensor; 3], plan: VarlenPlan, pk: &Packing) -> Result<Tensor> {
    let p = plan.problem;
    let dev = q.device();
    let row_q = Tensor::from_vec(row_map(&pk.cu_q, p.s_q), pk.cu_q[p.b] as usize, dev)?;
    let row_kv = Tensor::from_vec(row_map(&pk.cu_kv, p.s_kv), pk.cu_kv[p.b] as usize, dev)?;
    let pad = |t: &Tensor, rows: &Tensor, s: usize, h: usize| -> Result<Tensor> {
        let zeros = Tensor::zeros((p.b * s, h, p.d), t.dtype(), dev)?;
        zeros.index_add(rows, t, 0)?.reshape((p.b, s, h, p.d))
    };
    let qp = pad(q, &row_q, p.s_q, p.h_q)?;
    let kp = pad(k, &row_kv, p.s_kv, p.h_kv)?;
    let vp = pad(v, &row_kv, p.s_kv, p.h_kv)?;
    let stats = [&qp, &kp, &vp].iter().any(|t| t.track_op()).then(OnceLock::new);
    let op = VarlenOp { plan: Arc::new(plan), stats };
    let o = qp.apply_op3(&kp, &vp, op)?;
    o.reshape((p.b * p.s_q, p.h_q, p.d))?.index_select(&row_q, 0)
}

/// The engine's forward on the padded tensors.
struct VarlenOp {
    plan: Arc<VarlenPlan>,
    /// Where the forward keeps `lse[b, h_q, s_q]` (f32) for the backward; `None` where no
    /// input tracks a gradient.
    stats: Option<OnceLock<Tensor>>,
}

/// The storage offsets of padded inputs, which are contiguous (made by `index_add`).
fn starts(op: &str, layouts: [&Layout; 3]) -> Result<[usize; 3]> {
    if layouts.iter().any(|l| !l.is_contiguous()) {
        candle_core::bail!("{op}: the padded inputs are not contiguous");
    }
    Ok(layouts.map(Layout::start_offset))
}

impl CustomOp3 for VarlenOp {
    fn name(&self) -> &'static str {
        "gemmbridge-sdpa-varlen"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        lq: &Layout,
        k: &CpuStorage,
        lk: &Layout,
        v: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [sq, sk, sv] = starts("sdpa_varlen", [lq, lk, lv])?;
        let o = by_dtype!("sdpa_varlen", [q, k, v], |T| cpu_forward::<T>(
            &self.plan.problem,
            [&q[sq..], &k[sk..], &v[sv..]],
            self.plan.lens(),
            self.stats.as_ref()
        ));
        Ok((o, lq.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        lq: &Layout,
        k: &candle_core::CudaStorage,
        lk: &Layout,
        v: &candle_core::CudaStorage,
        lv: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let st = starts("sdpa_varlen", [lq, lk, lv])?;
        let dev = q.device.clone();
        let o = crate::cuda::by_dtype!("sdpa_varlen", dev, [q, k, v], |T| crate::cuda_attention::forward::<T>(
            &dev,
            &self.plan.problem,
            ([q, k, v], st),
            self.plan.seq_lens(),
            self.stats.as_ref()
        ));
        Ok((o, lq.shape().clone()))
    }

    /// The padded `dq`, `dk`, `dv` from one backward call, with the statistics the forward
    /// kept.
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, o: &Tensor, grad: &Tensor) -> Result<Grads> {
        let Some(stats) = self.stats.as_ref().and_then(OnceLock::get) else {
            candle_core::bail!("sdpa_varlen backward: the forward kept no softmax statistics")
        };
        let (qd, kd, vd) = (dense_aligned(q)?, dense_aligned(k)?, dense_aligned(v)?);
        let op =
            VarlenBwdOp { plan: self.plan.clone(), saved: [dense_aligned(o)?, dense_aligned(grad)?, stats.clone()] };
        let flat = qd.apply_op3_no_bwd(&kd, &vd, &op)?;
        let elems = [q.elem_count(), k.elem_count(), v.elem_count()];
        debug_assert_eq!(
            elems.iter().sum::<usize>(),
            flat.elem_count(),
            "the backward wrote dq, dk, dv of the padded shapes"
        );
        let ins = [q, k, v];
        split_grads(&flat, ins, elems, |i, part| part.reshape(ins[i].shape()))
    }
}

/// The engine's backward on the padded tensors: the flat buffer `[dq | dk | dv]`, each dense
/// BSHD. `saved`: `o` and its gradient (contiguous `[b, s_q, h_q, d]`, aligned starts) and the
/// statistics.
struct VarlenBwdOp {
    plan: Arc<VarlenPlan>,
    saved: [Tensor; 3],
}

impl CustomOp3 for VarlenBwdOp {
    fn name(&self) -> &'static str {
        "gemmbridge-sdpa-varlen-backward"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        lq: &Layout,
        k: &CpuStorage,
        lk: &Layout,
        v: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [sq, sk, sv] = starts("sdpa_varlen backward", [lq, lk, lv])?;
        let g = by_dtype!("sdpa_varlen backward", [q, k, v], |T| cpu_backward::<T>(
            "sdpa_varlen backward",
            &self.plan.problem,
            [&q[sq..], &k[sk..], &v[sv..]],
            &self.saved,
            self.plan.lens()
        ));
        Ok((g, grads_shape(&self.plan.problem)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        lq: &Layout,
        k: &candle_core::CudaStorage,
        lk: &Layout,
        v: &candle_core::CudaStorage,
        lv: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let st = starts("sdpa_varlen backward", [lq, lk, lv])?;
        let dev = q.device.clone();
        let g = crate::cuda::by_dtype!("sdpa_varlen backward", dev, [q, k, v], |T| {
            crate::cuda_attention::backward::<T>(
                "sdpa_varlen backward",
                &dev,
                &self.plan.problem,
                ([q, k, v], st),
                &self.saved,
                self.plan.seq_lens(),
            )
        });
        Ok((g, grads_shape(&self.plan.problem)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rows_map_to_their_padded_rows() {
        // sequences of 2, 0, 3 rows padded to 4
        assert_eq!(row_map(&[0, 2, 2, 5], 4), vec![0, 1, 8, 9, 10]);
        assert_eq!(row_map(&[0], 4), Vec::<u32>::new());
    }
}
