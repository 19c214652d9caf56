//! The cuDNN room: one raw handle per `Gpu`, kept under the device's lock and bound per call
//! to the call's stream (docs/DESIGN.md says why not cudarc's safe `Cudnn`), a plan per
//! problem, direction and alignment, and its launch. Two cuDNN APIs: the graph (backend) API
//! (`graph.rs` and its `graph_*.rs`, the default: an execution plan per problem,
//! `cudnnBackendExecute` per call) and the legacy API (`legacy.rs` and its `legacy_*.rs`:
//! `cudnnConvolutionForward`, `cudnnConvolutionBiasActivationForward`,
//! `cudnnConvolutionBackwardData`, `cudnnConvolutionBackwardFilter`), taken where the graph API
//! has no engine and on request ([`ConvApi`]). Created on the first convolution, so a GEMM-only
//! program creates no cuDNN handle. A call's way from [`ConvCall`] to its launch: `run.rs`;
//! graph replay of repeated calls: `replay.rs`; the room's own larger workspace:
//! `workspace.rs`. Plans from the tactic database, and plans a measured search chose as tactics
//! for it: `tactic.rs` (rebuilt from an entry: `rebuild.rs`). Beside the convolutions, on the
//! graph API with the small graph builder both share (`builder.rs`): attention (`attention/`),
//! RMSNorm (`norm/`) and the MoE grouped matmul (`moe/`).
//!
//! This file: the settings ([`ConvSearch`], [`ConvApi`]), the call ([`ConvOp`],
//! [`ConvBuffers`], [`ConvCall`]), the plan key and the planned call of either API, and
//! [`DnnState`] with its reports.

pub(crate) mod attention;
mod builder;
mod graph;
mod graph_desc;
mod graph_plan;
mod graph_search;
mod legacy;
mod legacy_launch;
mod legacy_rank;
pub(crate) mod moe;
pub(crate) mod norm;
mod rebuild;
mod replay;
mod run;
mod sys;
mod tactic;
mod workspace;

use cudarc::driver::sys::CUstream;
use rustc_hash::FxHashMap as HashMap;

use super::device::GraphExec;
use super::library;
use crate::conv::{Conv2d, ConvActivation};
use crate::error::Result;
use crate::tactics::Choice;
use graph_plan::GraphPlan;
use legacy::ConvPlan;
use replay::ReplayKey;
use sys::{types, ActivationDesc, Handle, TensorDesc};
use workspace::BigWorkspaces;

/// One convolution direction (the fused forward with its activation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConvOp {
    Forward,
    Fused(ConvActivation),
    BackwardData,
    BackwardFilter,
}

/// How a convolution's algorithm is chosen, once per problem and direction
/// ([`crate::cuda::GpuOptions::conv_search`]).
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

/// Which cuDNN API runs the convolutions ([`crate::cuda::GpuOptions::conv_api`]).
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
    /// Graph replay of repeated calls (`replay.rs`; the GEMMs'
    /// [`GraphReplay`](super::device::GraphReplay) settings, every size: a convolution call
    /// costs the host tens of µs): captured graphs, and how often each call has been seen
    /// (cleared past 4 × capacity keys).
    graphs: HashMap<ReplayKey, GraphExec>,
    seen: HashMap<ReplayKey, u32>,
    pub search: ConvSearch,
    /// Whether a fused forward is fused (else: the convolution, then the bias add and the
    /// activation as two more calls).
    pub fuse: bool,
    pub api: ConvApi,
    /// The most workspace a graph-API plan may take
    /// ([`crate::cuda::GpuOptions::conv_workspace_limit`]).
    pub ws_limit: usize,
    /// The room's own workspace for plans that need more than the stream's: stream-ordered,
    /// grown (never shrunk) when a new plan needs more.
    big: BigWorkspaces,
    /// The tactic database's plans of this cuDNN version, by key text (`tactic.rs`).
    tuned: HashMap<String, Choice>,
    /// The key texts of the entries of `tuned` that plans were built from.
    applied: std::collections::BTreeSet<String>,
    /// The loaded libcudnn's version (`cudnnGetVersion`).
    version: usize,
    /// Attention plans, by problem, direction and alignment (`attention/`).
    attn: HashMap<attention::AttnKey, attention::AttnPlan>,
    /// Whether an attention plan is chosen by a measured search
    /// ([`crate::cuda::GpuOptions::attention_search`]).
    pub attn_search: bool,
    /// RMSNorm plans, by problem, direction and alignment, or why cuDNN has none (`norm/`).
    norm: HashMap<norm::NormKey, norm::Planned>,
    /// MoE grouped matmul plans, by product and alignment (`moe/`).
    moe: HashMap<moe::MoeKey, moe::MoePlan>,
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
        let applied = Default::default();
        let (attn, norm, moe) = (HashMap::default(), HashMap::default(), HashMap::default());
        Ok(DnnState {
            handle,
            plans,
            graphs,
            seen,
            search,
            fuse,
            api,
            ws_limit,
            big,
            tuned,
            applied,
            version,
            attn,
            attn_search: false,
            norm,
            moe,
        })
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
        self.attn.clear();
        self.norm.clear();
        self.moe.clear();
        self.big = BigWorkspaces::default();
        self.handle.release();
    }

    /// Forgets the handle without destroying it (no context to destroy it in).
    pub fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.graphs));
        std::mem::forget(std::mem::take(&mut self.plans));
        std::mem::forget(std::mem::take(&mut self.attn));
        std::mem::forget(std::mem::take(&mut self.norm));
        std::mem::forget(std::mem::take(&mut self.moe));
        std::mem::forget(std::mem::take(&mut self.big));
        self.handle.leak();
    }

    /// Whether a plan for `p`, `op` and these buffers exists (a call is then capturable).
    pub fn has_plan(&self, p: &Conv2d, op: ConvOp, b: &ConvBuffers) -> bool {
        self.plans.contains_key(&self.key(p, op, b))
    }

    /// The chosen plan's API, engine or algorithm, math type and workspace for `p` and `op`,
    /// once planned; for a fused forward that runs as separate calls (the convolution, then
    /// the bias and the activation), the text says `unfused`.
    pub fn describe_plan(&self, p: &Conv2d, op: ConvOp) -> Option<String> {
        self.any_plan(p, op).map(|pl| match pl {
            Planned::Graph(g, tail) => {
                let unfused = if tail.is_some() { ", then bias and activation unfused" } else { "" };
                format!("graph API {}{unfused}, workspace {} B", g.name, g.workspace)
            }
            Planned::Legacy(pl) => {
                let c = pl.choice;
                let db = if pl.from_database { " (tactic database)" } else { "" };
                let unfused =
                    if matches!(op, ConvOp::Fused(_)) && !pl.fused { " (bias and activation unfused)" } else { "" };
                format!("legacy API {} {:?}{db}{unfused} workspace {} B", c.algo.name(), c.math, c.workspace)
            }
        })
    }
}

/// The loaded libcudnn's version (e.g. 91400), or `None` when it cannot be loaded.
pub fn cudnn_version() -> Option<usize> {
    library::ensure_cudnn().ok().map(|()| sys::version())
}
