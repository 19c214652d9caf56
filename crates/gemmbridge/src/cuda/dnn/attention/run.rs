//! One attention call's way through the cuDNN room: its plan looked up, or made on its first
//! call (from the tactic database's entry, by a measured search, or cuDNN's heuristic), the
//! workspace it runs on (the stream's, or the room's larger one), and the launch.

use cudarc::cudnn::sys as raw;

use super::plan::{self, AttnPlan, Choose};
use super::tactic::{export, key_text};
use super::{AttnCall, AttnKey, AttnOp, LensSource, BACKWARD_FIX_VERSION};
use crate::attention::Attention;
use crate::cuda::dnn::graph_search::time_launches;
use crate::cuda::dnn::{DnnState, EngineConfig};
use crate::error::{Error, Result};
use crate::tactics::{Choice, Tactic};

impl DnnState {
    /// The number of attention plans kept.
    pub fn attention_plans(&self) -> usize {
        self.attn.len()
    }

    /// Whether the call's plan exists (a call is then capturable, given device lengths).
    pub fn attention_planned(&self, call: &AttnCall) -> bool {
        self.attn.contains_key(&AttnKey::new(call.problem, call.op, call.buffers.alignment()))
    }

    /// Where a plan for `p` and `op` takes lengths from: the decode's (q lengths of 1 and the
    /// call's kv lengths) for a paged decode; the call's with per-sequence lengths;
    /// the full extents for a backward on a cuDNN before the fix whose key length is not a
    /// multiple of 128; none otherwise.
    fn lens_source(&self, p: &Attention, op: AttnOp) -> LensSource {
        if matches!(op, AttnOp::PagedDecode(_)) {
            LensSource::Decode
        } else if p.var_len {
            LensSource::Call
        } else if op == AttnOp::Backward && self.version < BACKWARD_FIX_VERSION && !p.s_kv.is_multiple_of(128) {
            LensSource::Full
        } else {
            LensSource::None
        }
    }

    /// Runs one attention call on its stream: the plan (made on first use; the caller has
    /// checked that the stream is not capturing then) and its launch. `before` enqueues what
    /// the launch reads besides the call's buffers (the FP8 backward's scales): once the plan
    /// exists and before the launch, and before each launch a measured search times.
    ///
    /// # Safety
    /// The call's addresses are device memory of this context holding the problem's tensors
    /// (checked by the entry point), its workspace is this stream's, its stream is live.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where no engine of the loaded cuDNN takes the graph;
    /// [`Error::Cudnn`]; driver errors of the workspace and the lengths' copies.
    pub unsafe fn attention(&mut self, call: &AttnCall, before: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let (p, op, align) = (call.problem, call.op, call.buffers.alignment());
        let key = AttnKey::new(p, op, align);
        self.attention_supported(p, op)?;
        let h = self.handle.on(call.stream)?;
        if !self.attn.contains_key(&key) {
            let limit = self.ws_limit.max(call.workspace.1);
            // SAFETY: forwarded.
            let Some(made) = (unsafe { self.attention_make(h, call, &key, limit, before) })? else {
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
        before()?;
        // SAFETY: forwarded; `ws` holds the plan's workspace.
        unsafe { plan.launch(h, call, ws) }
    }

    /// The version rules of cudnn-frontend's support checks, as named errors: the FP8 backward
    /// from 9.1.0, not 9.10.0 (known bugs there); paged caches from 9.5.0, and with a head
    /// dimension above 128 only after 9.9 (`sdpa_support_surface.h`).
    fn attention_supported(&self, p: &Attention, op: AttnOp) -> Result<()> {
        let v = self.version;
        let refused = match op {
            AttnOp::BackwardFp8 { .. } if v < 90100 || v == 91000 => {
                "the FP8 attention backward (it needs 9.1.0 or later, not 9.10.0)"
            }
            AttnOp::PagedDecode(_) if v < 90500 => "attention over a paged KV cache (it needs 9.5.0 or later)",
            AttnOp::PagedDecode(_) if p.d > 128 && v <= 90900 => {
                "attention over a paged KV cache with a head dimension above 128 (it needs a cuDNN after 9.9)"
            }
            _ => return Ok(()),
        };
        Err(Error::Unsupported { backend: "cuDNN", what: format!("{refused} on cuDNN {v}: {}", p.describe()) })
    }

    /// The plan for the call's key: the tactic database's entry where there is one (a warning
    /// and the search below where cuDNN refuses it), else a measured search where
    /// [`DnnState::attn_search`] is set (each candidate timed on the call's own buffers), else
    /// the heuristic's first.
    ///
    /// # Safety
    /// As [`DnnState::attention`]; `h` is bound to the call's stream.
    unsafe fn attention_make(
        &mut self,
        h: raw::cudnnHandle_t,
        call: &AttnCall,
        key: &AttnKey,
        limit: usize,
        before: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Option<AttnPlan>> {
        let (p, op, align) = (call.problem, call.op, key.align);
        let lens = self.lens_source(p, op);
        let sig = key_text(key);
        if let Some(Choice::CudnnEngine { engine, knobs, .. }) = self.tuned.get(&sig) {
            let c = EngineConfig { engine: *engine, knobs: knobs.clone() };
            match plan::make(h, (p, op, align), lens, limit, Choose::Tuned(&c)) {
                Ok(made) => {
                    self.applied.insert(sig);
                    return Ok(made);
                }
                Err(e) => {
                    tracing::warn!(key = %sig, ?c, error = %e, "cuDNN refused the tactic database's attention plan; planning without it");
                }
            }
        }
        if !self.attn_search {
            return plan::make(h, (p, op, align), lens, limit, Choose::Heuristic);
        }
        let (big, graphs) = (&mut self.big, &mut self.graphs);
        let mut time = |pl: &mut AttnPlan| -> Option<f64> {
            let ws = big.get(graphs, call.workspace, pl.extra.total, call.stream).ok()?;
            before().ok()?;
            // SAFETY: forwarded; `ws` holds the plan's workspace.
            let ms = unsafe { time_launches(call.stream, &mut || pl.launch(h, call, ws)) };
            ms.map_err(|e| tracing::debug!(name = %pl.name, error = %e, "skipped: the plan fails to run")).ok()
        };
        plan::make(h, (p, op, align), lens, limit, Choose::Measured(&mut time))
    }

    /// The tactic of `p` and `op`'s plan (the best-aligned one), where a measured search
    /// chose it: its key text and the tactic.
    pub fn attention_tactic(&self, p: &Attention, op: AttnOp) -> Option<(String, Tactic)> {
        let keys = (0..=4).rev().map(|s| AttnKey::new(p, op, 1 << s));
        let (key, plan) = keys.filter_map(|k| self.attn.get(&k).map(|pl| (k, pl))).next()?;
        export(plan, self.version).map(|t| (key_text(&key), t))
    }

    /// The engine planned for `p` and `op` (at the best alignment planned), once planned.
    pub fn attention_plan(&self, p: &Attention, op: AttnOp) -> Option<String> {
        let mine = (0..=4).rev().map(|s| AttnKey::new(p, op, 1 << s));
        mine.filter_map(|k| self.attn.get(&k)).map(|pl| pl.name.clone()).next()
    }
}
