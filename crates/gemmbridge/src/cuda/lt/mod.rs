//! The cuBLASLt backend: plans and plan keys ([`plan`]), the bindings' small safe wrappers
//! ([`sys`]), the launch of a validated call with its epilogue operands and bias staging
//! (here), graph replay of repeated small calls ([`replay`]), and tuning ([`tune`],
//! [`search`]; the timing is the device layer's). FP8 is a mode of this backend ([`fp8`]: its plans and launch,
//! cached beside the others). It borrows the stream's
//! workspace and the capture stream from the device layer and knows nothing of the entry
//! points above it.

pub(crate) mod fp8;
pub(crate) mod jobs;
pub(crate) mod launch;
pub(crate) mod plan;
mod search;
pub(crate) mod sys;
pub(crate) mod transform;
pub(crate) mod tune;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use cudarc::driver::sys::CUstream;

use crate::cuda::call::GemmCall;
use crate::cuda::device::{refuse_if_capturing, DeviceState, Lru, Needs, Workspace};
use crate::cuda::device::{Cached, ReplayCache, ReplayKey};
use crate::cuda::status;
use crate::epilogue::VectorUse;
use crate::error::{Error, Result, Which};
use crate::problem::GemmProblem;
use fp8::{fp8_signature, Fp8Key, Fp8Operands, Fp8Plan};
use launch::Algorithm;
use plan::{LtOperands, Plan, PlanKey};
use sys::LtHandle;

/// Most plans kept by default ([`crate::cuda::GpuOptions::plan_cache_capacity`]), the least
/// recently used dropped to make room, and most problems remembered as unsupported: a program
/// that makes endless distinct problems keeps a bounded cache. A plan is a few host
/// descriptors (~1 KiB); a dropped one is rebuilt on its next use.
pub(crate) const PLAN_CAPACITY: usize = 4096;

/// Everything the cuBLASLt backend keeps (under the device's lock).
pub(crate) struct LtState {
    pub handle: LtHandle,
    pub plans: Lru<PlanKey, Plan>,
    /// FP8 plans (as many at most as `plans`).
    pub fp8_plans: Lru<Fp8Key, Fp8Plan>,
    /// Problems cuBLASLt's heuristic had no algorithm for (Auto then uses cuBLAS).
    pub unsupported: HashSet<PlanKey>,
    /// Tuned algorithms by bucketed signature (see [`plan::signature`]).
    pub tuned: HashMap<String, Algorithm>,
    /// The signatures of the entries of `tuned` that plans were built with.
    pub applied: std::collections::BTreeSet<String>,
    /// Cached graphs of repeated small calls (see [`replay`]).
    pub replay: ReplayCache<PlanKey>,
    /// Cached graphs of repeated calls made of several launches of this room (a grouped
    /// GEMM's), under a key the caller encodes (opaque here); dropped with the plans, since a
    /// graph bakes in their algorithms.
    pub composite: ReplayCache<Vec<u64>>,
    /// SM count target of dense plans made from now on (0: all SMs;
    /// [`crate::cuda::GpuOptions::sm_count_target`]).
    pub sm_count: u32,
}

// SAFETY: the raw handle, descriptors and graphs are used only under the device's Mutex;
// cuBLASLt allows a handle to be used from any host thread when calls on it do not overlap
// (cuBLAS documentation, "Thread Safety"), and driver graph handles are valid on any thread.
unsafe impl Send for LtState {}

/// Why cuBLASLt did not run a call.
pub(crate) enum LtFailure {
    /// cuBLASLt has no algorithm for the problem (Auto may use cuBLAS instead).
    NoAlgorithm(Error),
    /// Anything else.
    Other(Error),
}

impl From<Error> for LtFailure {
    fn from(e: Error) -> Self {
        LtFailure::Other(e)
    }
}

/// A bias cuBLASLt is not given directly: copied through the stream's scratch region.
#[derive(Clone, Copy)]
struct Staged {
    /// The caller's bias (or bias-gradient) address.
    user: u64,
    bytes: usize,
}

impl LtState {
    /// Takes a handle (from device `pool`'s pool for a primary context, see [`LtHandle::new`]).
    /// The library is loaded (checked by the caller).
    pub fn new(pool: Option<usize>) -> Result<LtState> {
        Ok(LtState {
            handle: LtHandle::new(pool)?,
            plans: Lru::new(PLAN_CAPACITY),
            fp8_plans: Lru::new(PLAN_CAPACITY),
            unsupported: HashSet::default(),
            tuned: HashMap::default(),
            applied: Default::default(),
            replay: ReplayCache::default(),
            composite: ReplayCache::default(),
            sm_count: 0,
        })
    }

    /// Forgets cached plans matching `drop` and every cached graph (a graph bakes in its
    /// plan's algorithm). The caller has bound the context (graphs are destroyed here).
    /// FP8 plans are all dropped (they are few, and rebuilt on next use).
    pub fn forget_plans(&mut self, drop: impl Fn(&PlanKey) -> bool) {
        self.plans.retain(|k| !drop(k));
        self.fp8_plans.clear();
        self.replay.clear();
        self.composite.clear();
    }

