//! The grouped GEMM entry point: validate (every buffer's context, dtype and length, the
//! output apart from the inputs, then each group's GEMM as the dense entry checks it) → one
//! GEMM per group on [`Gpu::stream`], in group order, through the routing floor's dense path
//! (cuBLASLt's plan per group shape, kept and replayed as any GEMM's). Nothing is launched
//! until every group has passed its checks.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::checks::{disjoint, same_context, Span};
use super::engine::Gpu;
use super::operands::{check_all, RawBuffer, RawExtras};
use crate::cuda::call::Scale;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::grouped::GroupedProblem;
use crate::validate::BufferDesc;

/// One group's GEMM, ready to launch.
struct GroupCall {
    p: crate::problem::GemmProblem,
    descs: [BufferDesc; 3],
    bias: Option<RawBuffer>,
}

impl Gpu {
    /// The grouped product `p` ([`crate::grouped`]: a mixture-of-experts layer's forward
    /// `y = x·w[e]ᵀ (+ bias[e])`, backward data `dx = dy·w[e]` or backward weight
    /// `dw[e] = dy[e]ᵀ·x[e]`, rows sorted by group) on row-major contiguous buffers in argument
    /// order ([`GroupedOp::names`](crate::grouped::GroupedOp::names)): `a`, `b` read, `c`
    /// written; `bias` (`[E, N]`, forward with [`GroupedProblem::with_bias`] only). Every
    /// buffer holds `T`, the precision's input and output type (f32 for f32 and tf32, f16, bf16);
    /// lengths in elements at least [`GroupedProblem::lens`]. Rows of `c` past the last group
    /// are not written; an empty group writes nothing in the forward and backward data, and
    /// zeros into its `dw[e]` (k = 0: β·C with β = 0).
    ///
    /// Backend: one GEMM per non-empty group on [`Gpu::stream`], in group order, through the
    /// same path as [`Gpu::gemm`] (cuBLASLt, each group shape's plan kept). Group sizes are
    /// host counts, so a call is capturable once each group shape has been planned: run it once
    /// outside the capture first. Inside a capture, a group shape not planned yet fails with
    /// [`Error::NotCapturable`] after the groups before it were recorded: end the capture and
    /// discard it.
    ///
    /// # Errors
    /// Before anything is launched, with no buffer written: [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`] (a buffer's `T` against the precision's), [`Error::BufferTooSmall`]
    /// (a buffer shorter than [`GroupedProblem::lens`], a bias shorter than `E·N`),
    /// [`Error::OutputOverlapsInput`] (the output's extent against an input's, the bias's
    /// included), [`Error::EpilogueOperand`] (a bias given without
    /// [`GroupedProblem::has_bias`] or missing with it), and each group's GEMM checks as
    /// [`Gpu::gemm`]'s. From the launches: as [`Gpu::gemm`] (a failure part-way leaves the
    /// earlier groups written).
    pub fn grouped_gemm<T: Element>(
        &self,
        p: &GroupedProblem,
        a: &dyn DevicePtr<T>,
        b: &dyn DevicePtr<T>,
        c: &mut dyn DevicePtrMut<T>,
        bias: Option<&dyn DevicePtr<T>>,
    ) -> Result<()> {
        let ctx = self.context();
        let names = [Which::A, Which::B, Which::C];
        same_context(Which::A, a.stream(), ctx)?;
        same_context(Which::B, b.stream(), ctx)?;
        same_context(Which::C, c.stream(), ctx)?;
        if let Some(v) = bias {
            same_context(Which::Bias, v.stream(), ctx)?;
        }
        let pr = p.precision();
        for (which, want) in [(Which::A, pr.input()), (Which::C, pr.output())] {
            if T::DTYPE != want {
                return Err(Error::DTypeMismatch { operand: which, expected: want, got: T::DTYPE });
            }
        }
        if bias.is_some() != p.has_bias() {
            let problem =
                if p.has_bias() { "is missing (the problem has a bias)" } else { "was given to a problem without one" };
            return Err(Error::EpilogueOperand { epilogue: crate::Epilogue::Bias, operand: "bias", problem });
        }
        let s = self.stream();
        let (pa, _ra) = a.device_ptr(s);
        let (pb, _rb) = b.device_ptr(s);
        let (pv, _rv) = match bias {
            Some(v) => {
                let (ptr, g) = v.device_ptr(s);
                (Some((ptr, v.num_bytes())), Some(g))
            }
            None => (None, None),
        };
        let (lc, pc) = (c.num_bytes(), c.device_ptr_mut(s));
        let (pc, _wc) = pc;
        let elem = T::DTYPE.size_bytes();
        let bufs = [(pa, a.num_bytes()), (pb, b.num_bytes()), (pc, lc)];
        let mut spans = Vec::with_capacity(4);
        for ((which, (addr, have)), elems) in names.into_iter().zip(bufs).zip(p.lens()) {
            spans.push(Span::sized(which, addr, have, elems, elem)?);
        }
        if let Some((addr, have)) = pv {
            spans.push(Span::sized(Which::Bias, addr, have, p.groups().saturating_mul(p.n()), elem)?);
        }
        // the output against every input (a, b and the bias): an earlier group's rows of c
        // must not be what a later group reads
        let (out, ins): (Vec<Span>, Vec<Span>) = spans.iter().partition(|s| s.which == Which::C);
        disjoint(&out, &ins)?;
        let calls = group_calls(p, bufs, pv, elem)?;
        for call in &calls {
            let extras = RawExtras { bias: call.bias, aux: None };
            // SAFETY: every address is a live cudarc allocation of this context borrowed for
            // this call (the guards above); each group's slice lies inside its buffer
            // and passed check_all (`group_calls`), the output apart from the inputs.
            unsafe { self.enqueue_checked(&call.p, Scale::PRODUCT, call.descs, extras, s.cu_stream()) }?;
        }
        Ok(())
    }
}

/// Each group's GEMM on its slices of the buffers `bufs` (address, bytes), every one checked
/// as the dense entry checks a call, before any is launched.
fn group_calls(
    p: &GroupedProblem,
    bufs: [(u64, usize); 3],
    bias: Option<(u64, usize)>,
    elem: usize,
) -> Result<Vec<GroupCall>> {
    let (pr, mut calls) = (p.precision(), Vec::with_capacity(p.groups()));
    let dtypes = [pr.input(), pr.input(), pr.output()];
    for e in 0..p.groups() {
        let (g, offs) = p.group(e)?;
        let slice = |(addr, len): (u64, usize), off: usize| {
            let at = off.saturating_mul(elem).min(len);
            (addr + at as u64, len - at)
        };
        let descs = [0, 1, 2].map(|i| {
            let (address, len_bytes) = slice(bufs[i], offs[i]);
            BufferDesc { address, len_bytes, dtype: dtypes[i] }
        });
        let bias = bias.map(|v| {
            let (address, len_bytes) = slice(v, e * p.n());
            RawBuffer { address, len_bytes }
        });
        check_all(&g, descs, RawExtras { bias, aux: None })?;
        if !g.is_empty() {
            calls.push(GroupCall { p: g, descs, bias });
        }
    }
    Ok(calls)
}
