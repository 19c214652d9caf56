//! The cuDNN room: one raw handle per `Gpu`, kept under the device's lock and bound per call
//! to the call's stream (docs/DESIGN.md says why not cudarc's safe `Cudnn`), a plan per
//! problem and direction (`plan.rs`), and the launches of cuDNN's convolution API:
//! `cudnnConvolutionForward`, `cudnnConvolutionBiasActivationForward` (fused; the unfused
//! sequence where cuDNN refuses it), `cudnnConvolutionBackwardData`,
//! `cudnnConvolutionBackwardFilter`. Created on the first convolution, so a GEMM-only program
//! never loads libcudnn.

mod plan;
mod sys;

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;
use cudarc::driver::sys::CUstream;
use rustc_hash::FxHashMap as HashMap;

use super::device::{capture, is_capturing, GraphExec};
use super::library;
use super::lt::replay::GraphReplay;
use crate::conv::{Conv2d, ConvActivation};
use crate::error::{Error, Result};
pub(crate) use plan::SearchBuffers;
use plan::{Algo, ConvPlan};
use sys::{check, Handle};

/// One convolution direction (the fused forward with its activation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConvOp {
    Forward,
    Fused(ConvActivation),
    BackwardData,
    BackwardFilter,
}

/// How a convolution's algorithm is chosen, once per problem and direction
/// ([`crate::cuda::Gpu::set_conv_search`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvSearch {
    /// cuDNN's heuristic (`cudnnGetConvolution*Algorithm_v7`): its best-ranked algorithm that
    /// fits the workspace. No GPU work, no synchronisation.
    #[default]
    Heuristic,
    /// A measured search (`cudnnFindConvolution*AlgorithmEx`, PyTorch's
    /// `cudnn.benchmark = True`) on the first call's own buffers: every algorithm that fits the
    /// workspace is run and timed, the fastest kept. That first call synchronises the stream
    /// and takes milliseconds to seconds.
    Measured,
}

/// Device addresses of one call: x (or dx), w (or dw), y (or dy), and the bias (fused; 0
/// otherwise).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvBuffers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub bias: u64,
}

/// A plan's key: problem, direction, and (fused forward) whether the fused call is tried.
type PlanKey = (Conv2d, ConvOp, bool);

/// A replayable call: its plan, its buffers, its workspace and its stream (as an integer).
type ReplayKey = (PlanKey, [u64; 4], u64, usize);

/// cuDNN's state under the device's lock.
pub(crate) struct DnnState {
    handle: Handle,
    plans: HashMap<PlanKey, ConvPlan>,
    /// Graph replay of repeated calls (the GEMMs' [`GraphReplay`] settings, every size: the
    /// legacy API's host cost per call is tens of µs): captured graphs, and how often each
    /// call has been seen (cleared past 4 × capacity keys).
    graphs: HashMap<ReplayKey, GraphExec>,
    seen: HashMap<ReplayKey, u32>,
    pub search: ConvSearch,
    /// Whether a fused forward tries cuDNN's fused call (else: the unfused sequence).
    pub fuse: bool,
}

