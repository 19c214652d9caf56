//! A grouped product spread over a small pool of streams, as data: the groups' GEMMs assigned to
//! the pool's streams by their work, longest first, each to the stream with the least work so far
//! (so that small groups, which leave most of the GPU idle on their own, run side by side); the
//! pool forked from the caller's stream with an event and joined back to it with one event per
//! pool stream, so that what follows on the caller's stream sees every group and a capture of
//! the caller's stream takes the pool's work with it. [`schedule`] makes the steps (the tests
//! replay them on in-order queues with events: every group runs once, after the fork and
//! before the join — the order a GPU run must keep). Empty groups launch nothing.
//!
//! Which way a grouped product runs — cuDNN's MoE grouped matmul, one strided batch, cuBLAS's
//! grouped call, or this pool of per-group plans — is chosen among the [`candidates`] that
//! apply, by the rule of [`GroupedSettings::choose`], by measurement, or forced.

use crate::error::{Error, Result};
use crate::precision::Precision;

use super::{GroupedOp, GroupedProblem};

/// A way to run a grouped product on the vendor libraries (in a tactic database:
/// "strided_batch", "grouped_batched", "stream_pool", "cudnn_moe").
///
/// The measured reason each is kept (docs/DESIGN.md, "Grouped GEMMs"): one strided batch is the
/// fastest way for equal groups; cuBLAS's grouped call the fastest for small unequal groups of
/// a forward or backward data; the pool the fastest for large unequal groups and most backward
/// weights; cuDNN's MoE grouped matmul is the vendor's one operation over every group whatever
/// their sizes (the way [`crate::moe`]'s device group starts run on), measured several times
/// slower than the others on skewed groups on Hopper (cuDNN 9.19), so taken only where measured
/// faster or forced.
/// cuBLASLt's grouped matmul (cuBLAS 13.2 and later) is not a way yet;
/// [`crate::cuda::library::has_cublaslt_grouped_matmul`] tells whether the loaded library
/// offers it, from its version and its exported symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupedBackend {
    /// One strided-batched GEMM: every group has the same (non-zero) size and there is no
    /// bias.
    StridedBatch,
    /// cuBLAS's grouped batched GEMM (`cublasGemmGroupedBatchedEx`, cuBLAS 12.5 and later):
    /// every group in one call. For the precisions whose inputs and output share a type (f32,
    /// tf32, f16, bf16: the types cuBLAS's documentation lists for it), without a bias and
    /// without an empty group in a backward weight (its zeros would need a GEMM of k = 0).
    /// Not capturable (its pointer arrays are copied from the host on each call).
    GroupedBatched,
    /// A plan per group (cuBLASLt), launched on a pool of streams ([`schedule`]); in order on
    /// the caller's stream where one group has rows or the pool has one stream.
    StreamPool,
    /// cuDNN's MoE grouped matmul (cuDNN 9.18 and later, [`crate::moe`]): every group in one
    /// operation, the group starts written to the device by a kernel launch. A forward in f16
    /// or bf16 without a bias.
    #[serde(rename = "cudnn_moe")]
    Cudnn,
}

/// The ways that apply to `p` where the loaded cuDNN has (`cudnn_moe`) or lacks the MoE
/// grouped matmul: a strided batch where every group has the same non-zero size and there is
/// no bias (a bias per group would need a batch stride for the bias), cuDNN's MoE operation
/// where [`GroupedBackend::Cudnn`] says it applies, cuBLAS's grouped call where
/// [`GroupedBackend::GroupedBatched`] says it applies, then the pool, which takes any problem.
pub fn candidates(p: &GroupedProblem, cudnn_moe: bool) -> Vec<GroupedBackend> {
    let mut out = Vec::with_capacity(4);
    let first = p.sizes()[0];
    if first > 0 && !p.has_bias() && p.sizes().iter().all(|&m| m == first) {
        out.push(GroupedBackend::StridedBatch);
    }
    if cudnn_moe && moe_fits(p) {
        out.push(GroupedBackend::Cudnn);
    }
    let empty_dw = p.op() == GroupedOp::BackwardWeight && p.sizes().contains(&0);
    if same_type(p) && !p.has_bias() && !empty_dw && p.groups() <= MAX_GROUPED_CALL_GEMMS {
        out.push(GroupedBackend::GroupedBatched);
    }
    out.push(GroupedBackend::StreamPool);
    out
}

/// Whether cuDNN's MoE grouped matmul takes `p`: a forward (its backward data reads the weight
/// in a layout cuDNN 9.19 has no engine for; its backward weight needs 9.22), f16 or bf16, no
/// bias.
fn moe_fits(p: &GroupedProblem) -> bool {
    p.op() == GroupedOp::Forward && !p.has_bias() && matches!(p.precision(), Precision::F16 | Precision::BF16)
}

