//! The graph API's engine search: cuDNN's ranked engine configurations for an operation graph
//! (heuristic mode A, then the fallback list) and an execution plan finalized for the chosen
//! one, kept per problem ([`GraphPlan`]).
//!
//! Choice: [`ConvSearch::Heuristic`] takes the first configuration that finalizes, fits the
//! workspace limit and keeps the precision's promise; [`ConvSearch::Measured`] times up to
//! [`SEARCH_LIMIT`] of each list on the call's own buffers (PyTorch's `cudnn.benchmark`, whose
//! default limit is also 10) and keeps the fastest. No configuration with the
//! `DOWN_CONVERT_INPUTS` numerical note, and for strict f32 none with `TENSOR_CORE` (on Ampere
//! and later those are TF32): PyTorch's filter with `allow_tf32` off.

use std::ptr::null_mut;

use cudarc::cudnn::sys as raw;
use cudarc::driver::result::event;
use cudarc::driver::sys::{CUevent_flags, CUstream};
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::graph::{alignment, graph, variant};
use super::graph_desc::Desc;
use super::graph_plan::GraphPlan;
use super::sys::check;
use super::{ConvCall, ConvSearch, Measured};
use crate::cuda::status;
use crate::error::Result;
use crate::precision::Precision;

/// At most this many configurations are timed by a measured search.
pub(crate) const SEARCH_LIMIT: usize = 10;

/// The engine configurations cuDNN ranks for `graph` under `mode`, best first.
pub(super) fn configs(graph: &Desc, mode: raw::cudnnBackendHeurMode_t) -> Result<Vec<Desc>> {
    // SAFETY: HEUR_MODE reads the enum.
    let heur = unsafe {
        Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?
            .set(A::CUDNN_ATTR_ENGINEHEUR_MODE, T::CUDNN_TYPE_HEUR_MODE, &[mode])?
            .finalize(|| format!("engine heuristic {mode:?}"))?
    };
    let mut n = 0i64;
    // SAFETY: a count query (no elements requested).
    let st = unsafe {
        raw::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut n,
            null_mut(),
        )
    };
    check(st, "cudnnBackendGetAttribute", || "ENGINEHEUR_RESULTS count".into())?;
    let cfgs: Vec<Desc> =
        (0..n.max(0)).map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)).collect::<Result<_>>()?;
    let mut raws: Vec<raw::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    // SAFETY: cuDNN fills the caller's created ENGINECFG descriptors.
    let got = unsafe { heur.get(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raws) }?;
    Ok(cfgs.into_iter().take(got).collect())
}

/// A plan cuDNN's heuristic picked: the finalized execution plan, its engine configuration,
/// the workspace bytes it needs and its name (`engine <index> (<mode>, notes <notes>)`).
pub(super) struct Picked {
    pub plan: Desc,
    pub cfg: Desc,
    pub workspace: usize,
    pub name: String,
}

/// The first configuration of cuDNN's ranked lists for `graph` (heuristic mode A, then the
/// fallback list) whose execution plan finalizes within `limit` bytes of workspace; `Ok(None)`
/// when none does. `what` names the problem in the log.
pub(super) fn first_plan(
    h: raw::cudnnHandle_t,
    graph: &Desc,
    limit: usize,
    what: &dyn Fn() -> String,
) -> Result<Option<Picked>> {
    use raw::cudnnBackendHeurMode_t::*;
    for mode in [CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK] {
        let cfgs = match configs(graph, mode) {
            Ok(cfgs) => cfgs,
            Err(e) => {
                tracing::debug!(problem = %what(), ?mode, error = %e, "cuDNN heuristic list unavailable");
                continue;
            }
        };
        for cfg in cfgs {
            let Ok((index, notes)) = engine_of(&cfg) else { continue };
            let name = format!("engine {index} ({mode:?}, notes {notes:?})");
            match execution_plan(h, &cfg, || format!("{} {name}", what())) {
                Ok((_, bytes)) if bytes > limit => {
                    tracing::debug!(problem = %what(), %name, bytes, limit, "skipped: workspace over the limit");
                }
                Ok((plan, workspace)) => return Ok(Some(Picked { plan, cfg, workspace, name })),
                Err(e) => tracing::debug!(problem = %what(), %name, error = %e, "skipped"),
            }
        }
    }
    Ok(None)
}

