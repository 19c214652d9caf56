//! A MoE grouped matmul plan: the graph of one product (`super`'s tensors), cuDNN's
//! best-ranked engine configuration that finalizes within the workspace limit, and its launch —
//! a variant pack (the last one kept while the addresses repeat), `cudnnBackendExecute`.

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;

use super::MoeBuffers;
use crate::cuda::dnn::builder::{Builder, Dt};
use crate::cuda::dnn::graph_desc::Desc;
use crate::cuda::dnn::graph_plan::pack;
use crate::cuda::dnn::graph_search::{first_plan, Picked};
use crate::cuda::dnn::sys::check;
use crate::error::Result;
use crate::grouped::GroupedOp;
use crate::moe::MoeGemm;
use crate::precision::Precision;

/// The variant pack's unique ids.
mod uid {
    pub const INPUT: i64 = 1;
    pub const W: i64 = 2;
    pub const STARTS: i64 = 3;
    pub const OUT: i64 = 4;
}

/// A finalized MoE plan and what a call needs to run it.
pub(crate) struct MoePlan {
    plan: Desc,
    /// The engine configuration, the graph and what it was made of, alive as long as the plan.
    _made_of: Vec<Desc>,
    /// cuDNN's workspace, bytes.
    pub workspace: usize,
    /// The engine's global index and notes.
    pub name: String,
    /// The last variant pack and the addresses it holds (the buffers, then the workspace).
    pack: Option<([u64; 5], Desc)>,
}

// SAFETY: host-side cuDNN objects and plain data, used under the device's Mutex only.
unsafe impl Send for MoePlan {}

/// The graph of `p` for buffers aligned to `align` bytes.
fn graph(g: &mut Builder, p: &MoeGemm) -> Result<()> {
    let io = if p.precision() == Precision::F16 { Dt::CUDNN_DATA_HALF } else { Dt::CUDNN_DATA_BFLOAT16 };
    let i32_ = Dt::CUDNN_DATA_INT32;
    let (win, wout) = p.width();
    let [e, r, n, k, win, wout] = [p.experts(), p.rows(), p.n(), p.k(), win, wout].map(|v| v as i64);
    let input = g.io3(uid::INPUT, [1, r, win], [r * win, win, 1], io)?;
    // w[E, N, K] as [E, in, out]: the forward reads K (in) contiguous; the backward data would
    // read N (in) with stride K, a layout cuDNN 9.19 has no engine for on Hopper (refused by
    // name when planned)
    let w_strides = if p.op() == GroupedOp::BackwardData { [n * k, k, 1] } else { [n * k, 1, k] };
    let w = g.io3(uid::W, [e, win, wout], w_strides, io)?;
    let starts = g.io3(uid::STARTS, [e, 1, 1], [1, 1, 1], i32_)?;
    let out = g.io3(uid::OUT, [1, r, wout], [r * wout, wout, 1], io)?;
    g.moe([input, w, starts], out)
}

/// Makes the plan of `p` for buffers aligned to `align` bytes, needing at most `limit` bytes
/// of workspace. `Ok(None)` when no configuration does.
///
/// # Errors
/// The graph's errors (cuDNN refusing the operation or the graph).
pub(super) fn make(h: raw::cudnnHandle_t, p: &MoeGemm, align: u8, limit: usize) -> Result<Option<MoePlan>> {
    let what = || p.describe();
    let mut g = Builder::new(align);
    graph(&mut g, p)?;
    let graph = g.finish(h, what)?;
    let Some(Picked { plan, cfg, workspace, name }) = first_plan(h, &graph.graph, limit, &what)? else {
        return Ok(None);
    };
    tracing::debug!(problem = %what(), %name, workspace, "cuDNN MoE grouped matmul plan");
    let mut made_of = vec![cfg, graph.graph];
    made_of.extend(graph.parts);
    Ok(Some(MoePlan { plan, _made_of: made_of, workspace, name, pack: None }))
}

impl MoePlan {
    /// Enqueues the plan on the handle's stream with the buffers `b` and the workspace at `ws`
    /// (at least [`MoePlan::workspace`] bytes).
    ///
    /// # Safety
    /// `h` is the live handle the plan was made with, bound to the call's stream; `b` holds
    /// device buffers of the plan's product's sizes (the starts in range); `ws` holds the plan's
    /// workspace.
    pub unsafe fn launch(&mut self, h: raw::cudnnHandle_t, b: &MoeBuffers, ws: u64) -> Result<()> {
        let key = [b.input, b.w, b.out, b.starts, ws];
        if self.pack.as_ref().is_none_or(|(k, _)| *k != key) {
            let v = |a: u64| a as *mut c_void;
            let uids = [uid::INPUT, uid::W, uid::STARTS, uid::OUT];
            let ptrs = [v(b.input), v(b.w), v(b.starts), v(b.out)];
            self.pack = Some((key, pack(&uids, &ptrs, ws)?));
        }
        let vp = &self.pack.as_ref().expect("set above").1;
        // SAFETY: a finalized plan and variant pack of this handle (contract).
        check(unsafe { raw::cudnnBackendExecute(h, self.plan.0, vp.0) }, "cudnnBackendExecute", || self.name.clone())
    }
}
