//! An RMSNorm execution plan: the graph of one problem and direction, cuDNN's best-ranked
//! engine configuration for it that finalizes and fits the workspace limit (heuristic mode A,
//! then the fallback list), and its launch — a variant pack (the last one kept while the
//! addresses repeat) with ε by value, `cudnnBackendExecute`.

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;

use super::graphs::{self, uid};
use super::{NormBuffers, NormCall, NormOp};
use crate::cuda::dnn::builder::Builder;
use crate::cuda::dnn::graph_desc::Desc;
use crate::cuda::dnn::graph_plan::pack;
use crate::cuda::dnn::graph_search::{first_plan, Picked};
use crate::cuda::dnn::sys::check;
use crate::error::Result;
use crate::norm::RmsNorm;

/// A finalized RMSNorm plan and what a call needs to run it.
pub(crate) struct NormPlan {
    plan: Desc,
    /// The engine configuration, the graph and what it was made of, alive as long as the plan.
    _made_of: Vec<Desc>,
    /// cuDNN's workspace, bytes.
    pub workspace: usize,
    /// The engine's global index and notes, for the log and reports.
    pub name: String,
    /// ε's unique id (the forward's by-value scalar) and its value, which the variant pack
    /// points at: set from the call's problem before each launch.
    eps_uid: Option<i64>,
    eps: Box<f32>,
    /// The last variant pack and the addresses it holds (the buffers, then the workspace).
    pack: Option<([u64; 12], Desc)>,
}

// SAFETY: host-side cuDNN objects and plain data, used under the device's Mutex only.
unsafe impl Send for NormPlan {}

/// Makes the plan of `p` and `op` for buffers aligned to `align` bytes, needing at most
/// `limit` bytes of workspace: the first configuration of cuDNN's ranked lists that finalizes
/// within the limit. `Ok(None)` when none does.
///
/// # Errors
/// The graph's errors (cuDNN refusing an operation or the graph itself).
pub(super) fn make(
    h: raw::cudnnHandle_t,
    p: &RmsNorm,
    op: NormOp,
    align: u8,
    limit: usize,
) -> Result<Option<NormPlan>> {
    let what = || format!("{} {op:?}", p.describe());
    let mut g = Builder::new(align);
    match op {
        NormOp::Forward { .. } => graphs::forward(&mut g, p, op)?,
        NormOp::Backward => graphs::backward(&mut g, p)?,
    }
    let graph = g.finish(h, what)?;
    let Some(Picked { plan, cfg, workspace, name }) = first_plan(h, &graph.graph, limit, &what)? else {
        return Ok(None);
    };
    tracing::debug!(problem = %what(), %name, workspace, "cuDNN RMSNorm plan");
    let mut made_of = vec![cfg, graph.graph];
    made_of.extend(graph.parts);
    let eps_uid = graph.scalars.first().map(|&(u, _)| u);
    Ok(Some(NormPlan { plan, _made_of: made_of, workspace, name, eps_uid, eps: Box::new(p.eps), pack: None }))
}

impl NormPlan {
    /// The variant pack's unique ids and addresses for the call's buffers.
    fn variant(&self, op: NormOp, b: &NormBuffers) -> (Vec<i64>, Vec<*mut c_void>) {
        let v = |a: u64| a as *mut c_void;
        let (mut uids, mut ptrs) = match op {
            NormOp::Forward { training, residual, fp8 } => {
                let (mut u, mut p) = (vec![uid::X, uid::W, uid::Y], vec![v(b.x), v(b.w), v(b.y)]);
                if training {
                    u.push(uid::INV_RMS);
                    p.push(v(b.inv_rms));
                }
                if residual {
                    u.extend([uid::RESIDUAL, uid::SUM]);
                    p.extend([v(b.residual), v(b.sum)]);
                }
                if fp8 {
                    u.extend([uid::SCALE, uid::AMAX]);
                    p.extend([v(b.scale), v(b.amax)]);
                }
                (u, p)
            }
            NormOp::Backward => (
                vec![uid::X, uid::DY, uid::W, uid::INV_RMS, uid::DX, uid::DW],
                vec![v(b.x), v(b.dy), v(b.w), v(b.inv_rms), v(b.dx), v(b.dw)],
            ),
        };
        if let Some(u) = self.eps_uid {
            uids.push(u);
            ptrs.push(&*self.eps as *const f32 as *mut c_void);
        }
        (uids, ptrs)
    }

    /// Enqueues the plan on the handle's stream with the call's buffers, ε and the workspace
    /// at `ws` (at least [`NormPlan::workspace`] bytes).
    ///
    /// # Safety
    /// `h` is the live handle the plan was made with, bound to the call's stream; the call's
    /// buffers are device buffers of the problem's sizes; `ws` holds the plan's workspace.
    pub unsafe fn launch(&mut self, h: raw::cudnnHandle_t, call: &NormCall, ws: u64) -> Result<()> {
        // read by cuDNN when the plan is executed (a by-value scalar)
        *self.eps = call.problem.eps;
        let b = &call.buffers;
        let a = b.all();
        let key = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], ws];
        if self.pack.as_ref().is_none_or(|(k, _)| *k != key) {
            let (uids, ptrs) = self.variant(call.op, b);
            self.pack = Some((key, pack(&uids, &ptrs, ws)?));
        }
        let vp = &self.pack.as_ref().expect("set above").1;
        // SAFETY: a finalized plan and variant pack of this handle (contract); ε, which the
        // pack points at, lives in `self`.
        check(unsafe { raw::cudnnBackendExecute(h, self.plan.0, vp.0) }, "cudnnBackendExecute", || self.name.clone())
    }
}
