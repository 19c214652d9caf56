//! The CUDA backend: burn's buffers handed to cuDNN's flash-attention engines (gemmbridge's
//! `GpuAttention::forward` / `GpuAttention::backward`) by address.
//!
//! Served for `CubeBackend<CudaRuntime, …>` with f16/bf16 inputs; any other runtime or dtype,
//! a problem gemmbridge refuses (head dimension not a multiple of 8 up to 256, …), or an error
//! before the launch (no cuDNN, a misaligned view) runs burn's ops instead (`composed.rs`),
//! counted and logged. Ordering with cubecl's stream is the GEMMs' ([`crate::GemmOrdering`],
//! `order.rs`): device edges by default, host waits where those cannot be correct.

use std::any::Any;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::cuda::CudaRuntime;
use gemmbridge::attention::{Attention, AttnMask as EngineMask, AttnTensor, HeadLayout};
use gemmbridge::cuda::{AttnSaved, Gpu, SeqLens};
use gemmbridge::cudarc::driver::DevicePtrMut;
use gemmbridge::half::{bf16, f16};
use gemmbridge::Element;

use super::{composed, AttentionOps, AttnMask, AttnResiduals};
use crate::layer_ops::run::{run, Raw};
use crate::layout::Fallback;

type Cuda = CubeTensor<CudaRuntime>;

/// Lengths `[len_q, len_kv]` (one per sequence) for the engine's padding mask, on the host.
type HostLens = Option<[Vec<i32>; 2]>;

/// One buffer as the launch is given it: its address and its length in bytes.
type Buf = (u64, usize);

/// The strides gemmbridge reads for a `[b, h, s, d]` tensor with burn's `shape` and `strides`
/// (elements), or `None` where it cannot: the head dimension contiguous, the other strides
/// multiples of 8 elements, no two elements at one address (gemmbridge's `Attention::validate`
/// rules for one tensor). A dimension of extent 1 takes the contiguous stride, whatever burn
/// recorded for it.
pub(crate) fn head_layout(shape: &[usize], strides: &[usize]) -> Option<HeadLayout> {
    if shape.len() != 4 || strides.len() != 4 || (shape[3] > 1 && strides[3] != 1) {
        return None;
    }
    let dense = HeadLayout::bhsd(shape[2], shape[1], shape[3]);
    let pick = |i: usize, dense: usize| if shape[i] == 1 { dense } else { strides[i] };
    let l = HeadLayout { batch: pick(0, dense.batch), head: pick(1, dense.head), seq: pick(2, dense.seq) };
    if [l.batch, l.head, l.seq].iter().any(|s| !s.is_multiple_of(8)) {
        return None;
    }
    // in stride order, each dimension (of extent > 1) starts past the span of those below it
    let mut dims: Vec<(usize, usize)> = [(l.batch, shape[0]), (l.head, shape[1]), (l.seq, shape[2]), (1, shape[3])]
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .collect();
    dims.sort_unstable();
    let mut span = 1usize;
    for (stride, n) in dims {
        if stride < span {
            return None;
        }
        span = stride.saturating_mul(n);
    }
    Some(l)
}

/// The engine's problem for `q[b, h_q, s_q, d]`, `k`/`v[b, h_kv, s_kv, d]` (every tensor BHSD
/// until the caller sets the actual strides) and the host lengths `(len_q, len_kv)` the mask
/// gives (query lengths all `s_q`).
pub(crate) fn problem(
    [b, h_q, s_q, d]: [usize; 4],
    [_, h_kv, s_kv, _]: [usize; 4],
    mask: &AttnMask,
    scale: f32,
    dtype: DType,
) -> Result<(Attention, HostLens), Fallback> {
    let dtype = match dtype {
        DType::F16 => gemmbridge::DType::F16,
        DType::BF16 => gemmbridge::DType::BF16,
        other => return Err(Fallback::Problem(format!("dtype {other:?} (cuDNN attention takes f16, bf16)"))),
    };
    let engine_mask = match mask {
        AttnMask::None | AttnMask::Lengths(_) => EngineMask::None,
        AttnMask::Causal | AttnMask::CausalLengths(_) => EngineMask::Causal,
        AttnMask::CausalBottomRight => EngineMask::CausalBottomRight,
    };
    let lens = mask.lengths().map(|l| [vec![s_q as i32; b], l.iter().map(|&n| n as i32).collect()]);
    let p = Attention::new(b, (h_q, h_kv), (s_q, s_kv), d, dtype)
        .bhsd()
        .with_mask(engine_mask)
        .with_scale(scale)
        .with_var_len(lens.is_some());
    p.validate().map_err(|e| Fallback::Shape(e.to_string()))?;
    Ok((p, lens))
}

