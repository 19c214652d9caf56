//! The cuDNN room: one raw handle per `Gpu`, kept under the device's lock and bound per call
//! to the call's stream (docs/DESIGN.md says why not cudarc's safe `Cudnn`), a plan per
//! problem, direction and alignment, and its launch. Two cuDNN APIs: the graph (backend) API
//! (`graph.rs`, the default: an execution plan per problem, `cudnnBackendExecute` per call) and
//! the legacy API (`legacy.rs`: `cudnnConvolutionForward`, `cudnnConvolutionBiasActivationForward`,
//! `cudnnConvolutionBackwardData`, `cudnnConvolutionBackwardFilter`), taken where the graph API
//! has no engine and on request ([`ConvApi`]). Created on the first convolution, so a GEMM-only
//! program creates no cuDNN handle. Plans from the tactic database, and plans a measured search
//! chose as tactics for it: `tactic.rs`.

mod graph;
mod graph_desc;
mod graph_plan;
mod graph_search;
mod legacy;
mod legacy_launch;
mod legacy_rank;
mod sys;
mod tactic;

use cudarc::cudnn::sys as raw;
use cudarc::driver::sys::CUstream;
use rustc_hash::FxHashMap as HashMap;

use super::device::GraphReplay;
use super::device::{capture, is_capturing, GraphExec, Scratch};
use super::library;
use crate::conv::{Conv2d, ConvActivation};
use crate::error::{Error, Result};
use crate::tactics::Choice;
use graph_plan::GraphPlan;
use legacy::{ConvPlan, SearchBuffers};
use sys::{types, ActivationDesc, Handle, TensorDesc};

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
    /// cuDNN's heuristic: the graph API's best-ranked engine configuration (heuristic mode A,
    /// then its fallback list) that finalizes, fits the workspace and keeps the precision's
    /// promise (the legacy API: `cudnnGetConvolution*Algorithm_v7`'s). No GPU work, no
    /// synchronisation.
    #[default]
    Heuristic,
    /// A measured search on the first call's own buffers (PyTorch's `cudnn.benchmark =
    /// True`): up to 10 plans of each of cuDNN's two heuristic lists (mode A, then the
    /// fallback list; an engine in both may be timed twice) are run and timed, the fastest kept (the legacy API: `cudnnFindConvolution*AlgorithmEx`, every algorithm).
    /// That first call synchronises the stream, overwrites the output and takes milliseconds
    /// to seconds.
    Measured,
}

/// Which cuDNN API runs the convolutions ([`crate::cuda::Gpu::set_conv_api`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvApi {
    /// The graph (backend) API, as PyTorch uses it: an operation graph per problem (the fused
    /// forward as one graph of convolution, bias add and ReLU), cuDNN's engine heuristics, a
    /// finalized execution plan kept per problem; the legacy API where no engine qualifies
    /// (logged).
    #[default]
    Graph,
    /// The legacy API (`cudnnConvolutionForward` and the like, `cudnnFind…`/`cudnnGet…_v7` for
    /// the algorithm), for comparisons.
    Legacy,
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

/// One convolution call, carried as one value from the entry point to its launch: the
/// problem, its direction, its buffers, the stream's workspace (address, bytes) and the stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvCall<'a> {
    pub problem: &'a Conv2d,
    pub op: ConvOp,
    pub buffers: ConvBuffers,
    /// The stream's workspace (address, bytes); a plan that needs more runs on the room's
    /// own ([`BigWorkspaces`]).
    pub workspace: (u64, usize),
    pub stream: CUstream,
}

/// A plan's key: problem, direction, whether a fused forward is fused, the API, and (graph
/// API) the buffers' common alignment (cuDNN's `BYTE_ALIGNMENT`; 0 for the legacy API).
type PlanKey = (Conv2d, ConvOp, bool, ConvApi, u8);

/// A replayable call: its plan, its buffers, its workspace and its stream (as an integer).
type ReplayKey = (PlanKey, [u64; 4], u64, usize);

/// A planned call of either API.
enum Planned {
    /// A graph-API plan; for a fused forward run unfused, the bias add and activation
    /// that follow its convolution (legacy calls: [`legacy_launch::bias_activation`]).
    Graph(GraphPlan, Option<Tail>),
    Legacy(ConvPlan),
}

/// The unfused tail of a fused forward: the bias `[1, K, 1, 1]`, y, and the activation.
struct Tail {
    bias: TensorDesc,
    y: TensorDesc,
    act: ActivationDesc,
}

impl Tail {
    fn new(p: &Conv2d, act: ConvActivation) -> Result<Tail> {
        let (dtype, _) = types(p.precision);
        Ok(Tail {
            bias: TensorDesc::new(dtype, [1, p.k, 1, 1], p.layout)?,
            y: TensorDesc::new(dtype, p.y_dims(), p.layout)?,
            act: ActivationDesc::new(act)?,
        })
    }
}

