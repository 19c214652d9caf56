//! The attention entry points on cuDNN: validate (the problem, every buffer's dtype, length,
//! alignment, context and overlap, the lengths) before anything is enqueued → plan (once per
//! problem, direction and alignment, `dnn/attention/`) → launch on [`Gpu::stream`], no host
//! synchronisation.

mod fp8;
mod fp8_bwd;
mod packed;

pub use fp8_bwd::AttnSavedFp8;

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::attention::{Attention, AttnMask, AttnTensor};
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::plans::Plans;
use crate::cuda::device::{refuse_if_capturing, AttnBwdScales, KernelSet, Needs, Relaxed};
use crate::cuda::dnn::attention::{AttnBuffers, AttnCall, AttnOp};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::Fp8Format;
use crate::tactics::Tactic;

/// The per-sequence lengths of a padded variable-length batch ([`Attention::var_len`]):
/// `len_q[b]` and `len_kv[b]`, each in `1..=s_q` and `1..=s_kv`.
#[derive(Clone, Copy)]
pub struct SeqLens<'a>(Lens<'a>);

#[derive(Clone, Copy)]
enum Lens<'a> {
    Host(&'a [i32], &'a [i32]),
    Device(&'a dyn DevicePtr<i32>, &'a dyn DevicePtr<i32>),
}

impl<'a> SeqLens<'a> {
    /// Lengths on the host: checked against the problem ([`Attention::check_lengths`]) before
    /// anything is enqueued, then copied in stream order into the call's workspace (a pageable
    /// copy the driver stages before returning). Such a call cannot be captured into a CUDA
    /// graph ([`Error::NotCapturable`]); device lengths can.
    pub fn host(len_q: &'a [i32], len_kv: &'a [i32]) -> SeqLens<'a> {
        SeqLens(Lens::Host(len_q, len_kv))
    }

    /// Lengths already on the device (int32, `b` each, read by cuDNN's engine in stream order):
    /// no host copy, no synchronisation, capturable. Their buffers are checked (context, size,
    /// alignment); their values cannot be without a synchronisation.
    ///
    /// # Safety
    /// When the call runs, every `len_q[n]` is in `1..=s_q` and every `len_kv[n]` in
    /// `1..=s_kv` (for the bottom-right causal mask also `len_kv[n] ≥ len_q[n]`); a length out
    /// of range makes cuDNN's engine read and write outside the tensors.
    pub unsafe fn device(len_q: &'a dyn DevicePtr<i32>, len_kv: &'a dyn DevicePtr<i32>) -> SeqLens<'a> {
        SeqLens(Lens::Device(len_q, len_kv))
    }
}

/// What the backward reads: the forward's inputs `q`, `k`, `v`, its output `o` and statistics
/// `stats` (`lse[b, h_q, s_q]`, f32, dense, as [`GpuAttention::forward`] writes them), and the
/// output's gradient `d_o` (strided as `o`).
#[derive(Clone, Copy)]
pub struct AttnSaved<'a, T> {
    /// The queries `q[b, h_q, s_q, d]`.
    pub q: &'a dyn DevicePtr<T>,
    /// The keys `k[b, h_kv, s_kv, d]`.
    pub k: &'a dyn DevicePtr<T>,
    /// The values `v[b, h_kv, s_kv, d]`.
    pub v: &'a dyn DevicePtr<T>,
    /// The forward's output `o[b, h_q, s_q, d]`.
    pub o: &'a dyn DevicePtr<T>,
    /// The output's gradient `do`, shaped and strided as `o`.
    pub d_o: &'a dyn DevicePtr<T>,
    /// The forward's statistics `lse[b, h_q, s_q]` (f32, dense).
    pub stats: &'a dyn DevicePtr<f32>,
}

/// Host lengths `(len_q, len_kv)`, passed on to the launch.
type HostLens<'a> = Option<(&'a [i32], &'a [i32])>;