/// `t` as gemmbridge reads it: itself where its strides are readable, else a contiguous copy
/// (queued on the caller's cubecl stream).
fn readable(t: &Cuda) -> Result<(Cuda, HeadLayout), Fallback> {
    if let Some(l) = head_layout(t.meta.shape(), t.meta.strides()) {
        return Ok((t.clone(), l));
    }
    let c = burn_cubecl::kernel::into_contiguous(t.clone());
    let l = head_layout(c.meta.shape(), c.meta.strides())
        .ok_or_else(|| Fallback::Layout(format!("{:?} strides {:?}", c.meta.shape(), c.meta.strides())))?;
    Ok((c, l))
}

/// `t` contiguous (itself where it is already).
fn contiguous(t: &Cuda) -> Cuda {
    if t.is_contiguous() {
        t.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(t.clone())
    }
}

fn dims(t: &Cuda) -> [usize; 4] {
    let s = t.meta.shape();
    [s[0], s[1], s[2], s[3]]
}

/// A new contiguous tensor from burn's allocator on the caller's cubecl stream.
fn empty(like: &Cuda, shape: &[usize], dtype: DType) -> Cuda {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape.to_vec()),
        dtype,
    )
}

/// The lengths as int32 tensors `[len_q, len_kv]` (`[b]` each) on the caller's cubecl
/// stream, written there before the call's forward edge: the engine reads them on the device
/// (no host copy on gemmbridge's stream, which under device ordering waits for cubecl's).
fn device_lens(like: &Cuda, lens: &HostLens) -> Option<[Cuda; 2]> {
    let tensor = |l: &Vec<i32>| {
        let bytes: Vec<u8> = l.iter().flat_map(|n| n.to_le_bytes()).collect();
        let handle = like.client.create_from_slice(&bytes);
        Cuda::new_contiguous(like.client.clone(), like.device.clone(), Shape::from([l.len()]), handle, DType::I32)
    };
    lens.as_ref().map(|[q, kv]| [tensor(q), tensor(kv)])
}

/// The call's buffers, and the lengths' buffers where the problem has them (the last two).
fn split_lens<'a>(a: &'a [Buf], p: &Attention) -> (&'a [Buf], Option<[Buf; 2]>) {
    match (p.var_len, a.len()) {
        (true, n @ 2..) => (&a[..n - 2], Some([a[n - 2], a[n - 1]])),
        _ => (a, None),
    }
}

/// Runs `call` with the engine's lengths argument for the lengths' buffers `lens`.
fn with_lens<R>(gpu: &Gpu, lens: Option<[Buf; 2]>, call: impl FnOnce(Option<SeqLens>) -> R) -> R {
    let raw = lens.map(|l| l.map(|a| Raw::<i32>::new(gpu, a)));
    // SAFETY: the lengths were checked at the entry ([`super::attention`]: every key length in
    // 1..=s_kv) and the query lengths are s_q; no mask here is bottom-right with lengths; the
    // buffers hold them, written on the caller's stream before this call's forward edge.
    call(raw.as_ref().map(|[q, kv]| unsafe { SeqLens::device(q, kv) }))
}

