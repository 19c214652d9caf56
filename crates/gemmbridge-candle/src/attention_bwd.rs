//! The backward of [`crate::sdpa`] through candle's autograd.
//!
//! The forward keeps its softmax statistics: when any of q, k, v tracks a gradient
//! (`Tensor::track_op`, the rule by which candle records the operation for its backward), the
//! forward runs with statistics (`lse[b, h_q, s_q]`, f32) and keeps them, as a tensor on the
//! inputs' device, in the operation candle holds for the backward. The backward then makes one
//! call of gemmbridge's attention backward (cuDNN's fused backward on CUDA, gemmbridge's CPU
//! attention on the CPU) from q, k, v, the forward's output `o` (the tensor candle hands to
//! `bwd`), the output's gradient and those statistics: nothing is recomputed.
//!
//! gemmbridge's gradients share their input's strides, so each of q, k, v is read in place
//! where its `[b, h, s]` dimensions are a dense permutation of itself (contiguous `[b, h, s,
//! d]`, a `[b, s, h, d]` projection transposed, ...) with a 16-byte aligned start, and its
//! gradient is written dense in that same order and viewed back as `[b, h, s, d]`; any other
//! view (such as q, k, v inside one fused projection's output) is copied contiguous first.
//! The output's gradient is read in place where it is contiguous with an aligned start, else
//! copied (the gradient of a `sum`, a stride-0 broadcast, is).

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Storage, Tensor, WithDType};
use gemmbridge::attention::{Attention, AttnTensor, HeadLayout};
use gemmbridge::Element;

use crate::cpu::{self, by_dtype, keep, wrap};

/// `dq`, `dk`, `dv` as candle's `CustomOp3::bwd` returns them.
pub(crate) type Grads = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// The forward of `p` on the CPU, on q, k, v each from its first element (with the lengths of
/// a padded variable-length batch where given: [`cpu::attention`]): `o` dense; with a `slot`
/// (an input tracks a gradient) the statistics are computed too and kept there as a CPU tensor
/// `[b, h_q, s_q]`.
pub(crate) fn cpu_forward<T: Element>(
    p: &Attention,
    qkv: [&[T]; 3],
    lens: Option<(&[i32], &[i32])>,
    slot: Option<&OnceLock<Tensor>>,
) -> Result<Vec<T>> {
    let (o, lse) = cpu::attention(p, qkv, lens, slot.is_some())?;
    if let (Some(slot), Some(lse)) = (slot, lse) {
        keep(slot, Tensor::from_vec(lse, (p.b, p.h_q, p.s_q), &Device::Cpu)?);
    }
    Ok(o)
}

/// `dq`, `dk`, `dv` of the attention `fwd` (the forward's problem) at `q`, `k`, `v` (the
/// forward's inputs), from its output `o`, the output's gradient `grad` and the statistics the
/// forward kept; `None` for an input that tracks no gradient. Each gradient has its input's
/// shape; its strides are its input's where that input is read in place (see the module
/// documentation), else contiguous.
pub(crate) fn backward(
    fwd: &Attention,
    [q, k, v]: [&Tensor; 3],
    o: &Tensor,
    grad: &Tensor,
    stats: &Tensor,
) -> Result<Grads> {
    let mut ins = Vec::with_capacity(3);
    for t in [q, k, v] {
        ins.push(match Dense::of(t) {
            Some(dense) => (t.clone(), dense),
            None => {
                let c = t.detach().force_contiguous()?;
                let dims = c.dims4()?;
                (c, Dense { dims: [dims.0, dims.1, dims.2, dims.3], order: [0, 1, 2] })
            }
        });
    }
    let p = fwd
        .with_layout(AttnTensor::Q, ins[0].1.layout())
        .with_layout(AttnTensor::K, ins[1].1.layout())
        .with_layout(AttnTensor::V, ins[2].1.layout());
    p.validate().map_err(wrap)?;
    let op = AttnBwdOp { problem: p, saved: [dense_aligned(o)?, dense_aligned(grad)?, stats.clone()] };
    let flat = ins[0].0.apply_op3_no_bwd(&ins[1].0, &ins[2].0, &op)?;
    let elems = [ins[0].1.elems(), ins[1].1.elems(), ins[2].1.elems()];
    split_grads(&flat, [q, k, v], elems, |i, part| ins[i].1.view(&part))
}

/// The gradients of `ins` (q, k, v) from the backward's flat `[dq | dk | dv]`, `elems[i]`
/// elements each in that order, each part given its input's shape by `view(i, part)`; `None`
/// for an input that tracks no gradient.
pub(crate) fn split_grads(
    flat: &Tensor,
    ins: [&Tensor; 3],
    elems: [usize; 3],
    view: impl Fn(usize, Tensor) -> Result<Tensor>,
) -> Result<Grads> {
    let mut grads = [None, None, None];
    let mut at = 0;
    for (i, t) in ins.into_iter().enumerate() {
        if t.track_op() {
            grads[i] = Some(view(i, flat.narrow(0, at, elems[i])?)?);
        }
        at += elems[i];
    }
    let [dq, dk, dv] = grads;
    Ok((dq, dk, dv))
}

/// The shape of the backward's flat `[dq | dk | dv]` for the problem `p`.
pub(crate) fn grads_shape(p: &Attention) -> Shape {
    Shape::from([AttnTensor::Q, AttnTensor::K, AttnTensor::V].iter().map(|&t| p.required_elems(t)).sum::<usize>())
}

/// Whether `t` starts at a 16-byte aligned element (cuDNN's engines load 16-byte vectors; the
/// CPU path keeps the rule so that it runs what the GPU is handed).
fn aligned(t: &Tensor) -> bool {
    (t.layout().start_offset() * t.dtype().size_in_bytes()).is_multiple_of(16)
}