impl Planned {
    /// Workspace bytes the plan needs.
    fn workspace(&self) -> usize {
        match self {
            Planned::Graph(g, _) => g.workspace,
            Planned::Legacy(pl) => pl.choice.workspace,
        }
    }
}

/// A measured search's times, ms: the heuristic's choice and the chosen plan (for the tactic
/// database, `tactic.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Measured {
    pub heuristic_ms: f64,
    pub tuned_ms: f64,
}

/// A graph-API engine configuration: the engine's global index and its knob choices
/// (`cudnnBackendKnobType_t` value, knob value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineConfig {
    pub engine: i64,
    pub knobs: Vec<(u32, i64)>,
}

/// The default of [`DnnState::ws_limit`]: 1 GiB.
pub(crate) const CONV_WORKSPACE_LIMIT: usize = 1 << 30;

/// cuDNN's state under the device's lock.
pub(crate) struct DnnState {
    handle: Handle,
    plans: HashMap<PlanKey, Planned>,
    /// Graph replay of repeated calls (the GEMMs' [`GraphReplay`] settings, every size: a
    /// convolution call costs the host tens of µs): captured graphs, and how often each call
    /// has been seen (cleared past 4 × capacity keys).
    graphs: HashMap<ReplayKey, GraphExec>,
    seen: HashMap<ReplayKey, u32>,
    pub search: ConvSearch,
    /// Whether a fused forward is fused (else: the convolution, then the bias add and the
    /// activation as two more calls).
    pub fuse: bool,
    pub api: ConvApi,
    /// The most workspace a graph-API plan may take ([`crate::cuda::Gpu::set_conv_workspace_limit`]).
    pub ws_limit: usize,
    /// The room's own workspace for plans that need more than the stream's: stream-ordered,
    /// grown (never shrunk) when a new plan needs more.
    big: BigWorkspaces,
    /// The tactic database's plans of this cuDNN version, by key text (`tactic.rs`).
    tuned: HashMap<String, Choice>,
    /// The loaded libcudnn's version (`cudnnGetVersion`).
    version: usize,
}

/// The room's larger workspace and its size in bytes.
struct Big(Scratch, usize);

// SAFETY: the memory and the stream it is freed on are the Gpu's own; the value is used and
// dropped only under the device's Mutex.
unsafe impl Send for Big {}

/// The room's workspaces: the one in use, and those it replaced, kept until the room is
/// released (a graph the caller captured may still name one).
#[derive(Default)]
struct BigWorkspaces {
    current: Option<Big>,
    retired: Vec<Big>,
}

impl BigWorkspaces {
    /// The address of `bytes` of workspace for a call on `stream`: the stream's own
    /// (`stream_ws`) when it is large enough, else the room's, grown first if needed (a new
    /// stream-ordered allocation; the old one is retired, not freed, and the room's replay
    /// graphs that name it are dropped). Growing inside a capture is refused.
    fn get(
        &mut self,
        graphs: &mut HashMap<ReplayKey, GraphExec>,
        stream_ws: (u64, usize),
        bytes: usize,
        stream: CUstream,
    ) -> Result<u64> {
        if bytes <= stream_ws.1 {
            return Ok(stream_ws.0);
        }
        if let Some(Big(s, n)) = self.current.as_ref() {
            if *n >= bytes {
                return Ok(s.ptr);
            }
        }
        if is_capturing(stream)? {
            return Err(Error::NotCapturable {
                action: "grow the convolution workspace",
                problem: format!("{bytes} bytes of workspace"),
            });
        }
        // SAFETY: the Gpu's live stream, context bound by the caller; every use of the memory is
        // enqueued on this stream (or replayed on it) after this allocation.
        let s = unsafe { Scratch::alloc(bytes, stream)? };
        let ptr = s.ptr;
        if let Some(old) = self.current.replace(Big(s, bytes)) {
            graphs.retain(|k, _| k.2 != old.0.ptr);
            self.retired.push(old);
        }
        tracing::debug!(bytes, "convolution workspace grown beyond the stream's");
        Ok(ptr)
    }
}

impl DnnState {
    /// Loads libcudnn and creates the handle (the context bound by the caller).
    ///
    /// # Errors
    /// [`crate::error::Error::LibraryNotFound`] naming the files tried;
    /// [`crate::error::Error::Cudnn`].
    pub fn new(search: ConvSearch, fuse: bool, api: ConvApi, pool: Option<usize>) -> Result<DnnState> {
        library::ensure_cudnn()?;
        let (plans, graphs, seen) = (HashMap::default(), HashMap::default(), HashMap::default());
        let (ws_limit, big, tuned, version) =
            (CONV_WORKSPACE_LIMIT, BigWorkspaces::default(), HashMap::default(), sys::version());
        let handle = Handle::new(pool)?;
        Ok(DnnState { handle, plans, graphs, seen, search, fuse, api, ws_limit, big, tuned, version })
    }

