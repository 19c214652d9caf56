//! A grouped product spread over a small pool of streams, as data: the groups' GEMMs assigned to
//! the pool's streams by their work, longest first, each to the stream with the least work so far
//! (so that small groups, which leave most of the GPU idle on their own, run side by side); the
//! pool forked from the caller's stream with an event and joined back to it with one event per
//! pool stream, so that what follows on the caller's stream sees every group and a capture of
//! the caller's stream takes the pool's work with it. [`schedule`] makes the steps; [`check`]
//! replays them on in-order queues with events and says whether every group runs once, after
//! the fork and before the join — the order a GPU run must keep. Empty groups launch nothing.
//!
//! Which way a grouped product runs — one strided batch, cuBLAS's grouped call (of the groups,
//! or of their row chunks), this pool of per-group plans, the pool beside one grouped call, or
//! the same plans in order — is chosen among the [`candidates`] that apply, by the rule of
//! [`GroupedSettings::choose`], by measurement, or forced.

use crate::error::{Error, Result};
use crate::precision::Precision;

use super::{GroupedOp, GroupedProblem};

/// A way to run a grouped product on the vendor libraries (in a tactic database:
/// "strided_batch", "grouped_batched", "stream_pool", "chunked_batched", "split_pool",
/// "in_order").
///
/// Every way takes the group sizes on the host. cuBLASLt's grouped matmul (cuBLAS 13.2 and
/// later: one matmul over groups whose shapes stay on the device, so a call from device
/// offsets needs no copy and can be captured) is not a way yet;
/// [`crate::cuda::library::has_cublaslt_grouped_matmul`] tells whether the loaded library
/// offers it, from its version and its exported symbol, and a way built on it would be a
/// candidate only there.
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
    /// A plan per group (cuBLASLt), launched on a pool of streams ([`schedule`]).
    StreamPool,
    /// Each group's rows cut into chunks of a few shapes ([`super::chunks`]: 128 rows, then
    /// 64, 32, …, 1), and every chunk in one cuBLAS grouped call whose alike chunks form one
    /// batch each: at most eight shapes for any routing instead of one per group. A forward or
    /// backward data where [`GroupedBackend::GroupedBatched`] applies and the chunks fit one
    /// call ([`MAX_GROUPED_CALL_GEMMS`]). Not capturable (as cuBLAS's grouped call).
    ChunkedBatched,
    /// The groups above [`SMALL_GROUP_MACS`] multiply-adds each on the pool of streams, and
    /// the rest in one cuBLAS grouped batched call on a stream of the same pool, beside them:
    /// for skewed routing, where a few large groups would leave cuBLAS's grouped call waiting on
    /// its longest GEMM and many small ones leave the pool's per-group launches half idle.
    /// Where [`GroupedBackend::GroupedBatched`] applies, with at least one large group and two
    /// small ones. Not capturable (as cuBLAS's grouped call).
    SplitPool,
    /// A plan per group, one after another on the caller's stream.
    InOrder,
}

/// The ways that apply to `p`: a strided batch where every group has the same non-zero size
/// and there is no bias (a bias per group would need a batch stride for the bias), cuBLAS's
/// grouped call where [`GroupedBackend::GroupedBatched`] says it applies, then the pool of
/// per-group plans and the same plans in order, which take any problem.
pub fn candidates(p: &GroupedProblem) -> Vec<GroupedBackend> {
    let mut out = Vec::with_capacity(3);
    let first = p.sizes()[0];
    if first > 0 && !p.has_bias() && p.sizes().iter().all(|&m| m == first) {
        out.push(GroupedBackend::StridedBatch);
    }
    let same_type = same_type(p);
    let empty_dw = p.op() == super::GroupedOp::BackwardWeight && p.sizes().contains(&0);
    if same_type && !p.has_bias() && !empty_dw && p.groups() <= MAX_GROUPED_CALL_GEMMS {
        out.push(GroupedBackend::GroupedBatched);
        let (large, small) = split_counts(p);
        if large >= 1 && small >= 2 {
            out.push(GroupedBackend::SplitPool);
        }
        if p.op() != GroupedOp::BackwardWeight && p.chunk_count() <= MAX_GROUPED_CALL_GEMMS {
            out.push(GroupedBackend::ChunkedBatched);
        }
    }
    out.extend([GroupedBackend::StreamPool, GroupedBackend::InOrder]);
    out
}

