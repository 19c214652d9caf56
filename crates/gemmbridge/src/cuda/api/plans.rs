//! [`Plans`]: the engine's plans, replay graphs and tuned tactics — loading a tactic database,
//! what served, what is cached, dropping it; how a problem was or would be planned (those
//! queries sit beside their capability's entry points: `conv.rs`, `attention/`,
//! `gemm/grouped.rs`).

use super::engine::Gpu;
use crate::cuda::lt::launch::Algorithm;
use crate::tactics;

/// The plans of one [`Gpu`] ([`Gpu::plans`]): its tactic database entries
/// ([`Plans::load_tactics`], [`Plans::applied_tactics`]), its caches ([`Plans::cached`],
/// [`Plans::graphs`], [`Plans::clear`]), and how a problem was planned or would run —
/// convolutions ([`Plans::conv2d`], [`Plans::conv2d_tactic`], [`Plans::conv2d_tactics`]),
/// attention ([`Plans::attention`], [`Plans::attention_tactic`]), grouped GEMMs
/// ([`Plans::grouped_backend`]). Each query takes the engine's
/// lock for its own duration.
#[derive(Clone, Copy, Debug)]
pub struct Plans<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The engine's plans, replay graphs and tactics ([`Plans`]).
    pub fn plans(&self) -> Plans<'_> {
        Plans { gpu: self }
    }
}

impl Plans<'_> {
    /// Loads tuned algorithms (from [`tactics::TacticDb::load`]): plans built from now on use
    /// them wherever cuBLASLt confirms they are valid (cublasLtMatmulAlgoCheck); cached plans
    /// are dropped so that they are rebuilt.
    ///
    /// Convolutions: the entries of kind "conv2d" tuned with the cuDNN version this process
    /// loads (entries of another are left out with a warning, once the cuDNN room exists) are
    /// kept by problem signature. The first time a problem with an entry is planned, its plan is
    /// rebuilt from the entry without a search, whatever [`GpuOptions::conv_search`] says: the
    /// graph API's engine by its global index with the recorded knobs (the legacy API's
    /// algorithm with its math type), used if cuDNN finalizes it, it keeps the precision's
    /// promise and its workspace fits [`GpuOptions::conv_workspace_limit`] (the legacy API: the
    /// stream's workspace); otherwise a warning is logged and the problem is planned as without
    /// the database. Convolution plans an entry replaces are dropped.
    ///
    /// Attention: the entries of kind "attention" of the cuDNN version loaded are taken the
    /// same way; a problem, direction and alignment with an entry is planned from its engine
    /// and knobs, whatever [`GpuOptions::attention_search`] says, if cuDNN finalizes the plan
    /// and its workspace fits the limit (otherwise a warning, and the usual planning).
    /// Attention plans an entry replaces are dropped.
    ///
    /// Grouped GEMMs: the entries of kind "grouped_gemm" are kept by signature
    /// ([`crate::grouped::GroupedProblem::signature`]); a problem with an entry runs the
    /// entry's backend where it applies to it and none is forced
    /// ([`crate::grouped::streams::GroupedSettings::choose`]).
    ///
    /// [`GpuOptions::conv_search`]: super::GpuOptions::conv_search
    /// [`GpuOptions::conv_workspace_limit`]: super::GpuOptions::conv_workspace_limit
    /// [`GpuOptions::attention_search`]: super::GpuOptions::attention_search
    pub fn load_tactics(&self, db: &tactics::TacticDb) {
        let gpu = self.gpu;
        {
            let mut st = gpu.lock();
            let grouped = db.entries.iter().filter_map(|(k, t)| Some((k.clone(), t.grouped_backend()?)));
            st.libs.grouped.tuned.extend(grouped);
            let kinds = [tactics::ProblemKind::Conv2d, tactics::ProblemKind::Attention];
            let dnn = db.entries.iter().filter(|(_, t)| kinds.contains(&t.kind));
            st.libs.dnn_tactics.extend(dnn.map(|(k, t)| (k.clone(), t.clone())));
            if let Some(d) = st.libs.dnn.as_mut() {
                let _ = gpu.device().bind(); // replay graphs may be destroyed
                d.load_tactics(db.entries.iter());
            }
        }
        gpu.with_lt(|lt| {
            // GEMM and FP8 GEMM keys share the map: their prefixes never collide (tactics docs)
            let lt_kinds = [tactics::ProblemKind::Gemm, tactics::ProblemKind::Fp8Gemm];
            for (sig, t) in db.entries.iter().filter(|(_, t)| lt_kinds.contains(&t.kind)) {
                if let Some((data, workspace)) = t.lt_algo() {
                    lt.tuned.insert(sig.clone(), Algorithm { data, workspace });
                }
            }
            lt.forget_plans(|_| true);
        });
    }

    /// The signatures of the tuned entries this `Gpu` has built plans with since it was
    /// created, sorted: entries of a tactic database ([`Plans::load_tactics`]) and choices this
    /// `Gpu` tuned itself ([`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw), [`GpuTuning::fp8`](crate::cuda::GpuTuning::fp8): these keep their
    /// result for their signature, even where it is the heuristic's own choice) — cuBLASLt GEMM
    /// and FP8 entries whose algorithm cuBLASLt accepted for the call, convolution and attention
    /// entries cuDNN rebuilt, grouped GEMM entries whose way ran a call ([`GpuTuning::grouped`](crate::cuda::GpuTuning::grouped)'s
    /// included). Never cleared (loading other entries or dropping plans keeps the record). An
    /// entry that was loaded but is missing here has served no call yet — or was refused (a
    /// warning is logged) or does not match the calls made (another alignment, workspace or SM
    /// count target gives another signature). `gemmbridge tune` uses this to check that the
    /// call it times is the one an entry serves.
    pub fn applied_tactics(&self) -> Vec<String> {
        let st = self.gpu.lock();
        let mut all: Vec<String> =
            st.libs.lt.as_ref().map(|lt| lt.applied.iter().cloned().collect()).unwrap_or_default();
        all.extend(st.libs.dnn.as_ref().map(|d| d.applied().iter().cloned().collect::<Vec<_>>()).unwrap_or_default());
        all.extend(st.libs.grouped.applied.iter().cloned());
        all.sort();
        all
    }

    /// Number of cached cuBLASLt plans (0 without cuBLASLt).
    pub fn cached(&self) -> usize {
        self.gpu.lock().libs.lt.as_ref().map_or(0, |lt| lt.plans.len())
    }

    /// Number of cached cuDNN attention plans, every direction and paged decodes included (0
    /// before the first attention call). A paged decode's plan is keyed by its bucketed table
    /// width, so steps inside one bucket add none.
    pub fn attention_count(&self) -> usize {
        self.gpu.lock().libs.dnn.as_ref().map_or(0, |d| d.attention_plans())
    }

    /// Number of cached replay graphs: of single calls, and of whole grouped GEMMs
    /// ([`GpuOptions::graph_replay`](super::GpuOptions::graph_replay)).
    pub fn graphs(&self) -> usize {
        self.gpu.lock().libs.lt.as_ref().map_or(0, |lt| lt.replay.graphs.len() + lt.composite.graphs.len())
    }

    /// Drops every cached cuBLASLt plan and replay graph (they are rebuilt on next use).
    /// Convolution and attention plans are kept.
    pub fn clear(&self) {
        self.gpu.with_lt(|lt| {
            lt.forget_plans(|_| true);
            lt.unsupported.clear();
        });
    }
}