    fn key(&self, p: &Conv2d, op: ConvOp, b: &ConvBuffers) -> PlanKey {
        let align = if self.api == ConvApi::Graph { graph::alignment(b) } else { 0 };
        (*p, op, matches!(op, ConvOp::Fused(_)) && self.fuse, self.api, align)
    }

    /// The plan of `p` and `op` under the current settings, of the best alignment planned
    /// (allocations are aligned to 256 bytes): for reports.
    fn any_plan(&self, p: &Conv2d, op: ConvOp) -> Option<&Planned> {
        self.any_entry(p, op).map(|(_, v)| v)
    }

    /// [`DnnState::any_plan`] with its key.
    fn any_entry(&self, p: &Conv2d, op: ConvOp) -> Option<(&PlanKey, &Planned)> {
        let fused = matches!(op, ConvOp::Fused(_)) && self.fuse;
        // the best-aligned one: the plan buffers from allocations get
        let mine = self.plans.iter().filter(|(k, _)| k.0 == *p && k.1 == op && k.2 == fused && k.3 == self.api);
        mine.max_by_key(|(k, _)| k.4)
    }

    /// Destroys the plans and the handle (context bound, device synchronised).
    pub fn release(&mut self) {
        self.graphs.clear();
        self.plans.clear();
        self.big = BigWorkspaces::default();
        self.handle.release();
    }

    /// Forgets the handle without destroying it (no context to destroy it in).
    pub fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.graphs));
        std::mem::forget(std::mem::take(&mut self.plans));
        std::mem::forget(std::mem::take(&mut self.big));
        self.handle.leak();
    }

    /// Whether a plan for `p`, `op` and these buffers exists (a call is then capturable).
    pub fn has_plan(&self, p: &Conv2d, op: ConvOp, b: &ConvBuffers) -> bool {
        self.plans.contains_key(&self.key(p, op, b))
    }

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
        let rkey = (key, [b.x, b.w, b.y, b.bias], ws, stream as usize);
        if let (true, Some(g)) = (replay.enabled, self.graphs.get(&rkey)) {
            // never a graph launch into the caller's capture (as for the GEMMs): the call is
            // then captured directly below
            if !is_capturing(stream)? {
                // SAFETY: the graph was captured for exactly these buffers, workspace and stream.
                return unsafe { g.launch(stream) };
            }
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
                    match unsafe { capture(cap, |_| launch(h, call, plan, ws)) } {
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
        if self.plans.contains_key(&key) {
            let plan = self.plans.get_mut(&key).expect("checked");
            // SAFETY: forwarded; `ws` holds the plan's workspace.
            return unsafe { launch(h, call, plan, ws) };
        }
        // SAFETY: forwarded.
        let plan = unsafe { self.make(h, call, key.2)? };
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
    /// fused): the graph API's where it has an engine, else the legacy API's, each fallback
    /// logged.
    ///
    /// # Safety
    /// As [`DnnState::run`]; `h` is bound to the call's stream.
    unsafe fn make(&self, h: raw::cudnnHandle_t, call: &ConvCall, fuse: bool) -> Result<Planned> {
        let ConvCall { problem: p, op, workspace, stream, .. } = *call;
        // SAFETY: forwarded.
        if let Some(plan) = unsafe { self.database_plan(h, call, fuse) } {
            return Ok(plan);
        }
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

    /// Whether the fused call ran `p`'s fused forward (`None` before its first call).
    pub fn fused_used(&self, p: &Conv2d, act: ConvActivation) -> Option<bool> {
        self.any_plan(p, ConvOp::Fused(act)).map(|pl| match pl {
            Planned::Graph(_, tail) => tail.is_none(),
            Planned::Legacy(pl) => pl.fused,
        })
    }

    /// The chosen plan's API, engine or algorithm, math type and workspace for `p` and `op`,
    /// once planned.
    pub fn describe_plan(&self, p: &Conv2d, op: ConvOp) -> Option<String> {
        self.any_plan(p, op).map(|pl| match pl {
            Planned::Graph(g, tail) => {
                let unfused = if tail.is_some() { ", then bias and activation unfused" } else { "" };
                format!("graph API {}{unfused}, workspace {} B", g.name, g.workspace)
            }
            Planned::Legacy(pl) => {
                let c = pl.choice;
                let db = if pl.from_database { " (tactic database)" } else { "" };
                format!("legacy API {} {:?}{db} workspace {} B", c.algo.name(), c.math, c.workspace)
            }
        })
    }
}

/// The launch of one planned call (α = 1, β = 0: every output is overwritten).
///
/// # Safety
/// As [`DnnState::run`]; `h` is bound to the call's stream and `ws` holds the plan's workspace.
unsafe fn launch(h: raw::cudnnHandle_t, call: &ConvCall, plan: &mut Planned, ws: u64) -> Result<()> {
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

/// The loaded libcudnn's version (e.g. 91400), or `None` when it cannot be loaded.
pub fn cudnn_version() -> Option<usize> {
    library::ensure_cudnn().ok().map(|()| sys::version())
}