    /// Enqueues `call` on its stream: a cached graph where replay has one, otherwise the
    /// plan (built on first use) and `cublasLtMatmul`, with a misaligned bias staged.
    ///
    /// # Safety
    /// The call's operands were validated for its problem and are valid until it has run on
    /// its stream, a live stream of the current context.
    pub unsafe fn enqueue(&mut self, dev: &mut DeviceState, call: &GemmCall) -> std::result::Result<(), LtFailure> {
        let p = call.problem;
        let mine = LtOperands::new(&call.cm, call.abc, call.bias, call.aux).with_c_in(call.c_in);
        let describe = || p.describe();
        let ws = dev.workspaces.get(call.stream, &describe)?;
        let staged = staging(call, &ws)?;
        let ops = LtOperands { bias: if staged.is_some() { Some(ws.scratch) } else { mine.bias }, ..mine };
        let key = PlanKey { sm_count: self.sm_count, ..PlanKey::of(p, call.cm, &ops, ws.matmul_bytes) };
        // Graph replay (see `replay`): a staged bias is excluded, its copy is not in the key.
        let replay_key = (staged.is_none() && self.replay.qualifies(p.macs()))
            .then(|| ReplayKey::new(key, ops.addresses(), (call.alpha, call.beta), ws.ptr, call.stream));
        let mut graph_unused = false;
        if let Some(rk) = &replay_key {
            // SAFETY: the key holds this stream and the validated addresses.
            match unsafe { self.replay.launch_cached(rk, call.stream, &describe) } {
                Cached::Launched => return Ok(()),
                Cached::NotLaunched { graph_unused: unused } => graph_unused = unused,
            }
        }
        self.ensure_plan(&key, p, call.stream)?;
        let LtState { handle, plans, replay, .. } = self;
        let plan = plans.get(&key).expect("ensure_plan made it");
        // The one launch of this call: validated operands, this stream's workspace (which no
        // other stream uses); `s` is the caller's stream, or the private capture stream.
        // SAFETY: as above; the caller of enqueue guarantees the addresses.
        let scalars = (call.alpha, call.beta);
        let launch = |s: CUstream| unsafe { plan.launch(handle, &plan.algo, scalars, &ops, &ws, s as _) };
        if let Some(rk) = replay_key.filter(|rk| replay.due(rk, graph_unused, call.stream)) {
            // SAFETY: the capture stream is private to the device, used only under its lock.
            if unsafe { replay.capture_and_launch(rk, dev.capture_stream(), call.stream, launch, &describe) } {
                return Ok(());
            }
        }
        // SAFETY: validated addresses; the scratch region belongs to this stream's workspace
        // and is ordered with the matmul on the same stream.
        unsafe { direct(call, staged, &ws, || launch(call.stream)) }
    }

    /// Builds and caches the plan of `key` if it is not cached (never while `stream` is
    /// capturing), with the tuned algorithm where one is stored and cuBLASLt accepts it.
    fn ensure_plan(&mut self, key: &PlanKey, p: &GemmProblem, stream: CUstream) -> std::result::Result<(), LtFailure> {
        if self.plans.contains_key(key) {
            return Ok(());
        }
        if self.unsupported.contains(key) {
            return Err(LtFailure::NoAlgorithm(no_algorithm(p)));
        }
        let needs = Needs::Plan("build a cuBLASLt plan (heuristic query)");
        refuse_if_capturing(stream, needs, || p.describe()).map_err(LtFailure::Other)?;
        let _relaxed = crate::cuda::device::Relaxed::enter()?;
        let plan = match self.build_plan(key, p) {
            Ok(plan) => plan,
            Err(e) => {
                if self.unsupported.len() >= PLAN_CAPACITY {
                    self.unsupported.clear();
                }
                self.unsupported.insert(*key);
                return Err(LtFailure::NoAlgorithm(e));
            }
        };
        // Bounded: the least recently used plan makes room. Graphs stay (a captured launch does
        // not refer to its plan's descriptors), and a dropped plan is rebuilt on its next use.
        self.plans.insert(*key, plan);
        Ok(())
    }
}

impl LtState {
    /// Builds the plan of `key` (cuBLASLt's heuristic; the caller has relaxed the thread's
    /// capture mode), with the tuned algorithm where one is stored and cuBLASLt accepts it
    /// for the plan's workspace. Cached by nobody: the eager path caches it, a
    /// [`GemmPlan`](crate::cuda::GemmPlan) owns it.
    ///
    /// # Errors
    /// Any error of [`Plan::build`] (`CUBLAS_STATUS_NOT_SUPPORTED` where the heuristic has no
    /// algorithm): the problem is not served by cuBLASLt.
    pub fn build_plan(&mut self, key: &PlanKey, p: &GemmProblem) -> Result<Plan> {
        let mut plan = Plan::build(&self.handle, key, 1)?;
        let sig = plan::signature(key);
        if let Some(algo) = self.tuned.get(&sig) {
            match plan.check_algo(&self.handle, algo) {
                Some(need) if need <= key.workspace => {
                    plan.algo = Algorithm { workspace: need, ..*algo };
                    self.applied.insert(sig);
                }
                _ => tracing::warn!(problem = %p.describe(), "tuned algorithm not valid here; using the heuristic's"),
            }
        }
        Ok(plan)
    }

