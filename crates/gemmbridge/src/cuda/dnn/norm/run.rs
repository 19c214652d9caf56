//! One RMSNorm call's way through the cuDNN room: its plan looked up, or made on its first call
//! (cuDNN's heuristic) — a graph no engine takes is remembered as refused, so that asking again
//! costs a lookup — then the workspace it runs on (the stream's, or the room's larger one) and
//! the launch.

use super::plan::{self, NormPlan};
use super::{features, NormCall, NormKey, RMS_NORM_VERSION};
use crate::cuda::dnn::DnnState;
use crate::error::{Error, Result};

/// A key's plan, or why cuDNN has none (no engine takes the graph, or the graph is refused).
pub(crate) type Planned = std::result::Result<NormPlan, String>;

impl DnnState {
    /// Whether the call's plan exists or is known to be refused (a call then plans nothing
    /// and is capturable, or fails at once).
    pub fn norm_planned(&self, call: &NormCall) -> bool {
        self.norm.contains_key(&NormKey::new(call.problem, call.op, call.buffers.alignment()))
    }

    /// Makes the call's plan if it is not made (the caller has checked that the stream is not
    /// capturing then). `Ok(Err(refusal))` where cuDNN has no engine for the graph or refuses
    /// it: [`Error::Unsupported`] naming what the graph holds and why, remembered for the key.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a cuDNN before 8.9.6; [`Error::Cudnn`] from the handle.
    pub fn norm_plan(&mut self, call: &NormCall) -> Result<std::result::Result<(), Error>> {
        let (p, op, align) = (call.problem, call.op, call.buffers.alignment());
        if self.version < RMS_NORM_VERSION {
            let what = format!("RMSNorm on cuDNN {}: the RMS norm mode needs 8.9.6 or later", self.version);
            return Err(Error::Unsupported { backend: "cuDNN", what });
        }
        let key = NormKey::new(p, op, align);
        if !self.norm.contains_key(&key) {
            let h = self.handle.on(call.stream)?;
            let limit = self.ws_limit.max(call.workspace.1);
            let refused = |why: String| {
                format!(
                    "{} ({}): {why} of cuDNN {} (buffers aligned to {align} bytes, workspace limit {limit} bytes)",
                    p.describe(),
                    features(p, op),
                    self.version
                )
            };
            let made = match plan::make(h, p, op, align, limit) {
                Ok(Some(made)) => Ok(made),
                Ok(None) => Err(refused("no engine takes this graph".into())),
                Err(e @ Error::Cudnn { .. }) => Err(refused(format!("the graph is refused ({e})"))),
                Err(e) => return Err(e),
            };
            match &made {
                Ok(plan) => tracing::debug!(problem = %p.describe(), ?op, plan = %plan.name, "RMSNorm planned"),
                Err(why) => tracing::debug!(problem = %p.describe(), ?op, %why, "RMSNorm refused"),
            }
            self.norm.insert(key, made);
        }
        Ok(match &self.norm[&key] {
            Ok(_) => Ok(()),
            Err(what) => Err(Error::Unsupported { backend: "cuDNN", what: what.clone() }),
        })
    }

    /// Runs one RMSNorm call on its stream: the plan (made on first use, [`DnnState::norm_plan`])
    /// and its launch.
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
        self.norm_plan(call)??;
        let h = self.handle.on(call.stream)?;
        let key = NormKey::new(call.problem, call.op, call.buffers.alignment());
        let Some(Ok(plan)) = self.norm.get_mut(&key) else { unreachable!("planned above") };
        let plan: &mut NormPlan = plan;
        let ws = self.big.get(&mut self.graphs, call.workspace, plan.workspace, call.stream)?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, call, ws) }
    }
}
