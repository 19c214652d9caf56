//! The FP8 grouped forward: validate (the per-group operands against the problem, the output
//! and bias buffers, then every group's FP8 call as [`Gpu::fp8_gemm`] checks it) → each group's
//! FP8 GEMM through the routing floor's FP8 launch (`route/fp8.rs`: its plan, and the staged
//! copy where the output's rows miss the FP8 kernels' alignment) on the pool of streams
//! (`route/grouped.rs`), or in order. Nothing is launched until every group has passed.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::checks::{disjoint, same_context, Span};
use super::engine::Gpu;
use super::grouped::check_bias;
use crate::cuda::library;
use crate::cuda::route::fp8::{enqueue, no_lt, Fp8Call, Fp8Options, Fp8Tensor};
use crate::cuda::route::grouped::pooled_launches;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::OutputKind;
use crate::grouped::streams::GroupedBackend;
use crate::grouped::{GroupedOp, GroupedProblem};

impl Gpu {
    /// The grouped forward `p` in FP8: `y_e[m_e, N] = α·(x_e · w_eᵀ) (+ bias[e])` for every
    /// group with rows, where `x[e]` is group e's `[m_e, K]` operand (`None` for an empty
    /// group, whose entry is not read) and `w[e]` expert e's `[N, K]`, each an [`Fp8Tensor`]
    /// with its own scales ([`Gpu::grouped_quantize`] makes both from bf16/f16/f32 buffers).
    /// `y` is row-major `[rows, N]` of `O`, the problem's output type
    /// ([`crate::Precision::output`]: f32, f16 or bf16), rows sorted by group; `bias` `[E, N]`
    /// of `O` with [`GroupedProblem::with_bias`]. `opts` as [`Gpu::fp8_gemm`]'s, for every
    /// group; β ≠ 0 reads each group's rows of `y`. Rows past the last group are not written.
    ///
    /// Each group is one FP8 GEMM as [`Gpu::fp8_gemm`] runs it (every recipe of
    /// [`crate::fp8`]: tensor-wise, row-wise, 1×128 · 128×128 blocks, …, the scalings of x
    /// and w paired as there), spread over the pool of the engine's streams forked from and
    /// joined to [`Gpu::stream`] ([`Gpu::set_grouped_streams`]), or in order on
    /// [`Gpu::stream`] when one group has rows or [`GroupedBackend::InOrder`] is forced. Work
    /// enqueued on [`Gpu::stream`] afterwards sees every group. No host synchronisation; not
    /// replayed as a whole.
    ///
    /// # Errors
    /// Before anything is launched, with nothing written: [`Error::Unsupported`] for a backward
    /// product, or a forced backend other than the pool or in order;
    /// [`Error::GroupedShape`] when `x` or `w` has another number of entries than groups, or a
    /// group's operand is missing or has other rows or K than the problem's (values named);
    /// [`Error::WrongContext`]; [`Error::DTypeMismatch`] (`O` against the problem's output
    /// type); [`Error::BufferTooSmall`] for `y` (`rows · N`) or the bias (`E · N`);
    /// [`Error::OutputOverlapsInput`] (`y` against the bias); [`Error::EpilogueOperand`] (a
    /// bias given without [`GroupedProblem::has_bias`] or missing with it); [`Error::Fp8`] (a
    /// group's FP8 rule, as [`Gpu::fp8_gemm`]); [`Error::LibraryNotFound`] without cuBLASLt.
    /// From the launches: as [`Gpu::fp8_gemm`] (a failure part-way leaves other groups
    /// written; the pool is joined back all the same).
    pub fn grouped_fp8_gemm<O: Element>(
        &self,
        p: &GroupedProblem,
        x: &[Option<Fp8Tensor>],
        w: &[Fp8Tensor],
        y: &mut dyn DevicePtrMut<O>,
        bias: Option<&dyn DevicePtr<O>>,
        opts: Fp8Options,
    ) -> Result<()> {
        let lanes = self.fp8_grouped_lanes(p)?;
        check_operands(p, x, w)?;
        let ctx = self.context();
        for t in x.iter().flatten() {
            same_context(Which::A, t.data.stream(), ctx)?;
        }
        for t in w {
            same_context(Which::B, t.data.stream(), ctx)?;
        }
        same_context(Which::C, y.stream(), ctx)?;
        if let Some(v) = bias {
            same_context(Which::Bias, v.stream(), ctx)?;
        }
        check_output::<O>(p, bias.is_some())?;
        if !library::has_cublaslt() {
            return Err(no_lt());
        }
        let s = self.stream();
        let (pv, _gv) = match bias {
            Some(v) => {
                let (ptr, g) = v.device_ptr(s);
                (Some((ptr, v.num_bytes())), Some(g))
            }
            None => (None, None),
        };
        let y_len = y.num_bytes();
        let (py, _gy) = y.device_ptr_mut(s);
        let elem = O::DTYPE.size_bytes();
        let mut spans = vec![Span::sized(Which::C, py, y_len, p.rows() * p.n(), elem)?];
        if let Some((addr, have)) = pv {
            spans.push(Span::sized(Which::Bias, addr, have, p.groups() * p.n(), elem)?);
        }
        disjoint(&spans[..1], &spans[1..])?;
        // every group's call, checked before any is launched
        let platform = self.fp8_platform()?;
        let mut calls = Vec::with_capacity(p.groups());
        for (e, xe) in x.iter().enumerate() {
            let Some(xe) = xe.as_ref().filter(|_| p.sizes()[e] > 0) else { continue };
            let (y0, b0) = (p.row_start(e) * p.n() * elem, e * p.n() * elem);
            let call = Fp8Call {
                x: xe,
                w: &w[e],
                y: (py + y0 as u64, y_len - y0),
                out: OutputKind::Dense(O::DTYPE),
                bias: pv.map(|(addr, have)| (addr + b0 as u64, have - b0, O::DTYPE)),
                d_scale: None,
                amax: None,
                opts,
            };
            call.validate(platform)?;
            calls.push(call);
        }
        // the operands' addresses, their guards held until every launch is enqueued
        let mut addrs = Vec::with_capacity(calls.len());
        let mut guards = Vec::with_capacity(4 * calls.len());
        for c in &calls {
            let (xd, gx) = c.x.data.device_ptr(s);
            let (wd, gw) = c.w.data.device_ptr(s);
            let (xs, gxs) = c.x.scales.device_ptr(s);
            let (ws, gws) = c.w.scales.device_ptr(s);
            addrs.push([xd, wd, xs, ws]);
            guards.extend([gx, gw, gxs, gws]);
        }
        let work: Vec<u64> =
            calls.iter().map(|c| (c.x.layout.rows * c.w.layout.rows * c.x.layout.cols) as u64).collect();
        self.device().bind()?;
        let mut st = self.lock();
        let describe = || format!("{} FP8 grouped GEMMs", calls.len());
        // SAFETY: every call passed `validate` on live buffers borrowed for this call (the
        // guards above); each launch enqueues one of them on the stream it is given, a lane of
        // the device (with its workspace) or the caller's stream.
        let done = unsafe {
            pooled_launches(&mut st, &work, lanes, s.cu_stream(), &describe, |st, e, stream| {
                enqueue(st, &calls[e], addrs[e], stream)
            })
        };
        // Even after a failure: part of the work may be enqueued.
        self.device().note_use(&mut st, s.cu_stream())?;
        done
    }