/// How grouped products run on an engine: a forced backend, or `None` for the measured
/// choices and the rule ([`GroupedSettings::choose`]); how many streams a pooled run spreads
/// over; whether the loaded cuDNN has the MoE grouped matmul.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupedSettings {
    /// The forced backend.
    pub backend: Option<GroupedBackend>,
    /// Streams of the pool (1 to [`MAX_STREAMS`]).
    pub streams: usize,
    /// Whether the loaded cuDNN has the MoE grouped matmul (9.18 and later): `None` until a
    /// grouped call first asks.
    pub cudnn_moe: Option<bool>,
    /// Measured choices by [`GroupedProblem::signature`] (a tactic database's entries of kind
    /// "grouped_gemm", or the engine's own tuning).
    pub tuned: std::collections::BTreeMap<String, GroupedBackend>,
    /// The signatures of measured choices that have served a call ([`GroupedSettings::note_use`]).
    pub applied: std::collections::BTreeSet<String>,
}

/// The most streams a pool has.
pub const MAX_STREAMS: usize = 16;

/// The mean multiply-adds per group with rows up to which [`GroupedSettings::choose`] takes
/// cuBLAS's grouped call for unequal groups (2³⁰, 1024³).
pub const SMALL_GROUP_MACS: u64 = 1 << 30;

/// The most GEMMs one cuBLAS grouped call takes here: their A, B and C pointers (8 bytes each)
/// are copied into the stream workspace's 1 MiB scratch. More groups than this make
/// [`GroupedBackend::GroupedBatched`] no candidate.
pub const MAX_GROUPED_CALL_GEMMS: usize = (1 << 20) / 24;

impl Default for GroupedSettings {
    /// The rule, and 4 streams (what TransformerEngine's grouped linear layer uses by default,
    /// `num_gemm_streams`).
    fn default() -> Self {
        let (tuned, applied) = Default::default();
        GroupedSettings { backend: None, streams: 4, cudnn_moe: None, tuned, applied }
    }
}

impl GroupedSettings {
    /// Whether `streams` is a pool size.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for 0 or more than [`MAX_STREAMS`].
    pub fn check_streams(streams: usize) -> Result<()> {
        if !(1..=MAX_STREAMS).contains(&streams) {
            let expected = format!("1 to {MAX_STREAMS}");
            return Err(Error::OutOfRange { what: "grouped GEMM streams", value: streams as u64, expected });
        }
        Ok(())
    }

    /// The backend for `p` among the ways that apply to it ([`candidates`]): the forced one if
    /// it applies; else the measured choice for `p`'s signature ([`GroupedSettings::tuned`]) if
    /// it applies; else [`rule`]'s.
    ///
    /// # Errors
    /// [`Error::Unsupported`]: the forced backend is not a candidate (naming why).
    pub fn choose(&self, p: &GroupedProblem) -> Result<GroupedBackend> {
        let moe = self.cudnn_moe.unwrap_or(false);
        let candidates = candidates(p, moe);
        if let Some(b) = self.backend {
            if candidates.contains(&b) {
                return Ok(b);
            }
            let what = format!("{b:?} for {}: {}", p.describe(), why_not(p, b, moe));
            return Err(Error::Unsupported { backend: "grouped GEMM", what });
        }
        if let Some(&b) = self.tuned.get(&p.signature()).filter(|b| candidates.contains(b)) {
            return Ok(b);
        }
        Ok(rule(p))
    }

    /// Records that `p` ran on `how`: where that was its measured choice (nothing forced), the
    /// signature joins [`GroupedSettings::applied`].
    pub fn note_use(&mut self, p: &GroupedProblem, how: GroupedBackend) {
        if self.backend.is_none() {
            let sig = p.signature();
            if self.tuned.get(&sig) == Some(&how) {
                self.applied.insert(sig);
            }
        }
    }
}

/// The backend [`GroupedSettings::choose`]'s rule gives `p` when nothing is forced or
/// measured for it (the baseline a measured choice is judged against): one strided batch for
/// equal groups; cuBLAS's grouped call for small unequal groups (at most [`SMALL_GROUP_MACS`]
/// multiply-adds each on average) of a forward or backward data; the pool otherwise. cuDNN's
/// MoE operation is never the rule's (see [`GroupedBackend`]). The rule is the measurement on
/// an H100 and an H200 (cuBLAS 13.1, cuDNN 9.19, bf16, bench/grouped.json's shapes,
/// docs/PERFORMANCE.md).
pub fn rule(p: &GroupedProblem) -> GroupedBackend {
    let candidates = candidates(p, false);
    let busy = p.busy_groups();
    let small = busy > 0 && p.macs() / busy as f64 <= SMALL_GROUP_MACS as f64;
    if candidates.contains(&GroupedBackend::StridedBatch) {
        GroupedBackend::StridedBatch
    } else if small && p.op() != GroupedOp::BackwardWeight && candidates.contains(&GroupedBackend::GroupedBatched) {
        GroupedBackend::GroupedBatched
    } else {
        GroupedBackend::StreamPool
    }
}

