//! The misaligned-operand path: a call whose operands are off 16 bytes runs on aligned,
//! zero-padded copies (`crate::pad` plans them), when the problem is large enough for the
//! copies to pay ([`Padding`]). The aligned call itself goes back through the caller's route
//! (the dispatch), given as a function so that this module does not depend on it.

use crate::cuda::call::GemmCall;
use crate::cuda::device::{copy_pitched, pad_copy, zero_pitched, KernelSet, Locked, PadCopy, Pitched, Scratch};
use crate::cuda::route::padding::Padding;
use crate::cuda::route::{Libraries, Served};
use crate::epilogue::Epilogue;
use crate::error::Result;
use crate::mapping::column_major_call;
use crate::pad::{self, Copy, PadPlan, ZeroPad};

/// The pad plan of `r` when the settings call for one.
pub(crate) fn plan(padding: &Padding, r: &GemmCall) -> Option<PadPlan> {
    let p = r.problem;
    if !padding.enabled || p.macs() < padding.min_macs(p.precision()) {
        return None;
    }
    if r.alpha == 0.0 && p.epilogue() == Epilogue::None {
        return None; // C = β·C: A and B are not read
    }
    // A separate C that is read and misaligned is what decides C's staging (laid out as the
    // output, so only its address can differ).
    let c = r.c_in.filter(|ci| r.beta != 0.0 && !ci.is_multiple_of(pad::ALIGN_BYTES as u64)).unwrap_or(r.abc.2);
    pad::plan(p, [r.abc.0, r.abc.1, c])
}

/// The function that runs a request on a library (the dispatch's route).
pub(crate) type Route = unsafe fn(&mut Locked<Libraries>, &GemmCall) -> Result<Served>;

/// Runs `r` through `plan`, the aligned request through `route`; `None` when no scratch could
/// be had (the caller runs `r` directly).
///
/// # Safety
/// `r`'s operands were validated for its problem and stay valid until it has run on its
/// stream, a live stream of the bound context; `route` runs a request under the same contract.
pub(crate) unsafe fn enqueue(
    st: &mut Locked<Libraries>,
    r: &GemmCall,
    plan: &PadPlan,
    route: Route,
) -> Option<Result<Served>> {
    // SAFETY: the request's stream is live (the caller's contract).
    let scratch = match unsafe { Scratch::alloc(plan.scratch_bytes, r.stream) } {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(problem = %r.problem.describe(), bytes = plan.scratch_bytes, error = %e,
                "no scratch for aligned copies; running the misaligned call directly");
            return None;
        }
    };
    // SAFETY: forwarded; the scratch is ours, in stream order.
    Some(unsafe { run(st, r, plan, scratch.ptr, route) })
    // `scratch` is freed here, in stream order after the copy back.
}

/// Copies in, the aligned GEMM, C back. The copies run on gemmbridge's own copy kernel
/// (`device/kernels/copy.cu`), or on the driver's pitched copies and fills where the kernel
/// cannot be had (no NVRTC, or its first compilation would fall inside a graph capture).
///
/// # Safety
/// As [`enqueue`]; `base` holds `plan.scratch_bytes` for this stream.
unsafe fn run(st: &mut Locked<Libraries>, r: &GemmCall, plan: &PadPlan, base: u64, route: Route) -> Result<Served> {
    let esize = |c: &Copy| {
        let prec = r.problem.precision();
        let vector_or_c = matches!(c.which, crate::Which::C | crate::Which::Bias);
        if vector_or_c { prec.output() } else { prec.input() }.size_bytes()
    };
    let at = |c: Option<Copy>, user: u64| c.map_or(user, |c| base + c.offset as u64);
    let beta_reads_c = r.beta != 0.0;
    // C is staged in from where it is read: a separate C, or the output itself
    let ins = [(plan.a, r.abc.0), (plan.b, r.abc.1), (plan.bias, r.bias.unwrap_or(0))]
        .into_iter()
        .chain(beta_reads_c.then_some((plan.c, r.c_in.unwrap_or(r.abc.2))))
        .filter_map(|(copy, user)| copy.map(|c| (c, user)));
    for (c, user) in ins {
        let pad = kernel_copy(&c, base + c.offset as u64, user, esize(&c), false);
        // SAFETY: validated user buffer; scratch sized by the plan; β ≠ 0 reads C.
        unsafe { enqueue_copy(st, &pad, r.stream, || copy_in_driver(&c, user, base, esize(&c), r.stream)) }?;
    }
    let aligned = GemmCall {
        problem: &plan.problem,
        cm: column_major_call(&plan.problem),
        abc: (at(plan.a, r.abc.0), at(plan.b, r.abc.1), at(plan.c, r.abc.2)),
        // a staged C holds C_in's values and is computed in place; an unstaged one reads C_in
        c_in: if plan.c.is_some() { None } else { r.c_in },
        bias: r.bias.map(|user| at(plan.bias, user)),
        ..*r
    };
    // SAFETY: the copies hold the operands; the rest is the caller's.
    let served = unsafe { route(st, &aligned) }?;
    if let Some(c) = plan.c {
        let ours = base + c.offset as u64;
        let back = kernel_copy(&c, ours, r.abc.2, esize(&c), true);
        // SAFETY: the logical m×n of the staged C back into the caller's C.
        unsafe {
            enqueue_copy(st, &back, r.stream, || copy_pitched(&pitched(&c, ours, r.abc.2, esize(&c), true), r.stream))
        }?;
    }
    Ok(served)
}

