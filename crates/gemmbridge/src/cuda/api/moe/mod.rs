//! The mixture-of-experts entry points with the routing on the device ([`crate::moe`]): the
//! router ([`GpuMoe::route`], gemmbridge's own kernels), the expert products
//! ([`GpuMoe::gemm`], cuDNN's MoE grouped matmul), the combine and its backward
//! ([`GpuMoe::combine`], [`GpuMoe::combine_backward`]) and rows gathered by index
//! ([`GpuMoe::gather`]). Each validates every buffer before anything is enqueued, then
//! enqueues on [`Gpu::stream`] with no host synchronisation.

mod routing;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};

pub use routing::MoeRouting;

use crate::cuda::api::checks::{disjoint, read_span, same_context, write_span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{refuse_if_capturing, KernelSet, MoeKernels, Needs, Relaxed, Scratch};
use crate::cuda::dnn::moe::{MoeBuffers, MoeCall};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::grouped::GroupedProblem;
use crate::moe::{MoeCombine, MoeGemm};

/// The gradients [`GpuMoe::combine_backward`] writes: the combine's input gradient `do`
/// `[S·k, N]`, the weights' `dw` `[S·k]` (f32) and the router logits' `dlogits` `[S, E]`.
pub struct MoeCombineGrads<'a, T> {
    /// The gradient of the expert outputs, in token order.
    pub d_o: &'a mut dyn DevicePtrMut<T>,
    /// The gradient of the weights.
    pub dw: &'a mut dyn DevicePtrMut<f32>,
    /// The gradient of the router's logits.
    pub dlogits: &'a mut dyn DevicePtrMut<T>,
}

/// Where a product's group starts come from: a device buffer, or the host (a grouped product
/// of host sizes, [`crate::grouped`]).
pub(super) enum Starts<'a> {
    Device(u64),
    Host(&'a [i32]),
}

/// The element type against the expected one.
fn check_type<T: Element>(which: Which, want: crate::DType) -> Result<()> {
    if T::DTYPE != want {
        return Err(Error::DTypeMismatch { operand: which, expected: want, got: T::DTYPE });
    }
    Ok(())
}

/// The mixture-of-experts operations of one [`Gpu`] ([`Gpu::moe`]): the router ([`GpuMoe::route`]), the
/// expert products ([`GpuMoe::gemm`]), the combine and its backward ([`GpuMoe::combine`],
/// [`GpuMoe::combine_backward`]) and rows gathered by index ([`GpuMoe::gather`]), each enqueued on
/// [`Gpu::stream`].
#[derive(Clone, Copy, Debug)]
pub struct GpuMoe<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The mixture-of-experts operations ([`GpuMoe`]).
    pub fn moe(&self) -> GpuMoe<'_> {
        GpuMoe { gpu: self }
    }
}

