//! Scaled-dot-product attention; its backward is in [`crate::attention_bwd`].

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use crate::attention_bwd::{self, Grads};
use crate::cpu::by_dtype;
use crate::plan::{self, AttnPlan};
use crate::{device_served, Served};

/// `o = softmax(scale·q·kᵀ + mask)·v` (PyTorch's `F.scaled_dot_product_attention` without
/// dropout) for `q[b, h_q, s_q, d]`, `k`, `v[b, h_kv, s_kv, d]` in candle's `[b, h, s, d]`
/// order, any strides with a contiguous head dimension (a `[b, s, h, d]` projection
/// transposed to `[b, h, s, d]` is read in place); `o` is `[b, h_q, s_q, d]`, contiguous.
/// `causal`: query `i` sees keys `j ≤ i` (the top-left diagonal, PyTorch's `is_causal`);
/// `scale`: `1/√d` unless given. Grouped-query heads: query head `hq` reads key/value head
/// `hq / (h_q / h_kv)`. Served for f16 and bf16 with `d` a multiple of 8 up to gemmbridge's
/// limit (cuDNN's flash-attention engines on CUDA, gemmbridge's CPU attention on the CPU:
/// f32 scores and softmax, one rounding); anything else runs [`sdpa_candle`].
///
/// # Backward
/// Through candle's autograd (`Tensor::backward`): `dq`, `dk`, `dv` of q's, k's, v's shapes
/// and dtype (`dk`, `dv` summed over the query heads that share a key/value head); where the
/// call fell back to [`sdpa_candle`], candle's own autograd through its operations. A served
/// call's backward is one call of gemmbridge's attention backward (cuDNN's fused backward on
/// CUDA; on the CPU gemmbridge's, f32 products and each gradient rounded once) from q, k, v,
/// the output, its gradient and the softmax statistics `lse[b, h_q, s_q]` (f32). The forward
/// keeps those: where q, k or v tracks a gradient (`Tensor::track_op`, candle's rule for
/// recording the operation) it writes them beside `o`, `4·b·h_q·s_q` bytes that the graph
/// holds until it is dropped, so the backward recomputes nothing. Each gradient is written
/// dense in its input's order of `[b, h, s]` (a `[b, s, h, d]` projection transposed to
/// `[b, h, s, d]` gets its gradient in the same strides) and given to candle as a view; an
/// input whose strides are no such order (q, k, v inside one fused projection's output,
/// padded rows) is copied contiguous for the backward, as is an output gradient that is not
/// contiguous (the stride-0 gradient of a `sum`).
///
/// # Errors
/// A `scale` given that is not finite and positive (candle's `Error::Msg` naming the value;
/// refused on every path, the fallback included, as gemmbridge's attention refuses it);
/// candle's errors for shapes that do not agree; a gemmbridge error from the GPU, wrapped;
/// the same from `Tensor::backward` for the backward.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f32>) -> Result<Tensor> {
    sdpa_served(q, k, v, causal, scale).map(|(t, _)| t)
}

/// [`sdpa`], and which path ran it.
///
/// # Errors
/// As [`sdpa`].
pub fn sdpa_served(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f32>) -> Result<(Tensor, Served)> {
    if let Some(s) = scale.filter(|s| !(s.is_finite() && *s > 0.0)) {
        candle_core::bail!("sdpa: scale = {s:?} is not finite and positive");
    }
    let dtype = q.dtype();
    if !device_served(q.device()) || k.dtype() != dtype || v.dtype() != dtype {
        return Ok((sdpa_candle(q, k, v, causal, scale)?, Served::Candle));
    }
    let planned = |q: &Tensor, k: &Tensor, v: &Tensor| {
        plan::attention([q.layout(), k.layout(), v.layout()], causal, scale, dtype)
    };
    if let Some(plan) = planned(q, k, v) {
        return Ok((apply(q, k, v, plan)?, Served::Gemmbridge));
    }
    let (q2, k2, v2) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    match planned(&q2, &k2, &v2) {
        Some(plan) => Ok((apply(&q2, &k2, &v2, plan)?, Served::AfterCopy)),
        None => Ok((sdpa_candle(q, k, v, causal, scale)?, Served::Candle)),
    }
}

