//! The FP8 grouped products: validate (the per-group operands against the problem's TN form,
//! the output and bias buffers, then every group's FP8 call as [`GpuFp8::gemm`] checks it) →
//! each group's FP8 GEMM through the routing floor's FP8 launch (`route/fp8.rs`: its plan, and
//! the staged copy where the output's rows miss the FP8 kernels' alignment) on the pool of
//! streams (`route/grouped.rs`), or in order, replayed as one graph when repeated. Nothing is
//! launched until every group has passed.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::GpuFp8;
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::library;
use crate::cuda::route::fp8::{enqueue, no_lt, Fp8Call, Fp8Options, Fp8Tensor};
use crate::cuda::route::grouped::{pooled_launches, replayed_with};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::OutputKind;
use crate::grouped::streams::GroupedBackend;
use crate::grouped::{GroupedOp, GroupedOperand, GroupedProblem};

/// The operands of one FP8 grouped call: one entry per group, as [`GpuFp8::grouped_quantize`]
/// makes them.
type Operands<'a> = (&'a [Option<Fp8Tensor>], &'a [Option<Fp8Tensor>]);

impl GpuFp8<'_> {
    /// The grouped product `p` in FP8, every group `c_e = α·(A_e · B_eᵀ) (+ bias[e]) (+ β·c_e)`
    /// in the TN form of [`GroupedProblem::tn_operand`]: the forward `y_e = x_e · w_eᵀ`, the
    /// backward data `dx_e = dy_e · w_e`, the backward weight `dw_e = dy_eᵀ · x_e`. `a` and `b`
    /// hold one [`Fp8Tensor`] per group, each with its own scales, as
    /// [`GpuFp8::grouped_quantize`] makes them from the buffers [`Gpu::grouped_gemm`] takes
    /// ([`GroupedOperand::A`], [`GroupedOperand::B`]); an entry is read only where its group
    /// has rows (`None` is fine elsewhere). `c` is the product's output as
    /// [`Gpu::grouped_gemm`] writes it (`y[rows, N]`, `dx[rows, K]` or `dw[E, N, K]`,
    /// row-major) of `O`, the problem's output type ([`crate::Precision::output`]: f32, f16 or
    /// bf16); `bias` `[E, N]` of `O` with [`GroupedProblem::with_bias`] (the forward only).
    /// `opts` as [`GpuFp8::gemm`]'s, for every group. Rows past the last group are not
    /// written; a backward weight's empty group gets zeros (β = 0) or keeps its `dw[e]`
    /// (β = 1).
    ///
    /// Each group is one FP8 GEMM as [`GpuFp8::gemm`] runs it (every recipe of
    /// [`crate::fp8`]: tensor-wise, row-wise, 1×128 · 128×128 blocks, …, the scalings of the
    /// two operands paired as there), spread over the pool of the engine's streams forked from and
    /// joined to [`Gpu::stream`]
    /// ([`GpuOptions::grouped_streams`](crate::cuda::GpuOptions::grouped_streams)), or in order on
    /// [`Gpu::stream`] when one group has rows or the pool has one stream. Work
    /// enqueued on [`Gpu::stream`] afterwards sees every group. No host synchronisation. A call
    /// repeated on the same operands and output is captured once into one CUDA graph of the whole
    /// call and replayed from then on (with graph replay on,
    /// [`GpuOptions::graph_replay`](crate::cuda::GpuOptions::graph_replay)): one launch on the host
    /// instead of one FP8 GEMM per group.
    ///
    /// # Errors
    /// Before anything is launched, with nothing written: [`Error::Unsupported`] for a forced
    /// backend other than the pool or in order, or a backward weight with an empty group and
    /// β other than 0 or 1; [`Error::GroupedShape`] when `a` or `b` has another number of
    /// entries than groups, or a group with rows lacks its operand or has one of another TN
    /// shape than [`GroupedProblem::tn_operand`]'s (values named); [`Error::WrongContext`];
    /// [`Error::DTypeMismatch`] (`O` against the problem's output type);
    /// [`Error::BufferTooSmall`] for `c` or the bias (`E · N`); [`Error::OutputOverlapsInput`]
    /// (`c` against the bias); [`Error::EpilogueOperand`] (a bias given without
    /// [`GroupedProblem::has_bias`] or missing with it); [`Error::Fp8`] (a group's FP8 rule, as
    /// [`GpuFp8::gemm`]: E5M2 on both sides, …); [`Error::LibraryNotFound`] without cuBLASLt;
    /// [`Error::NotCapturable`] when the pool's streams would be created while [`Gpu::stream`]
    /// is being captured (make one pooled call before capturing). From the launches: as [`GpuFp8::gemm`] (a failure part-way leaves other groups
    /// written; the pool is joined back all the same).
    pub fn grouped_gemm<O: Element>(
        &self,
        p: &GroupedProblem,
        a: &[Option<Fp8Tensor>],
        b: &[Option<Fp8Tensor>],
        c: &mut dyn DevicePtrMut<O>,
        bias: Option<&dyn DevicePtr<O>>,
        opts: Fp8Options,
    ) -> Result<()> {
        let gpu = self.gpu;
        let lanes = gpu.fp8_grouped_lanes()?;
        check_operands(p, (a, b))?;
        let ctx = gpu.context();
        let [wa, wb, wc] = p.op().operands();
        for (which, t) in a.iter().map(|t| (wa, t)).chain(b.iter().map(|t| (wb, t))) {
            if let Some(t) = t {
                same_context(which, t.data.stream(), ctx)?;
            }
        }
        same_context(wc, c.stream(), ctx)?;
        if let Some(v) = bias {
            same_context(Which::Bias, v.stream(), ctx)?;
        }
        check_output::<O>(p, bias.is_some())?;
        let zeroed = empty_gradients(p, opts)?;
        if !library::has_cublaslt() {
            return Err(no_lt());
        }
        let s = gpu.stream();
        let (pv, _gv) = match bias {
            Some(v) => {
                let (ptr, g) = v.device_ptr(s);
                (Some((ptr, v.num_bytes())), Some(g))
            }
            None => (None, None),
        };
        let c_len = c.num_bytes();
        let (pc, _gc) = c.device_ptr_mut(s);
        let calls = gpu.group_calls::<O>(p, (a, b), (pc, c_len), pv, opts)?;
        let zeroed: Vec<(u64, usize)> = zeroed.into_iter().map(|(at, bytes)| (pc + at, bytes)).collect();
        gpu.launch_groups(&calls, &zeroed, lanes)
    }
}