/// The buffer rules: the buffer holds `elems` elements of `elem` bytes, its address is 16-byte
/// aligned (cuDNN's attention engines load 16-byte vectors).
pub(super) fn span(which: Which, addr: u64, have: usize, elems: usize, elem: usize) -> Result<Span> {
    let s = Span::sized(which, addr, have, elems, elem)?;
    if !addr.is_multiple_of(16) {
        return Err(Error::Misaligned { operand: which, address: addr, align: 16 });
    }
    Ok(s)
}

/// The problem's rules for the GPU path: [`Attention::validate`], the element type, the
/// lengths present exactly with [`Attention::var_len`] (host lengths checked), and no query
/// row left without keys by the bottom-right causal mask (cuDNN's engines give such rows no
/// defined value).
pub(super) fn check_problem<T: Element>(p: &Attention, lens: Option<SeqLens>) -> Result<()> {
    if T::DTYPE != p.dtype {
        p.validate()?;
        return Err(Error::DTypeMismatch { operand: Which::AttnQ, expected: p.dtype, got: T::DTYPE });
    }
    check_problem_of(p, lens)
}

/// [`check_problem`] without the element type (the FP8 path's inputs are E4M3).
pub(super) fn check_problem_of(p: &Attention, lens: Option<SeqLens>) -> Result<()> {
    p.validate()?;
    let bad = |what: &'static str, detail: String| Err(Error::AttentionShape { what, detail });
    match (p.var_len, lens) {
        (true, None) => return bad("a problem with per-sequence lengths was given none", p.describe()),
        (false, Some(_)) => p.check_lengths(&[], &[])?,
        (true, Some(SeqLens(Lens::Host(q, kv)))) => {
            p.check_lengths(q, kv)?;
            if p.mask == AttnMask::CausalBottomRight {
                if let Some(n) = (0..p.b).find(|&n| kv[n] < q[n]) {
                    return bad(
                        "the bottom-right causal mask leaves query rows without keys",
                        format!("len_kv[{n}] = {} < len_q[{n}] = {} ({})", kv[n], q[n], p.describe()),
                    );
                }
            }
        }
        _ => {}
    }
    if p.mask == AttnMask::CausalBottomRight && p.s_kv < p.s_q && !p.var_len {
        return bad(
            "the bottom-right causal mask leaves query rows without keys",
            format!("s_kv = {} < s_q = {} ({})", p.s_kv, p.s_q, p.describe()),
        );
    }
    Ok(())
}

/// The attention operations of one [`Gpu`] ([`Gpu::attention`]): cuDNN's fused attention forward and backward
/// in f16/bf16 ([`GpuAttention::forward`], [`GpuAttention::backward`], [`GpuAttention::backward_packed`]) and
/// in FP8 ([`GpuAttention::forward_fp8`], [`GpuAttention::backward_fp8`], with [`GpuAttention::quantize`],
/// [`GpuAttention::quantize_grad`], [`GpuAttention::fp8_output`] and [`GpuAttention::fp8_grads`] making their
/// operands), each enqueued on [`Gpu::stream`].
#[derive(Clone, Copy, Debug)]
pub struct GpuAttention<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The attention operations ([`GpuAttention`]).
    pub fn attention(&self) -> GpuAttention<'_> {
        GpuAttention { gpu: self }
    }
}