    /// Enqueues one FP8 GEMM of `key` (its `workspace` field is filled in here) with the
    /// plan built on first use (never while `stream` is capturing), with a tuned algorithm
    /// where one is stored and cuBLASLt accepts it.
    ///
    /// # Safety
    /// `ops` were validated for `key` and stay valid until the GEMM has run on `stream`, a
    /// live stream of the current context.
    pub unsafe fn enqueue_fp8(
        &mut self,
        dev: &mut DeviceState,
        key: Fp8Key,
        ops: &Fp8Operands,
        (alpha, beta): (f32, f32),
        stream: CUstream,
    ) -> Result<()> {
        let describe = || fp8_signature(&key);
        let ws = dev.workspaces.get(stream, &describe)?;
        let align = plan::alignment(ops.d).min(plan::alignment(ops.c));
        let key = Fp8Key { workspace: ws.matmul_bytes, align, ..key };
        if !self.fp8_plans.contains_key(&key) {
            refuse_if_capturing(stream, Needs::Plan("build a cuBLASLt FP8 plan (heuristic query)"), describe)?;
            let _relaxed = crate::cuda::device::Relaxed::enter()?;
            let mut plan = Fp8Plan::build(&self.handle, &key, ops, 1)?;
            let sig = fp8_signature(&key);
            if let Some(algo) = self.tuned.get(&sig) {
                match plan.check_algo(&self.handle, algo) {
                    Some(need) if need <= key.workspace => {
                        plan.algo = Algorithm { workspace: need, ..*algo };
                        self.applied.insert(sig);
                    }
                    _ => {
                        tracing::warn!(problem = %describe(), "tuned FP8 algorithm not valid here; using the heuristic's")
                    }
                }
            }
            self.fp8_plans.insert(key, plan);
        }
        let LtState { handle, fp8_plans, .. } = self;
        let plan = fp8_plans.get(&key).expect("made above");
        // SAFETY: the caller's contract; `ws` is this stream's workspace.
        unsafe { plan.launch(handle, &plan.algo, (alpha, beta), ops, &ws, stream as _) }
    }
}

/// Whether the call's bias must be staged, and the aux alignment check.
///
/// cuBLASLt is given only 16-byte-aligned bias vectors: a public cuBLASLt integration
/// (Marian NMT, src/tensors/gpu/prod.cpp) found misaligned ones fail and uses 16 bytes; the
/// exact requirement was not probed here. Any other bias is staged through the stream's
/// scratch region (a stream-ordered copy of n elements), so it never faults.
fn staging(call: &GemmCall, ws: &Workspace) -> Result<Option<Staged>> {
    let p = call.problem;
    let bytes = p.vector_len() * p.precision().output().size_bytes();
    let staged = call.bias.filter(|&v| v % 16 != 0).map(|user| Staged { user, bytes });
    if staged.is_some() && bytes > ws.scratch_bytes {
        return Err(Error::Unsupported {
            backend: "cuBLASLt",
            what: format!(
                "a bias of {bytes} bytes at a non-16-byte-aligned address (staging holds {} bytes): align the bias",
                ws.scratch_bytes
            ),
        });
    }
    if let Some(x) = call.aux.filter(|x| x % 16 != 0) {
        return Err(Error::Misaligned { operand: Which::Aux, address: x, align: 16 });
    }
    Ok(staged)
}

/// The direct launch, with a staged bias copied into the scratch region before it (a bias
/// read) or out of it after (a bias gradient written).
///
/// # Safety
/// As [`LtState::enqueue`]; `launch` enqueues the call on its stream.
unsafe fn direct(
    call: &GemmCall,
    staged: Option<Staged>,
    ws: &Workspace,
    launch: impl FnOnce() -> Result<()>,
) -> std::result::Result<(), LtFailure> {
    let p = call.problem;
    let copy = |dst: u64, src: u64, bytes: usize| {
        // SAFETY: both regions hold `bytes` (validated bias, or this stream's scratch);
        // stream-ordered with the matmul.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, call.stream) }
            .map_err(status::driver("cuMemcpyDtoDAsync"))
    };
    if let (Some(s), VectorUse::ReadsBias) = (staged, p.epilogue().vector()) {
        copy(ws.scratch, s.user, s.bytes)?;
    }
    launch().map_err(|e| status::with_problem(e, p))?;
    if let (Some(s), VectorUse::WritesGrad) = (staged, p.epilogue().vector()) {
        copy(s.user, ws.scratch, s.bytes)?;
    }
    Ok(())
}

/// The error for a problem cuBLASLt's heuristic has no algorithm for.
pub(crate) fn no_algorithm(p: &GemmProblem) -> Error {
    Error::Cublas {
        operation: "cublasLtMatmulAlgoGetHeuristic",
        status: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
        problem: p.describe(),
    }
}