impl DnnState {
    /// Loads libcudnn and creates the handle (the context bound by the caller).
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] naming the files tried; [`Error::Cudnn`].
    pub fn new(search: ConvSearch, fuse: bool) -> Result<DnnState> {
        library::ensure_cudnn()?;
        let (plans, graphs, seen) = (HashMap::default(), HashMap::default(), HashMap::default());
        Ok(DnnState { handle: Handle::new()?, plans, graphs, seen, search, fuse })
    }

    fn key(&self, p: &Conv2d, op: ConvOp) -> (Conv2d, ConvOp, bool) {
        (*p, op, matches!(op, ConvOp::Fused(_)) && self.fuse)
    }

    /// Destroys the plans and the handle (context bound, device synchronised).
    pub fn release(&mut self) {
        self.graphs.clear();
        self.plans.clear();
        self.handle.destroy();
    }

    /// Forgets the handle without destroying it (no context to destroy it in).
    pub fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.graphs));
        self.handle.leak();
    }

    /// Whether a plan for `p` and `op` exists (a call is then capturable).
    pub fn has_plan(&self, p: &Conv2d, op: ConvOp) -> bool {
        self.plans.contains_key(&self.key(p, op))
    }

    /// Runs one convolution on `stream`: its plan (made on first use; the caller has checked
    /// that the stream is not capturing then) and the launch, with `workspace` (address,
    /// bytes) as cuDNN's workspace. With `replay` on and a private capture stream `cap`, a
    /// call seen `after_calls` times with the same buffers, workspace and stream is captured
    /// into a CUDA graph (on `cap`) and from then on launched as that graph; a capture that
    /// fails leaves the call to run directly.
    ///
    /// # Safety
    /// The addresses in `b` are device memory of this context holding the problem's tensors
    /// (checked by the entry point), `workspace` is this stream's, `stream` is live; `cap`
    /// is the device's private capture stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &mut self,
        p: &Conv2d,
        op: ConvOp,
        b: ConvBuffers,
        workspace: (u64, usize),
        stream: CUstream,
        replay: GraphReplay,
        cap: Option<CUstream>,
    ) -> Result<()> {
        let key = self.key(p, op);
        let rkey = (key, [b.x, b.w, b.y, b.bias], workspace.0, stream as usize);
        if let (true, Some(g)) = (replay.enabled, self.graphs.get(&rkey)) {
            // SAFETY: the graph was captured for exactly these buffers, workspace and stream.
            return unsafe { g.launch(stream) };
        }
        if replay.enabled && self.plans.contains_key(&key) {
            if self.seen.len() > 4 * replay.capacity.max(1) {
                self.seen.clear();
            }
            let n = self.seen.entry(rkey).or_insert(0);
            *n = n.saturating_add(1);
            // this call is the (n + 1)-th with this key: the first one planned it
            let due = *n + 1 >= replay.after_calls.max(1) && self.graphs.len() < replay.capacity;
            if let (true, Some(cap)) = (due, cap) {
                if !is_capturing(stream)? {
                    let h = self.handle.on(cap)?;
                    let plan = self.plans.get_mut(&key).expect("checked above");
                    // SAFETY: the capture stream is private and idle; the launch enqueues only
                    // on it; the buffers stay the caller's contract for every replay (the key).
                    match unsafe { capture(cap, |_| launch(h, p, op, plan, b, workspace.0)) } {
                        Ok(g) => {
                            self.seen.remove(&rkey);
                            let g = self.graphs.entry(rkey).or_insert(g);
                            // SAFETY: as for a cached graph above.
                            return unsafe { g.launch(stream) };
                        }
                        Err(e) => {
                            tracing::debug!(problem = %p.describe(), error = %e, "convolution capture failed; direct call")
                        }
                    }
                }
            }
        }
        let h = self.handle.on(stream)?;
        if !self.plans.contains_key(&key) {
            let search =
                (self.search == ConvSearch::Measured).then_some(SearchBuffers { x: b.x, w: b.w, y: b.y, workspace });
            // SAFETY: forwarded.
            let mut plan = unsafe { plan::make(h, p, op, workspace.1, search)? };
            plan.fused = key.2;
            self.plans.insert(key, plan);
        }
        let plan = self.plans.get_mut(&key).expect("inserted above");
        // SAFETY: forwarded; the plan's workspace is at most `workspace.1`.
        unsafe { launch(h, p, op, plan, b, workspace.0) }
    }
}

/// The launch of one planned call (α = 1, β = 0: every output is overwritten).
unsafe fn launch(
    h: raw::cudnnHandle_t,
    p: &Conv2d,
    op: ConvOp,
    plan: &mut ConvPlan,
    b: ConvBuffers,
    ws: u64,
) -> Result<()> {
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
                let st = raw::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
                check(st, "cudnnConvolutionForward", describe)
            }
            (ConvOp::Fused(act), Algo::Forward(algo)) => {
                let (bias, act_desc) =
                    (plan.bias.as_ref().expect("fused plan").raw(), plan.act.as_ref().expect("fused plan").raw());
                let cb = b.bias as *const c_void;
                if plan.fused {
                    // y = act(1·conv(x, w) + 0·z + bias), z = y (not read: α2 = 0)
                    let st = raw::cudnnConvolutionBiasActivationForward(
                        h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, cy, bias, cb, act_desc, y, my,
                    );
                    let refused = matches!(
                        st,
                        raw::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED | raw::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM
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
                let st = raw::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
                check(st, "cudnnConvolutionForward", describe)?;
                check(raw::cudnnAddTensor(h, a, bias, cb, a, y, my), "cudnnAddTensor", describe)?;
                if act == ConvActivation::Relu {
                    let st = raw::cudnnActivationForward(h, act_desc, a, y, cy, z, y, my);
                    check(st, "cudnnActivationForward", describe)?;
                }
                Ok(())
            }
            (ConvOp::BackwardData, Algo::Data(algo)) => {
                let st = raw::cudnnConvolutionBackwardData(
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
                let st = raw::cudnnConvolutionBackwardFilter(
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

impl DnnState {
    /// Whether the fused call ran `p`'s fused forward (`None` before its first call).
    pub fn fused_used(&self, p: &Conv2d, act: ConvActivation) -> Option<bool> {
        self.plans.get(&self.key(p, ConvOp::Fused(act))).map(|pl| pl.fused)
    }

    /// The chosen algorithm's name, math type and workspace for `p` and `op`, once planned.
    pub fn describe_plan(&self, p: &Conv2d, op: ConvOp) -> Option<String> {
        self.plans
            .get(&self.key(p, op))
            .map(|pl| format!("{} {:?} workspace {} B", pl.choice.algo.name(), pl.choice.math, pl.choice.workspace))
    }
}

/// The loaded libcudnn's version (e.g. 91400), or `None` when it cannot be loaded.
pub fn cudnn_version() -> Option<usize> {
    library::ensure_cudnn().ok().map(|()| sys::version())
}