impl Gpu {
    /// The lanes an FP8 grouped call spreads over: the stream setting (1: in order, on the
    /// caller's stream).
    fn fp8_grouped_lanes(&self) -> Result<usize> {
        let (backend, streams) = {
            let st = self.lock();
            (st.libs.grouped.backend, st.libs.grouped.streams)
        };
        match backend {
            None | Some(GroupedBackend::StreamPool) => Ok(streams),
            Some(other) => Err(Error::Unsupported {
                backend: "FP8 grouped GEMM",
                what: format!("{other:?} is forced: FP8 groups run on the pool of streams (in order with one stream)"),
            }),
        }
    }

    /// Every group's FP8 call on its slice of `c` (address, bytes) and of the bias, checked
    /// (the spans of `c` and the bias first, then each call as [`GpuFp8::gemm`] checks it).
    fn group_calls<'t, O: Element>(
        &self,
        p: &GroupedProblem,
        (a, b): Operands<'t>,
        (pc, c_len): (u64, usize),
        pv: Option<(u64, usize)>,
        opts: Fp8Options,
    ) -> Result<Vec<Fp8Call<'t>>> {
        let elem = O::DTYPE.size_bytes();
        let mut spans = vec![Span::sized(p.op().operands()[2], pc, c_len, p.lens()[2], elem)?];
        if let Some((addr, have)) = pv {
            spans.push(Span::sized(Which::Bias, addr, have, p.groups() * p.n(), elem)?);
        }
        disjoint(&spans[..1], &spans[1..])?;
        let platform = self.fp8_platform()?;
        let mut calls = Vec::with_capacity(p.groups());
        for e in 0..p.groups() {
            let (Some(x), Some(w)) = (present(p, a, e), present(p, b, e)) else { continue };
            let (c0, b0) = (p.tn_output(e).0 * elem, e * p.n() * elem);
            let call = Fp8Call {
                x,
                w,
                y: (pc + c0 as u64, c_len - c0),
                c_in: None,
                out: OutputKind::Dense(O::DTYPE),
                bias: pv.map(|(addr, have)| (addr + b0 as u64, have - b0, O::DTYPE)),
                d_scale: None,
                amax: None,
                opts,
            };
            call.validate(platform)?;
            calls.push(call);
        }
        Ok(calls)
    }

    /// Enqueues every call over at most `lanes` lanes (in order on [`Gpu::stream`] for one),
    /// then zeroes the regions `zeroed` (address, bytes: empty groups' slices of the checked
    /// output) on [`Gpu::stream`]; the operands' guards are held until every launch is
    /// enqueued.
    fn launch_groups(&self, calls: &[Fp8Call], zeroed: &[(u64, usize)], lanes: usize) -> Result<()> {
        let s = self.stream();
        let mut addrs = Vec::with_capacity(calls.len());
        let mut guards = Vec::with_capacity(4 * calls.len());
        for c in calls {
            let (xd, gx) = c.x.data.device_ptr(s);
            let (wd, gw) = c.w.data.device_ptr(s);
            let (xs, gxs) = c.x.scales.device_ptr(s);
            let (ws, gws) = c.w.scales.device_ptr(s);
            addrs.push([xd, wd, xs, ws]);
            guards.extend([gx, gw, gxs, gws]);
        }
        let work: Vec<u64> =
            calls.iter().map(|c| (c.x.layout.rows * c.w.layout.rows * c.x.layout.cols) as u64).collect();
        let key = replay_key(calls, &addrs, zeroed, lanes);
        self.device().bind()?;
        let mut st = self.lock();
        let describe = || format!("{} FP8 grouped GEMMs", calls.len());
        // SAFETY: every call passed `validate` on live buffers borrowed for this call (the
        // guards above and the caller's); each launch enqueues one of them on the stream it
        // is given, a lane of the device (with its workspace) or the caller's stream. The
        // zeroed regions are empty groups' slices of the checked output. The key encodes every
        // call, its addresses, the zeroed regions and the lanes.
        let done = unsafe {
            // the zeros last: they touch no group's output, and what can be refused before
            // anything is enqueued (lanes, a workspace or a plan made while `caller` is
            // captured) comes first
            let direct = |st: &mut crate::cuda::device::Locked<_>, caller| {
                if lanes == 1 || calls.len() <= 1 {
                    // in order on the caller's stream: no lanes, no fork
                    calls.iter().zip(&addrs).try_for_each(|(c, &a)| enqueue(st, c, a, caller))?;
                } else {
                    pooled_launches(st, &work, lanes, caller, &describe, |st, e, stream| {
                        enqueue(st, &calls[e], addrs[e], stream)
                    })?;
                }
                zero_regions(zeroed, caller)
            };
            replayed_with(&mut st, key, calls.len() + zeroed.len(), &describe, s.cu_stream(), direct)
        };
        // Even after a failure: part of the work may be enqueued.
        self.device().note_use(&mut st, s.cu_stream())?;
        done
    }
}

