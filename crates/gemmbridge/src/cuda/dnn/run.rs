//! One convolution call's way through the room: its plan looked up, or made on its first call
//! (the tactic database's, else the graph API's, else the legacy API's, each fallback logged),
//! the workspace it runs on, graph replay (`replay.rs`), and the launch of either API's plan.

use cudarc::cudnn::sys as raw;
use cudarc::driver::sys::CUstream;

use super::legacy::SearchBuffers;
use super::{graph_search, legacy, legacy_launch};
use super::{ConvApi, ConvCall, ConvOp, ConvSearch, DnnState, PlanKey, Planned, Tail};
use crate::conv::ConvActivation;
use crate::cuda::device::{GraphReplay, Scratch};
use crate::error::Result;

impl DnnState {
    /// Runs one convolution on the call's stream: its plan (made on first use; the caller has
    /// checked that the stream is not capturing then) and the launch, with the call's
    /// workspace (address, bytes) as cuDNN's workspace. With `replay` on and a private capture
    /// stream `cap`, a call seen `after_calls` times with the same buffers, workspace and
    /// stream is captured into a CUDA graph (on `cap`) and from then on launched as that
    /// graph; a capture that fails leaves the call to run directly.
    ///
    /// # Safety
    /// The addresses in the call's buffers are device memory of this context holding the
    /// problem's tensors (checked by the entry point), its workspace is this stream's, its
    /// stream is live; `cap` is the device's private capture stream.
    pub unsafe fn run(&mut self, call: &ConvCall, replay: GraphReplay, cap: Option<CUstream>) -> Result<()> {
        let ConvCall { problem: p, op, buffers: b, workspace, stream } = *call;
        let key = self.key(p, op, &b);
        // a planned call's workspace: the stream's, or the room's when the plan needs more
        // (grown when that plan was made, or now if this stream's workspace is smaller)
        let ws = match self.plans.get(&key).map(Planned::workspace) {
            Some(bytes) => self.big.get(&mut self.graphs, workspace, bytes, stream)?,
            None => workspace.0,
        };
        // SAFETY: forwarded; `ws` holds the plan's workspace where there is one.
        if unsafe { self.replayed(call, key, ws, replay, cap)? } {
            return Ok(());
        }
        let h = self.handle.on(stream)?;
        if self.plans.contains_key(&key) {
            let plan = self.plans.get_mut(&key).expect("checked");
            // SAFETY: forwarded; `ws` holds the plan's workspace.
            return unsafe { launch(h, call, plan, ws) };
        }
        // SAFETY: forwarded.
        unsafe { self.first_call(h, call, key) }
    }

    /// The first call of plan key `key`: plans it ([`DnnState::make`]), grows the room's
    /// workspace if the plan needs it, and launches it; a graph-API plan that fails that
    /// launch is replaced by the legacy API's.
    ///
    /// # Safety
    /// As [`DnnState::run`]; `h` is bound to the call's stream.
    unsafe fn first_call(&mut self, h: raw::cudnnHandle_t, call: &ConvCall, key: PlanKey) -> Result<()> {
        let ConvCall { problem: p, op, workspace, stream, .. } = *call;
        // SAFETY: forwarded (both).
        let plan = match unsafe { self.database_plan(h, call, key.2) } {
            Some((plan, sig)) => {
                self.applied.insert(sig);
                plan
            }
            None => unsafe { self.make(h, call, key.2)? },
        };
        let ws = self.big.get(&mut self.graphs, workspace, plan.workspace(), stream)?;
        let plan = self.plans.entry(key).or_insert(plan);
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        let first = unsafe { launch(h, call, plan, ws) };
        let (Err(e), Planned::Graph(..)) = (&first, &*plan) else { return first };
        // a graph-API plan that fails its first launch (cuDNN can refuse at execute time):
        // the legacy API's plan instead, for this and later calls
        tracing::warn!(problem = %p.describe(), ?op, error = %e, "the graph API's plan failed its first launch; legacy API");
        // SAFETY: forwarded.
        let legacy = unsafe { self.make_legacy(h, call, key.2)? };
        let ws = self.big.get(&mut self.graphs, workspace, legacy.workspace(), stream)?;
        let plan = self.plans.entry(key).insert_entry(legacy).into_mut();
        // SAFETY: as above.
        unsafe { launch(h, call, plan, ws) }
    }

