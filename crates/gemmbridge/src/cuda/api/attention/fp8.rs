//! FP8 attention on cuDNN (Hopper and later): q, k, v quantised to E4M3 by gemmbridge's own
//! kernels with one scale each ([`GpuAttention::quantize`], tensor-wise current scaling, as the
//! FP8 GEMMs' operands), then cuDNN's FP8 attention graph ([`GpuAttention::forward_fp8`]) with
//! those scales read on the device, o in E4M3 with its scale ([`GpuAttention::fp8_output`]).

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::GpuAttention;
use super::{check_problem_of, span, SeqLens};
use crate::attention::{Attention, AttnTensor, HeadLayout};
use crate::cuda::api::checks::same_context;
use crate::cuda::device::{Relaxed, RelaxedDrop};
use crate::cuda::dnn::attention::{MAX_KEYS, O_FACTOR};
use crate::cuda::route::fp8::Fp8Tensor;
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, Which};
use crate::fp8::{Fp8Format, Fp8Layout, Scaling, Source};

/// The FP8 rules of a problem beside [`Attention::validate`]'s: the head dimension and every
/// stride of q, k and v multiples of 16 elements (16-byte rows of one-byte elements); at most
/// 400 000 keys (o's fixed scale leaves room for P's rounding up to there).
pub(super) fn check_fp8_layout(p: &Attention) -> Result<()> {
    if p.s_kv > MAX_KEYS {
        return Err(Error::AttentionShape {
            what: "an FP8 attention has more keys than its output's fixed scale allows",
            detail: format!("s_kv = {} > {MAX_KEYS} ({})", p.s_kv, p.describe()),
        });
    }
    for t in [AttnTensor::Q, AttnTensor::K, AttnTensor::V] {
        let l = p.layout(t);
        if [p.d, l.batch, l.head, l.seq].iter().any(|x| !x.is_multiple_of(16)) {
            return Err(Error::AttentionShape {
                what: "an FP8 tensor's head dimension or stride is not a multiple of 16 elements (16 bytes)",
                detail: format!("{} d {}, strides {} {} {} ({})", t.name(), p.d, l.batch, l.head, l.seq, p.describe()),
            });
        }
    }
    Ok(())
}

/// The operand name of tensor `t`.
pub(super) fn which(t: AttnTensor) -> Which {
    match t {
        AttnTensor::Q => Which::AttnQ,
        AttnTensor::K => Which::AttnK,
        AttnTensor::V => Which::AttnV,
        AttnTensor::O => Which::AttnO,
    }
}