    /// The lanes an FP8 grouped forward spreads over: the stream setting, or 1 (in order, on
    /// the caller's stream) when [`GroupedBackend::InOrder`] is forced.
    fn fp8_grouped_lanes(&self, p: &GroupedProblem) -> Result<usize> {
        let unsupported = |what: String| Err(Error::Unsupported { backend: "FP8 grouped GEMM", what });
        if p.op() != GroupedOp::Forward {
            return unsupported(format!("{}: FP8 groups are offered for the forward only", p.describe()));
        }
        let (backend, streams) = {
            let st = self.lock();
            (st.libs.grouped.backend, st.libs.grouped.streams)
        };
        match backend {
            None | Some(GroupedBackend::StreamPool) => Ok(streams),
            Some(GroupedBackend::InOrder) => Ok(1),
            Some(other) => unsupported(format!(
                "{other:?} is forced: FP8 groups run on the pool of streams or in order ({})",
                p.describe()
            )),
        }
    }
}

/// One operand per group, each of the problem's rows and K.
fn check_operands(p: &GroupedProblem, x: &[Option<Fp8Tensor>], w: &[Fp8Tensor]) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
    let e_count = p.groups();
    if x.len() != e_count || w.len() != e_count {
        return bad(
            "one FP8 operand of x and one of w per group",
            format!("{} of x and {} of w for {e_count} groups", x.len(), w.len()),
        );
    }
    for (e, (xe, we)) in x.iter().zip(w).enumerate() {
        let m = p.sizes()[e];
        let (wl, k, n) = (we.layout, p.k(), p.n());
        if (wl.rows, wl.cols) != (n, k) {
            return bad(
                "an expert's w is not [N, K]",
                format!("w[{e}] is [{}, {}], N = {n}, K = {k}", wl.rows, wl.cols),
            );
        }
        match xe {
            None if m > 0 => return bad("a group with rows has no x", format!("x[{e}] is None, m[{e}] = {m}")),
            Some(t) if m > 0 && (t.layout.rows, t.layout.cols) != (m, k) => {
                let (r, c) = (t.layout.rows, t.layout.cols);
                return bad("a group's x is not [m_e, K]", format!("x[{e}] is [{r}, {c}], m[{e}] = {m}, K = {k}"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The output type against the problem's, and the bias against the problem.
fn check_output<O: Element>(p: &GroupedProblem, has_bias: bool) -> Result<()> {
    let want = p.precision().output();
    if O::DTYPE != want {
        return Err(Error::DTypeMismatch { operand: Which::C, expected: want, got: O::DTYPE });
    }
    check_bias(p, has_bias)
}