impl GpuAttention<'_> {
    /// Scaled-dot-product attention, PyTorch's `F.scaled_dot_product_attention(q, k, v,
    /// is_causal=…, scale=p.scale)` without dropout, on cuDNN's fused flash-attention engines:
    /// `o = softmax(scale·q·kᵀ + mask)·v` on [`Gpu::stream`]. Shapes, strides, masks, grouped
    /// key/value heads and the definition: [`crate::attention`]. The inputs `[q, k, v]` and
    /// `o` are `p.dtype` (f16 or bf16; f32 softmax and accumulation), strided as `p.layouts` say (so a
    /// fused QKV projection's output is read in place); `o` is overwritten. With `stats`, the
    /// softmax statistics `lse[b, h_q, s_q]` (f32, dense, natural log) are written too — the
    /// backward needs them. With per-sequence lengths (`p.var_len`), `lens` gives them; query
    /// rows past a sequence's length are padding (their `o` and `lse` are not defined).
    ///
    /// The first call of a problem (per direction and buffer alignment) builds its cuDNN
    /// operation graph and plan (cuDNN's best-ranked engine configuration); later calls only
    /// launch and can be captured into a CUDA graph (with no or device lengths). The workspace
    /// is this stream's ([`GpuOptions::workspace_bytes`](crate::cuda::GpuOptions::workspace_bytes))
    /// where it fits, else the cuDNN room's own (up to
    /// [`GpuOptions::conv_workspace_limit`](crate::cuda::GpuOptions::conv_workspace_limit)).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::AttentionShape`] (the problem's rules, the
    /// lengths); [`Error::DTypeMismatch`], [`Error::BufferTooSmall`], [`Error::Misaligned`]
    /// (every address 16-byte aligned), [`Error::OutputOverlapsInput`], [`Error::WrongContext`]
    /// for a buffer; [`Error::LibraryNotFound`] without libcudnn; [`Error::NotCapturable`] for
    /// a first call, or host lengths, inside a capture; [`Error::Unsupported`] where no engine
    /// of the loaded cuDNN takes the problem. From cuDNN: [`Error::Cudnn`].
    pub fn forward<T: Element>(
        &self,
        p: &Attention,
        [q, k, v]: [&dyn DevicePtr<T>; 3],
        o: &mut dyn DevicePtrMut<T>,
        stats: Option<&mut dyn DevicePtrMut<f32>>,
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_problem::<T>(p, lens)?;
        let (ctx, s) = (gpu.context(), gpu.stream());
        let ins =
            [(Which::AttnQ, q, AttnTensor::Q), (Which::AttnK, k, AttnTensor::K), (Which::AttnV, v, AttnTensor::V)];
        let mut guards = Vec::with_capacity(4);
        let read = gpu.input_spans(p, &ins, &mut guards)?;
        let elem = T::DTYPE.size_bytes();
        same_context(Which::AttnO, o.stream(), ctx)?;
        let o_bytes = o.num_bytes();
        let (o_addr, g) = o.device_ptr_mut(s);
        guards.push(g);
        let o = span(Which::AttnO, o_addr, o_bytes, p.required_elems(AttnTensor::O), elem)?;
        let r = gpu.forward_outputs(p, None, read, o, stats, lens);
        drop(guards);
        r
    }

    /// The backward of [`GpuAttention::forward`]: `dq`, `dk`, `dv` (shaped and strided as `q`,
    /// `k`, `v`; overwritten) from the forward's `q`, `k`, `v`, `o`, its statistics and the
    /// output's gradient `do` ([`AttnSaved`]), on [`Gpu::stream`]: `dv = Pᵀ·do`,
    /// `dS = P ∘ (do·vᵀ − rowsum(do ∘ o))`, `dq = scale·dS·k`, `dk = scale·dSᵀ·q` with
    /// `P = exp(scale·q·kᵀ − lse)` masked as the forward; with grouped key/value heads `dk`
    /// and `dv` are summed over the query heads that share them. The same mask, lengths and
    /// plans as the forward.
    ///
    /// cuDNN before 9.15.1 ran this backward wrongly for key lengths that are not a multiple of
    /// 128 without a padding mask (fixed in 9.15.1, per its release notes); on such a cuDNN
    /// the backward of those problems runs with a padding mask of the full lengths (the
    /// lengths written into the workspace in stream order), as cudnn-frontend does.
    ///
    /// # Errors
    /// As [`GpuAttention::forward`]; every gradient is checked against every input and the
    /// other gradients (dq, dk, dv in one packed buffer are refused: their spans overlap).
    pub fn backward<T: Element>(
        &self,
        p: &Attention,
        saved: AttnSaved<T>,
        dq: &mut dyn DevicePtrMut<T>,
        dk: &mut dyn DevicePtrMut<T>,
        dv: &mut dyn DevicePtrMut<T>,
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_problem::<T>(p, lens)?;
        let (ctx, s) = (gpu.context(), gpu.stream());
        same_context(Which::AttnStats, saved.stats.stream(), ctx)?;
        let outs: [(Which, &mut dyn DevicePtrMut<T>, AttnTensor); 3] = [
            (Which::AttnDq, dq, AttnTensor::Q),
            (Which::AttnDk, dk, AttnTensor::K),
            (Which::AttnDv, dv, AttnTensor::V),
        ];
        for (w, b, _) in &outs {
            same_context(*w, b.stream(), ctx)?;
        }
        let elem = T::DTYPE.size_bytes();
        let mut guards = Vec::with_capacity(12);
        let mut read = gpu.saved_spans(p, saved, &mut guards)?;
        let mut written = Vec::with_capacity(3);
        for (w, b, t) in outs {
            let bytes = b.num_bytes();
            let (addr, g) = b.device_ptr_mut(s);
            guards.push(g);
            written.push(span(w, addr, bytes, p.required_elems(t), elem)?);
        }
        let (mut b, host) = gpu.lens_buffers(p, lens, &mut guards, &mut read)?;
        disjoint(&written, &read)?;
        (b.q, b.k, b.v, b.o, b.d_o, b.stats) =
            (read[0].addr, read[1].addr, read[2].addr, read[3].addr, read[4].addr, read[5].addr);
        (b.dq, b.dk, b.dv) = (written[0].addr, written[1].addr, written[2].addr);
        let r = gpu.attention_run(p, AttnOp::Backward, b, host, None);
        drop(guards);
        r
    }
}

