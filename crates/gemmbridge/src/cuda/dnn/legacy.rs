//! The legacy convolution API (`cudnnConvolutionForward` and friends): a plan's descriptors and
//! the algorithm chosen for it, once per problem, and its launch. The room's fallback where the
//! graph API (`graph.rs`) finds no engine, and selectable for comparisons
//! ([`super::ConvApi::Legacy`]).
//!
//! The choice: cuDNN's heuristic (`cudnnGetConvolution*Algorithm_v7`, its ranked list) by
//! default, or a measured search on request (`cudnnFindConvolution*AlgorithmEx` on the call's
//! own buffers: cuDNN times every algorithm once; it synchronises and overwrites the output).
//! Of the ranked candidates the first is taken that succeeded, fits the stream's workspace and
//! keeps the precision's promise (strict f32: `CUDNN_FMA_MATH` only); its math type is then
//! set on the convolution descriptor, because cuDNN picks the kernel from the pair (PyTorch
//! measured a 10× slowdown when the heuristic's math type is ignored, as cudarc's safe
//! `pick_algorithm` does).

use std::ffi::c_void;

use cudarc::cudnn::sys;

use super::sys::{check, math_ok, types, ActivationDesc, ConvDesc, FilterDesc, TensorDesc};
use super::{ConvCall, ConvOp, Measured};
use crate::conv::{Conv2d, ConvActivation};
use crate::error::{Error, Result};
use cudarc::cudnn::sys::cudnnHandle_t;

/// The algorithm chosen, in its direction's enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    /// cuDNN's name for it, e.g. `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`.
    pub fn name(&self) -> String {
        match self {
            Algo::Forward(a) => format!("{a:?}"),
            Algo::Data(a) => format!("{a:?}"),
            Algo::Filter(a) => format!("{a:?}"),
        }
    }
    /// Its value in its direction's enum (the tactic database's record).
    pub fn value(&self) -> u32 {
        match *self {
            Algo::Forward(a) => a as u32,
            Algo::Data(a) => a as u32,
            Algo::Filter(a) => a as u32,
        }
    }
}

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

/// The buffers a measured search runs on (device addresses) and the workspace it may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchBuffers {
    /// x (or dx), w (or dw), y (or dy).
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub workspace: (u64, usize),
}

/// What the three directions' performance records share.
trait Perf: Copy {
    fn status(&self) -> sys::cudnnStatus_t;
    fn memory(&self) -> usize;
    fn math(&self) -> sys::cudnnMathType_t;
    fn algo(&self) -> Algo;
    fn time(&self) -> f32;
}

macro_rules! perf {
    ($t:ty, $variant:ident) => {
        impl Perf for $t {
            fn status(&self) -> sys::cudnnStatus_t {
                self.status
            }
            fn memory(&self) -> usize {
                self.memory
            }
            fn math(&self) -> sys::cudnnMathType_t {
                self.mathType
            }
            fn algo(&self) -> Algo {
                Algo::$variant(self.algo)
            }
            fn time(&self) -> f32 {
                self.time
            }
        }
    };
}

perf!(sys::cudnnConvolutionFwdAlgoPerf_t, Forward);
perf!(sys::cudnnConvolutionBwdDataAlgoPerf_t, Data);
perf!(sys::cudnnConvolutionBwdFilterAlgoPerf_t, Filter);

/// Room for every algorithm cuDNN has in a direction (8, 6 and 7 in cuDNN 9).
const MAX_ALGOS: usize = 16;

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
    // SAFETY: forwarded; the descriptors are live.
    let problem = || format!("{} {op:?}", p.describe());
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
                 (candidates: {candidates:?}); raise Gpu::set_workspace_bytes",
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

/// A ranked candidate: algorithm, math type, workspace bytes and (measured) time in ms.
type Ranked = (Algo, sys::cudnnMathType_t, usize, f32);

pub(super) type Descs = (
    sys::cudnnTensorDescriptor_t,
    sys::cudnnFilterDescriptor_t,
    sys::cudnnTensorDescriptor_t,
    sys::cudnnConvolutionDescriptor_t,
);