/// The groups with rows of `p`: how many are large (more than [`SMALL_GROUP_MACS`]
/// multiply-adds, for [`GroupedBackend::SplitPool`]) and how many small.
fn split_counts(p: &GroupedProblem) -> (usize, usize) {
    let nk = p.n() as u64 * p.k() as u64;
    let busy = p.sizes().iter().filter(|&&m| m > 0);
    let large = busy.clone().filter(|&&m| m as u64 * nk > SMALL_GROUP_MACS).count();
    (large, busy.count() - large)
}

/// How grouped products run on an engine: a forced backend, or `None` for the measured
/// choices and the rule ([`GroupedSettings::choose`]); how many streams a pooled run spreads
/// over.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupedSettings {
    /// The forced backend.
    pub backend: Option<GroupedBackend>,
    /// Streams of the pool (1 to [`MAX_STREAMS`]).
    pub streams: usize,
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
/// [`GroupedBackend::GroupedBatched`] and [`GroupedBackend::SplitPool`] no candidates.
pub const MAX_GROUPED_CALL_GEMMS: usize = (1 << 20) / 24;

impl Default for GroupedSettings {
    /// The rule, and 4 streams (what TransformerEngine's grouped linear layer uses by default,
    /// `num_gemm_streams`).
    fn default() -> Self {
        GroupedSettings { backend: None, streams: 4, tuned: Default::default(), applied: Default::default() }
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
    /// it applies; else one strided batch where it is a candidate; else cuBLAS's grouped call
    /// for a forward or backward data whose groups average at most [`SMALL_GROUP_MACS`]
    /// multiply-adds; else the pool where more than one group has rows, in order otherwise.
    ///
    /// The rule is the H200's measurement (cuBLAS 13.1, bf16, Mixtral's, Qwen3-30B-A3B's and
    /// DeepSeek-V3's shapes, docs/PERFORMANCE.md): one strided batch was the fastest way for
    /// equal groups at every shape; for unequal groups cuBLAS's grouped call was the fastest for
    /// Qwen3's (about 0.4 G multiply-adds per group: 0.39 ms against the pool's 0.66) and 1.3 to
    /// 2.5 times slower than the pool at every larger shape, and slower than the pool for every
    /// backward weight.
    ///
    /// # Errors
    /// [`Error::Unsupported`]: the forced backend is not a candidate (naming why).
    pub fn choose(&self, p: &GroupedProblem) -> Result<GroupedBackend> {
        let candidates = candidates(p);
        if let Some(b) = self.backend {
            if candidates.contains(&b) {
                return Ok(b);
            }
            let what = format!("{b:?} for {}: {}", p.describe(), why_not(p, b));
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
/// measured for it (the baseline a measured choice is judged against). The rule holds only
/// ways measured faster for the problems it gives them to (on the H200); the split pool is
/// taken where measured ([`crate::cuda::Gpu::tune_grouped`]) or forced.
pub fn rule(p: &GroupedProblem) -> GroupedBackend {
    let candidates = candidates(p);
    let busy = p.busy_groups();
    let small = busy > 0 && p.macs() / busy as f64 <= SMALL_GROUP_MACS as f64;
    if candidates.contains(&GroupedBackend::StridedBatch) {
        GroupedBackend::StridedBatch
    } else if small && p.op() != GroupedOp::BackwardWeight && candidates.contains(&GroupedBackend::GroupedBatched) {
        GroupedBackend::GroupedBatched
    } else if busy > 1 {
        GroupedBackend::StreamPool
    } else {
        GroupedBackend::InOrder
    }
}

/// Why the split pool does not apply to `large` groups above [`SMALL_GROUP_MACS`] and `small`
/// at or below it.
pub(crate) fn split_needs(large: usize, small: usize) -> String {
    format!(
        "it needs at least one GEMM above 2³⁰ multiply-adds and two at or below; there are {large} above and \
         {small} at or below"
    )
}

/// Whether `p`'s precision is one of those cuBLAS's grouped call takes (inputs and output of
/// one type).
fn same_type(p: &GroupedProblem) -> bool {
    matches!(p.precision(), Precision::F32 | Precision::TF32 | Precision::F16 | Precision::BF16)
}

/// Why backend `b` does not apply to `p` (for the error of a forced one).
fn why_not(p: &GroupedProblem, b: GroupedBackend) -> String {
    let empty = p.sizes().iter().position(|&m| m == 0);
    let first = p.sizes()[0];
    match (b, empty) {
        _ if p.has_bias() => "there is a bias".into(),
        (GroupedBackend::StridedBatch, Some(e)) => format!("group {e} is empty"),
        (GroupedBackend::StridedBatch, None) => {
            let e = p.sizes().iter().position(|&m| m != first).unwrap_or(0);
            format!("the groups differ in size (m[0] = {first}, m[{e}] = {})", p.sizes()[e])
        }
        (GroupedBackend::GroupedBatched | GroupedBackend::SplitPool, Some(e))
            if p.op() == GroupedOp::BackwardWeight =>
        {
            format!("group {e} of a backward weight is empty (its zeros need a GEMM of k = 0)")
        }
        (GroupedBackend::GroupedBatched | GroupedBackend::SplitPool | GroupedBackend::ChunkedBatched, _)
            if p.groups() > MAX_GROUPED_CALL_GEMMS =>
        {
            format!("{} groups, more than the {MAX_GROUPED_CALL_GEMMS} one call takes", p.groups())
        }
        (GroupedBackend::SplitPool, _) if same_type(p) => {
            let (large, small) = split_counts(p);
            split_needs(large, small)
        }
        (GroupedBackend::ChunkedBatched, _) if p.op() == GroupedOp::BackwardWeight => {
            "a backward weight's rows are its inner dimension: its groups cannot be cut into row chunks".into()
        }
        (GroupedBackend::ChunkedBatched, _) if same_type(p) && !p.has_bias() => {
            format!("{} row chunks, more than the {MAX_GROUPED_CALL_GEMMS} one call takes", p.chunk_count())
        }
        (GroupedBackend::GroupedBatched | GroupedBackend::SplitPool | GroupedBackend::ChunkedBatched, _) => {
            format!("its output type differs from its inputs' ({})", p.precision())
        }
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
        load[lane] += work[e];
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

/// Replays `steps` on in-order lanes with events: every group of `work` with work runs exactly
/// once, after the fork (the caller's event 0, recorded before anything else) and before the
/// caller's stream has waited for its lane; an empty group never runs.
///
/// # Errors
/// [`Error::GroupedShape`] naming the first step out of order.
pub fn check(steps: &[(Lane, Step)], work: &[u64]) -> Result<()> {
    let bad = |detail: String| Err(Error::GroupedShape { what: "a pooled schedule runs out of order", detail });
    let lanes = steps.iter().map(|&(l, _)| l + 1).max().unwrap_or(1);
    // per lane: whether it has waited for the fork; per event: the lane that recorded it and
    // the groups that lane had run by then
    let mut forked = vec![false; lanes];
    forked[0] = true;
    let mut ran: Vec<Vec<usize>> = vec![Vec::new(); lanes];
    let mut recorded: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    let mut seen = vec![0usize; work.len()];
    let mut joined: Vec<usize> = Vec::new();
    for (i, &(lane, step)) in steps.iter().enumerate() {
        match step {
            Step::Record(n) => {
                if n == 0 && (lane != 0 || i != 0) {
                    return bad(format!("step {i}: the fork is not the caller's first step"));
                }
                recorded.insert(n, ran[lane].clone());
            }
            Step::Wait(n) => {
                let Some(done) = recorded.get(&n) else {
                    return bad(format!("step {i}: lane {lane} waits for event {n}, not recorded before"));
                };
                if n == 0 {
                    forked[lane] = true;
                } else if lane == 0 {
                    joined.extend(done);
                }
            }
            Step::Launch(e) => {
                if !forked[lane] {
                    return bad(format!("step {i}: group {e} launched on lane {lane} before the fork"));
                }
                if e >= work.len() || work[e] == 0 {
                    return bad(format!("step {i}: group {e} has no work and launches"));
                }
                seen[e] += 1;
                ran[lane].push(e);
            }
        }
    }
    for (e, &w) in work.iter().enumerate() {
        if w > 0 && seen[e] != 1 {
            return bad(format!("group {e} runs {} times", seen[e]));
        }
        if w > 0 && !joined.contains(&e) {
            return bad(format!("group {e} is not covered by the join"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grouped::GroupedOp;

    #[test]
    fn groups_go_longest_first_to_the_least_loaded_stream_and_empty_groups_nowhere() {
        let work = [5, 0, 9, 3, 3, 0, 7];
        let a = assign(&work, 3);
        assert_eq!(a, vec![vec![2], vec![6, 4], vec![0, 3]]);
        let loads: Vec<u64> = a.iter().map(|g| g.iter().map(|&e| work[e]).sum()).collect();
        assert_eq!(loads, [9, 10, 8]); // the sum 27 over 3 streams, none above 10
                                       // never more streams than groups with work, and one even when none has any
        assert_eq!(assign(&[4, 0, 4], 8).len(), 2);
        assert_eq!(assign(&[0, 0], 4), vec![Vec::<usize>::new()]);
    }

    #[test]
    fn the_schedule_forks_launches_every_group_once_and_joins() {
        for (work, streams) in [(vec![5u64, 0, 9, 3, 3, 0, 7], 3), (vec![1; 128], 4), (vec![0, 0], 2), (vec![7], 1)] {
            let steps = schedule(&assign(&work, streams));
            check(&steps, &work).unwrap_or_else(|e| panic!("{work:?} on {streams}: {e}"));
        }
    }

    #[test]
    fn a_schedule_out_of_order_is_caught() {
        let work = [2u64, 3, 0];
        let good = schedule(&assign(&work, 2));
        let rule = |steps: &[(Lane, Step)]| check(steps, &work).unwrap_err().to_string();
        // a launch before its lane waited for the fork
        let mut early = good.clone();
        let at = early.iter().position(|s| s.1 == Step::Wait(0)).unwrap();
        early.remove(at);
        assert!(rule(&early).contains("before the fork"), "{}", rule(&early));
        // the caller forgets to wait for a lane
        let mut unjoined = good.clone();
        unjoined.pop();
        assert!(rule(&unjoined).contains("not covered by the join"), "{}", rule(&unjoined));
        // a group twice, an empty group launched
        let mut twice = good.clone();
        twice.insert(2, (1, Step::Launch(1)));
        assert!(rule(&twice).contains("runs 2 times") || rule(&twice).contains("before the fork"), "{}", rule(&twice));
        let mut empty = good;
        empty.insert(2, (1, Step::Launch(2)));
        assert!(rule(&empty).contains("has no work"), "{}", rule(&empty));
    }

    #[test]
    fn candidates_follow_the_sizes_and_the_precision() {
        let p = |sizes: &[usize], precision| GroupedProblem::new(GroupedOp::Forward, sizes, 64, 32, precision).unwrap();
        use GroupedBackend::*;
        assert_eq!(
            candidates(&p(&[4, 4, 4], Precision::BF16)),
            [StridedBatch, GroupedBatched, ChunkedBatched, StreamPool, InOrder]
        );
        assert_eq!(candidates(&p(&[4, 0, 4], Precision::F16)), [GroupedBatched, ChunkedBatched, StreamPool, InOrder]);
        assert_eq!(candidates(&p(&[0, 0], Precision::F32)), [GroupedBatched, ChunkedBatched, StreamPool, InOrder]);
        assert_eq!(candidates(&p(&[8, 8], Precision::BF16).with_bias().unwrap()), [StreamPool, InOrder]);
        assert_eq!(candidates(&p(&[8, 8], Precision::BF16_F32OUT)), [StridedBatch, StreamPool, InOrder]);
        let dw =
            |sizes: &[usize]| GroupedProblem::new(GroupedOp::BackwardWeight, sizes, 64, 32, Precision::TF32).unwrap();
        assert_eq!(candidates(&dw(&[4, 0, 4])), [StreamPool, InOrder]);
        assert_eq!(candidates(&dw(&[4, 1, 4])), [GroupedBatched, StreamPool, InOrder]);
    }

    #[test]
    fn the_rule_batches_equal_groups_pools_ragged_ones_and_names_a_forced_misfit() {
        use GroupedBackend::*;
        let p = |sizes: &[usize]| GroupedProblem::new(GroupedOp::Forward, sizes, 64, 32, Precision::BF16).unwrap();
        let auto = GroupedSettings::default();
        let choose = |s: &GroupedSettings, p: &GroupedProblem| s.choose(p);
        assert_eq!(choose(&auto, &p(&[8, 8, 8])).unwrap(), StridedBatch);
        // small unequal groups: cuBLAS's grouped call, but not for a backward weight
        assert_eq!(choose(&auto, &p(&[8, 0, 8])).unwrap(), GroupedBatched);
        let dw = GroupedProblem::new(GroupedOp::BackwardWeight, &[8, 3, 8], 64, 32, Precision::BF16).unwrap();
        assert_eq!(choose(&auto, &dw).unwrap(), StreamPool);
        // large unequal groups (DeepSeek-V3's: 2048 × 7168 per row, 128 and 300 rows): the pool
        let big = GroupedProblem::new(GroupedOp::Forward, &[128, 300], 2048, 7168, Precision::BF16).unwrap();
        assert_eq!(choose(&auto, &big).unwrap(), StreamPool);
        assert_eq!(choose(&auto, &p(&[0, 9, 0])).unwrap(), GroupedBatched);
        assert_eq!(choose(&auto, &p(&[8, 8]).with_bias().unwrap()).unwrap(), StreamPool);
        let f32out = GroupedProblem::new(GroupedOp::Forward, &[0, 9, 0], 64, 32, Precision::BF16_F32OUT).unwrap();
        assert_eq!(choose(&auto, &f32out).unwrap(), InOrder);
        let forced = |b| GroupedSettings { backend: Some(b), ..auto.clone() };
        assert_eq!(choose(&forced(InOrder), &p(&[8, 8, 8])).unwrap(), InOrder);
        let e = choose(&forced(StridedBatch), &p(&[8, 7])).unwrap_err().to_string();
        assert!(e.contains("StridedBatch") && e.contains("differ in size (m[0] = 8, m[1] = 7)"), "{e}");
        let e = choose(&forced(StridedBatch), &p(&[8, 0])).unwrap_err().to_string();
        assert!(e.contains("group 1 is empty"), "{e}");
        assert!(GroupedSettings::check_streams(0).is_err() && GroupedSettings::check_streams(17).is_err());
        assert!(GroupedSettings::check_streams(16).is_ok());
    }

    /// A measured choice serves every problem of its signature where it applies; a forced
    /// backend still wins; a choice that does not apply falls back to the rule.
    #[test]
    fn a_measured_choice_serves_its_signature_where_it_applies() {
        use GroupedBackend::*;
        let p = |sizes: &[usize]| GroupedProblem::new(GroupedOp::Forward, sizes, 768, 2048, Precision::BF16).unwrap();
        let mut s = GroupedSettings::default();
        // one group above 2³⁰ multiply-adds (700 · 768 · 2048), three below: the split pool is
        // a candidate, cuBLAS's grouped call the rule's choice
        let skewed = p(&[700, 60, 100, 164]);
        assert_eq!(candidates(&skewed), [GroupedBatched, SplitPool, ChunkedBatched, StreamPool, InOrder]);
        assert_eq!(s.choose(&skewed).unwrap(), GroupedBatched);
        s.tuned.insert(skewed.signature(), StreamPool);
        assert_eq!(s.choose(&skewed).unwrap(), StreamPool);
        // other sizes of the same total bucket and skew: the same entry
        assert_eq!(skewed.signature(), p(&[650, 110, 90, 174]).signature());
        assert_eq!(s.choose(&p(&[650, 110, 90, 174])).unwrap(), StreamPool);
        // another skew: the rule
        assert_ne!(p(&[256, 256, 256, 256]).signature(), skewed.signature());
        // an entry that does not apply (a strided batch for unequal groups): the rule
        s.tuned.insert(skewed.signature(), StridedBatch);
        assert_eq!(s.choose(&skewed).unwrap(), GroupedBatched);
        s.tuned.insert(skewed.signature(), SplitPool);
        assert_eq!(s.choose(&skewed).unwrap(), SplitPool);
        s.backend = Some(InOrder);
        assert_eq!(s.choose(&skewed).unwrap(), InOrder);
        assert_eq!(rule(&skewed), GroupedBatched);
        // fewer than two small groups: no split
        let e = GroupedSettings { backend: Some(SplitPool), ..Default::default() }.choose(&p(&[700, 60])).unwrap_err();
        assert!(e.to_string().contains("there are 1 above and 1 at or below"), "{e}");
    }
}
