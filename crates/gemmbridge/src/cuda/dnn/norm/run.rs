//! One RMSNorm call's way through the cuDNN room: its plan looked up, or made on its first call
//! (cuDNN's heuristic), the workspace it runs on (the stream's, or the room's larger one), and
//! the launch.

use super::plan::{self, NormPlan};
use super::{features, NormCall, NormKey, RMS_NORM_VERSION};
use crate::cuda::dnn::DnnState;
use crate::error::{Error, Result};

impl DnnState {
    /// Whether the call's plan exists (a call is then capturable).
    pub fn norm_planned(&self, call: &NormCall) -> bool {
        self.norm.contains_key(&NormKey::new(call.problem, call.op, call.buffers.alignment()))
    }

    /// Runs one RMSNorm call on its stream: the plan (made on first use; the caller has checked
    /// that the stream is not capturing then) and its launch.
    ///
    /// # Safety
    /// The call's addresses are device memory of this context holding the problem's tensors
    /// (checked by the entry point), its workspace is this stream's, its stream is live.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a cuDNN before 8.9.6, or where no engine of the loaded cuDNN
    /// takes the graph (naming what the graph holds and cuDNN's refusal);
    /// [`Error::Cudnn`]; driver errors of the workspace.
    pub unsafe fn rms_norm(&mut self, call: &NormCall) -> Result<()> {
        let (p, op, align) = (call.problem, call.op, call.buffers.alignment());
        let key = NormKey::new(p, op, align);
        if self.version < RMS_NORM_VERSION {
            let what = format!("RMSNorm on cuDNN {}: the RMS norm mode needs 8.9.6 or later", self.version);
            return Err(Error::Unsupported { backend: "cuDNN", what });
        }
        let h = self.handle.on(call.stream)?;
        if !self.norm.contains_key(&key) {
            let limit = self.ws_limit.max(call.workspace.1);
            let refused = |why: String| Error::Unsupported {
                backend: "cuDNN",
                what: format!(
                    "{} ({}): {why} of cuDNN {} (buffers aligned to {align} bytes, workspace limit {limit} bytes)",
                    p.describe(),
                    features(p, op),
                    self.version
                ),
            };
            let made = match plan::make(h, p, op, align, limit) {
                Ok(Some(made)) => made,
                Ok(None) => return Err(refused("no engine takes this graph".into())),
                Err(e @ Error::Cudnn { .. }) => return Err(refused(format!("the graph is refused ({e})"))),
                Err(e) => return Err(e),
            };
            tracing::debug!(problem = %p.describe(), ?op, plan = %made.name, "RMSNorm planned");
            self.norm.insert(key, made);
        }
        let plan: &mut NormPlan = self.norm.get_mut(&key).expect("inserted above");
        let ws = self.big.get(&mut self.graphs, call.workspace, plan.workspace, call.stream)?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, call, ws) }
    }
}