/// The ranked candidates that succeeded.
unsafe fn rank(
    h: sys::cudnnHandle_t,
    op: ConvOp,
    (x, w, y, conv): Descs,
    search: Option<SearchBuffers>,
    problem: &dyn Fn() -> String,
) -> Result<Vec<Ranked>> {
    fn keep<P: Perf>(v: &[P], n: i32) -> Vec<Ranked> {
        let ok = sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
        v[..n.clamp(0, v.len() as i32) as usize]
            .iter()
            .filter(|r| r.status() == ok)
            .map(|r| (r.algo(), r.math(), r.memory(), r.time()))
            .collect()
    }
    let (mut n, req) = (0i32, MAX_ALGOS as i32);
    let cv = |a: u64| a as *const c_void;
    let mv = |a: u64| a as *mut c_void;
    // SAFETY (every arm): live descriptors, out-arrays of MAX_ALGOS records, the search's
    // buffers per the caller's contract.
    unsafe {
        match op {
            ConvOp::Forward | ConvOp::Fused(_) => {
                let mut r = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); MAX_ALGOS];
                let (st, name) = match search {
                    None => (
                        sys::cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, req, &mut n, r.as_mut_ptr()),
                        "cudnnGetConvolutionForwardAlgorithm_v7",
                    ),
                    Some(b) => (
                        sys::cudnnFindConvolutionForwardAlgorithmEx(
                            h,
                            x,
                            cv(b.x),
                            w,
                            cv(b.w),
                            conv,
                            y,
                            mv(b.y),
                            req,
                            &mut n,
                            r.as_mut_ptr(),
                            mv(b.workspace.0),
                            b.workspace.1,
                        ),
                        "cudnnFindConvolutionForwardAlgorithmEx",
                    ),
                };
                check(st, name, problem)?;
                Ok(keep(&r, n))
            }
            ConvOp::BackwardData => {
                let mut r = [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX_ALGOS];
                let (st, name) = match search {
                    None => (
                        sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, conv, x, req, &mut n, r.as_mut_ptr()),
                        "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                    ),
                    Some(b) => (
                        sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                            h,
                            w,
                            cv(b.w),
                            y,
                            cv(b.y),
                            conv,
                            x,
                            mv(b.x),
                            req,
                            &mut n,
                            r.as_mut_ptr(),
                            mv(b.workspace.0),
                            b.workspace.1,
                        ),
                        "cudnnFindConvolutionBackwardDataAlgorithmEx",
                    ),
                };
                check(st, name, problem)?;
                Ok(keep(&r, n))
            }
            ConvOp::BackwardFilter => {
                let mut r = [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX_ALGOS];
                let (st, name) = match search {
                    None => (
                        sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                            h,
                            x,
                            y,
                            conv,
                            w,
                            req,
                            &mut n,
                            r.as_mut_ptr(),
                        ),
                        "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                    ),
                    Some(b) => (
                        sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                            h,
                            x,
                            cv(b.x),
                            y,
                            cv(b.y),
                            conv,
                            w,
                            mv(b.w),
                            req,
                            &mut n,
                            r.as_mut_ptr(),
                            mv(b.workspace.0),
                            b.workspace.1,
                        ),
                        "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                    ),
                };
                check(st, name, problem)?;
                Ok(keep(&r, n))
            }
        }
    }
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

/// The unfused tail of a forward with bias and activation, after the convolution wrote `y`:
/// `y += bias` (`cudnnAddTensor`, the bias `[1, K, 1, 1]` broadcast), then (ReLU)
/// `y = relu(y)` (`cudnnActivationForward`, in place).
///
/// # Safety
/// `h` is live and bound to the call's stream; `y` (described by `yd`) and `bias` (by `bd`)
/// are device buffers of the problem's sizes.
pub(crate) unsafe fn bias_activation(
    h: cudnnHandle_t,
    (bd, bias): (&TensorDesc, u64),
    (yd, y): (&TensorDesc, u64),
    act: (&ActivationDesc, ConvActivation),
    describe: &dyn Fn() -> String,
) -> Result<()> {
    let one = 1.0f32;
    let a = &one as *const f32 as *const c_void;
    let zero = 0.0f32;
    let z = &zero as *const f32 as *const c_void;
    // SAFETY: live descriptors, device buffers per the caller's contract, f32 host scalars.
    unsafe {
        let st = sys::cudnnAddTensor(h, a, bd.raw(), bias as *const c_void, a, yd.raw(), y as *mut c_void);
        check(st, "cudnnAddTensor", describe)?;
        if act.1 == ConvActivation::Relu {
            let st = sys::cudnnActivationForward(
                h,
                act.0.raw(),
                a,
                yd.raw(),
                y as *const c_void,
                z,
                yd.raw(),
                y as *mut c_void,
            );
            check(st, "cudnnActivationForward", describe)?;
        }
    }
    Ok(())
}