/// Enqueues the forward on buffers `[q, k, v, o, (lse), (len_q, len_kv)]`.
fn launch_forward<T: Element>(gpu: &Gpu, p: &Attention, a: &[Buf]) -> gemmbridge::Result<()> {
    let (a, lens) = split_lens(a, p);
    let [q, k, v, mut o] = [0, 1, 2, 3].map(|i| Raw::<T>::new(gpu, a[i]));
    let mut lse = a.get(4).map(|&s| Raw::<f32>::new(gpu, s));
    let stats = lse.as_mut().map(|s| s as &mut dyn DevicePtrMut<f32>);
    with_lens(gpu, lens, |l| gpu.attention().forward(p, [&q, &k, &v], &mut o, stats, l))
}

/// Enqueues the backward on buffers `[q, k, v, o, do, lse, dq, dk, dv, (len_q, len_kv)]`.
fn launch_backward<T: Element>(gpu: &Gpu, p: &Attention, a: &[Buf]) -> gemmbridge::Result<()> {
    let (a, lens) = split_lens(a, p);
    let [q, k, v, o, d_o] = [0, 1, 2, 3, 4].map(|i| Raw::<T>::new(gpu, a[i]));
    let lse = Raw::<f32>::new(gpu, a[5]);
    let [mut dq, mut dk, mut dv] = [6, 7, 8].map(|i| Raw::<T>::new(gpu, a[i]));
    let saved = AttnSaved { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, stats: &lse };
    with_lens(gpu, lens, |l| gpu.attention().backward(p, saved, &mut dq, &mut dk, &mut dv, l))
}

/// Checks what every call needs before anything is queued: one dtype that cuDNN takes, and
/// the problem, with its host lengths.
fn planned(q: &Cuda, k: &Cuda, v: &Cuda, mask: &AttnMask, scale: f32) -> Result<(Attention, HostLens), Fallback> {
    if k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(Fallback::Problem(format!("dtypes {:?}, {:?}, {:?}", q.dtype, k.dtype, v.dtype)));
    }
    problem(dims(q), dims(k), mask, scale, q.dtype)
}

/// The forward on cuDNN: `o` (contiguous) and, with `stats`, `lse[b, h_q, s_q]` (f32).
fn try_forward(
    q: &Cuda,
    k: &Cuda,
    v: &Cuda,
    mask: &AttnMask,
    scale: f32,
    stats: bool,
) -> Result<(Cuda, Option<Cuda>), Fallback> {
    let (p, lens) = planned(q, k, v, mask, scale)?;
    let ([q, k, v], [lq, lk, lv]) = {
        let ((q, lq), (k, lk), (v, lv)) = (readable(q)?, readable(k)?, readable(v)?);
        ([q, k, v], [lq, lk, lv])
    };
    let o = empty(&q, &dims(&q), q.dtype);
    let lo = head_layout(o.meta.shape(), o.meta.strides()).ok_or_else(|| Fallback::Layout("output".into()))?;
    let [b, h, s, _] = dims(&q);
    let lse = stats.then(|| empty(&q, &[b, h, s], DType::F32));
    let p = p.with_layout(AttnTensor::Q, lq).with_layout(AttnTensor::K, lk).with_layout(AttnTensor::V, lv);
    let p = p.with_layout(AttnTensor::O, lo);
    let lens = device_lens(&q, &lens);
    let tensors: Vec<&Cuda> = [&q, &k, &v, &o].into_iter().chain(lse.as_ref()).chain(lens.iter().flatten()).collect();
    let dtype = q.dtype;
    run(
        &tensors,
        Box::new(move |gpu: &Gpu, a: &[Buf]| match dtype {
            DType::F16 => launch_forward::<f16>(gpu, &p, a),
            _ => launch_forward::<bf16>(gpu, &p, a),
        }),
    )?;
    Ok((o, lse))
}