/// Whether `p`'s precision is one of those cuBLAS's grouped call takes (inputs and output of
/// one type).
fn same_type(p: &GroupedProblem) -> bool {
    matches!(p.precision(), Precision::F32 | Precision::TF32 | Precision::F16 | Precision::BF16)
}

/// Why backend `b` does not apply to `p` (for the error of a forced one), the loaded cuDNN
/// having (`cudnn_moe`) or lacking the MoE grouped matmul.
fn why_not(p: &GroupedProblem, b: GroupedBackend, cudnn_moe: bool) -> String {
    let empty = p.sizes().iter().position(|&m| m == 0);
    let first = p.sizes()[0];
    match (b, empty) {
        _ if p.has_bias() => "there is a bias".into(),
        (GroupedBackend::StridedBatch, Some(e)) => format!("group {e} is empty"),
        (GroupedBackend::StridedBatch, None) => {
            let e = p.sizes().iter().position(|&m| m != first).unwrap_or(0);
            format!("the groups differ in size (m[0] = {first}, m[{e}] = {})", p.sizes()[e])
        }
        (GroupedBackend::Cudnn, _) if p.op() == GroupedOp::BackwardWeight => {
            "cuDNN's MoE grouped matmul has no backward weight before 9.22".into()
        }
        (GroupedBackend::Cudnn, _) if p.op() == GroupedOp::BackwardData => {
            "cuDNN's MoE grouped matmul has no engine for the backward data's weight layout (cuDNN 9.19)".into()
        }
        (GroupedBackend::Cudnn, _) if !cudnn_moe => {
            "the loaded cuDNN has no MoE grouped matmul (it needs 9.18 or later)".into()
        }
        (GroupedBackend::Cudnn, _) => format!("cuDNN's MoE grouped matmul takes f16 and bf16, not {}", p.precision()),
        (GroupedBackend::GroupedBatched, Some(e)) if p.op() == GroupedOp::BackwardWeight => {
            format!("group {e} of a backward weight is empty (its zeros need a GEMM of k = 0)")
        }
        (GroupedBackend::GroupedBatched, _) if p.groups() > MAX_GROUPED_CALL_GEMMS => {
            format!("{} groups, more than the {MAX_GROUPED_CALL_GEMMS} one call takes", p.groups())
        }
        (GroupedBackend::GroupedBatched, _) => format!("its output type differs from its inputs' ({})", p.precision()),
        _ => "not offered for this problem".into(),
    }
}

/// A queue: lane 0 is the caller's stream, lanes 1.. the pool's.
pub type Lane = usize;

/// One step on a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Group `e`'s GEMM.
    Launch(usize),
    /// Records event `n` on the lane (after what the lane enqueued so far).
    Record(usize),
    /// The lane waits for event `n`.
    Wait(usize),
}

/// The groups assigned to `streams` pool streams (at most one per group with work; at least
/// one), longest-processing-time first: `work[e]` is group e's work (e.g. its multiply-adds);
/// groups of no work are assigned nowhere. Returns each pool stream's groups in launch order.
pub fn assign(work: &[u64], streams: usize) -> Vec<Vec<usize>> {
    let busy = work.iter().filter(|&&w| w > 0).count();
    let lanes = streams.min(busy).max(1);
    let mut order: Vec<usize> = (0..work.len()).filter(|&e| work[e] > 0).collect();
    order.sort_by_key(|&e| (std::cmp::Reverse(work[e]), e));
    let mut load = vec![0u64; lanes];
    let mut out = vec![Vec::new(); lanes];
    for e in order {
        let lane = (0..lanes).min_by_key(|&l| (load[l], l)).expect("at least one lane");
        load[lane] = load[lane].saturating_add(work[e]);
        out[lane].push(e);
    }
    out
}

/// The steps of a pooled run: the caller's stream records the fork (event 0), each pool stream
/// waits for it, launches its groups and records its own event (1, 2, …), and the caller's
/// stream waits for every one of them. Per lane, in enqueue order.
pub fn schedule(assigned: &[Vec<usize>]) -> Vec<(Lane, Step)> {
    let mut steps = vec![(0, Step::Record(0))];
    for (i, groups) in assigned.iter().enumerate() {
        let lane = i + 1;
        steps.push((lane, Step::Wait(0)));
        steps.extend(groups.iter().map(|&e| (lane, Step::Launch(e))));
        steps.push((lane, Step::Record(lane)));
    }
    steps.extend((1..=assigned.len()).map(|lane| (0, Step::Wait(lane))));
    steps
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
