//! The chunked overlap of a row-parallel layer's all-reduce with its GEMM, as data: the tokens
//! split into chunks ([`chunks`]); chunk i's partial output computed on the compute stream, an
//! event recorded after it, the communication stream waiting on that event and all-reducing
//! chunk i while the compute stream goes on to chunk i+1; at the end the compute stream waits
//! for the communication stream (the join, so that what follows on the caller's stream sees
//! the whole reduced output, and a capture of the compute stream takes the communication
//! stream's work with it). [`schedule`] makes the steps; [`check`] replays them on two
//! in-order queues with events and says whether every all-reduce starts after its chunk's GEMM
//! and the join covers every all-reduce — the order a GPU run must keep.

use std::ops::Range;

use crate::error::{Error, Result};

/// The two streams of the overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The caller's stream: the GEMMs.
    Compute,
    /// The communication stream: the all-reduces.
    Comm,
}

/// One step on a lane.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The partial output of these token rows (the GEMM of one chunk).
    Gemm(Range<usize>),
    /// The all-reduce of these token rows of the output.
    AllReduce(Range<usize>),
    /// Records event `n` on the lane (after what the lane enqueued so far).
    Record(usize),
    /// The lane waits for event `n` (its later steps start after what preceded the record).
    Wait(usize),
}

/// The tokens `0..tokens` split into `n` chunks of nearly equal rows, each but the last a
/// multiple of `align` rows (so that every chunk's rows start 16-byte aligned: 8 rows of a
/// half-precision output of any width); fewer chunks where there are not enough rows.
///
/// # Errors
/// [`Error::TensorParallel`] for `n` or `align` zero.
pub fn chunks(tokens: usize, n: usize, align: usize) -> Result<Vec<Range<usize>>> {
    if n == 0 || align == 0 {
        return Err(Error::TensorParallel {
            what: "chunks and their alignment are at least 1",
            detail: format!("{n} chunks, align {align}"),
        });
    }
    let per = tokens.div_ceil(n).div_ceil(align).max(1) * align;
    Ok((0..tokens).step_by(per).map(|s| s..(s + per).min(tokens)).collect())
}

/// The steps of the overlap of `chunks` (module documentation), with one event per chunk
/// (`0..chunks.len()`) and the join's event (`chunks.len()`).
pub fn schedule(chunks: &[Range<usize>]) -> Vec<(Lane, Step)> {
    let mut steps = Vec::with_capacity(4 * chunks.len() + 2);
    for (i, rows) in chunks.iter().enumerate() {
        steps.push((Lane::Compute, Step::Gemm(rows.clone())));
        steps.push((Lane::Compute, Step::Record(i)));
        steps.push((Lane::Comm, Step::Wait(i)));
        steps.push((Lane::Comm, Step::AllReduce(rows.clone())));
    }
    let join = chunks.len();
    steps.push((Lane::Comm, Step::Record(join)));
    steps.push((Lane::Compute, Step::Wait(join)));
    steps
}

/// Replays `steps` (enqueued in this order, each lane in order) and checks the order a GPU
/// must keep: every row of `0..tokens` computed once and all-reduced once; each all-reduce
/// after the GEMM of every row it reduces; after the schedule, the compute lane ordered after
/// every all-reduce. Happens-before is the lane's order plus record → wait edges (a wait on
/// an event not yet recorded, as CUDA's `cuStreamWaitEvent` on a fresh event, orders nothing).
///
/// # Errors
/// [`Error::TensorParallel`] naming the first step out of order.
pub fn check(steps: &[(Lane, Step)], tokens: usize) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::TensorParallel { what, detail });
    // for each lane, the set of GEMM rows and all-reduce rows known complete before its next step
    #[derive(Clone, Default)]
    struct Known {
        gemm: Vec<bool>,
        reduced: Vec<bool>,
    }
    let fresh = || Known { gemm: vec![false; tokens], reduced: vec![false; tokens] };
    let (mut compute, mut comm) = (fresh(), fresh());
    let mut events: std::collections::HashMap<usize, Known> = Default::default();
    let (mut computed, mut reduced) = (vec![0u32; tokens], vec![0u32; tokens]);
    for (at, (lane, step)) in steps.iter().enumerate() {
        let known = if *lane == Lane::Compute { &mut compute } else { &mut comm };
        match step {
            Step::Gemm(rows) => {
                for r in rows.clone().filter(|&r| r < tokens) {
                    computed[r] += 1;
                    known.gemm[r] = true;
                }
            }
            Step::AllReduce(rows) => {
                if let Some(r) = rows.clone().find(|&r| r >= tokens || !known.gemm[r]) {
                    return bad("an all-reduce can start before the GEMM of its rows", format!("step {at}: row {r}"));
                }
                for r in rows.clone() {
                    reduced[r] += 1;
                    known.reduced[r] = true;
                }
            }
            Step::Record(e) => {
                events.insert(*e, known.clone());
            }
            Step::Wait(e) => {
                if let Some(k) = events.get(e) {
                    let k = k.clone();
                    known.gemm.iter_mut().zip(&k.gemm).for_each(|(a, b)| *a |= b);
                    known.reduced.iter_mut().zip(&k.reduced).for_each(|(a, b)| *a |= b);
                }
            }
        }
    }
    if let Some(r) = (0..tokens).find(|&r| computed[r] != 1 || reduced[r] != 1) {
        return bad(
            "a row is not computed and reduced exactly once",
            format!("row {r}: {} GEMMs, {} all-reduces", computed[r], reduced[r]),
        );
    }
    if let Some(r) = (0..tokens).find(|&r| !compute.reduced[r]) {
        return bad("the compute lane is not joined after every all-reduce", format!("row {r}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_tokens_aligned() {
        assert_eq!(chunks(100, 4, 8).unwrap(), [0..32, 32..64, 64..96, 96..100]);
        assert_eq!(chunks(10, 4, 8).unwrap(), [0..8, 8..10]);
        assert_eq!(chunks(0, 4, 8).unwrap(), Vec::<Range<usize>>::new());
        assert_eq!(chunks(4096, 1, 8).unwrap(), vec![Range { start: 0, end: 4096 }]);
        assert!(chunks(10, 0, 8).is_err() && chunks(10, 2, 0).is_err());
    }

    #[test]
    fn the_schedule_keeps_the_order_and_broken_ones_are_caught() {
        for (tokens, n) in [(100, 4), (4096, 8), (7, 3), (1, 1), (0, 2)] {
            let c = chunks(tokens, n, 8).unwrap();
            check(&schedule(&c), tokens).unwrap();
        }
        let c = chunks(64, 4, 8).unwrap();
        let s = schedule(&c);
        let rule = |steps: &[(Lane, Step)]| match check(steps, 64) {
            Err(Error::TensorParallel { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        // the comm lane not waiting for chunk 1's event
        let no_wait: Vec<_> = s.iter().filter(|x| **x != (Lane::Comm, Step::Wait(1))).cloned().collect();
        assert_eq!(rule(&no_wait), "an all-reduce can start before the GEMM of its rows");
        // the wait enqueued before the record: orders nothing
        let mut early = s.clone();
        early.swap(1, 2);
        assert_eq!(rule(&early), "an all-reduce can start before the GEMM of its rows");
        // no join at the end
        assert_eq!(rule(&s[..s.len() - 1]), "the compute lane is not joined after every all-reduce");
        // a chunk reduced twice
        let mut twice = s.clone();
        twice.push((Lane::Comm, Step::AllReduce(0..16)));
        assert_eq!(rule(&twice), "a row is not computed and reduced exactly once");
    }
}