/// The backward on cuDNN from `[q, k, v, o, do, lse]`: `[dq, dk, dv]`, contiguous (q, k, v, o
/// and do read contiguous, copied where they are not: the gradients share the inputs' strides).
fn try_backward(saved: [&Cuda; 6], mask: &AttnMask, scale: f32) -> Result<[Cuda; 3], Fallback> {
    let [q, k, v, o, d_o, lse] = saved;
    let (p, lens) = planned(q, k, v, mask, scale)?;
    if d_o.dtype != q.dtype || o.dtype != q.dtype || lse.dtype != DType::F32 {
        return Err(Fallback::Problem(format!("o {:?}, do {:?}, lse {:?}", o.dtype, d_o.dtype, lse.dtype)));
    }
    let ins = saved.map(contiguous);
    let grads = [0, 1, 2].map(|i| empty(&ins[i], &dims(&ins[i]), ins[i].dtype));
    // every tensor BHSD-contiguous, as the problem says (checked, not assumed)
    for t in ins.iter().take(5).chain(&grads) {
        if head_layout(t.meta.shape(), t.meta.strides()) != Some(HeadLayout::bhsd(dims(t)[2], dims(t)[1], dims(t)[3])) {
            return Err(Fallback::Layout(format!("{:?} strides {:?}", t.meta.shape(), t.meta.strides())));
        }
    }
    let lens = device_lens(q, &lens);
    let tensors: Vec<&Cuda> = ins.iter().chain(&grads).chain(lens.iter().flatten()).collect();
    let dtype = q.dtype;
    run(
        &tensors,
        Box::new(move |gpu: &Gpu, a: &[Buf]| match dtype {
            DType::F16 => launch_backward::<f16>(gpu, &p, a),
            _ => launch_backward::<bf16>(gpu, &p, a),
        }),
    )?;
    Ok(grads)
}

/// The tensor as a CUDA tensor when the runtime `R` is `CudaRuntime`.
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Option<&Cuda> {
    (t as &dyn Any).downcast_ref::<Cuda>()
}

/// A CUDA tensor back as `CubeTensor<R>` (`R` is `CudaRuntime` whenever `as_cuda` succeeded).
fn from_cuda<R: CubeRuntime>(t: Cuda) -> CubeTensor<R> {
    *(Box::new(t) as Box<dyn Any>).downcast::<CubeTensor<R>>().expect("as_cuda succeeded, so R is CudaRuntime")
}

/// The result of `attempt` when the adapter is on and cuDNN serves, `None` when the caller
/// should run burn's ops; counted ([`super::attention_counts`]) and logged.
fn served<T>(what: &str, shapes: &[&[usize]], attempt: impl FnOnce() -> Result<T, Fallback>) -> Option<T> {
    let r = if crate::enabled() { attempt() } else { Err(Fallback::Problem("adapter disabled".into())) };
    super::count(r.is_ok());
    match r {
        Ok(out) => {
            tracing::debug!(?shapes, "{what}: cuDNN (gemmbridge)");
            Some(out)
        }
        Err(why) => {
            tracing::debug!(?shapes, ?why, "{what}: burn");
            None
        }
    }
}

