//! The pool's schedule as data, the candidates and the rule.

use super::*;

/// Replays `steps` on in-order lanes with events: every group of `work` with work runs exactly
/// once, after the fork (the caller's event 0, recorded before anything else) and before the
/// caller's stream has waited for its lane; an empty group never runs.
///
/// # Errors
/// [`Error::GroupedShape`] naming the first step out of order.
fn check(steps: &[(Lane, Step)], work: &[u64]) -> Result<()> {
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
    // work past u64 in sum saturates instead of overflowing
    assert_eq!(assign(&[u64::MAX, u64::MAX, 1], 1), vec![vec![0, 1, 2]]);
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
fn candidates_follow_the_sizes_the_precision_and_the_loaded_cudnn() {
    let p = |sizes: &[usize], precision| GroupedProblem::new(GroupedOp::Forward, sizes, 64, 32, precision).unwrap();
    use GroupedBackend::*;
    let c = |p: &GroupedProblem| candidates(p, false);
    assert_eq!(c(&p(&[4, 4, 4], Precision::BF16)), [StridedBatch, GroupedBatched, StreamPool]);
    assert_eq!(candidates(&p(&[4, 4, 4], Precision::BF16), true), [StridedBatch, Cudnn, GroupedBatched, StreamPool]);
    assert_eq!(c(&p(&[4, 0, 4], Precision::F16)), [GroupedBatched, StreamPool]);
    assert_eq!(candidates(&p(&[4, 0, 4], Precision::F16), true), [Cudnn, GroupedBatched, StreamPool]);
    let dx = GroupedProblem::new(GroupedOp::BackwardData, &[4, 0, 4], 64, 32, Precision::F16).unwrap();
    assert_eq!(candidates(&dx, true), [GroupedBatched, StreamPool]);
    // cuDNN's MoE operation: f16 and bf16 without a bias, no backward weight
    assert_eq!(candidates(&p(&[0, 0], Precision::F32), true), [GroupedBatched, StreamPool]);
    assert_eq!(candidates(&p(&[8, 8], Precision::BF16).with_bias().unwrap(), true), [StreamPool]);
    assert_eq!(candidates(&p(&[8, 8], Precision::BF16_F32OUT), true), [StridedBatch, StreamPool]);
    let dw =
        |sizes: &[usize], precision| GroupedProblem::new(GroupedOp::BackwardWeight, sizes, 64, 32, precision).unwrap();
    assert_eq!(c(&dw(&[4, 0, 4], Precision::TF32)), [StreamPool]);
    assert_eq!(c(&dw(&[4, 1, 4], Precision::TF32)), [GroupedBatched, StreamPool]);
    assert_eq!(candidates(&dw(&[4, 1, 4], Precision::BF16), true), [GroupedBatched, StreamPool]);
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
    assert_eq!(choose(&auto, &f32out).unwrap(), StreamPool);
    // with cuDNN's MoE operation loaded: the rule does not change (measured slower), forcing
    // takes it
    let moe = GroupedSettings { cudnn_moe: Some(true), ..auto.clone() };
    assert_eq!(choose(&moe, &p(&[8, 0, 8])).unwrap(), GroupedBatched);
    assert_eq!(choose(&moe, &big).unwrap(), StreamPool);
    assert_eq!(choose(&GroupedSettings { backend: Some(Cudnn), ..moe.clone() }, &big).unwrap(), Cudnn);
    let forced = |b| GroupedSettings { backend: Some(b), ..auto.clone() };
    assert_eq!(choose(&forced(StreamPool), &p(&[8, 8, 8])).unwrap(), StreamPool);
    let e = choose(&forced(StridedBatch), &p(&[8, 7])).unwrap_err().to_string();
    assert!(e.contains("StridedBatch") && e.contains("differ in size (m[0] = 8, m[1] = 7)"), "{e}");
    let e = choose(&forced(StridedBatch), &p(&[8, 0])).unwrap_err().to_string();
    assert!(e.contains("group 1 is empty"), "{e}");
    let e = choose(&forced(Cudnn), &p(&[8, 0])).unwrap_err().to_string();
    assert!(e.contains("needs 9.18 or later"), "{e}");
    let e = choose(&GroupedSettings { cudnn_moe: Some(true), ..forced(Cudnn) }, &dw).unwrap_err().to_string();
    assert!(e.contains("no backward weight"), "{e}");
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
    let skewed = p(&[700, 60, 100, 164]);
    assert_eq!(candidates(&skewed, false), [GroupedBatched, StreamPool]);
    assert_eq!(s.choose(&skewed).unwrap(), GroupedBatched);
    s.tuned.insert(skewed.signature(), StreamPool);
    assert_eq!(s.choose(&skewed).unwrap(), StreamPool);
    // other sizes of the same total bucket and skew: the same entry
    assert_eq!(skewed.signature(), p(&[650, 110, 90, 174]).signature());
    assert_eq!(s.choose(&p(&[650, 110, 90, 174])).unwrap(), StreamPool);
    // another skew: the rule
    assert_ne!(p(&[256, 256, 256, 256]).signature(), skewed.signature());
    // an entry that does not apply (a strided batch for unequal groups; cuDNN not loaded): the rule
    s.tuned.insert(skewed.signature(), StridedBatch);
    assert_eq!(s.choose(&skewed).unwrap(), GroupedBatched);
    s.tuned.insert(skewed.signature(), Cudnn);
    assert_eq!(s.choose(&skewed).unwrap(), GroupedBatched);
    s.cudnn_moe = Some(true);
    assert_eq!(s.choose(&skewed).unwrap(), Cudnn);
    s.backend = Some(StreamPool);
    assert_eq!(s.choose(&skewed).unwrap(), StreamPool);
    assert_eq!(rule(&skewed), GroupedBatched);
}
