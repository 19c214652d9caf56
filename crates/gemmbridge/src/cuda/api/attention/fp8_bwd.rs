//! The FP8 attention backward on cuDNN's FP8 backward graph: E4M3 q, k, v and o (as the FP8
//! forward wrote it), do quantised by gemmbridge's kernels ([`GpuAttention::quantize_grad`]),
//! the forward's statistics; dq, dk, dv in do's FP8 format with scales made on the device from
//! the inputs' scales by one kernel of gemmbridge's own (fixed bounds: nothing can overflow,
//! nothing comes back to the host; `gemmbridge::attention::fp8::backward_scales` documents them).
//!
//! What cuDNN's FP8 backward offers, from cudnn-frontend's support checks for it: compute
//! capability 9.0 or later; on 9.x a head dimension of 128 only (10.x and later: at most 128, a
//! multiple of 16); the bottom-right causal mask only on 10.x and later; padded per-sequence
//! lengths yes; cuDNN 9.1.0 or later, not 9.10.0. The rest is refused by name before anything
//! runs ([`Error::Unsupported`]).

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::fp8::{check_fp8_layout, which};
use super::GpuAttention;
use super::{check_problem_of, span, SeqLens};
use crate::attention::fp8::smallest;
use crate::attention::{Attention, AttnMask, AttnTensor};
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::device::{AttnBwdScales, Relaxed, RelaxedDrop};
use crate::cuda::dnn::attention::AttnOp;
use crate::cuda::route::fp8::Fp8Tensor;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::{Fp8Format, Fp8Layout, Scaling, Source};

/// What the FP8 backward reads: the FP8 forward's inputs `q`, `k`, `v` (E4M3, from
/// [`GpuAttention::quantize`]), its output `o` ([`GpuAttention::forward_fp8`]) and statistics
/// (`lse[b, h_q, s_q]`, f32, dense), and the output's gradient `d_o` from
/// [`GpuAttention::quantize_grad`] (E4M3 or E5M2, one scale).
#[derive(Clone, Copy)]
pub struct AttnSavedFp8<'a> {
    /// The queries (E4M3).
    pub q: &'a Fp8Tensor,
    /// The keys (E4M3).
    pub k: &'a Fp8Tensor,
    /// The values (E4M3).
    pub v: &'a Fp8Tensor,
    /// The FP8 forward's output (E4M3, its scale twice v's).
    pub o: &'a Fp8Tensor,
    /// The output's gradient, shaped as o; its format is the gradients'.
    pub d_o: &'a Fp8Tensor,
    /// The forward's statistics (f32, dense).
    pub stats: &'a dyn DevicePtr<f32>,
}

/// The scale kernel's job for `p`: the scales at `inputs` (q, k, v, o, do) and `grads` (dq,
/// dk, dv), and the numbers `crate::attention::fp8::backward_scales` uses in `format`.
fn scales_job(p: &Attention, inputs: [u64; 5], grads: [u64; 3], format: Fp8Format) -> AttnBwdScales {
    let rows = (p.group() * p.s_q) as f32;
    AttnBwdScales::new(inputs, grads, [p.scale, p.d as f32, rows, p.s_kv as f32, format.max(), smallest(format)])
}

/// An [`Error::AttentionShape`] naming a tensor of the FP8 backward that is not what it takes.
fn not_taken(what: &'static str, name: &str, t: &Fp8Tensor, p: &Attention) -> Error {
    let l = t.layout();
    let detail = format!("{name}: [{}, {}] {:?} {:?} ({})", l.rows, l.cols, t.format(), l.scaling, p.describe());
    Error::AttentionShape { what, detail }
}

/// The tensors' formats and layouts: q, k, v, o E4M3 with one scale each; do with one scale, in
/// the gradients' format; dq, dk, dv as [`GpuAttention::fp8_grads`] makes them in do's format.
/// Returns that format.
fn check_tensors(p: &Attention, s: &AttnSavedFp8, grads: &[&mut Fp8Tensor; 3]) -> Result<Fp8Format> {
    use AttnTensor::{K, O, Q, V};
    for (t, x) in [(Q, s.q), (K, s.k), (V, s.v), (O, s.o)] {
        if x.format() != Fp8Format::E4M3 || x.layout().scaling != Scaling::Tensor {
            return Err(not_taken("FP8 attention takes E4M3 tensors with one scale each", t.name(), x, p));
        }
    }
    if s.d_o.layout().scaling != Scaling::Tensor {
        return Err(not_taken("the FP8 attention backward takes do with one scale", "do", s.d_o, p));
    }
    let format = s.d_o.format();
    for (t, g) in [Q, K, V].into_iter().zip(grads) {
        let [b, h, rows] = p.dims(t);
        let l = g.layout();
        if (l.rows, l.cols, l.scaling, g.format()) != (b * h * rows, p.d, Scaling::Tensor, format) {
            let what = "an FP8 gradient was not made for this problem and do's format (GpuAttention::fp8_grads)";
            return Err(not_taken(what, &format!("d{}", t.name()), g, p));
        }
    }
    Ok(format)
}