/// `t` contiguous with an aligned start: itself where it is, else a copy (detached: the
/// backward's inputs need no graph of their own).
pub(crate) fn dense_aligned(t: &Tensor) -> Result<Tensor> {
    let t = t.detach();
    if t.is_contiguous() && aligned(&t) {
        Ok(t)
    } else {
        t.force_contiguous()
    }
}

/// One of q, k, v (`[b, h, s, d]`) and its gradient as the backward reads and writes them:
/// dense, the `[b, h, s]` dimensions stored in the order `order` (outermost first; `[0, 1, 2]`
/// is contiguous `[b, h, s, d]`, `[0, 2, 1]` a `[b, s, h, d]` projection), the head
/// dimension innermost.
#[derive(Clone, Copy, Debug)]
struct Dense {
    dims: [usize; 4],
    order: [usize; 3],
}

impl Dense {
    /// `t`'s own layout where it is dense in some order of `[b, h, s]` (strides of dimensions
    /// of size 1 are free) with a contiguous head dimension and an aligned start; the
    /// contiguous order is tried first.
    fn of(t: &Tensor) -> Option<Dense> {
        let (l, dims): (&Layout, [usize; 4]) = (t.layout(), t.dims().try_into().ok()?);
        let stride = l.stride();
        if stride[3] != 1 || !aligned(t) {
            return None;
        }
        const ORDERS: [[usize; 3]; 6] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
        let dense = |order: [usize; 3]| Dense { dims, order };
        ORDERS.into_iter().map(dense).find(|c| {
            let s = c.strides();
            (0..3).all(|i| dims[i] <= 1 || stride[i] == s[i])
        })
    }

    /// The strides of `b`, `h`, `s` in this order, dense.
    fn strides(self) -> [usize; 3] {
        let mut strides = [0; 3];
        let mut s = self.dims[3];
        for &i in self.order.iter().rev() {
            strides[i] = s;
            s *= self.dims[i];
        }
        strides
    }

    /// The strides as gemmbridge's layout.
    fn layout(self) -> HeadLayout {
        let [batch, head, seq] = self.strides();
        HeadLayout { batch, head, seq }
    }

    /// The tensor's elements.
    fn elems(self) -> usize {
        self.dims.iter().product()
    }

    /// `flat` (the gradient's [`Dense::elems`] elements, stored in this order) as a
    /// `[b, h, s, d]` tensor: a view, no copy.
    fn view(self, flat: &Tensor) -> Result<Tensor> {
        let (o, d) = (self.order, self.dims);
        let stored = flat.reshape((d[o[0]], d[o[1]], d[o[2]], d[3]))?;
        // stored axis `a` holds dimension `o[a]`: dimension `i` comes from the axis holding it
        let mut back = [0, 1, 2, 3];
        for (a, &i) in o.iter().enumerate() {
            back[i] = a;
        }
        stored.permute(back)
    }
}

/// The backward as candle's operation on q, k, v (in the problem's strides, read at their start
/// offsets): the flat buffer `[dq | dk | dv]`, each part dense in its input's order. `saved`:
/// the forward's output `o` and the output's gradient (contiguous `[b, h_q, s_q, d]`, aligned
/// starts) and the statistics, on q's device.
struct AttnBwdOp {
    problem: Attention,
    saved: [Tensor; 3],
}

impl CustomOp3 for AttnBwdOp {
    fn name(&self) -> &'static str {
        "gemmbridge-sdpa-backward"
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
        let starts = [lq.start_offset(), lk.start_offset(), lv.start_offset()];
        let g = by_dtype!("sdpa backward", [q, k, v], |T| cpu_backward::<T>(
            "sdpa backward",
            &self.problem,
            [&q[starts[0]..], &k[starts[1]..], &v[starts[2]..]],
            &self.saved,
            None
        ));
        Ok((g, grads_shape(&self.problem)))
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
        let dev = q.device.clone();
        let starts = [lq.start_offset(), lk.start_offset(), lv.start_offset()];
        let g = crate::cuda::by_dtype!("sdpa backward", dev, [q, k, v], |T| {
            crate::cuda_attention::backward::<T>(
                "sdpa backward",
                &dev,
                &self.problem,
                ([q, k, v], starts),
                &self.saved,
                None,
            )
        });
        Ok((g, grads_shape(&self.problem)))
    }
}

/// The CPU backward of `p` for the operation `op` (named in errors): `o`, `do` and the
/// statistics read from the saved tensors' storages; `lens` as [`cpu::attention`]'s.
pub(crate) fn cpu_backward<T: Element + WithDType>(
    op: &str,
    p: &Attention,
    [q, k, v]: [&[T]; 3],
    saved: &[Tensor; 3],
    lens: Option<(&[i32], &[i32])>,
) -> Result<Vec<T>> {
    // read locks beside the ones candle holds on q, k, v: the saved tensors are the forward's
    // output, a gradient and the statistics, never written in place
    let [(o, lo), (d_o, ldo), (lse, llse)] = saved.each_ref().map(|t| t.storage_and_layout());
    let (Storage::Cpu(o), Storage::Cpu(d_o), Storage::Cpu(lse)) = (&*o, &*d_o, &*lse) else {
        candle_core::bail!("{op}: the saved tensors are not on the CPU")
    };
    let o = &o.as_slice::<T>()?[lo.start_offset()..];
    let d_o = &d_o.as_slice::<T>()?[ldo.start_offset()..];
    let lse = &lse.as_slice::<f32>()?[llse.start_offset()..];
    cpu::attention_backward(p, [q, k, v, o, d_o], lse, lens)
}
