//! One MoE grouped matmul call's way through the cuDNN room: its plan looked up, or made on its
//! first call (cuDNN's heuristic), the workspace it runs on, and the launch.

use super::plan::{self, MoePlan};
use super::{MoeCall, MoeKey, MOE_VERSION};
use crate::cuda::dnn::DnnState;
use crate::error::{Error, Result};

impl DnnState {
    /// The key of the call's plan.
    fn moe_key(call: &MoeCall) -> MoeKey {
        (*call.problem, call.buffers.alignment())
    }

    /// Whether the call's plan exists (a call is then capturable).
    pub fn moe_planned(&self, call: &MoeCall) -> bool {
        self.moe.contains_key(&Self::moe_key(call))
    }

    /// Whether the loaded cuDNN has the MoE grouped matmul (9.18 or later).
    pub fn has_moe(&self) -> bool {
        self.version >= MOE_VERSION
    }

    /// Runs one MoE call on its stream: the plan (made on first use; the caller has checked
    /// that the stream is not capturing then) and its launch.
    ///
    /// # Safety
    /// The call's addresses are device memory of this context holding the problem's tensors
    /// and routing in range (checked or clamped by the entry point), its workspace is this
    /// stream's, its stream is live.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a cuDNN before 9.18, or where no engine of the loaded cuDNN
    /// takes the graph (naming the product and cuDNN's refusal); [`Error::Cudnn`]; driver
    /// errors of the workspace.
    pub unsafe fn moe_gemm(&mut self, call: &MoeCall) -> Result<()> {
        let (p, align) = (call.problem, call.buffers.alignment());
        if !self.has_moe() {
            let what =
                format!("{} on cuDNN {}: the MoE grouped matmul needs 9.18 or later", p.describe(), self.version);
            return Err(Error::Unsupported { backend: "cuDNN", what });
        }
        let h = self.handle.on(call.stream)?;
        let key = Self::moe_key(call);
        if !self.moe.contains_key(&key) {
            let limit = self.ws_limit.max(call.workspace.1);
            let refused = |why: String| Error::Unsupported {
                backend: "cuDNN MoE grouped matmul",
                what: format!(
                    "{}: {why} of cuDNN {} (buffers aligned to {align} bytes, workspace limit {limit} bytes)",
                    p.describe(),
                    self.version
                ),
            };
            let made = match plan::make(h, p, align, limit) {
                Ok(Some(made)) => made,
                Ok(None) => return Err(refused("no engine takes this graph".into())),
                Err(e @ Error::Cudnn { .. }) => return Err(refused(format!("the graph is refused ({e})"))),
                Err(e) => return Err(e),
            };
            tracing::debug!(problem = %p.describe(), plan = %made.name, "MoE grouped matmul planned");
            self.moe.insert(key, made);
        }
        let plan: &mut MoePlan = self.moe.get_mut(&key).expect("inserted above");
        let ws = self.big.get(&mut self.graphs, call.workspace, plan.workspace, call.stream)?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, &call.buffers, ws) }
    }
}