/// cudnn-frontend's support checks of the FP8 backward, for compute capability `cc`.
fn check_offered(p: &Attention, cc: (i32, i32)) -> Result<()> {
    let no = |what: String| Err(Error::Unsupported { backend: "cuDNN", what });
    if cc.0 < 9 {
        return no(format!("the FP8 attention backward on compute capability {}.{} (it needs 9.0)", cc.0, cc.1));
    }
    if cc.0 == 9 && p.d != 128 {
        return no(format!("the FP8 attention backward with head dimension {} on Hopper (only 128)", p.d));
    }
    if p.d > 128 {
        return no(format!("the FP8 attention backward with head dimension {} (at most 128)", p.d));
    }
    if p.mask == AttnMask::CausalBottomRight && cc.0 < 10 {
        return no("the FP8 attention backward with the bottom-right causal mask before Blackwell".into());
    }
    if !p.s_q.is_multiple_of(ROWS) || !p.s_kv.is_multiple_of(ROWS) {
        return no(format!(
            "the FP8 attention backward with {} query rows and {} keys (each a multiple of {ROWS}: at 7 query rows \
             cuDNN 9.14 and 9.19 gave a dq about 7 times as far from float64 as the recipe's emulation, at 7 and \
             65 keys 1.8 and 1.6 times; dk and dv within it; padded lengths are taken)",
            p.s_q, p.s_kv
        ));
    }
    if p.mask == AttnMask::Causal && cc.0 == 9 {
        return no(format!(
            "the FP8 attention backward with a causal mask on Hopper ({}): cuDNN's FP8 flash backward kernel takes \
             about twice its bf16 kernel's time there (5.27 against 2.53 ms at b 4, h 32, s 4096, d 128 on an \
             H100, cuDNN 9.14 and 9.19), so the bf16 backward is faster: run the backward in bf16",
            p.describe()
        ));
    }
    Ok(())
}

/// What the FP8 backward's query rows and keys must be multiples of (see [`check_offered`]).
const ROWS: usize = 64;

/// E4M3 gradients are refused: under the bound-derived scales dk's values fall below E4M3's
/// smallest subnormal (relative error 1.0 on the GPU and in the emulation at s = 129, d = 128).
fn check_grad_format(p: &Attention, grad: Fp8Format) -> Result<()> {
    if grad != Fp8Format::E5M2 {
        let what = format!(
            "the FP8 attention backward with {grad:?} gradients ({}): under its bound-derived scales dk underflows to \
             zero; quantise do to E5M2",
            p.describe()
        );
        return Err(Error::Unsupported { backend: "cuDNN", what });
    }
    Ok(())
}