/// The launch of one planned call (α = 1, β = 0: every output is overwritten).
///
/// # Safety
/// `h` is live and bound to the call's stream; the call's buffers are device buffers of its
/// problem's sizes; `ws` has at least the plan's workspace.
pub(crate) unsafe fn launch(h: cudnnHandle_t, call: &ConvCall, plan: &mut ConvPlan, ws: u64) -> Result<()> {
    let (p, op, b) = (call.problem, call.op, call.buffers);
    let (one, zero) = (1.0f32, 0.0f32);
    let (a, z) = (&one as *const f32 as *const c_void, &zero as *const f32 as *const c_void);
    let (wsp, wsb) = (ws as *mut c_void, plan.choice.workspace);
    let (x, w, y, conv) = (plan.x.raw(), plan.w.raw(), plan.y.raw(), plan.conv.raw());
    let (cx, cw, cy, my) = (b.x as *const c_void, b.w as *const c_void, b.y as *const c_void, b.y as *mut c_void);
    let describe = || format!("{} {op:?} {}", p.describe(), plan.choice.algo.name());
    // SAFETY (every call): live descriptors of the problem, device buffers of its sizes (the
    // caller's contract), a workspace of at least `wsb` bytes, host scalars of f32 (cuDNN's
    // scaling type for float, half and bfloat16 data).
    unsafe {
        match (op, plan.choice.algo) {
            (ConvOp::Forward, Algo::Forward(algo)) => {
                let st = sys::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
                check(st, "cudnnConvolutionForward", describe)
            }
            (ConvOp::Fused(act), Algo::Forward(algo)) => {
                let (bias, act_desc) =
                    (plan.bias.as_ref().expect("fused plan"), plan.act.as_ref().expect("fused plan"));
                let cb = b.bias as *const c_void;
                if plan.fused {
                    // y = act(1·conv(x, w) + 0·z + bias), z = y (not read: α2 = 0)
                    let st = sys::cudnnConvolutionBiasActivationForward(
                        h,
                        a,
                        x,
                        cx,
                        w,
                        cw,
                        conv,
                        algo,
                        wsp,
                        wsb,
                        z,
                        y,
                        cy,
                        bias.raw(),
                        cb,
                        act_desc.raw(),
                        y,
                        my,
                    );
                    let refused = matches!(
                        st,
                        sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED | sys::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM
                    );
                    if !refused {
                        return check(st, "cudnnConvolutionBiasActivationForward", describe);
                    }
                    plan.fused = false;
                    tracing::info!(
                        problem = %p.describe(), status = ?st,
                        "cuDNN refused the fused convolution + bias + activation; running it unfused (3 calls)"
                    );
                }
                let st = sys::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
                check(st, "cudnnConvolutionForward", describe)?;
                bias_activation(h, (bias, b.bias), (&plan.y, b.y), (act_desc, act), &describe)
            }
            (ConvOp::BackwardData, Algo::Data(algo)) => {
                let st = sys::cudnnConvolutionBackwardData(
                    h,
                    a,
                    w,
                    cw,
                    y,
                    cy,
                    conv,
                    algo,
                    wsp,
                    wsb,
                    z,
                    x,
                    b.x as *mut c_void,
                );
                check(st, "cudnnConvolutionBackwardData", describe)
            }
            (ConvOp::BackwardFilter, Algo::Filter(algo)) => {
                let st = sys::cudnnConvolutionBackwardFilter(
                    h,
                    a,
                    x,
                    cx,
                    y,
                    cy,
                    conv,
                    algo,
                    wsp,
                    wsb,
                    z,
                    w,
                    b.w as *mut c_void,
                );
                check(st, "cudnnConvolutionBackwardFilter", describe)
            }
            (op, algo) => Err(Error::Unsupported { backend: "cuDNN", what: format!("{op:?} with {}", algo.name()) }),
        }
    }
}