impl GpuAttention<'_> {
    /// Tensor `t` (q, k or v) of `p`, in `p.dtype` (f16 or bf16) with `p.layouts`'s strides,
    /// quantised to E4M3 with one scale for the tensor from its current absolute maximum
    /// ([`GpuFp8::quantize`](crate::cuda::GpuFp8::quantize) with [`Scaling::Tensor`]: `scale = amax/448`, the GPU's result equal
    /// to [`crate::fp8::quantize`]'s bit for bit), on [`Gpu::stream`](crate::cuda::Gpu::stream), no host synchronisation.
    /// The FP8 tensor keeps the source's element layout (one byte per element), so `p` describes
    /// it too (pass [`GpuAttention::forward_fp8`] the problem with the same layouts); as an
    /// [`Fp8Tensor`] it is the matrix `[b·h·s, d]` (rows of one head and position). The tensor must be dense — its elements fill `[0, required_elems)` with no gaps
    /// (BSHD or BHSD as [`Attention::new`] and [`Attention::bhsd`] make them; not a view into a
    /// packed QKV projection) — and its head dimension a multiple of 16.
    ///
    /// # Errors
    /// [`Error::AttentionShape`] (the problem's rules; a tensor that is not dense; the FP8
    /// layout rule); [`Error::DTypeMismatch`]; as [`GpuFp8::quantize`](crate::cuda::GpuFp8::quantize) (a GPU without FP8:
    /// [`Error::Fp8`]).
    pub fn quantize<T: Element, S: DevicePtr<T>>(&self, p: &Attention, t: AttnTensor, src: &S) -> Result<Fp8Tensor> {
        let gpu = self.gpu;
        p.validate()?;
        check_fp8_layout(p)?;
        if T::DTYPE != p.dtype {
            return Err(Error::DTypeMismatch { operand: which(t), expected: p.dtype, got: T::DTYPE });
        }
        let [b, h, s] = p.dims(t);
        let n = b * h * s * p.d;
        if p.required_elems(t) != n {
            return Err(Error::AttentionShape {
                what: "a tensor to quantise is not dense (its elements leave gaps)",
                detail: format!("{} spans {} elements for {n} ({})", t.name(), p.required_elems(t), p.describe()),
            });
        }
        gpu.fp8().quantize(src, n / p.d, p.d, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor)
    }

    /// The FP8 output of `p`'s forward, for [`GpuAttention::forward_fp8`]: `o` in E4M3 with one
    /// dequantisation scale, allocated from the stream-ordered pool (not yet written), as an
    /// [`Fp8Tensor`] a following FP8 GEMM takes as an operand — `[b·s_q, h_q·d]` for a BSHD
    /// `o` (the output projection's input), `[b·h_q·s_q, d]` for a BHSD one.
    ///
    /// # Errors
    /// [`Error::AttentionShape`] (the problem's rules; an `o` layout that is neither dense BSHD
    /// nor dense BHSD); [`Error::Fp8`] on a GPU without FP8; [`Error::Driver`].
    pub fn fp8_output(&self, p: &Attention) -> Result<Fp8Tensor> {
        let gpu = self.gpu;
        p.validate()?;
        check_fp8_layout(p)?;
        gpu.check_fp8(Scaling::Tensor)?;
        let (rows, cols) = output_matrix(p)?;
        let layout = Fp8Layout::new(rows, cols, Scaling::Tensor);
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?; // stream-ordered allocations
                                          // the padding rows (rows_alloc − rows) are zeroed: cuDNN writes the rows only
                                          // SAFETY: every byte is written by the attention call or zeroed here.
        let mut data = unsafe { s.alloc::<u8>(layout.data_len()) }.map_err(status::driver("cuMemAllocAsync"))?;
        let pad = (rows * layout.ld)..layout.data_len();
        if !pad.is_empty() {
            s.memset_zeros(&mut data.slice_mut(pad)).map_err(status::driver("cuMemsetD8Async"))?;
        }
        // SAFETY: written by every attention call before it is read.
        let scales = unsafe { s.alloc::<f32>(1) }.map_err(status::driver("cuMemAllocAsync"))?;
        Ok(Fp8Tensor {
            data: RelaxedDrop::new(data),
            scales: RelaxedDrop::new(scales),
            layout,
            format: Fp8Format::E4M3,
        })
    }

    /// [`GpuAttention::forward`] on FP8 inputs: `q`, `k`, `v` in E4M3 with one dequantisation
    /// scale each, as [`GpuAttention::quantize`] makes them from dense tensors (checked),
    /// read in `p.layouts`'s strides (one byte per element), through cuDNN's FP8 attention
    /// graph — the scores in f32 from the FP8 product and the two scales, the softmax in f32
    /// (with its statistics `lse` when `stats` is given), P stored in E4M3 with the fixed scale
    /// 448 (P ≤ 1: E4M3's whole range), `P·v` in FP8 — into `o` ([`GpuAttention::fp8_output`]).
    ///
    /// `o` is E4M3 with a fixed dequantisation scale of twice v's (not o's own amax/448): o is a
    /// convex combination of v's rows, so in units of v's scale it cannot exceed v's largest
    /// value, and the factor 2 leaves room for P's rounding (hence at most 400 000 keys); o uses
    /// about half of E4M3's range. The scale is written on the device after the attention call
    /// (a copy and a cuBLAS `axpy` of one value): no host round trip. Read o back with
    /// `o.to_host()?` and [`crate::fp8::dequantize`]. On Hopper cuDNN's FP8 attention writes o
    /// only in FP8; an f16/bf16 o is not offered. Masks, grouped key/value heads and
    /// per-sequence lengths as the f16/bf16 forward, where cuDNN's FP8 engines take them (a
    /// combination they do not take — decoding, one query row, on cuDNN 9.19 — is
    /// [`Error::Unsupported`] naming the cuDNN version). `p.dtype` names the type the inputs were
    /// quantised from.
    ///
    /// # Errors
    /// As [`GpuAttention::forward`]; and [`Error::AttentionShape`] for an input that is not
    /// E4M3 with one scale or was not quantised for this problem, a head dimension or stride
    /// that is not a multiple of 16, more than 400 000 keys, or an `o` not made for this
    /// problem; [`Error::BufferTooSmall`] for an FP8 tensor smaller than the
    /// problem's; [`Error::Fp8`] on a GPU without FP8.
    pub fn forward_fp8(
        &self,
        p: &Attention,
        [q, k, v]: [&Fp8Tensor; 3],
        o: &mut Fp8Tensor,
        stats: Option<&mut dyn DevicePtrMut<f32>>,
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_problem_of(p, lens)?;
        check_fp8_layout(p)?;
        gpu.check_fp8(Scaling::Tensor)?;
        let (rows, cols) = output_matrix(p)?;
        let l = o.layout();
        if (l.rows, l.cols, l.scaling, o.format()) != (rows, cols, Scaling::Tensor, Fp8Format::E4M3) {
            return Err(Error::AttentionShape {
                what: "the FP8 output was not made for this problem (GpuAttention::fp8_output)",
                detail: format!(
                    "o is [{}, {}] {:?} {:?}, the problem's [{rows}, {cols}] ({})",
                    l.rows,
                    l.cols,
                    l.scaling,
                    o.format(),
                    p.describe()
                ),
            });
        }
        let (ctx, s) = (gpu.context(), gpu.stream());
        let ins = [(AttnTensor::Q, q), (AttnTensor::K, k), (AttnTensor::V, v)];
        let mut guards = Vec::with_capacity(8);
        let (mut read, mut scales) = (Vec::with_capacity(5), [0u64; 3]);
        for (i, (t, x)) in ins.into_iter().enumerate() {
            if x.format() != Fp8Format::E4M3 || x.layout().scaling != Scaling::Tensor {
                return Err(Error::AttentionShape {
                    what: "FP8 attention takes E4M3 tensors with one scale each",
                    detail: format!(
                        "{}: {:?} with {:?} scales ({})",
                        t.name(),
                        x.format(),
                        x.layout().scaling,
                        p.describe()
                    ),
                });
            }
            same_context(which(t), x.data().stream(), ctx)?;
            let (addr, g) = x.data().device_ptr(s);
            guards.push(g);
            read.push(span(which(t), addr, x.data().num_bytes(), p.required_elems(t), 1)?);
            let (sc, g) = x.scales().device_ptr(s);
            guards.push(g);
            scales[i] = sc;
        }
        same_context(Which::AttnO, o.data.stream(), ctx)?;
        let o_bytes = o.data.num_bytes();
        let (o_addr, g) = o.data.device_ptr_mut(s);
        guards.push(g);
        let o_span = span(Which::AttnO, o_addr, o_bytes, p.required_elems(AttnTensor::O), 1)?;
        let (o_scale, g) = o.scales.device_ptr_mut(s);
        guards.push(g);
        gpu.forward_outputs(p, Some([scales[0], scales[1]]), read, o_span, stats, lens)?;
        // o's scale: v's / O_FACTOR = v's + v's (a copy, then y += 1·x)
        // SAFETY: both hold one f32 of this context; stream-ordered after the attention call.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(o_scale, scales[2], 4, s.cu_stream())
                .map_err(status::driver("cuMemcpyDtoDAsync"))?;
            gpu.enqueue_axpy(DType::F32, 1, 1.0 / O_FACTOR - 1.0, scales[2], o_scale)?;
        }
        drop(guards);
        Ok(())
    }
}

