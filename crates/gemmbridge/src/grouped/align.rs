//! The pointer alignment cuBLAS's grouped call needs, and the way taken instead where a call's
//! pointers miss it.
//!
//! `cublasGemmGroupedBatchedEx` reads every GEMM's A, B and C pointers from arrays in device
//! memory, so cuBLAS cannot look at them when it picks a kernel: its documentation of the
//! batched and grouped GEMMs asks that, with tensor-core (fast) math, every such pointer be
//! aligned, ideally to 16 bytes, the alignment its vectorised loads assume. A pointer off that
//! alignment is a misaligned-address fault, which ends the CUDA context. gemmbridge never hands
//! it one: the ways through that call ([`GroupedBackend::uses_grouped_call`]) are taken only
//! where every pointer is 16-byte aligned, and the pool of per-GEMM cuBLASLt plans (which see
//! each pointer) serves the rest.

use super::streams::GroupedBackend;
use super::GroupedProblem;
use crate::error::{Error, Result, Which};

/// The alignment, in bytes, of every A, B and C pointer a cuBLAS grouped call is given here.
pub const GROUPED_CALL_ALIGN: u64 = 16;

impl GroupedBackend {
    /// Whether this way runs cuBLAS's grouped call ([`GroupedBackend::GroupedBatched`]), which
    /// takes only pointers aligned to [`GROUPED_CALL_ALIGN`] bytes.
    pub fn uses_grouped_call(self) -> bool {
        self == GroupedBackend::GroupedBatched
    }
}

/// Why some pointer a grouped call of `p` on buffers at `bases` (`[a, b, c]`, device
/// addresses) would hand cuBLAS's grouped call is off [`GROUPED_CALL_ALIGN`], or `None` where
/// none is. Every group's (and row chunk's) slice starts a whole number of rows (N or K
/// elements) or weight matrices (N·K elements) past its buffer's start, so every pointer is
/// aligned where every base is and a row of N and of K elements is a whole number of
/// alignments.
pub fn grouped_call_misalignment(p: &GroupedProblem, bases: [u64; 3]) -> Option<String> {
    let elem = p.precision().input().size_bytes() as u64;
    let off = |a: u64| !a.is_multiple_of(GROUPED_CALL_ALIGN);
    if let Some((which, addr)) = p.op().operands().into_iter().zip(bases).find(|&(_, a)| off(a)) {
        return Some(misaligned_pointer(which, addr));
    }
    [("N", p.n()), ("K", p.k())].into_iter().find(|&(_, d)| off(d as u64 * elem)).map(|(name, d)| {
        format!(
            "a row of {name} = {d} elements is {} bytes, so the groups' slices start off the {GROUPED_CALL_ALIGN}-byte \
             alignment cuBLAS's grouped call needs of every pointer",
            d as u64 * elem
        )
    })
}

/// Why `(which, addr)`, the first of a call's pointers off [`GROUPED_CALL_ALIGN`], keeps
/// cuBLAS's grouped call away.
pub(crate) fn misaligned_pointer(which: Which, addr: u64) -> String {
    format!("{which} at {addr:#x} is not {GROUPED_CALL_ALIGN}-byte aligned, as cuBLAS's grouped call needs of every pointer")
}

/// The way to take for a call chosen `how`, given why its pointers are off the grouped call's
/// alignment (`misaligned`, `None` where they are not): `how` unless it runs cuBLAS's grouped
/// call on misaligned pointers; then the pool.
///
/// # Errors
/// [`Error::Unsupported`] naming `what` and why, where such a way is `forced`.
pub(crate) fn off_grouped_call(
    how: GroupedBackend,
    misaligned: Option<String>,
    forced: bool,
    what: impl FnOnce() -> String,
) -> Result<GroupedBackend> {
    match misaligned {
        Some(why) if how.uses_grouped_call() && forced => {
            Err(Error::Unsupported { backend: "grouped GEMM", what: format!("{how:?} for {}: {why}", what()) })
        }
        Some(_) if how.uses_grouped_call() => Ok(GroupedBackend::StreamPool),
        _ => Ok(how),
    }
}

/// [`super::streams::candidates`] for `p` on buffers at `bases` (`[a, b, c]`), the loaded cuDNN
/// having (`cudnn_moe`) or lacking the MoE grouped matmul: without cuBLAS's grouped call where a
/// pointer would miss its alignment ([`grouped_call_misalignment`]).
pub fn candidates_at(p: &GroupedProblem, bases: [u64; 3], cudnn_moe: bool) -> Vec<GroupedBackend> {
    let mut out = super::streams::candidates(p, cudnn_moe);
    if grouped_call_misalignment(p, bases).is_some() {
        out.retain(|b| !b.uses_grouped_call());
    }
    out
}

#[cfg(test)]
#[path = "align_tests.rs"]
mod tests;
