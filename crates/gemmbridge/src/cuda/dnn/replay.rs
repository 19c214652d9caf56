//! Graph replay of repeated convolution calls (the GEMMs' [`GraphReplay`] settings, every size:
//! a convolution call costs the host tens of µs): a call seen often enough with the same plan,
//! buffers, workspace and stream is captured once into a CUDA graph on the device's private
//! capture stream and from then on launched as that graph.

use cudarc::driver::sys::CUstream;

use super::run::launch;
use super::{ConvCall, DnnState, PlanKey};
use crate::cuda::device::{capture, is_capturing, GraphReplay};
use crate::error::Result;

/// A replayable call: its plan, its buffers, its workspace and its stream (as an integer).
pub(super) type ReplayKey = (PlanKey, [u64; 4], u64, usize);

impl DnnState {
    /// Graph replay of a call of plan key `key` on workspace `ws` ([`DnnState::run`]): its
    /// captured graph launched, unless the stream is capturing; else the call counted, and
    /// once it is due captured on `cap` and launched as the new graph. `Ok(true)` when the call
    /// ran as a graph, `Ok(false)` when it is left to run directly (replay off, not planned
    /// yet, not due, inside the caller's capture, or a capture that failed).
    ///
    /// # Safety
    /// As [`DnnState::run`]; `ws` holds the plan's workspace where there is one.
    pub(super) unsafe fn replayed(
        &mut self,
        call: &ConvCall,
        key: PlanKey,
        ws: u64,
        replay: GraphReplay,
        cap: Option<CUstream>,
    ) -> Result<bool> {
        let ConvCall { problem: p, buffers: b, stream, .. } = *call;
        let rkey = (key, [b.x, b.w, b.y, b.bias], ws, stream as usize);
        if let (true, Some(g)) = (replay.enabled, self.graphs.get(&rkey)) {
            // never a graph launch into the caller's capture (as for the GEMMs): the call is
            // then captured directly below
            if !is_capturing(stream)? {
                // SAFETY: the graph was captured for exactly these buffers, workspace and stream.
                return unsafe { g.launch(stream) }.map(|()| true);
            }
        }
        if replay.enabled && self.plans.contains_key(&key) {
            if self.seen.len() > 4 * replay.capacity.max(1) {
                self.seen.clear();
            }
            let n = self.seen.entry(rkey).or_insert(0);
            *n = n.saturating_add(1);
            // this call is the (n + 1)-th with this key: the first one planned it
            let due = *n + 1 >= replay.after_calls.max(1) && self.graphs.len() < replay.capacity;
            if let (true, Some(cap)) = (due, cap) {
                if !is_capturing(stream)? {
                    let h = self.handle.on(cap)?;
                    let plan = self.plans.get_mut(&key).expect("checked above");
                    // SAFETY: the capture stream is private and idle; the launch enqueues only
                    // on it; the buffers stay the caller's contract for every replay (the key).
                    match unsafe { capture(cap, |_| launch(h, call, plan, ws)) } {
                        Ok(g) => {
                            self.seen.remove(&rkey);
                            let g = self.graphs.entry(rkey).or_insert(g);
                            // SAFETY: as for a cached graph above.
                            return unsafe { g.launch(stream) }.map(|()| true);
                        }
                        Err(e) => {
                            tracing::debug!(problem = %p.describe(), error = %e, "convolution capture failed; direct call")
                        }
                    }
                }
            }
        }
        Ok(false)
    }
}