impl Gpu {
    /// The rest of a forward whose inputs q, k, v and output o are checked (`read`: the
    /// inputs' spans, in that order, `o` the output's; the caller holds their guards until this
    /// returns): the statistics checked, the lengths, the overlaps, then the call; `fp8`: the
    /// dequantisation scales' addresses of q and k for an FP8 forward.
    pub(super) fn forward_outputs(
        &self,
        p: &Attention,
        fp8: Option<[u64; 2]>,
        mut read: Vec<Span>,
        o: Span,
        stats: Option<&mut dyn DevicePtrMut<f32>>,
        lens: Option<SeqLens>,
    ) -> Result<()> {
        let (ctx, s) = (self.context(), self.stream());
        let mut guards = Vec::with_capacity(4);
        if let Some(st) = stats.as_ref() {
            same_context(Which::AttnStats, st.stream(), ctx)?;
        }
        let mut written = vec![o];
        let mut stats_addr = 0;
        if let Some(st) = stats {
            let bytes = st.num_bytes();
            let (addr, g) = st.device_ptr_mut(s);
            guards.push(g);
            written.push(span(Which::AttnStats, addr, bytes, p.stats_elems(), 4)?);
            stats_addr = addr;
        }
        let (mut b, host) = self.lens_buffers(p, lens, &mut guards, &mut read)?;
        disjoint(&written, &read)?;
        (b.q, b.k, b.v, b.o, b.stats) = (read[0].addr, read[1].addr, read[2].addr, o.addr, stats_addr);
        let stats = stats_addr != 0;
        let op = match fp8 {
            Some(d) => {
                b.descale = [d[0], d[1], 0, 0, 0];
                AttnOp::ForwardFp8 { stats }
            }
            None => AttnOp::Forward { stats },
        };
        let r = self.attention_run(p, op, b, host, None);
        drop(guards);
        r
    }