/// The execution plan of engine configuration `cfg` on handle `h`, finalized, and the
/// workspace bytes it needs.
///
/// # Errors
/// [`crate::error::Error::Cudnn`] where cuDNN refuses it (`what` names the problem).
pub(super) fn execution_plan(
    h: raw::cudnnHandle_t,
    cfg: &Desc,
    what: impl FnOnce() -> String,
) -> Result<(Desc, usize)> {
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?
        .handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h)?
        .descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?
        .finalize(what)?;
    let bytes = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
    Ok((plan, bytes))
}

/// A configuration's engine: its global index and numerical notes (as raw values).
pub(super) fn engine_of(cfg: &Desc) -> Result<(i64, Vec<u32>)> {
    let eng = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut slot = [eng.0];
    // SAFETY: cuDNN fills the created ENGINE descriptor.
    unsafe { cfg.get(A::CUDNN_ATTR_ENGINECFG_ENGINE, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut slot) }?;
    let index = eng.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let mut notes = [0u32; 16];
    // SAFETY: NUMERICAL_NOTE attributes write the (32-bit) enum.
    let n = unsafe { eng.get(A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T::CUDNN_TYPE_NUMERICAL_NOTE, &mut notes) }?;
    Ok((index, notes[..n.min(16)].to_vec()))
}

/// Whether an engine with `notes` keeps `precision`'s promise: none that down-converts its
/// inputs (tf32 to half precision, say), and for strict f32 no tensor-core (TF32) engine —
/// PyTorch's filter with `allow_tf32` off.
pub(super) fn notes_ok(precision: Precision, notes: &[u32]) -> bool {
    use raw::cudnnBackendNumericalNote_t::*;
    let down = CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as u32;
    let tensor_core = CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32;
    !notes.contains(&down) && (precision != Precision::F32 || !notes.contains(&tensor_core))
}

/// Device ms per call of `launch` on `stream`: two warm-up calls, then the faster of two
/// rounds of 3 calls between events (waits for the stream).
///
/// # Safety
/// `launch` enqueues valid work on `stream`, a live stream of the bound context.
pub(super) unsafe fn time_launches(stream: CUstream, launch: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let drv = status::driver;
    let create = || event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"));
    let (e0, e1) = (create()?, create()?);
    // SAFETY: live events and stream; launches per the caller's contract.
    let r = unsafe {
        (|| -> Result<f64> {
            launch()?;
            launch()?;
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                event::record(e0, stream).map_err(drv("cuEventRecord"))?;
                for _ in 0..3 {
                    launch()?;
                }
                event::record(e1, stream).map_err(drv("cuEventRecord"))?;
                event::synchronize(e1).map_err(drv("cuEventSynchronize"))?;
                best = best.min(event::elapsed(e0, e1).map_err(drv("cuEventElapsedTime"))? as f64 / 3.0);
            }
            Ok(best)
        })()
    };
    // SAFETY: created above, not used after.
    unsafe {
        let _ = event::destroy(e0);
        let _ = event::destroy(e1);
    }
    r
}

/// Device ms per call of `plan` with the call's buffers on its stream ([`time_launches`]).
///
/// # Safety
/// As [`GraphPlan::launch`]; the call's stream is the handle's.
unsafe fn time(h: raw::cudnnHandle_t, call: &ConvCall, plan: &mut GraphPlan, ws: u64) -> Result<f64> {
    let (op, b) = (call.op, &call.buffers);
    // SAFETY: forwarded.
    unsafe { time_launches(call.stream, &mut || plan.launch(h, op, b, ws)) }
}

/// Where a plan's workspace comes from: `bytes` → the address of at least that many bytes,
/// usable on the call's stream (the stream's workspace, or the room's larger one).
pub(crate) type WorkspaceFor<'a> = dyn FnMut(usize) -> Result<u64> + 'a;

