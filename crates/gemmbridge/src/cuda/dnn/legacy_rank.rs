//! The legacy API's candidates for a problem and direction, ranked by cuDNN: its heuristic
//! (`cudnnGetConvolution*Algorithm_v7`) or a measured search (`cudnnFindConvolution*AlgorithmEx`
//! on the call's own buffers), the three directions' performance records read alike.

use std::ffi::c_void;

use cudarc::cudnn::sys;

use super::sys::check;
use super::ConvOp;
use crate::error::Result;

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

/// The buffers a measured search runs on (device addresses) and the workspace it may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchBuffers {
    /// x (or dx), w (or dw), y (or dy).
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub workspace: (u64, usize),
}

/// A problem's descriptors: x, w, y and the convolution.
pub(super) type Descs = (
    sys::cudnnTensorDescriptor_t,
    sys::cudnnFilterDescriptor_t,
    sys::cudnnTensorDescriptor_t,
    sys::cudnnConvolutionDescriptor_t,
);

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

/// A ranked candidate: algorithm, math type, workspace bytes and (measured) time in ms.
pub(super) type Ranked = (Algo, sys::cudnnMathType_t, usize, f32);

/// The ranked candidates that succeeded: cuDNN's heuristic list, or with `search` the
/// measured one.
///
/// # Safety
/// `h` is a live handle bound to the call's stream and the descriptors are live; with
/// `search`, its addresses are device memory of the problem's sizes (the search writes the
/// output) and its workspace is valid.
pub(super) unsafe fn rank(
    h: sys::cudnnHandle_t,
    op: ConvOp,
    descs: Descs,
    search: Option<SearchBuffers>,
    problem: &dyn Fn() -> String,
) -> Result<Vec<Ranked>> {
    // SAFETY (every arm): forwarded.
    unsafe {
        match op {
            ConvOp::Forward | ConvOp::Fused(_) => rank_forward(h, descs, search, problem),
            ConvOp::BackwardData => rank_backward_data(h, descs, search, problem),
            ConvOp::BackwardFilter => rank_backward_filter(h, descs, search, problem),
        }
    }
}

/// The candidates that succeeded, of the first `n` records cuDNN wrote.
fn keep<P: Perf>(v: &[P], n: i32) -> Vec<Ranked> {
    let ok = sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
    v[..n.clamp(0, v.len() as i32) as usize]
        .iter()
        .filter(|r| r.status() == ok)
        .map(|r| (r.algo(), r.math(), r.memory(), r.time()))
        .collect()
}

/// A device address as cuDNN reads it.
fn cv(a: u64) -> *const c_void {
    a as *const c_void
}

/// A device address as cuDNN writes it.
fn mv(a: u64) -> *mut c_void {
    a as *mut c_void
}

/// The forward candidates (the fused forward's too): `cudnnGetConvolutionForwardAlgorithm_v7`,
/// or with `search` `cudnnFindConvolutionForwardAlgorithmEx`.
///
/// # Safety
/// As [`rank`].
unsafe fn rank_forward(
    h: sys::cudnnHandle_t,
    (x, w, y, conv): Descs,
    search: Option<SearchBuffers>,
    problem: &dyn Fn() -> String,
) -> Result<Vec<Ranked>> {
    let (mut n, req) = (0i32, MAX_ALGOS as i32);
    // SAFETY: live descriptors, an out-array of MAX_ALGOS records, the search's buffers per
    // the caller's contract.
    unsafe {
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
}

/// The backward-data candidates: `cudnnGetConvolutionBackwardDataAlgorithm_v7`, or with
/// `search` `cudnnFindConvolutionBackwardDataAlgorithmEx`.
///
/// # Safety
/// As [`rank`].
unsafe fn rank_backward_data(
    h: sys::cudnnHandle_t,
    (x, w, y, conv): Descs,
    search: Option<SearchBuffers>,
    problem: &dyn Fn() -> String,
) -> Result<Vec<Ranked>> {
    let (mut n, req) = (0i32, MAX_ALGOS as i32);
    // SAFETY: live descriptors, an out-array of MAX_ALGOS records, the search's buffers per
    // the caller's contract.
    unsafe {
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
}

/// The backward-filter candidates: `cudnnGetConvolutionBackwardFilterAlgorithm_v7`, or with
/// `search` `cudnnFindConvolutionBackwardFilterAlgorithmEx`.
///
/// # Safety
/// As [`rank`].
unsafe fn rank_backward_filter(
    h: sys::cudnnHandle_t,
    (x, w, y, conv): Descs,
    search: Option<SearchBuffers>,
    problem: &dyn Fn() -> String,
) -> Result<Vec<Ranked>> {
    let (mut n, req) = (0i32, MAX_ALGOS as i32);
    // SAFETY: live descriptors, an out-array of MAX_ALGOS records, the search's buffers per
    // the caller's contract.
    unsafe {
        let mut r = [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX_ALGOS];
        let (st, name) = match search {
            None => (
                sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, conv, w, req, &mut n, r.as_mut_ptr()),
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
