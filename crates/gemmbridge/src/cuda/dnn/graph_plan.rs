//! A finalized graph-API execution plan, kept per problem, and its launch: per call only a
//! variant pack (the data pointers and the workspace; the last one is kept and reused while
//! the pointers repeat) and `cudnnBackendExecute`.

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::graph::variant;
use super::graph_desc::Desc;
use super::sys::check;
use super::{ConvBuffers, ConvOp, EngineConfig, Measured};
use crate::error::Result;

/// A finalized execution plan and what a call needs to run it.
pub(crate) struct GraphPlan {
    pub(super) plan: Desc,
    /// The engine configuration, the graph and what it was made of, alive as long as the plan.
    pub(super) _made_of: Vec<Desc>,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// The engine's global index and notes, and (measured) its time: for the log and
    /// [`crate::cuda::Plans::conv2d`].
    pub name: String,
    pub(super) uids: Vec<i64>,
    /// The last variant pack and the pointers it holds (x, w, y, bias, workspace).
    pub(super) pack: Option<([u64; 5], Desc)>,
    /// The engine configuration, once read for the tactic database (`tactic.rs`).
    pub config: Option<EngineConfig>,
    /// A measured search's times (the heuristic's choice and this plan's); `None` otherwise.
    pub measured: Option<Measured>,
}

pub(super) fn pack(uids: &[i64], ptrs: &[*mut c_void], ws: u64) -> Result<Desc> {
    // SAFETY: VOID_PTR attributes read pointers.
    unsafe {
        Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?
            .i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T::CUDNN_TYPE_VOID_PTR, ptrs)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T::CUDNN_TYPE_VOID_PTR, &[ws as *mut c_void])?
            .finalize(|| "variant pack".into())
    }
}

impl GraphPlan {
    /// `plan`, needing `workspace` bytes, made of `made_of` (its engine configuration first),
    /// with the variant pack's `uids`; no configuration read yet, no times.
    pub(super) fn new(plan: Desc, made_of: Vec<Desc>, workspace: usize, name: String, uids: Vec<i64>) -> GraphPlan {
        GraphPlan { plan, _made_of: made_of, workspace, name, uids, pack: None, config: None, measured: None }
    }

    /// Enqueues the plan on the handle's stream with `b` and the workspace at `ws`.
    ///
    /// # Safety
    /// `h` is the live handle the plan was made with, bound to the call's stream; `b` holds
    /// device buffers of the problem's sizes; `ws` has at least [`GraphPlan::workspace`]
    /// bytes.
    pub unsafe fn launch(&mut self, h: raw::cudnnHandle_t, op: ConvOp, b: &ConvBuffers, ws: u64) -> Result<()> {
        let key = [b.x, b.w, b.y, b.bias, ws];
        if self.pack.as_ref().is_none_or(|(k, _)| *k != key) {
            let (uids, ptrs) = variant(op, b);
            debug_assert_eq!(uids, self.uids);
            self.pack = Some((key, pack(&uids, &ptrs, ws)?));
        }
        let vp = &self.pack.as_ref().expect("set above").1;
        // SAFETY: a finalized plan and variant pack of this handle (contract).
        check(unsafe { raw::cudnnBackendExecute(h, self.plan.0, vp.0) }, "cudnnBackendExecute", || self.name.clone())
    }
}
