//! One RMSNorm call's way through the cuDNN room, in three steps the entry point takes in turn
//! (so that it can enqueue a step of its own before the launch): its plan looked up, or made on
//! its first call (cuDNN's heuristic) — a graph no engine takes is remembered as refused, so
//! that asking again costs a lookup; the handle and the workspace it runs on (the stream's, or
//! the room's larger one); the launch.

use cudarc::cudnn::sys as raw;

use super::plan::{self, NormPlan};
use super::{features, NormCall, NormKey, RMS_NORM_VERSION};
use crate::cuda::dnn::DnnState;
use crate::error::{Error, Result};

/// A key's plan, or why cuDNN has none (no engine takes the graph within the workspace limit
/// it was asked under — kept beside the reason — or the graph is refused).
pub(crate) type Planned = std::result::Result<NormPlan, (usize, String)>;

impl DnnState {
    /// Whether the call's plan exists or is known to be refused (a call then plans nothing
    /// and is capturable, or fails at once).
    pub fn norm_planned(&self, call: &NormCall) -> bool {
        self.norm.contains_key(&NormKey::new(call.problem, call.op, call.buffers.alignment()))
    }

    /// Makes the call's plan if it is not made (the caller has checked that the stream is not
    /// capturing then). `Ok(Err(refusal))` where cuDNN has no engine for the graph or refuses
    /// it: [`Error::Unsupported`] naming what the graph holds and why, remembered for the key
    /// and asked again once the workspace limit is above the one it was refused under.
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
        let limit = self.ws_limit.max(call.workspace.1);
        if matches!(self.norm.get(&key), Some(Err((under, _))) if limit > *under) {
            self.norm.remove(&key); // refused under a smaller workspace limit: ask again
        }
        if !self.norm.contains_key(&key) {
            let h = self.handle.on(call.stream)?;
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
                Ok(None) => Err((limit, refused("no engine takes this graph".into()))),
                Err(e @ Error::Cudnn { .. }) => Err((limit, refused(format!("the graph is refused ({e})")))),
                Err(e) => return Err(e),
            };
            match &made {
                Ok(plan) => tracing::debug!(problem = %p.describe(), ?op, plan = %plan.name, "RMSNorm planned"),
                Err((_, why)) => tracing::debug!(problem = %p.describe(), ?op, %why, "RMSNorm refused"),
            }
            self.norm.insert(key, made);
        }
        Ok(match &self.norm[&key] {
            Ok(_) => Ok(()),
            Err((_, what)) => Err(Error::Unsupported { backend: "cuDNN", what: what.clone() }),
        })
    }

    /// The handle bound to the call's stream and the workspace address its plan runs on (the
    /// stream's, or the room's larger one, grown in stream order): what the launch needs,
    /// got before anything of the call is enqueued.
    ///
    /// # Errors
    /// [`Error::Cudnn`] binding the stream; driver errors of the workspace; an internal error
    /// where the call is not planned ([`DnnState::norm_plan`] first).
    pub fn norm_ready(&mut self, call: &NormCall) -> Result<(raw::cudnnHandle_t, u64)> {
        let need = self.planned_norm(call)?.workspace;
        let h = self.handle.on(call.stream)?;
        let ws = self.big.get(&mut self.graphs, call.workspace, need, call.stream)?;
        Ok((h, ws))
    }

    /// Launches the call's plan (made by [`DnnState::norm_plan`]) on its stream with what
    /// [`DnnState::norm_ready`] returned.
    ///
    /// # Safety
    /// The call's addresses are device memory of this context holding the problem's tensors
    /// (checked by the entry point), its workspace is this stream's, its stream is live;
    /// `ready` is `norm_ready`'s for this call.
    ///
    /// # Errors
    /// [`Error::Cudnn`] from `cudnnBackendExecute` (or the variant pack).
    pub unsafe fn norm_launch(&mut self, call: &NormCall, (h, ws): (raw::cudnnHandle_t, u64)) -> Result<()> {
        let plan = self.planned_norm(call)?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, call, ws) }
    }

    /// The call's plan; an internal error where it is not made ([`DnnState::norm_plan`] first).
    fn planned_norm(&mut self, call: &NormCall) -> Result<&mut NormPlan> {
        match self.norm.get_mut(&NormKey::new(call.problem, call.op, call.buffers.alignment())) {
            Some(Ok(plan)) => Ok(plan),
            _ => {
                let what = format!("{}: an RMSNorm call launched before it was planned", call.problem.describe());
                Err(Error::Unsupported { backend: "gemmbridge (internal)", what })
            }
        }
    }
}