/// Runs the planned attention as a custom operation, keeping its statistics for the backward
/// where an input tracks a gradient (the rule by which candle records the operation).
fn apply(q: &Tensor, k: &Tensor, v: &Tensor, plan: AttnPlan) -> Result<Tensor> {
    let out = q.shape().clone();
    let stats = [q, k, v].iter().any(|t| t.track_op()).then(OnceLock::new);
    q.apply_op3(k, v, AttnOp { plan, out, stats })
}

/// candle's own matmul-softmax attention, in f32 and rounded to q's dtype at the end: the
/// scores `scale·q·kᵀ` materialised (`[b, h_q, s_q, s_kv]`), the causal mask added as `−∞`, the
/// softmax with its row maximum subtracted, then `·v`; key/value heads repeated for grouped
/// queries. What the fallback runs, and what the tests compare with.
///
/// # Errors
/// candle's errors for tensors that are not 4-D or whose shapes do not agree (`h_q` not a
/// multiple of `h_kv` included).
pub fn sdpa_candle(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f32>) -> Result<Tensor> {
    let (b, h_q, s_q, d) = q.dims4()?;
    let (_, h_kv, s_kv, _) = k.dims4()?;
    if h_kv == 0 || h_q % h_kv != 0 {
        candle_core::bail!("sdpa: {h_q} query heads are not a multiple of {h_kv} key/value heads");
    }
    let g = h_q / h_kv;
    let repeat = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(DType::F32)?;
        if g == 1 {
            return Ok(t);
        }
        t.unsqueeze(2)?.broadcast_as((b, h_kv, g, s_kv, d))?.reshape((b, h_q, s_kv, d))
    };
    let (q32, k32, v32) = (q.to_dtype(DType::F32)?, repeat(k)?, repeat(v)?);
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let mut s = (q32.contiguous()?.matmul(&k32.t()?.contiguous()?)? * f64::from(scale))?;
    if causal {
        let mask: Vec<f32> =
            (0..s_q * s_kv).map(|e| if e % s_kv > e / s_kv { f32::NEG_INFINITY } else { 0.0 }).collect();
        s = s.broadcast_add(&Tensor::from_vec(mask, (s_q, s_kv), q.device())?)?;
    }
    let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v32.contiguous()?)?.to_dtype(q.dtype())
}

/// The planned attention, as candle's custom operation.
struct AttnOp {
    plan: AttnPlan,
    out: Shape,
    /// Where the forward keeps its statistics (`lse[b, h_q, s_q]`, f32, on the inputs'
    /// device) for the backward; `None` where no input tracks a gradient.
    stats: Option<OnceLock<Tensor>>,
}

impl CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "gemmbridge-sdpa"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        _: &Layout,
        k: &CpuStorage,
        _: &Layout,
        v: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [sq, sk, sv] = self.plan.starts;
        let o = by_dtype!("sdpa", [q, k, v], |T| attention_bwd::cpu_forward::<T>(
            &self.plan.problem,
            [&q[sq..], &k[sk..], &v[sv..]],
            None,
            self.stats.as_ref()
        ));
        Ok((o, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        _: &Layout,
        k: &candle_core::CudaStorage,
        _: &Layout,
        v: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = q.device.clone();
        let o = crate::cuda::by_dtype!("sdpa", dev, [q, k, v], |T| crate::cuda_attention::forward::<T>(
            &dev,
            &self.plan.problem,
            ([q, k, v], self.plan.starts),
            None,
            self.stats.as_ref()
        ));
        Ok((o, self.out.clone()))
    }

    /// `dq`, `dk`, `dv` from one backward call, with the statistics the forward kept.
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, o: &Tensor, grad: &Tensor) -> Result<Grads> {
        let Some(stats) = self.stats.as_ref().and_then(OnceLock::get) else {
            candle_core::bail!("sdpa backward: the forward kept no softmax statistics")
        };
        attention_bwd::backward(&self.plan.problem, [q, k, v], o, grad, stats)
    }
}