    /// The read spans of a backward's saved tensors, in the order the launch takes them: q, k,
    /// v, o and do (checked as [`Gpu::input_spans`] checks them), then the statistics (its
    /// context checked by the caller); their guards added to `guards`.
    pub(super) fn saved_spans<'a: 's, 's, T: Element>(
        &'s self,
        p: &Attention,
        saved: AttnSaved<'a, T>,
        guards: &mut Vec<cudarc::driver::SyncOnDrop<'s>>,
    ) -> Result<Vec<Span>> {
        let AttnSaved { q, k, v, o, d_o, stats } = saved;
        let ins = [
            (Which::AttnQ, q, AttnTensor::Q),
            (Which::AttnK, k, AttnTensor::K),
            (Which::AttnV, v, AttnTensor::V),
            (Which::AttnO, o, AttnTensor::O),
            (Which::AttnDo, d_o, AttnTensor::O),
        ];
        let mut read = self.input_spans(p, &ins, guards)?;
        let (addr, g) = stats.device_ptr(self.stream());
        guards.push(g);
        read.push(span(Which::AttnStats, addr, stats.num_bytes(), p.stats_elems(), 4)?);
        Ok(read)
    }

    /// The checked spans of the inputs `ins` (each of the problem's tensor, in `T`): every
    /// buffer's context first, then its guard (added to `guards`), size and alignment.
    pub(super) fn input_spans<'a: 's, 's, T: Element>(
        &'s self,
        p: &Attention,
        ins: &[(Which, &'a dyn DevicePtr<T>, AttnTensor)],
        guards: &mut Vec<cudarc::driver::SyncOnDrop<'s>>,
    ) -> Result<Vec<Span>> {
        let (ctx, s) = (self.context(), self.stream());
        for (w, b, _) in ins {
            same_context(*w, b.stream(), ctx)?;
        }
        let elem = T::DTYPE.size_bytes();
        let mut read = Vec::with_capacity(ins.len() + 3);
        for &(w, b, t) in ins {
            let (addr, g) = b.device_ptr(s);
            guards.push(g);
            read.push(span(w, addr, b.num_bytes(), p.required_elems(t), elem)?);
        }
        Ok(read)
    }

    /// The lengths' buffers: device lengths checked (context, size, alignment) and added to
    /// `read`, their guards to `guards`; host lengths passed on.
    pub(super) fn lens_buffers<'a: 'g, 'g>(
        &'g self,
        p: &Attention,
        lens: Option<SeqLens<'a>>,
        guards: &mut Vec<cudarc::driver::SyncOnDrop<'g>>,
        read: &mut Vec<Span>,
    ) -> Result<(AttnBuffers, HostLens<'a>)> {
        let mut b = AttnBuffers::default();
        match lens.map(|l| l.0) {
            None => Ok((b, None)),
            Some(Lens::Host(q, kv)) => Ok((b, Some((q, kv)))),
            Some(Lens::Device(q, kv)) => {
                let s = self.stream();
                for (buf, slot) in [(q, &mut b.len_q), (kv, &mut b.len_kv)] {
                    same_context(Which::AttnLens, buf.stream(), self.context())?;
                    let (addr, g) = buf.device_ptr(s);
                    guards.push(g);
                    read.push(span(Which::AttnLens, addr, buf.num_bytes(), p.b, 4)?);
                    *slot = addr;
                }
                Ok((b, None))
            }
        }
    }

    /// Plan (on first use) and launch one checked call; `scales`: the FP8 backward's scale
    /// job (the scratch it writes becomes the call's `scalars`).
    pub(super) fn attention_run(
        &self,
        p: &Attention,
        op: AttnOp,
        b: AttnBuffers,
        host: HostLens,
        scales: Option<&AttnBwdScales>,
    ) -> Result<()> {
        let stream = self.stream().cu_stream();
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        let mut call = AttnCall { problem: p, op, buffers: b, host_lens: host, workspace: (0, 0), stream };
        let planned = st.libs.dnn.as_ref().is_some_and(|d| d.attention_planned(&call));
        let needs = if !planned {
            Some(Needs::Plan("plan an attention call (cuDNN operation graph and engine choice)"))
        } else {
            host.is_some().then_some(Needs::HostCopy("copy host sequence lengths (pass them with SeqLens::device)"))
        };
        if let Some(needs) = needs {
            refuse_if_capturing(stream, needs, || format!("attention {} {op:?}", p.describe()))?;
        }
        // Planning may allocate and load kernels: allowed while another thread captures in
        // global mode.
        let _relaxed = if planned { None } else { Some(Relaxed::enter()?) };
        let ctx = self.context();
        st.libs.ensure_dnn(ctx.is_primary().then(|| ctx.ordinal()))?;
        let ws = st.dev.workspaces.get(stream, &|| p.describe())?;
        call.workspace = (ws.ptr, ws.matmul_bytes);
        let kernels = match scales {
            Some(_) => Some(st.dev.kernels(stream, KernelSet::Fp8)?),
            None => None,
        };
        // the scales live in the stream's scratch: written and read under this one lock hold,
        // in stream order, so no other call on the stream can use the scratch in between
        call.buffers.scalars = if scales.is_some() { ws.scratch } else { 0 };
        let mut before = || match (scales, kernels) {
            // SAFETY: the job's addresses were checked by the entry point; the scratch holds
            // far more than the job's 11 f32; `stream` is the Gpu's own.
            (Some(job), Some(k)) => unsafe { job.enqueue(k, ws.scratch, stream) },
            _ => Ok(()),
        };
        let dnn = st.libs.dnn.as_mut().expect("created above");
        // SAFETY: every address was checked above against the problem's sizes and belongs to
        // this context, borrowed (guards) until the call is enqueued; the workspace is this
        // stream's; the stream is the Gpu's own, live.
        unsafe { dnn.attention(&call, &mut before) }
    }
}