impl GpuAttention<'_> {
    /// The output's gradient `do` of `p` (shaped and strided as o, dense, in `p.dtype`) quantised
    /// to `format` with one scale from its current absolute maximum, for
    /// [`GpuAttention::backward_fp8`] (as [`GpuAttention::quantize`] does for q, k, v).
    /// E5M2 (the usual format of gradients) is what the backward's fixed scales suit best.
    ///
    /// # Errors
    /// As [`GpuAttention::quantize`].
    pub fn quantize_grad<T: Element, S: DevicePtr<T>>(
        &self,
        p: &Attention,
        d_o: &S,
        format: Fp8Format,
    ) -> Result<Fp8Tensor> {
        let gpu = self.gpu;
        p.validate()?;
        check_fp8_layout(p)?;
        if T::DTYPE != p.dtype {
            return Err(Error::DTypeMismatch { operand: Which::AttnDo, expected: p.dtype, got: T::DTYPE });
        }
        let [b, h, s] = p.dims(AttnTensor::O);
        let n = b * h * s * p.d;
        if p.required_elems(AttnTensor::O) != n {
            return Err(Error::AttentionShape {
                what: "a tensor to quantise is not dense (its elements leave gaps)",
                detail: format!("do spans {} elements for {n} ({})", p.required_elems(AttnTensor::O), p.describe()),
            });
        }
        gpu.fp8().quantize(d_o, n / p.d, p.d, Source::RowMajor, format, Scaling::Tensor)
    }

    /// The FP8 gradients dq, dk, dv of `p` in `format`, for [`GpuAttention::backward_fp8`]:
    /// each in its tensor's layout (one byte per element) as the matrix `[b·h·s, d]` with one
    /// dequantisation scale, allocated from the stream-ordered pool (not yet written).
    ///
    /// # Errors
    /// [`Error::AttentionShape`] (the problem's rules, the FP8 layout rule); [`Error::Fp8`] on a
    /// GPU without FP8; [`Error::Driver`].
    pub fn fp8_grads(&self, p: &Attention, format: Fp8Format) -> Result<[Fp8Tensor; 3]> {
        let gpu = self.gpu;
        p.validate()?;
        check_fp8_layout(p)?;
        gpu.check_fp8(Scaling::Tensor)?;
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?;
        let one = |t: AttnTensor| -> Result<Fp8Tensor> {
            let [b, h, sq] = p.dims(t);
            let layout = Fp8Layout::new(b * h * sq, p.d, Scaling::Tensor);
            let data = s.alloc_zeros::<u8>(layout.data_len()).map_err(status::driver("cuMemAllocAsync"))?;
            let scales = s.alloc_zeros::<f32>(1).map_err(status::driver("cuMemAllocAsync"))?;
            Ok(Fp8Tensor { data: RelaxedDrop::new(data), scales: RelaxedDrop::new(scales), layout, format })
        };
        Ok([one(AttnTensor::Q)?, one(AttnTensor::K)?, one(AttnTensor::V)?])
    }

    /// The backward of [`GpuAttention::forward_fp8`] on cuDNN's FP8 backward graph: `dq`, `dk`,
    /// `dv` (shaped as q, k, v: `[b, h, s, d]` in `p.layouts`'s strides, one byte per element;
    /// [`GpuAttention::fp8_grads`] makes them) from the FP8 forward's inputs, output and
    /// statistics and the quantised output gradient ([`AttnSavedFp8`]), on [`Gpu::stream`](crate::cuda::Gpu::stream), no
    /// host synchronisation. The definition is [`GpuAttention::backward`]'s (with grouped
    /// key/value heads dk and dv summed over the query heads that share them); the same mask,
    /// lengths and plans.
    ///
    /// The recipe, as [`crate::attention::fp8::backward`] emulates it on the CPU: q, k, v, o in
    /// E4M3 and do in its own format, each with one dequantisation scale (stored value · scale =
    /// value); `P = exp(scale·q·kᵀ − lse)` recomputed in f32 and stored in E4M3 with the scale
    /// 448 for `dv = Pᵀ·do`; `dS = scale·P∘(do·vᵀ − rowsum(do∘o))` stored in do's format for
    /// `dq = dS·k` and `dk = dSᵀ·q`; the three gradients written in do's format. Every scale
    /// (dS's and the gradients') comes from a bound of the tensor's magnitude made from the
    /// inputs' scales alone ([`crate::attention::fp8::backward_scales`] documents the bounds),
    /// computed on the device by one kernel of gemmbridge's own before cuDNN's call: nothing can
    /// overflow and nothing comes back to the host. The gradients' dequantisation scales are
    /// written into their tensors (read them back with `to_host` and
    /// [`crate::fp8::dequantize`]). The bounds sit far above typical values, so E5M2 gradients
    /// (do quantised with [`GpuAttention::quantize_grad`] to E5M2, Transformer Engine's
    /// hybrid recipe) keep typical values at full E5M2 precision; E4M3 gradients would push dk
    /// below E4M3's smallest subnormal (all zeros at s = 129, d = 128, in the emulation too),
    /// so do in E4M3 is refused.
    ///
    /// What cuDNN offers, from cudnn-frontend's support checks of its FP8 backward: compute
    /// capability 9.0 or later; on Hopper (9.x) a head dimension of 128 only (later GPUs: at
    /// most 128); the bottom-right causal mask only from compute capability 10.0 on; cuDNN 9.1.0
    /// or later, not 9.10.0. Measured on the H200 with cuDNN 9.14 and 9.19: with 7 query rows
    /// dq came out about 7 times as far from float64 as the emulation's, with 7 and 65 keys 1.8
    /// and 1.6 times (dk and dv within it), with 64 the same as the emulation's; so query rows
    /// and keys that are not multiples of 64 are refused (shorter sequences go in a padded
    /// batch with their lengths, which measured within). Each combination not offered is
    /// refused by name before anything runs.
    ///
    /// Speed, and why a causal mask is refused on Hopper: there the FP8 backward is slower than
    /// the bf16 one. On an
    /// H100 (cuDNN 9.14 and 9.19, `gemmbridge bench --ops attn_fwd_bwd,attn_fwd_bwd_fp8
    /// --attn-shapes h24,h32-causal,h32:8-causal,h32-causal-8k --dtypes bf16,fp8_e4m3`) FP8
    /// forward+backward took 6.26–6.37 ms against bf16's 4.07–4.18 at b 4, h 32, s 4096, d 128
    /// causal (6.60 against 4.19 with GQA 32/8; 10.5–10.8 against 7.4–7.6 at s 8192), and 1.32 ms
    /// against 1.62 without a mask (b 1, h 24, s 4608). Nsight Compute puts the difference in
    /// cuDNN's own kernel: at b 4, h 32, s 4096 its FP8 flash backward (`flash_bprop_wgmma_f8`,
    /// 64×64×128 tiles) took 5.27 ms where the bf16 one (`flash_bprop_wgmma_f16`, the same
    /// tiles) took 2.53, while the FP8 forward (0.77 ms against 0.90), the scale kernel and the
    /// conversions around them gain or cost under 0.3 ms (docs/results/layer/kernels.txt). So on compute capability
    /// 9.x the (top-left) causal mask is refused by name, whatever the cuDNN (none newer was
    /// measured); unmasked problems, faster in FP8, are taken.
    ///
    /// # Errors
    /// Before anything is enqueued or written: [`Error::AttentionShape`] (the problem's rules,
    /// the lengths; a head dimension or stride that is not a multiple of 16; q, k, v or o not
    /// E4M3 with one scale; do without one scale; a gradient not made for this problem in do's
    /// format); [`Error::Unsupported`] (what cuDNN's FP8 backward does not offer, above; E4M3
    /// gradients);
    /// [`Error::Fp8`] on a GPU without FP8; [`Error::BufferTooSmall`], [`Error::Misaligned`],
    /// [`Error::WrongContext`], [`Error::OutputOverlapsInput`] for a buffer (the statistics
    /// and device lengths included). Later: [`Error::NotCapturable`] for a first call (or the
    /// first FP8 kernel compilation, [`GpuFp8::prepare`](crate::cuda::GpuFp8::prepare)), or host lengths, inside a capture;
    /// [`Error::Unsupported`] where no engine of the loaded cuDNN takes the graph or its
    /// version is refused (then the gradients' data is not written);
    /// [`Error::LibraryNotFound`], [`Error::Cudnn`], [`Error::Driver`].
    pub fn backward_fp8(
        &self,
        p: &Attention,
        saved: AttnSavedFp8,
        grads: [&mut Fp8Tensor; 3],
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let gpu = self.gpu;
        use AttnTensor::{K, O, Q, V};
        check_problem_of(p, lens)?;
        check_fp8_layout(p)?;
        gpu.check_fp8(Scaling::Tensor)?;
        check_offered(p, gpu.fp8_platform()?.0)?;
        let grad = check_tensors(p, &saved, &grads)?;
        check_grad_format(p, grad)?;
        let (ctx, s) = (gpu.context(), gpu.stream());
        let AttnSavedFp8 { q, k, v, o, d_o, stats } = saved;
        let ins = [(which(Q), q, Q), (which(K), k, K), (which(V), v, V), (which(O), o, O), (Which::AttnDo, d_o, O)];
        let outs = [(Which::AttnDq, Q), (Which::AttnDk, K), (Which::AttnDv, V)];
        for (w, x, _) in &ins {
            same_context(*w, x.data().stream(), ctx)?;
        }
        same_context(Which::AttnStats, stats.stream(), ctx)?;
        for ((w, _), g) in outs.iter().zip(&grads) {
            same_context(*w, g.data.stream(), ctx)?;
        }
        let mut guards = Vec::with_capacity(20);
        // read: each input's data then its scale, then the statistics, then device lengths
        let (mut read, mut descale) = (Vec::with_capacity(13), [0u64; 5]);
        for (i, (w, x, t)) in ins.into_iter().enumerate() {
            let (addr, g) = x.data().device_ptr(s);
            guards.push(g);
            read.push(span(w, addr, x.data().num_bytes(), p.required_elems(t), 1)?);
            let (sc, g) = x.scales().device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, sc, x.scales().num_bytes(), 1, 4)?);
            descale[i] = sc;
        }
        let (addr, g) = stats.device_ptr(s);
        guards.push(g);
        read.push(span(Which::AttnStats, addr, stats.num_bytes(), p.stats_elems(), 4)?);
        // written: each gradient's data then its scale
        let (mut written, mut scales) = (Vec::with_capacity(6), [0u64; 3]);
        for (i, ((w, t), g)) in outs.into_iter().zip(grads).enumerate() {
            let bytes = g.data.num_bytes();
            let (addr, gd) = g.data.device_ptr_mut(s);
            guards.push(gd);
            written.push(span(w, addr, bytes, p.required_elems(t), 1)?);
            let bytes = g.scales.num_bytes();
            let (sc, gs) = g.scales.device_ptr_mut(s);
            guards.push(gs);
            written.push(Span::sized(w, sc, bytes, 1, 4)?);
            scales[i] = sc;
        }
        let (mut b, host) = gpu.lens_buffers(p, lens, &mut guards, &mut read)?;
        disjoint(&written, &read)?;
        (b.q, b.k, b.v, b.o, b.d_o, b.stats) =
            (read[0].addr, read[2].addr, read[4].addr, read[6].addr, read[8].addr, read[10].addr);
        (b.dq, b.dk, b.dv, b.descale) = (written[0].addr, written[2].addr, written[4].addr, descale);
        let job = scales_job(p, descale, scales, grad);
        let r = gpu.attention_run(p, AttnOp::BackwardFp8 { grad }, b, host, Some(&job));
        drop(guards);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn refused(p: &Attention, cc: (i32, i32)) -> bool {
        matches!(check_offered(p, cc), Err(Error::Unsupported { .. }))
    }

    #[test]
    fn what_cudnn_does_not_offer_is_refused_by_name() {
        let p = Attention::new(2, (8, 2), (128, 128), 128, DType::BF16);
        check_offered(&p, (9, 0)).unwrap();
        for (sq, skv) in [(129, 128), (128, 65), (7, 7)] {
            assert!(refused(&Attention::new(1, (8, 2), (sq, skv), 128, DType::BF16), (9, 0)), "{sq}/{skv}");
        }
        assert!(refused(&p, (8, 9)), "before Hopper");
        let narrow = Attention::new(2, (8, 2), (128, 128), 64, DType::BF16);
        assert!(refused(&narrow, (9, 0)));
        check_offered(&narrow, (10, 0)).unwrap();
        assert!(refused(&Attention::new(1, (1, 1), (16, 16), 256, DType::BF16), (10, 0)));
        let bottom_right = p.with_mask(AttnMask::CausalBottomRight);
        assert!(refused(&bottom_right, (9, 0)));
        check_offered(&bottom_right, (10, 0)).unwrap();
    }

    #[test]
    fn a_causal_fp8_backward_is_refused_on_hopper_only() {
        let p = Attention::new(2, (8, 2), (128, 128), 128, DType::BF16);
        check_offered(&p, (9, 0)).unwrap();
        let causal = p.with_mask(AttnMask::Causal);
        match check_offered(&causal, (9, 0)) {
            Err(Error::Unsupported { what, .. }) => assert!(what.contains("causal mask on Hopper"), "{what}"),
            other => panic!("{other:?}"),
        }
        check_offered(&causal, (10, 0)).unwrap();
    }

    #[test]
    fn the_scale_job_carries_the_emulations_numbers() {
        let p = Attention::new(2, (8, 2), (33, 40), 128, DType::BF16);
        let job = scales_job(&p, [1, 2, 3, 4, 5], [6, 7, 8], Fp8Format::E5M2);
        assert_eq!(job.numbers(), [p.scale, 128.0, (4 * 33) as f32, 40.0, 57344.0, 1.0 / 65536.0]);
        let e4 = scales_job(&p, [0; 5], [0; 3], Fp8Format::E4M3);
        assert_eq!(&e4.numbers()[4..], &[448.0, 1.0 / 512.0]);
    }
}