/// Group `e`'s entry of `ops` when the group has rows (checked by [`check_operands`]).
fn present<'t>(p: &GroupedProblem, ops: &'t [Option<Fp8Tensor>], e: usize) -> Option<&'t Fp8Tensor> {
    (p.sizes()[e] > 0).then(|| ops[e].as_ref()).flatten()
}

/// Stream-ordered zeros over each (address, bytes) of `regions`.
///
/// # Safety
/// Every region lies within a live allocation; `stream` is a live stream of the bound context.
unsafe fn zero_regions(regions: &[(u64, usize)], stream: cudarc::driver::sys::CUstream) -> Result<()> {
    for &(at, bytes) in regions {
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::memset_d8_async(at, 0, bytes, stream) }
            .map_err(crate::cuda::status::driver("cuMemsetD8Async"))?;
    }
    Ok(())
}

/// One entry per group in `a` and `b`, and every group with rows holding operands of its TN
/// shape ([`GroupedProblem::tn_operand`]).
fn check_operands(p: &GroupedProblem, (a, b): Operands) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
    let e_count = p.groups();
    if a.len() != e_count || b.len() != e_count {
        return bad(
            "one FP8 operand of a and one of b per group",
            format!("{} of a and {} of b for {e_count} groups", a.len(), b.len()),
        );
    }
    let names = p.op().names();
    for e in (0..e_count).filter(|&e| p.sizes()[e] > 0) {
        for (operand, ops, name) in [(GroupedOperand::A, a, names[0]), (GroupedOperand::B, b, names[1])] {
            let Some(want) = p.tn_operand(operand, e) else { continue };
            let m = p.sizes()[e];
            let Some(t) = &ops[e] else {
                return bad("a group with rows has no FP8 operand", format!("{name}[{e}] is None, m[{e}] = {m}"));
            };
            let (r, c) = (t.layout.rows, t.layout.cols);
            if (r, c) != (want.rows, want.inner) {
                return bad(
                    "a group's FP8 operand is not of its TN shape",
                    format!("{name}[{e}] is [{r}, {c}] where [{}, {}] (m[{e}] = {m})", want.rows, want.inner),
                );
            }
        }
    }
    Ok(())
}