/// Makes the plan for the call's problem and direction with buffers aligned as the call's:
/// the graph, cuDNN's ranked configurations (mode A, then the fallback list), and the first
/// that finalizes, needs at most `limit` bytes of workspace and keeps the precision's promise
/// — or, with `search` measured, the fastest of up to [`SEARCH_LIMIT`] such plans from each
/// list, timed on the call's buffers (that synchronises its stream and overwrites the output;
/// `ws` gives each its workspace). `Ok(None)` when no configuration qualifies (the caller then
/// takes the legacy API).
///
/// # Safety
/// `h` is live and bound to the call's stream; with a measured search the call's buffers are
/// device buffers of the problem's sizes and `ws` gives valid workspaces.
pub(crate) unsafe fn make(
    h: raw::cudnnHandle_t,
    call: &ConvCall,
    ws: &mut WorkspaceFor<'_>,
    limit: usize,
    search: ConvSearch,
) -> Result<Option<GraphPlan>> {
    let (p, op, b) = (call.problem, call.op, &call.buffers);
    let (g, mut parts) = graph(h, p, op, alignment(b))?;
    let (uids, _) = variant(op, b);
    let (mut best, mut first_ms): (Option<(f64, GraphPlan)>, Option<f64>) = (None, None);
    let what = || format!("{} {op:?}", p.describe());
    use raw::cudnnBackendHeurMode_t::*;
    'modes: for mode in [CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK] {
        // a mode cuDNN cannot serve for this graph is skipped, not an error
        let cfgs = match configs(&g, mode) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(problem = %what(), ?mode, error = %e, "cuDNN heuristic list unavailable");
                continue;
            }
        };
        let mut timed = 0usize;
        for cfg in cfgs {
            let Some(mut gp) = qualified(h, call, mode, cfg, limit, &uids) else { continue };
            if search == ConvSearch::Heuristic {
                best = Some((0.0, gp));
                break 'modes;
            }
            // SAFETY: forwarded.
            let Some(ms) = (unsafe { measure(h, call, &mut gp, ws) }) else { continue };
            first_ms.get_or_insert(ms); // the heuristic's choice: the first that runs
            gp.name = format!("{} {ms:.4} ms", gp.name);
            if best.as_ref().is_none_or(|(t, _)| ms < *t) {
                best = Some((ms, gp));
            }
            timed += 1;
            if timed >= SEARCH_LIMIT {
                continue 'modes;
            }
        }
    }
    let Some((ms, mut plan)) = best else { return Ok(None) };
    plan.pack = None;
    plan.measured = first_ms.map(|heuristic_ms| Measured { heuristic_ms, tuned_ms: ms });
    parts.push(g);
    plan._made_of.append(&mut parts);
    tracing::debug!(problem = %p.describe(), ?op, plan = %plan.name, workspace = plan.workspace, "cuDNN graph plan");
    Ok(Some(plan))
}

/// The execution plan of engine configuration `cfg` (ranked under `mode`) for the call's
/// problem and direction, where it qualifies: its engine's numerical notes keep the
/// precision's promise, the plan finalizes and needs at most `limit` bytes of workspace.
/// `None` otherwise (each refusal logged at debug level).
fn qualified(
    h: raw::cudnnHandle_t,
    call: &ConvCall,
    mode: raw::cudnnBackendHeurMode_t,
    cfg: Desc,
    limit: usize,
    uids: &[i64],
) -> Option<GraphPlan> {
    let (p, op) = (call.problem, call.op);
    let what = || format!("{} {op:?}", p.describe());
    let Ok((index, notes)) = engine_of(&cfg) else { return None };
    let name = format!("engine {index} ({mode:?}, notes {notes:?})");
    if !notes_ok(p.precision, &notes) {
        tracing::debug!(problem = %what(), %name, "skipped: numerical notes break the precision");
        return None;
    }
    let made = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
        .and_then(|d| d.handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h))
        .and_then(|d| d.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg]))
        .and_then(|d| d.finalize(String::new));
    let Ok(plan) = made else {
        tracing::debug!(problem = %what(), %name, "skipped: the plan does not finalize");
        return None;
    };
    let Ok(bytes) = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) else { return None };
    let bytes = bytes.max(0) as usize;
    if bytes > limit {
        tracing::debug!(problem = %what(), %name, bytes, limit, "skipped: workspace over the limit");
        return None;
    }
    Some(GraphPlan::new(plan, vec![cfg], bytes, name, uids.to_vec()))
}

/// Device ms per call of `gp` on the call's buffers ([`time`]), on a workspace from `ws`;
/// `None` where it fails to run (logged at debug level).
///
/// # Safety
/// As [`make`] with a measured search.
unsafe fn measure(
    h: raw::cudnnHandle_t,
    call: &ConvCall,
    gp: &mut GraphPlan,
    ws: &mut WorkspaceFor<'_>,
) -> Option<f64> {
    let (p, op, bytes) = (call.problem, call.op, gp.workspace);
    let what = || format!("{} {op:?}", p.describe());
    let timing = ws(bytes).and_then(|addr| {
        // SAFETY: forwarded; `addr` holds `bytes`.
        unsafe { time(h, call, gp, addr) }
    });
    let ms = match timing {
        Ok(ms) => ms,
        Err(e) => {
            tracing::debug!(problem = %what(), name = %gp.name, error = %e, "skipped: the plan fails to run");
            return None;
        }
    };
    tracing::debug!(problem = %what(), name = %gp.name, bytes, ms, "timed");
    Some(ms)
}
