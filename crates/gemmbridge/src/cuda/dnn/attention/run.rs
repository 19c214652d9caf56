//! One attention call's way through the cuDNN room: its plan looked up, or made on its first
//! call, the workspace it runs on (the stream's, or the room's larger one), and the launch.

use super::plan::{self, AttnPlan};
use super::{AttnCall, AttnKey, AttnOp, LensSource, BACKWARD_FIX_VERSION};
use crate::attention::Attention;
use crate::cuda::dnn::DnnState;
use crate::error::{Error, Result};

impl DnnState {
    /// Whether the call's plan exists (a call is then capturable, given device lengths).
    pub fn attention_planned(&self, call: &AttnCall) -> bool {
        self.attn.contains_key(&AttnKey::new(call.problem, call.op, call.buffers.alignment()))
    }

    /// Where a plan for `p` and `op` takes lengths from: the call's with per-sequence lengths;
    /// the full extents for a backward on a cuDNN before the fix whose key length is not a
    /// multiple of 128; none otherwise.
    fn lens_source(&self, p: &Attention, op: AttnOp) -> LensSource {
        if p.var_len {
            LensSource::Call
        } else if op == AttnOp::Backward && self.version < BACKWARD_FIX_VERSION && !p.s_kv.is_multiple_of(128) {
            LensSource::Full
        } else {
            LensSource::None
        }
    }

    /// Runs one attention call on its stream: the plan (made on first use; the caller has
    /// checked that the stream is not capturing then) and its launch.
    ///
    /// # Safety
    /// The call's addresses are device memory of this context holding the problem's tensors
    /// (checked by the entry point), its workspace is this stream's, its stream is live.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where no engine of the loaded cuDNN takes the graph;
    /// [`Error::Cudnn`]; driver errors of the workspace and the lengths' copies.
    pub unsafe fn attention(&mut self, call: &AttnCall) -> Result<()> {
        let (p, op, align) = (call.problem, call.op, call.buffers.alignment());
        let key = AttnKey::new(p, op, align);
        let h = self.handle.on(call.stream)?;
        if !self.attn.contains_key(&key) {
            let limit = self.ws_limit.max(call.workspace.1);
            let made = plan::make(h, p, op, align, self.lens_source(p, op), limit)?;
            let Some(made) = made else {
                return Err(Error::Unsupported {
                    backend: "cuDNN",
                    what: format!(
                        "attention {} {op:?}: no engine of cuDNN {} takes this graph (buffers aligned to {align} bytes, \
                         workspace limit {limit} bytes)",
                        p.describe(),
                        self.version
                    ),
                });
            };
            tracing::debug!(problem = %p.describe(), ?op, plan = %made.name, "attention planned");
            self.attn.insert(key, made);
        }
        let plan: &mut AttnPlan = self.attn.get_mut(&key).expect("inserted above");
        let ws = self.big.get(&mut self.graphs, call.workspace, plan.extra.total, call.stream)?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, call, ws) }
    }

    /// The engine planned for `p` and `op` (at the best alignment planned), once planned.
    pub fn attention_plan(&self, p: &Attention, op: AttnOp) -> Option<String> {
        let mine = (0..=4).rev().map(|s| AttnKey::new(p, op, 1 << s));
        mine.filter_map(|k| self.attn.get(&k)).map(|pl| pl.name.clone()).next()
    }
}
