//! The legacy convolution API (`cudnnConvolutionForward` and friends): a plan's descriptors and
//! the algorithm chosen for it, once per problem (the candidates: `legacy_rank.rs`; the
//! launches: `legacy_launch.rs`). The room's fallback where the graph API (`graph.rs`) finds no
//! engine, and selectable for comparisons ([`super::ConvApi::Legacy`]).
//!
//! The choice: cuDNN's heuristic (`cudnnGetConvolution*Algorithm_v7`, its ranked list) by
//! default, or a measured search on request (`cudnnFindConvolution*AlgorithmEx` on the call's
//! own buffers: cuDNN times every algorithm once; it synchronises and overwrites the output).
//! Of the ranked candidates the first is taken that succeeded, fits the stream's workspace and
//! keeps the precision's promise (strict f32: `CUDNN_FMA_MATH` only); its math type is then
//! set on the convolution descriptor, because cuDNN picks the kernel from the pair (PyTorch
//! measured a 10× slowdown when the heuristic's math type is ignored, as cudarc's safe
//! `pick_algorithm` does).

use cudarc::cudnn::sys;

use super::legacy_rank::Descs;
use super::legacy_rank::{rank, Ranked};
pub(crate) use super::legacy_rank::{Algo, SearchBuffers};
use super::sys::{check, math_ok, types, ActivationDesc, ConvDesc, FilterDesc, TensorDesc};
use super::{ConvOp, Measured};
use crate::conv::{Conv2d, ConvActivation};
use crate::error::{Error, Result};

/// The chosen algorithm, its math type and its workspace in bytes; a measured search's times
/// (the heuristic's choice and this one, as `cudnnFind…` timed them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Choice {
    pub algo: Algo,
    pub math: sys::cudnnMathType_t,
    pub workspace: usize,
    pub measured: Option<Measured>,
}

/// Descriptors and choice of one problem and direction.
pub(crate) struct ConvPlan {
    pub x: TensorDesc,
    pub w: FilterDesc,
    pub y: TensorDesc,
    pub conv: ConvDesc,
    pub choice: Choice,
    /// Fused forward: the bias `[1, K, 1, 1]` and the activation.
    pub bias: Option<TensorDesc>,
    pub act: Option<ActivationDesc>,
    /// Fused forward: whether `cudnnConvolutionBiasActivationForward` runs it (set false the
    /// first time cuDNN refuses; the convolution, `cudnnAddTensor` and
    /// `cudnnActivationForward` then run it).
    pub fused: bool,
    /// Whether the choice came from the tactic database.
    pub from_database: bool,
}

/// Makes the plan for `p` and `op`: descriptors, then the heuristic's (or, with `search`, the
/// measured) ranking, then the first candidate that fits `workspace_limit` bytes.
///
/// # Safety
/// `h` is a live handle bound to the call's stream; with `search`, its addresses are device
/// memory of the problem's sizes (the search writes the output) and its workspace is valid.
pub(crate) unsafe fn make(
    h: sys::cudnnHandle_t,
    p: &Conv2d,
    op: ConvOp,
    workspace_limit: usize,
    search: Option<SearchBuffers>,
) -> Result<ConvPlan> {
    let (dtype, math) = types(p.precision);
    let x = TensorDesc::new(dtype, p.x_dims(), p.layout)?;
    let w = FilterDesc::new(dtype, p.w_dims(), p.layout)?;
    let y = TensorDesc::new(dtype, p.y_dims(), p.layout)?;
    let conv = ConvDesc::new(p, math)?;
    let descs = (x.raw(), w.raw(), y.raw(), conv.raw());
    let problem = || format!("{} {op:?}", p.describe());
    // SAFETY: forwarded; the descriptors are live.
    let candidates = unsafe { rank(h, op, descs, search, &problem)? };
    let fits = |c: &&Ranked| c.2 <= workspace_limit && math_ok(p.precision, c.1);
    // the identity activation of the fused call exists only with IMPLICIT_PRECOMP_GEMM (cuDNN
    // documentation, cudnnConvolutionBiasActivationForward): those first, then the rest
    let precomp = Algo::Forward(sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
    let first = |c: &&Ranked| op == ConvOp::Fused(ConvActivation::Identity) && c.0 == precomp;
    let ordered = candidates.iter().filter(first).chain(candidates.iter().filter(|c| !first(c)));
    let mut chosen = None;
    for &(algo, math, _, ms) in ordered.filter(fits) {
        conv.set_math(math)?;
        // SAFETY: forwarded; the descriptors are live and the math type is set.
        let workspace = unsafe { workspace_size(h, descs, algo)? };
        if workspace <= workspace_limit {
            let measured = search.map(|_| Measured { heuristic_ms: f64::from(ms), tuned_ms: f64::from(ms) });
            chosen = Some(Choice { algo, math, workspace, measured });
            break;
        }
    }
    if let Some(Choice { measured: Some(m), math: chosen_math, .. }) = chosen.as_mut() {
        // the heuristic's first candidate that fits (asked as without a search, with the
        // precision's math type), at the time cudnnFind… measured for it
        conv.set_math(math)?;
        // SAFETY: forwarded; a heuristic query (no GPU work).
        let heuristic = unsafe { rank(h, op, descs, None, &problem) }.unwrap_or_default();
        let mut ordered = heuristic.iter().filter(first).chain(heuristic.iter().filter(|c| !first(c)));
        if let Some(heur) = ordered.find(fits) {
            if let Some(timed) = candidates.iter().find(|c| (c.0, c.1) == (heur.0, heur.1)) {
                m.heuristic_ms = f64::from(timed.3);
            }
        }
        conv.set_math(*chosen_math)?;
    }
    let Some(choice) = chosen else {
        return Err(Error::Unsupported {
            backend: "cuDNN",
            what: format!(
                "{} {op:?}: no algorithm fits a workspace of {workspace_limit} bytes at this precision \
                 (candidates: {candidates:?}); raise GpuOptions::workspace_bytes",
                p.describe()
            ),
        });
    };
    let (bias, act) = match op {
        ConvOp::Fused(a) => (Some(TensorDesc::new(dtype, [1, p.k, 1, 1], p.layout)?), Some(ActivationDesc::new(a)?)),
        _ => (None, None),
    };
    tracing::debug!(problem = %p.describe(), ?op, algo = %choice.algo.name(), math = ?choice.math, workspace = choice.workspace, "cuDNN plan");
    Ok(ConvPlan { x, w, y, conv, choice, bias, act, fused: true, from_database: false })
}

/// The exact workspace of `algo` with the descriptor's math type as set.
pub(super) unsafe fn workspace_size(h: sys::cudnnHandle_t, (x, w, y, conv): Descs, algo: Algo) -> Result<usize> {
    let mut bytes = 0usize;
    // SAFETY: live descriptors, a valid out-pointer.
    let (st, name) = unsafe {
        match algo {
            Algo::Forward(a) => (
                sys::cudnnGetConvolutionForwardWorkspaceSize(h, x, w, conv, y, a, &mut bytes),
                "cudnnGetConvolutionForwardWorkspaceSize",
            ),
            Algo::Data(a) => (
                sys::cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, conv, x, a, &mut bytes),
                "cudnnGetConvolutionBackwardDataWorkspaceSize",
            ),
            Algo::Filter(a) => (
                sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, conv, w, a, &mut bytes),
                "cudnnGetConvolutionBackwardFilterWorkspaceSize",
            ),
        }
    };
    check(st, name, || algo.name())?;
    Ok(bytes)
}