impl GpuMoe<'_> {
    /// The router's top-k and the sort of the routed rows by expert ([`MoeRouter`](crate::moe::MoeRouter), the one
    /// `out` was made for) from `logits` `[S, E]` (row-major, `T` the router's dtype), into
    /// `out`: four launches of gemmbridge's own kernels on [`Gpu::stream`], no host wait.
    ///
    /// # Errors
    /// Before anything is launched: [`Error::WrongContext`], [`Error::DTypeMismatch`],
    /// [`Error::BufferTooSmall`] (logits shorter than S·E); [`Error::NotCapturable`] for the
    /// first call of the process inside a capture (the kernels are compiled then);
    /// [`Error::Driver`] from the launches.
    pub fn route<T: Element>(&self, logits: &dyn DevicePtr<T>, out: &mut MoeRouting) -> Result<()> {
        let gpu = self.gpu;
        let r = out.router;
        check_type::<T>(Which::Grouped("logits"), r.dtype)?;
        same_context(Which::Grouped("logits"), logits.stream(), gpu.context())?;
        same_context(Which::Grouped("routing"), out.ids.stream(), gpu.context())?;
        let s = gpu.stream();
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        let lp = read_span(
            s,
            (Which::Grouped("logits"), logits),
            (r.tokens * r.experts, T::DTYPE.size_bytes()),
            &mut guards,
        )?
        .addr;
        let (ids, _a) = out.ids.device_ptr_mut(s);
        let (weights, _b) = out.weights.device_ptr_mut(s);
        let (counts, _c) = out.counts.device_ptr_mut(s);
        let (starts, _d) = out.starts.device_ptr_mut(s);
        out.cap = None; // the sorted layout, rewritten below
        let [i0, i1, i2, i3] = &mut out.sorted;
        let [(index, _e), (ks, _f), (slots, _h), (pos, _i)] = [i0, i1, i2, i3].map(|b| b.device_ptr_mut(s));
        // SAFETY: `out`'s buffers were made for this router (MoeRouting::new), the logits checked
        // above; all are borrowed until the launches are enqueued.
        gpu.with_moe_kernels(|k| unsafe { k.route(&r, lp, [ids, weights, counts], [starts, index, ks, slots, pos]) })
    }

    /// The expert product `p` over device group starts ([`MoeGemm`]): `input` `[R, in]`, `w`
    /// `[E, N, K]` (`nn.Linear`'s layout per expert), `out` `[R, out]` written, rows in expert
    /// order, row-major and contiguous, `T` the precision's type; `starts` `[E]` int32, where
    /// each expert's rows begin (the router's [`MoeRouting::starts`]). On cuDNN's MoE grouped
    /// matmul (cuDNN 9.18 and later), planned on the first call of each product and buffer
    /// alignment; the starts are first copied clamped into range by a kernel of gemmbridge's
    /// own (non-decreasing within `[0, R]`), so nothing outside the buffers is read or written
    /// whatever they hold ([`crate::moe::check_starts`] says what they should hold). No host
    /// synchronisation.
    ///
    /// What the loaded cuDNN serves is measured, not assumed (`bench/probes/moe_grouped.py`):
    /// cuDNN 9.19 on Hopper runs the forward, has no engine for the backward data (refused by
    /// name), and runs skewed groups several times slower than cuBLAS's grouped call
    /// (docs/DESIGN.md, "Grouped GEMMs") — [`Gpu::grouped_gemm`] over host sizes is the fast
    /// way there. A CUDA graph capture holding it was invalidated on Hopper with cuDNN 9.19:
    /// check a capture on your cuDNN before relying on one.
    ///
    /// # Errors
    /// Before anything is launched, nothing written: [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`], [`Error::BufferTooSmall`] (a buffer shorter than
    /// [`MoeGemm::lens`], starts shorter than E), [`Error::Misaligned`] (an address off its
    /// element size), [`Error::OutputOverlapsInput`]; [`Error::Unsupported`] on a cuDNN before
    /// 9.18 or where its engines refuse the product (naming it); [`Error::NotCapturable`] for
    /// a product's first call inside a capture. From the launch: [`Error::Cudnn`],
    /// [`Error::Driver`].
    pub fn gemm<T: Element>(
        &self,
        p: &MoeGemm,
        starts: &dyn DevicePtr<i32>,
        input: &dyn DevicePtr<T>,
        w: &dyn DevicePtr<T>,
        out: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let gpu = self.gpu;
        check_type::<T>(Which::Grouped("input"), p.precision().input())?;
        let ctx = gpu.context();
        let names = [Which::Grouped("input"), Which::Grouped("w"), Which::Grouped("starts"), Which::Grouped("out")];
        same_context(names[0], input.stream(), ctx)?;
        same_context(names[1], w.stream(), ctx)?;
        same_context(names[2], starts.stream(), ctx)?;
        same_context(names[3], out.stream(), ctx)?;
        let s = gpu.stream();
        let (lens, elem) = (p.lens(), T::DTYPE.size_bytes());
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        let read = [
            read_span(s, (names[0], input), (lens[0], elem), &mut guards)?,
            read_span(s, (names[1], w), (lens[1], elem), &mut guards)?,
            read_span(s, (names[2], starts), (p.experts(), 4), &mut guards)?,
        ];
        let written = [write_span(s, (names[3], out), (lens[2], elem), &mut guards)?];
        disjoint(&written, &read)?;
        let b = MoeBuffers { input: read[0].addr, w: read[1].addr, out: written[0].addr, starts: 0 };
        let r = gpu.moe_run(p, b, Starts::Device(read[2].addr), s.cu_stream());
        drop(guards);
        r
    }

    /// The combine `y[s] = Σ_j w[q] · o[row(q)]` over the slots q = s·k + j ([`MoeCombine`]):
    /// `o` with slot q's row at `rows[q]` (expert order: the router's [`MoeRouting::pos`];
    /// `o` `[MoeRouting::rows, N]`, as many rows as `o.len() / N`) or, without `rows`, at q
    /// (token order, `o` `[S·k, N]`), the weights `w` `[S·k]` f32 (`None`: ones), `y`
    /// written; one launch of gemmbridge's own kernel on [`Gpu::stream`]. A `rows` entry past
    /// o's rows is clamped to its last; a negative one (a slot a capacity dropped) adds
    /// nothing.
    ///
    /// # Errors
    /// Before anything is launched: as [`MoeCombine::validate`]; [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`], [`Error::BufferTooSmall`], [`Error::Misaligned`],
    /// [`Error::OutputOverlapsInput`]; [`Error::NotCapturable`] for the process's first
    /// launch inside a capture; [`Error::Driver`].
    pub fn combine<T: Element>(
        &self,
        c: &MoeCombine,
        (o, rows): (&dyn DevicePtr<T>, Option<&dyn DevicePtr<i32>>),
        w: Option<&dyn DevicePtr<f32>>,
        y: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let gpu = self.gpu;
        c.validate()?;
        check_type::<T>(Which::Grouped("o"), c.dtype)?;
        let (ctx, s, elem) = (gpu.context(), gpu.stream(), T::DTYPE.size_bytes());
        same_context(Which::Grouped("o"), o.stream(), ctx)?;
        same_context(Which::Grouped("y"), y.stream(), ctx)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        // with rows: whatever rows o holds (at least one), the kernel clamps below them
        let o_rows = if rows.is_some() { (o.len() / c.n).max(1) } else { c.rows() };
        if o_rows > crate::MAX_DIM {
            let detail = format!("{o_rows} rows of {}", c.n);
            return Err(Error::GroupedShape { what: "the combine reads at most 2³¹ − 1 rows of o", detail });
        }
        let mut read = vec![read_span(s, (Which::Grouped("o"), o), (o_rows * c.n, elem), &mut guards)?];
        let mut addr = [read[0].addr, 0, 0];
        if let Some(b) = w {
            same_context(Which::Grouped("weights"), b.stream(), ctx)?;
            let sp = read_span(s, (Which::Grouped("weights"), b), (c.rows(), 4), &mut guards)?;
            addr[1] = sp.addr;
            read.push(sp);
        }
        if let Some(b) = rows {
            same_context(Which::Grouped("rows"), b.stream(), ctx)?;
            let sp = read_span(s, (Which::Grouped("rows"), b), (c.rows(), 4), &mut guards)?;
            addr[2] = sp.addr;
            read.push(sp);
        }
        let written = [write_span(s, (Which::Grouped("y"), y), (c.tokens * c.n, elem), &mut guards)?];
        disjoint(&written, &read)?;
        // SAFETY: every buffer checked above and borrowed until the launch is enqueued.
        let r = gpu.with_moe_kernels(|k| unsafe { k.combine(c, addr, o_rows, written[0].addr) });
        drop(guards);
        r
    }

    /// The combine's backward ([`MoeCombine`]) for `routing`'s weights and experts: from `dy`
    /// `[S, N]` and the forward's `o` — in expert order (`sorted`: `[MoeRouting::rows, N]`,
    /// slot q's row at [`MoeRouting::pos`]`[q]`, as [`GpuMoe::combine`] read it with those
    /// rows) or in token order (`[S·k, N]`) — writes `grads` (`do` in o's order, the weights'
    /// and the logits' gradients); one launch on [`Gpu::stream`], and in the capacity layout
    /// ([`MoeRouting::pad`]) a second that zeros `do`'s pad rows, so that every row of it is
    /// written. A slot the capacity dropped gets no `do` row and a zero weight gradient.
    ///
    /// # Errors
    /// As [`GpuMoe::combine`]; [`Error::GroupedShape`] when `c`'s tokens or k differ from
    /// `routing`'s router.
    pub fn combine_backward<T: Element>(
        &self,
        c: &MoeCombine,
        (routing, sorted): (&MoeRouting, bool),
        (dy, o): (&dyn DevicePtr<T>, &dyn DevicePtr<T>),
        grads: MoeCombineGrads<'_, T>,
    ) -> Result<()> {
        let gpu = self.gpu;
        c.validate()?;
        check_type::<T>(Which::Grouped("dy"), c.dtype)?;
        let (r, ctx, s, elem) = (routing.router, gpu.context(), gpu.stream(), T::DTYPE.size_bytes());
        same_context(Which::Grouped("routing"), routing.ids.stream(), ctx)?;
        if (r.tokens, r.top_k) != (c.tokens, c.top_k) {
            let detail = format!("combine S {} k {}, router S {} k {}", c.tokens, c.top_k, r.tokens, r.top_k);
            return Err(Error::GroupedShape { what: "the combine is not the routing's", detail });
        }
        let names = ["dy", "o", "do", "dw", "dlogits"].map(Which::Grouped);
        same_context(names[0], dy.stream(), ctx)?;
        same_context(names[1], o.stream(), ctx)?;
        same_context(names[2], grads.d_o.stream(), ctx)?;
        same_context(names[3], grads.dw.stream(), ctx)?;
        same_context(names[4], grads.dlogits.stream(), ctx)?;
        let o_rows = if sorted { routing.rows() } else { c.rows() };
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        let mut read = vec![
            read_span(s, (names[0], dy), (c.tokens * c.n, elem), &mut guards)?,
            read_span(s, (names[1], o), (o_rows * c.n, elem), &mut guards)?,
        ];
        let wr: &dyn DevicePtr<f32> = &routing.weights;
        let ir: &dyn DevicePtr<i32> = &routing.ids;
        read.push(read_span(s, (Which::Grouped("weights"), wr), (c.rows(), 4), &mut guards)?);
        read.push(read_span(s, (Which::Grouped("ids"), ir), (c.rows(), 4), &mut guards)?);
        let (pr, ir): (&dyn DevicePtr<i32>, &dyn DevicePtr<i32>) = (routing.pos(), routing.index());
        let rows = if sorted { read_span(s, (Which::Grouped("pos"), pr), (c.rows(), 4), &mut guards)?.addr } else { 0 };
        let pad = match routing.cap {
            Some(_) if sorted => read_span(s, (Which::Grouped("index"), ir), (o_rows, 4), &mut guards)?.addr,
            _ => 0,
        };
        let written = [
            write_span(s, (names[2], grads.d_o), (o_rows * c.n, elem), &mut guards)?,
            write_span(s, (names[3], grads.dw), (c.rows(), 4), &mut guards)?,
            write_span(s, (names[4], grads.dlogits), (c.tokens * r.experts, elem), &mut guards)?,
        ];
        disjoint(&written, &read)?;
        let ins = [read[0].addr, read[1].addr, read[2].addr, read[3].addr, rows];
        let outs = [written[0].addr, written[1].addr, written[2].addr];
        // SAFETY: every buffer checked above, borrowed until the launch is enqueued; an id
        // outside 0..E writes no logit gradient (the kernel skips it).
        let res = gpu.with_moe_kernels(|k| unsafe {
            k.combine_backward((c, r.experts, o_rows), ins, outs)?;
            if pad != 0 {
                k.zero_rows(c.dtype, [pad, outs[0]], (o_rows, c.n))?;
            }
            Ok(())
        });
        drop(guards);
        res
    }

    /// Rows gathered by index: `out[r, ·] = input[index[r], ·]` for the `index.len()` rows of
    /// `width` elements (each index clamped below the input's rows, `input.len() / width`; a
    /// negative index, a pad row of the capacity layout, writes zeros): a MoE backward's
    /// expert-ordered copy of x (by [`MoeRouting::index`]) or of a token-ordered gradient (by
    /// [`MoeRouting::slots`]); one launch on [`Gpu::stream`].
    ///
    /// # Errors
    /// Before anything is launched: [`Error::GroupedShape`] for a zero width or an input of no
    /// row; [`Error::WrongContext`], [`Error::BufferTooSmall`] (`out` shorter than
    /// rows·width), [`Error::Misaligned`], [`Error::OutputOverlapsInput`];
    /// [`Error::NotCapturable`], [`Error::Driver`] as [`GpuMoe::combine`].
    pub fn gather<T: Element>(
        &self,
        index: &dyn DevicePtr<i32>,
        width: usize,
        input: &dyn DevicePtr<T>,
        out: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let gpu = self.gpu;
        let (ctx, s, elem) = (gpu.context(), gpu.stream(), T::DTYPE.size_bytes());
        let (rows, in_rows) = (index.len(), input.len() / width.max(1));
        let addressable = rows.checked_mul(width).is_some_and(|e| e <= isize::MAX as usize / 4);
        if width == 0 || in_rows == 0 || rows > crate::MAX_DIM || in_rows > crate::MAX_DIM || !addressable {
            let detail = format!("width {width}, {rows} rows from {in_rows}");
            return Err(Error::GroupedShape {
                what: "a gather needs a width, input rows, at most 2³¹ − 1 rows and an addressable output",
                detail,
            });
        }
        same_context(Which::Grouped("index"), index.stream(), ctx)?;
        same_context(Which::Grouped("input"), input.stream(), ctx)?;
        same_context(Which::Grouped("out"), out.stream(), ctx)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        let read = [
            read_span(s, (Which::Grouped("input"), input), (in_rows * width, elem), &mut guards)?,
            read_span(s, (Which::Grouped("index"), index), (rows, 4), &mut guards)?,
        ];
        let written = [write_span(s, (Which::Grouped("out"), out), (rows * width, elem), &mut guards)?];
        disjoint(&written, &read)?;
        let addrs = [read[0].addr, read[1].addr, written[0].addr];
        // SAFETY: every buffer checked above, borrowed until the launch; indices are clamped.
        let r = gpu.with_moe_kernels(|k| unsafe { k.gather(T::DTYPE, addrs, (rows, in_rows), width) });
        drop(guards);
        r
    }
}