/// Enqueues `pad` with the copy kernel, or runs `driver` (the same copy by the driver) where
/// the kernel cannot be had or has no launch for it.
///
/// # Safety
/// `pad` describes device memory valid for it on `stream`, a live stream of the bound
/// context; `driver` enqueues the same copy under the same contract.
unsafe fn enqueue_copy(
    st: &mut Locked<Libraries>,
    pad: &PadCopy,
    stream: cudarc::driver::sys::CUstream,
    driver: impl FnOnce() -> Result<()>,
) -> Result<()> {
    match st.dev.kernels(stream, KernelSet::Copy) {
        // SAFETY: the caller's contract.
        Ok(k) => {
            if unsafe { pad_copy(k, pad, stream) }? {
                return Ok(());
            }
        }
        Err(e) => tracing::debug!(error = %e, "no copy kernel; the driver copies the misaligned operands"),
    }
    driver()
}

/// The kernel copy of `c`'s logical elements between the caller's buffer at `user` and scratch
/// at `ours`: in (`out` false), the copy's whole scratch extent written, the extended rows and
/// columns as zeros (C's extra columns too: harmless, they are only written by the GEMM); out,
/// the staged C's logical part back into the caller's.
fn kernel_copy(c: &Copy, ours: u64, user: u64, esize: usize, out: bool) -> PadCopy {
    let (s, d) = (c.src, c.dst);
    let ((src, from), (dst, to)) = if out { ((ours, d), (user, s)) } else { ((user, s), (ours, d)) };
    PadCopy {
        src,
        src_ld: from.ld,
        src_slice: from.batch_stride,
        dst,
        dst_ld: to.ld,
        dst_slice: to.batch_stride,
        rows: s.rows,
        cols: s.cols,
        dst_rows: to.rows,
        dst_cols: to.cols,
        depth: c.depth,
        esize,
    }
}

/// The pitched copy of `c`'s logical elements: caller's buffer → scratch, or back (`out`).
fn pitched(c: &Copy, scratch: u64, user: u64, esize: usize, out: bool) -> Pitched {
    let (s, d) = (c.src, c.dst);
    let copy_in = Pitched {
        src: user,
        src_pitch: s.ld * esize,
        src_slice: s.batch_stride * esize,
        dst: scratch,
        dst_pitch: d.ld * esize,
        dst_slice: d.batch_stride * esize,
        width_bytes: s.cols * esize,
        height: s.rows,
        depth: c.depth,
    };
    if out {
        copy_in.reversed()
    } else {
        copy_in
    }
}

/// The driver's way: the zero fill of the extended K-range (if any), then the copy of the
/// user's matrix in.
///
/// # Safety
/// As [`run`].
unsafe fn copy_in_driver(
    c: &Copy,
    user: u64,
    base: u64,
    esize: usize,
    stream: cudarc::driver::sys::CUstream,
) -> Result<()> {
    let ours = base + c.offset as u64;
    let d = c.dst;
    let (pitch, slice) = (d.ld * esize, d.batch_stride.max(d.rows * d.ld) * esize);
    for zero in c.zero.into_iter().flatten() {
        // SAFETY (both): inside the scratch region the plan sized.
        match zero {
            ZeroPad::Cols { from, to } => unsafe {
                // columns from..to of every row of every matrix (matrices are contiguous rows)
                zero_pitched(ours + (from * esize) as u64, pitch, (to - from) * esize, d.rows * c.depth, stream)
            }?,
            ZeroPad::Rows { from, to } => unsafe {
                // rows from..to of each matrix: one block per matrix, `slice` apart
                zero_pitched(ours + (from * pitch) as u64, slice, (to - from) * pitch, c.depth, stream)
            }?,
        }
    }
    // SAFETY: the caller's contract.
    unsafe { copy_pitched(&pitched(c, ours, user, esize, false), stream) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GemmProblem, Precision};

    /// The kernel's copies move the same elements as the driver's pitched copies they replace:
    /// the same addresses, pitches, slices and logical extent; in, the kernel also writes the
    /// scratch's extended rows and columns (the driver path's zero fills).
    #[test]
    fn kernel_copies_match_the_driver_copies() {
        let al = 0x7f00_0000_0000u64;
        let p = GemmProblem::matmul(64, 63, 65, Precision::BF16).unwrap().batched(3).unwrap();
        let plan = pad::plan(&p, [al, al, al]).expect("K and N odd");
        for c in [plan.a.unwrap(), plan.b.unwrap(), plan.c.unwrap()] {
            let (ours, user, e) = (0x1000_0000, 0x2000_0000, 2);
            for out in [false, true] {
                let k = kernel_copy(&c, ours, user, e, out);
                let d = pitched(&c, ours, user, e, out);
                assert_eq!((k.src, k.dst), (d.src, d.dst), "{c:?} out {out}");
                assert_eq!((k.src_ld * e, k.src_slice * e), (d.src_pitch, d.src_slice));
                assert_eq!((k.dst_ld * e, k.dst_slice * e), (d.dst_pitch, d.dst_slice));
                assert_eq!((k.cols * e, k.rows, k.depth), (d.width_bytes, d.height, d.depth));
                let extent = if out { (c.src.rows, c.src.cols) } else { (c.dst.rows, c.dst.cols) };
                assert_eq!((k.dst_rows, k.dst_cols), extent);
            }
        }
    }
}