/// The output type against the problem's, and the bias against the problem.
fn check_output<O: Element>(p: &GroupedProblem, has_bias: bool) -> Result<()> {
    let want = p.precision().output();
    if O::DTYPE != want {
        return Err(Error::DTypeMismatch { operand: p.op().operands()[2], expected: want, got: O::DTYPE });
    }
    p.check_bias(has_bias)
}

/// A backward weight's empty groups (inner dimension 0: `dw[e] = β·dw[e]`) as byte ranges
/// of the output to zero (β = 0; none for β = 1).
///
/// # Errors
/// [`Error::Unsupported`] for an empty group and another β (no FP8 GEMM has an inner
/// dimension of 0 to scale it by).
fn empty_gradients(p: &GroupedProblem, opts: Fp8Options) -> Result<Vec<(u64, usize)>> {
    if p.op() != GroupedOp::BackwardWeight || opts.beta == 1.0 {
        return Ok(Vec::new());
    }
    let elem = p.precision().output().size_bytes();
    let empty: Vec<usize> = (0..p.groups()).filter(|&e| p.sizes()[e] == 0).collect();
    if opts.beta != 0.0 && !empty.is_empty() {
        return Err(Error::Unsupported {
            backend: "FP8 grouped GEMM",
            what: format!(
                "β = {} with empty groups {empty:?} of the backward weight: their dw[e] = β·dw[e] \
                 is offered for β = 0 (zeros) and β = 1 (kept)",
                opts.beta
            ),
        });
    }
    let bytes = p.n() * p.k() * elem;
    Ok(empty.into_iter().map(|e| ((p.tn_output(e).0 * elem) as u64, bytes)).collect())
}

/// Everything an FP8 grouped call's launches depend on, for its replay graph: a tag no other
/// grouped key starts with, the lanes, the zeroed regions, then per call its operands'
/// addresses (data and scales), layouts, formats and scalings, the output's type, address and
/// length, the bias and the options.
fn replay_key(calls: &[Fp8Call], addrs: &[[u64; 4]], zeroed: &[(u64, usize)], lanes: usize) -> Vec<u64> {
    let layout = |t: &Fp8Tensor| {
        let l = t.layout;
        [l.rows, l.rows_alloc, l.cols, l.ld, l.scaling as usize, t.format as usize].map(|x| x as u64)
    };
    let dtype = |d: crate::DType| d as u64;
    let mut key = vec![u64::MAX - 2, lanes as u64, zeroed.len() as u64];
    key.extend(zeroed.iter().flat_map(|&(at, bytes)| [at, bytes as u64]));
    for (c, a) in calls.iter().zip(addrs) {
        key.extend(a);
        key.extend(layout(c.x));
        key.extend(layout(c.w));
        let out = match c.out {
            OutputKind::Dense(d) => dtype(d),
            OutputKind::Fp8(f) => 16 + f as u64,
        };
        key.extend([out, c.y.0, c.y.1 as u64]);
        key.extend(c.bias.map_or([0; 3], |(at, len, d)| [at, len as u64, dtype(d)]));
        key.extend([c.d_scale.map_or(0, |d| d.0), c.amax.map_or(0, |a| a.0)]);
        let o = c.opts;
        key.extend([u64::from(o.alpha.to_bits()), u64::from(o.beta.to_bits()), u64::from(o.fast_accum)]);
    }
    key
}