/// The directions a name stands for ("forward": with or without statistics).
fn direction_ops(direction: &str) -> Option<&'static [AttnOp]> {
    Some(match direction {
        "forward" => &[AttnOp::Forward { stats: true }, AttnOp::Forward { stats: false }],
        "forward_fp8" => &[AttnOp::ForwardFp8 { stats: true }, AttnOp::ForwardFp8 { stats: false }],
        "backward" => &[AttnOp::Backward],
        "backward_fp8" => {
            &[AttnOp::BackwardFp8 { grad: Fp8Format::E5M2 }, AttnOp::BackwardFp8 { grad: Fp8Format::E4M3 }]
        }
        _ => return None,
    })
}

impl Plans<'_> {
    /// The cuDNN engine planned for `p`'s `"forward"`, `"forward_fp8"`, `"backward"` or
    /// `"backward_fp8"` (a forward planned with or without statistics, whichever ran; an FP8
    /// backward with E5M2 gradients, else E4M3), once its first call has run; `None` before or
    /// for another name.
    pub fn attention(&self, p: &Attention, direction: &str) -> Option<String> {
        let ops = direction_ops(direction)?;
        let st = self.gpu.lock();
        let d = st.libs.dnn.as_ref()?;
        ops.iter().find_map(|&op| d.attention_plan(p, op))
    }

    /// The plan a measured search
    /// ([`GpuOptions::attention_search`](crate::cuda::GpuOptions::attention_search)) chose for `p`'s
    /// direction (named as for [`Plans::attention`]: "forward", "forward_fp8", "backward",
    /// "backward_fp8"; of the best-aligned plan made, which for allocations is the 16-byte one) as
    /// a tactic for the database: its signature (the "attention" key, [`crate::tactics`]) and the
    /// [`Tactic`] (cuDNN, this cuDNN version, the engine and knobs, the workspace, the heuristic's
    /// and the chosen plan's measured times). `None` before the first call, for a heuristic choice,
    /// for a plan that came from the database and for another name.
    pub fn attention_tactic(&self, p: &Attention, direction: &str) -> Option<(String, Tactic)> {
        let ops = direction_ops(direction)?;
        let st = self.gpu.lock();
        let d = st.libs.dnn.as_ref()?;
        ops.iter().find_map(|&op| d.attention_tactic(p, op))
    }
}
