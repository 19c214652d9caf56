//! The cuDNN room's convolution plans in the tactic database ([`crate::tactics`], kind
//! "conv2d"; attention plans' keys are `attention/tactic.rs`'s, both kinds taken in here): a
//! plan key's stable text, a chosen plan as a [`Tactic`] (after a measured search), the
//! database's entries taken in, and a problem's plan from its entry (rebuilt without searching:
//! `rebuild.rs`).

use std::collections::{BTreeSet, HashSet};

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::graph_desc::Desc;
use super::graph_search::engine_of;
use super::rebuild::rebuild;
use super::{attention, ConvApi, ConvCall, ConvOp, DnnState, EngineConfig, PlanKey, Planned};
use crate::conv::{Conv2d, ConvActivation};
use crate::error::Result;
use crate::tactics::{Choice, Library, ProblemKind, Tactic};

/// The database key of a plan key (the format is the tactics module's, "Signatures").
pub(super) fn key_text(&(p, op, fused, api, align): &PlanKey) -> String {
    let dir = match op {
        ConvOp::Forward => "fwd",
        ConvOp::Fused(ConvActivation::Relu) => "fwd_bias_relu",
        ConvOp::Fused(ConvActivation::Identity) => "fwd_bias",
        ConvOp::BackwardData => "dgrad",
        ConvOp::BackwardFilter => "wgrad",
    };
    let unfused = if matches!(op, ConvOp::Fused(_)) && !fused { "_unfused" } else { "" };
    let api = match api {
        ConvApi::Graph => "graph",
        ConvApi::Legacy => "legacy",
    };
    let align = if align == 0 { "any".to_string() } else { align.to_string() };
    format!(
        "conv2d {dir}{unfused} n{} c{} h{} w{} k{} r{} s{} stride{},{} pad{},{} dil{},{} g{} {} {} {api} al{align}",
        p.n,
        p.c,
        p.h,
        p.w,
        p.k,
        p.r,
        p.s,
        p.stride[0],
        p.stride[1],
        p.pad[0],
        p.pad[1],
        p.dilation[0],
        p.dilation[1],
        p.groups,
        p.layout,
        p.precision.name()
    )
}

/// Knob choices asked of an engine configuration: more than cuDNN 9 has knob types
/// (`CUDNN_KNOB_TYPE_COUNTS` is below 64 in cuDNN 9.x's headers).
const KNOB_SLOTS: usize = 64;

/// The engine configuration `cfg` holds: its engine's global index and its knob choices.
pub(super) fn read_config(cfg: &Desc) -> Result<EngineConfig> {
    let (engine, _) = engine_of(cfg)?;
    let (attr, ty) = (A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, T::CUDNN_TYPE_BACKEND_DESCRIPTOR);
    // A count query (no array) answers 0 for the engine configurations cuDNN 9.19's heuristics
    // return (read that way, 88 plans tuned on the H200 were stored with no knobs, and the
    // plans rebuilt from them ran up to 7.7× slower than the tuned ones): as cudnn-frontend
    // does, ask for up to KNOB_SLOTS choices into descriptors created beforehand.
    let choices: Vec<Desc> =
        (0..KNOB_SLOTS).map(|_| Desc::new(D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)).collect::<Result<_>>()?;
    let mut raws: Vec<raw::cudnnBackendDescriptor_t> = choices.iter().map(|d| d.0).collect();
    // SAFETY: cuDNN fills the caller's created KNOB_CHOICE descriptors, at most KNOB_SLOTS.
    let got = unsafe { cfg.get(attr, ty, &mut raws) }?;
    let mut knobs = Vec::with_capacity(got);
    for c in choices.iter().take(got) {
        let mut ty = [0u32];
        // SAFETY: KNOB_TYPE is written as the (32-bit) enum; any value fits a u32.
        unsafe { c.get(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, T::CUDNN_TYPE_KNOB_TYPE, &mut ty) }?;
        knobs.push((ty[0], c.get_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?));
    }
    Ok(EngineConfig { engine, knobs })
}