/// The matrix an FP8 `o` is stored as: `[b·s_q, h_q·d]` for dense BSHD, `[b·h_q·s_q, d]` for
/// dense BHSD; another layout is refused.
pub(super) fn output_matrix(p: &Attention) -> Result<(usize, usize)> {
    let l = p.layout(AttnTensor::O);
    if l == HeadLayout::bshd(p.s_q, p.h_q, p.d) {
        Ok((p.b * p.s_q, p.h_q * p.d))
    } else if l == HeadLayout::bhsd(p.s_q, p.h_q, p.d) {
        Ok((p.b * p.h_q * p.s_q, p.d))
    } else {
        Err(Error::AttentionShape {
            what: "an FP8 output must be dense BSHD or dense BHSD",
            detail: format!("o strides batch {}, head {}, seq {} ({})", l.batch, l.head, l.seq, p.describe()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn rule(p: &Attention) -> &'static str {
        match check_fp8_layout(p).and_then(|()| output_matrix(p).map(|_| ())) {
            Err(Error::AttentionShape { what, .. }) => what,
            other => panic!("{}: {other:?}", p.describe()),
        }
    }

    #[test]
    fn the_fp8_rules_are_named_errors() {
        let p = Attention::new(2, (8, 2), (64, 64), 128, DType::BF16);
        check_fp8_layout(&p).unwrap();
        assert_eq!(output_matrix(&p).unwrap(), (2 * 64, 8 * 128));
        assert_eq!(output_matrix(&p.bhsd()).unwrap(), (2 * 8 * 64, 128));
        let narrow = Attention::new(2, (8, 2), (64, 64), 72, DType::BF16);
        assert_eq!(
            rule(&narrow),
            "an FP8 tensor's head dimension or stride is not a multiple of 16 elements (16 bytes)"
        );
        let long = Attention::new(1, (1, 1), (1, MAX_KEYS + 1), 128, DType::BF16);
        assert_eq!(rule(&long), "an FP8 attention has more keys than its output's fixed scale allows");
        let packed_o = p.with_layout(AttnTensor::O, HeadLayout::packed_qkv(64, 8, 128));
        assert_eq!(rule(&packed_o), "an FP8 output must be dense BSHD or dense BHSD");
    }
}