impl Gpu {
    /// Runs `f` with the MoE kernels (compiled on first use, never inside a capture) under
    /// the lock, the context bound.
    pub(super) fn with_moe_kernels(&self, f: impl FnOnce(&MoeKernels<'_>) -> Result<()>) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let stream = self.stream().cu_stream();
        let k = st.dev.kernels(stream, KernelSet::Layer)?;
        f(&MoeKernels { k, stream })
    }

    /// A grouped product of host group sizes ([`crate::grouped`], checked by its entry point)
    /// on cuDNN's MoE grouped matmul: the rows of the groups only (rows past the last group are
    /// neither read nor written), the starts written from the host by a kernel launch.
    pub(super) fn moe_grouped(&self, p: &GroupedProblem, bufs: [(u64, usize); 3], stream: CUstream) -> Result<()> {
        let total = p.row_start(p.groups());
        if total == 0 {
            return Ok(()); // no group has rows: nothing is written
        }
        let q = MoeGemm::new(p.op(), p.groups(), total, (p.n(), p.k()), p.precision())?;
        let starts = crate::moe::starts_of(p.sizes())?;
        let b = MoeBuffers { input: bufs[0].0, w: bufs[1].0, out: bufs[2].0, starts: 0 };
        self.moe_run(&q, b, Starts::Host(&starts), stream)
    }

    /// Plans (on first use), writes the group starts into scratch — device starts clamped into
    /// range, or host starts — and launches one checked MoE product on `stream`.
    pub(super) fn moe_run(&self, p: &MoeGemm, mut b: MoeBuffers, starts: Starts<'_>, stream: CUstream) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        let mut call = MoeCall { problem: p, buffers: b, workspace: (0, 0), stream };
        let planned = st.libs.dnn.as_ref().is_some_and(|d| d.moe_planned(&call));
        let _relaxed = if planned { None } else { Some(Relaxed::enter()?) };
        if !planned {
            let needs = Needs::Plan("plan a MoE grouped matmul (cuDNN operation graph and engine choice)");
            refuse_if_capturing(stream, needs, || p.describe())?;
        }
        let ctx = self.context();
        st.libs.ensure_dnn(ctx.is_primary().then(|| ctx.ordinal()))?;
        let k = MoeKernels { k: st.dev.kernels(stream, KernelSet::Layer)?, stream };
        // SAFETY: the stream is this Gpu's own or the caller's live one, its context bound.
        let scratch = unsafe { Scratch::alloc(4 * p.experts(), stream) }?;
        match starts {
            // SAFETY: the starts were checked to hold E int32; the scratch holds E and
            // overlaps nothing.
            Starts::Device(addr) => unsafe { k.clamp(addr, scratch.ptr, (p.experts(), p.rows())) }?,
            // SAFETY: the scratch holds the E starts.
            Starts::Host(host) => unsafe { k.starts(host, scratch.ptr) }?,
        }
        b.starts = scratch.ptr;
        call.buffers = b;
        let ws = st.dev.workspaces.get(stream, &|| p.describe())?;
        call.workspace = (ws.ptr, ws.matmul_bytes);
        let dnn = st.libs.dnn.as_mut().expect("created above");
        // SAFETY: every address was checked against the product's sizes and belongs to this
        // context, the routing in range; the workspace is this stream's.
        let res = unsafe { dnn.moe_gemm(&call) };
        drop(scratch); // freed in stream order, after the product
        res
    }
}