    /// Makes the plan of the call's problem and direction (`fuse`: a fused forward runs
    /// fused) without the tactic database: the graph API's where it has an engine, else the
    /// legacy API's, each fallback logged.
    ///
    /// # Safety
    /// As [`DnnState::run`]; `h` is bound to the call's stream.
    unsafe fn make(&self, h: raw::cudnnHandle_t, call: &ConvCall, fuse: bool) -> Result<Planned> {
        let ConvCall { problem: p, op, workspace, stream, .. } = *call;
        if self.api == ConvApi::Graph {
            let (search, limit) = (self.search, self.ws_limit.max(workspace.1));
            // a measured search times candidates that need more than the stream's workspace on
            // a temporary one (freed in stream order; the search synchronises after each)
            let mut temp: Option<Scratch> = None;
            let mut ws = |bytes: usize| -> Result<u64> {
                if bytes <= workspace.1 {
                    return Ok(workspace.0);
                }
                temp = None;
                // SAFETY: the Gpu's live stream, context bound; used by the timing only.
                let s = unsafe { Scratch::alloc(bytes, stream)? };
                let ptr = s.ptr;
                temp = Some(s);
                Ok(ptr)
            };
            // SAFETY (every call): forwarded.
            if let ConvOp::Fused(act) = op {
                if fuse {
                    match unsafe { graph_search::make(h, call, &mut ws, limit, search) } {
                        Ok(Some(g)) => return Ok(Planned::Graph(g, None)),
                        r => tracing::info!(
                            problem = %p.describe(), ?op, error = ?r.err(),
                            "no engine of cuDNN's graph API runs the fused convolution + bias + activation; \
                             trying the convolution alone, then the bias add and activation"
                        ),
                    }
                }
                let forward = ConvCall { op: ConvOp::Forward, ..*call };
                match unsafe { graph_search::make(h, &forward, &mut ws, limit, search) } {
                    Ok(Some(g)) => return Ok(Planned::Graph(g, Some(Tail::new(p, act)?))),
                    r => {
                        tracing::info!(problem = %p.describe(), ?op, error = ?r.err(), "no engine of cuDNN's graph API; legacy API")
                    }
                }
            } else {
                match unsafe { graph_search::make(h, call, &mut ws, limit, search) } {
                    Ok(Some(g)) => return Ok(Planned::Graph(g, None)),
                    r => {
                        tracing::info!(problem = %p.describe(), ?op, error = ?r.err(), "no engine of cuDNN's graph API; legacy API")
                    }
                }
            }
        }
        // SAFETY: forwarded.
        unsafe { self.make_legacy(h, call, fuse) }
    }

    /// The legacy API's plan of the call's problem and direction (its measured search on the
    /// call's buffers where the search is measured), within the stream's workspace.
    ///
    /// # Safety
    /// As [`DnnState::make`].
    unsafe fn make_legacy(&self, h: raw::cudnnHandle_t, call: &ConvCall, fuse: bool) -> Result<Planned> {
        let ConvCall { problem: p, op, buffers: b, workspace, .. } = *call;
        let search =
            (self.search == ConvSearch::Measured).then_some(SearchBuffers { x: b.x, w: b.w, y: b.y, workspace });
        // SAFETY: forwarded.
        let mut plan = unsafe { legacy::make(h, p, op, workspace.1, search)? };
        plan.fused = fuse;
        Ok(Planned::Legacy(plan))
    }
}

/// The launch of one planned call (α = 1, β = 0: every output is overwritten).
///
/// # Safety
/// As [`DnnState::run`]; `h` is bound to the call's stream and `ws` holds the plan's workspace.
pub(super) unsafe fn launch(h: raw::cudnnHandle_t, call: &ConvCall, plan: &mut Planned, ws: u64) -> Result<()> {
    let ConvCall { problem: p, op, buffers: b, .. } = *call;
    match plan {
        // SAFETY (all arms): forwarded.
        Planned::Legacy(pl) => unsafe { legacy_launch::launch(h, call, pl, ws) },
        Planned::Graph(g, None) => unsafe { g.launch(h, op, &b, ws) },
        Planned::Graph(g, Some(t)) => {
            let act = match op {
                ConvOp::Fused(a) => a,
                _ => ConvActivation::Identity,
            };
            unsafe { g.launch(h, ConvOp::Forward, &b, ws)? };
            let describe = || format!("{} {op:?} (unfused tail)", p.describe());
            unsafe { legacy_launch::bias_activation(h, (&t.bias, b.bias), (&t.y, b.y), (&t.act, act), &describe) }
        }
    }
}