/// The tactic of a plan a measured search chose (`None` for a heuristic choice or a plan that
/// came from the database), tuned with cuDNN `version`.
pub(super) fn export(plan: &Planned, version: usize) -> Option<Tactic> {
    let (choice, m) = match plan {
        Planned::Graph(g, tail) => {
            // read from the engine configuration (the first descriptor the plan was made of)
            let c = g.config.clone().or_else(|| read_config(&g._made_of[0]).ok())?;
            let unfused = tail.is_some();
            (Choice::CudnnEngine { engine: c.engine, knobs: c.knobs, workspace: g.workspace, unfused }, g.measured?)
        }
        Planned::Legacy(pl) => {
            let c = pl.choice;
            (Choice::CudnnAlgo { algo: c.algo.value(), math: c.math as u32, workspace: c.workspace }, c.measured?)
        }
    };
    Some(Tactic::cudnn_conv(choice, version, m.heuristic_ms, m.tuned_ms))
}

impl DnnState {
    /// Takes the tactic database's convolution and attention entries of this cuDNN version
    /// (entries of another are left out with one warning) and drops the plans, and their replay
    /// graphs, that the new entries replace: they are rebuilt from the entries on next use. The
    /// context is bound by the caller.
    pub fn load_tactics<'a>(&mut self, entries: impl IntoIterator<Item = (&'a String, &'a Tactic)>) {
        let (mut new, mut other) = (HashSet::<String>::new(), BTreeSet::new());
        let kinds = [ProblemKind::Conv2d, ProblemKind::Attention];
        let conv = entries.into_iter().filter(|(_, t)| t.library == Library::Cudnn && kinds.contains(&t.kind));
        let mut stale = 0usize;
        for (sig, t) in conv {
            if t.version == self.version {
                self.tuned.insert(sig.clone(), t.choice.clone());
                new.insert(sig.clone());
            } else {
                stale += 1;
                other.insert(t.version);
            }
        }
        if stale > 0 {
            let cudnn = self.version;
            tracing::warn!(stale, tuned_with = ?other, cudnn, "cuDNN tactics of another cuDNN version; not used");
        }
        self.plans.retain(|k, _| !new.contains(&key_text(k)));
        self.attn.retain(|k, _| !new.contains(&attention::key_text(k)));
        self.graphs.retain(|k, _| !new.contains(&key_text(&k.0)));
        self.seen.retain(|k, _| !new.contains(&key_text(&k.0)));
    }

    /// The plan the database holds for the call's problem, direction and alignment, rebuilt
    /// without a search; `None` without an entry, or (logged as a warning) where cuDNN refuses
    /// it. Limits: the room's workspace limit for the graph API, the stream's workspace for the
    /// legacy API, as for a plan made by a search. Returned with the entry's key text.
    ///
    /// # Safety
    /// `h` is a live handle.
    pub(super) unsafe fn database_plan(
        &self,
        h: raw::cudnnHandle_t,
        call: &ConvCall,
        fuse: bool,
    ) -> Option<(Planned, String)> {
        let (p, op, b, workspace) = (call.problem, call.op, &call.buffers, call.workspace);
        let sig = key_text(&(*p, op, fuse, self.api, self.key(p, op, b).4));
        let choice = self.tuned.get(&sig)?;
        let limit = self.ws_limit.max(workspace.1);
        // SAFETY: forwarded.
        match unsafe { rebuild(h, call, fuse, choice, limit) } {
            Ok(plan) => {
                tracing::debug!(key = %sig, ?choice, "cuDNN plan from the tactic database");
                Some((plan, sig))
            }
            Err(e) => {
                tracing::warn!(key = %sig, ?choice, error = %e, "cuDNN refused the tactic database's plan; planning without it");
                None
            }
        }
    }

    /// The tactic of `p` and `op`'s plan under the current settings (the best-aligned one),
    /// where a measured search chose it: its key text and the tactic.
    pub fn tactic(&self, p: &Conv2d, op: ConvOp) -> Option<(String, Tactic)> {
        let (key, plan) = self.any_entry(p, op)?;
        export(plan, self.version).map(|t| (key_text(key), t))
    }

    /// The key texts of the database entries plans were built from so far.
    pub fn applied(&self) -> &BTreeSet<String> {
        &self.applied
    }

    /// The tactics of every plan a measured search chose, by key text.
    pub fn tactics(&self) -> Vec<(String, Tactic)> {
        let mut all: Vec<(String, Tactic)> =
            self.plans.iter().filter_map(|(k, plan)| export(plan, self.version).map(|t| (key_text(k), t))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvLayout;
    use crate::precision::Precision;

    fn resnet() -> Conv2d {
        Conv2d::new([32, 64, 56, 56], [64, 3, 3], Precision::BF16).with_pad(1, 1)
    }

    #[test]
    fn key_text_is_the_documented_format() {
        let key = (resnet(), ConvOp::Fused(ConvActivation::Relu), true, ConvApi::Graph, 16);
        assert_eq!(
            key_text(&key),
            "conv2d fwd_bias_relu n32 c64 h56 w56 k64 r3 s3 stride1,1 pad1,1 dil1,1 g1 nhwc bf16 graph al16"
        );
        let odd = Conv2d::new([3, 8, 17, 15], [12, 7, 5], Precision::TF32)
            .with_stride(2, 3)
            .with_pad(3, 2)
            .with_dilation(1, 2)
            .with_groups(4)
            .with_layout(ConvLayout::Nchw);
        assert_eq!(
            key_text(&(odd, ConvOp::BackwardFilter, false, ConvApi::Legacy, 0)),
            "conv2d wgrad n3 c8 h17 w15 k12 r7 s5 stride2,3 pad3,2 dil1,2 g4 nchw tf32 legacy alany"
        );
    }

    #[test]
    fn every_part_of_the_plan_key_changes_the_text() {
        let p = resnet();
        let mut keys: Vec<PlanKey> = Vec::new();
        for op in [
            ConvOp::Forward,
            ConvOp::Fused(ConvActivation::Relu),
            ConvOp::Fused(ConvActivation::Identity),
            ConvOp::BackwardData,
            ConvOp::BackwardFilter,
        ] {
            for fused in [true, false] {
                // a fusion setting is part of the key only for the fused forward
                if fused || matches!(op, ConvOp::Fused(_)) {
                    keys.push((p, op, fused, ConvApi::Graph, 16));
                }
            }
        }
        for layout in [ConvLayout::Nhwc, ConvLayout::Nchw] {
            for precision in [Precision::F32, Precision::TF32, Precision::F16, Precision::BF16] {
                for (api, align) in
                    [(ConvApi::Graph, 16), (ConvApi::Graph, 8), (ConvApi::Graph, 2), (ConvApi::Legacy, 0)]
                {
                    keys.push((p.with_layout(layout).with_precision(precision), ConvOp::Forward, true, api, align));
                }
            }
        }
        for q in [
            Conv2d { n: 31, ..p },
            Conv2d { c: 63, ..p },
            Conv2d { h: 55, ..p },
            Conv2d { w: 55, ..p },
            Conv2d { k: 65, ..p },
            Conv2d { r: 1, ..p },
            Conv2d { s: 1, ..p },
            p.with_stride(2, 1),
            p.with_stride(1, 2),
            p.with_pad(0, 1),
            p.with_pad(1, 0),
            p.with_dilation(2, 1),
            p.with_dilation(1, 2),
            p.with_groups(2),
        ] {
            keys.push((q, ConvOp::Forward, true, ConvApi::Graph, 16));
        }
        let distinct: HashSet<PlanKey> = keys.iter().copied().collect();
        assert!(distinct.len() > 50, "{}", distinct.len());
        let texts: BTreeSet<String> = distinct.iter().map(key_text).collect();
        assert_eq!(texts.len(), distinct.len(), "two plan keys share a text");
        assert!(texts.iter().all(|t| t.starts_with("conv2d ") && !t.contains("  ")));
        // stable: the same key, the same text
        let again = keys[0];
        assert_eq!(key_text(&keys[0]), key_text(&again));
    }
}