/// The three tensors as CUDA tensors, or why not.
fn cuda3<R: CubeRuntime>(ts: [&CubeTensor<R>; 3]) -> Result<[&Cuda; 3], Fallback> {
    match ts.map(as_cuda) {
        [Some(a), Some(b), Some(c)] => Ok([a, b, c]),
        _ => Err(Fallback::Problem("not a CUDA backend".into())),
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> AttentionOps for CubeBackend<R, F, I, BT> {
    fn gemm_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [q.meta.shape(), k.meta.shape()];
        let attempt = || {
            let [cq, ck, cv] = cuda3([&q, &k, &v])?;
            try_forward(cq, ck, cv, mask, scale, false).map(|(o, _)| from_cuda::<R>(o))
        };
        served("attention", &shapes, attempt).unwrap_or_else(|| composed::burn_attention::<Self>(q, k, v, mask, scale))
    }

    fn gemm_attention_stats(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes: [&[usize]; 2] = [q.meta.shape(), k.meta.shape()];
        let attempt = || {
            let [cq, ck, cv] = cuda3([&q, &k, &v])?;
            let (o, lse) = try_forward(cq, ck, cv, mask, scale, true)?;
            Ok((from_cuda::<R>(o), from_cuda::<R>(lse.expect("statistics asked for"))))
        };
        served("attention forward with statistics", &shapes, attempt)
            .unwrap_or_else(|| composed::forward_stats::<Self>(q, k, v, mask, scale))
    }

    fn gemm_attention_backward(
        saved: AttnResiduals<Self>,
        d_o: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> [FloatTensor<Self>; 3] {
        let shapes: [&[usize]; 2] = [saved.q.meta.shape(), saved.k.meta.shape()];
        let attempt = || {
            let [q, k, v] = cuda3([&saved.q, &saved.k, &saved.v])?;
            let [o, lse, g] = cuda3([&saved.o, &saved.lse, &d_o])?;
            Ok(try_backward([q, k, v, o, g, lse], mask, scale)?.map(from_cuda::<R>))
        };
        served("attention backward", &shapes, attempt)
            .unwrap_or_else(|| composed::backward::<Self>(saved, d_o, mask, scale))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_layouts() {
        let bhsd = |h: usize, s: usize, d: usize| [h * s * d, s * d, d, 1];
        assert_eq!(head_layout(&[2, 5, 37, 64], &bhsd(5, 37, 64)), Some(HeadLayout::bhsd(37, 5, 64)));
        // a [b, s, h, d] projection seen as [b, h, s, d]: read in place
        assert_eq!(head_layout(&[2, 5, 37, 64], &[37 * 5 * 64, 64, 5 * 64, 1]), Some(HeadLayout::bshd(37, 5, 64)));
        // one head: its stride is free (burn may record anything for an extent-1 dimension)
        assert_eq!(head_layout(&[2, 1, 37, 64], &[37 * 64, 3, 64, 1]), Some(HeadLayout::bhsd(37, 1, 64)));
        assert_eq!(head_layout(&[2, 5, 37, 64], &[1, 2, 10, 320]), None, "head dimension not contiguous");
        assert_eq!(head_layout(&[2, 5, 37, 20], &[5 * 37 * 20, 37 * 20, 20, 1]), None, "strides not multiples of 8");
        assert_eq!(head_layout(&[2, 4, 37, 64], &[37 * 64, 0, 64, 1]), None, "heads broadcast: overlapping");
    }

    #[test]
    fn problems_and_their_refusals() {
        let (p, lens) =
            problem([3, 8, 37, 64], [3, 2, 41, 64], &AttnMask::CausalLengths(vec![41, 1, 20]), 0.125, DType::BF16)
                .expect("a problem cuDNN takes");
        assert_eq!((p.h_q, p.h_kv, p.s_q, p.s_kv, p.d, p.scale), (8, 2, 37, 41, 64, 0.125));
        assert_eq!((p.mask, p.var_len), (EngineMask::Causal, true));
        assert_eq!(lens, Some([vec![37; 3], vec![41, 1, 20]]));
        let (p, lens) = problem([1, 4, 16, 64], [1, 4, 16, 64], &AttnMask::CausalBottomRight, 1.0, DType::F16).unwrap();
        assert_eq!((p.mask, p.var_len, lens), (EngineMask::CausalBottomRight, false, None));
        assert!(matches!(
            problem([1, 4, 16, 64], [1, 4, 16, 64], &AttnMask::None, 1.0, DType::F32),
            Err(Fallback::Problem(_))
        ));
        let why = problem([1, 4, 16, 20], [1, 4, 16, 20], &AttnMask::None, 1.0, DType::BF16).unwrap_err();
        assert!(matches!(&why, Fallback::Shape(s) if s.contains("multiple of 8")), "{why:?}");
    }
}
