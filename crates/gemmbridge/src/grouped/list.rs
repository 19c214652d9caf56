//! The general form of a grouped GEMM as data: a list of independent GEMMs, each with its own
//! shapes, layouts, precision and buffers (`Gpu::gemm_group`), run together the ways a
//! grouped product runs ([`GroupedBackend`]) but one strided batch, which needs the MoE
//! layout. Which ways apply ([`candidates`]), and the rule that picks one ([`rule`]).

use super::streams::{split_needs, GroupedBackend, GroupedSettings, MAX_GROUPED_CALL_GEMMS, SMALL_GROUP_MACS};
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::problem::GemmProblem;

/// Multiply-adds of a GEMM (`m·n·k·batch`).
fn macs(p: &GemmProblem) -> u64 {
    (p.m() as u64).saturating_mul(p.n() as u64).saturating_mul(p.k() as u64).saturating_mul(p.batch() as u64)
}

/// Why cuBLAS's grouped call does not take the GEMMs `gemms`, or `None` where it does: the
/// GEMMs with work (the empty ones launch nothing and are not judged), at least one and at
/// most [`MAX_GROUPED_CALL_GEMMS`], all of one precision whose inputs and output are of one
/// type (f32, tf32, f16, bf16), with no epilogue, one batch entry and an inner dimension.
fn why_not_batched(gemms: &[GemmProblem]) -> Option<String> {
    let busy: Vec<(usize, &GemmProblem)> = gemms.iter().enumerate().filter(|(_, p)| !p.is_empty()).collect();
    let Some(&(i0, first)) = busy.first() else {
        return Some("no GEMM of the list has work".into());
    };
    if busy.len() > MAX_GROUPED_CALL_GEMMS {
        return Some(format!("{} GEMMs with work, more than the {MAX_GROUPED_CALL_GEMMS} one call takes", busy.len()));
    }
    let pr = first.precision();
    if pr.input() != pr.output() {
        return Some(format!("the output type differs from the inputs' ({pr})"));
    }
    for &(i, p) in &busy {
        if p.precision() != pr {
            return Some(format!("GEMM {i} is {}, GEMM {i0} {pr}", p.precision()));
        }
        if p.epilogue() != Epilogue::None {
            return Some(format!("GEMM {i} has the epilogue {}", p.epilogue()));
        }
        if p.batch() > 1 {
            return Some(format!("GEMM {i} has a batch of {}", p.batch()));
        }
        if p.k() == 0 {
            return Some(format!("GEMM {i} has k = 0 (its zeros need a GEMM of its own)"));
        }
    }
    None
}

/// The GEMMs with work (not [`GemmProblem::is_empty`]): how many are above
/// [`SMALL_GROUP_MACS`] multiply-adds and how many at most.
fn split_counts(gemms: &[GemmProblem]) -> (usize, usize) {
    let busy = gemms.iter().filter(|p| !p.is_empty());
    let large = busy.clone().filter(|p| macs(p) > SMALL_GROUP_MACS).count();
    (large, busy.count() - large)
}

/// The ways that apply to `gemms`: cuBLAS's grouped call where it takes them (one precision
/// with one element type, no epilogue, one batch entry, k ≥ 1), the split pool where that
/// applies and at least one GEMM is above [`SMALL_GROUP_MACS`] multiply-adds and two at most,
/// then the pool of per-GEMM plans and the same plans in order, which take any list.
pub fn candidates(gemms: &[GemmProblem]) -> Vec<GroupedBackend> {
    let mut out = Vec::with_capacity(4);
    if why_not_batched(gemms).is_none() {
        out.push(GroupedBackend::GroupedBatched);
        let (large, small) = split_counts(gemms);
        if large >= 1 && small >= 2 {
            out.push(GroupedBackend::SplitPool);
        }
    }
    out.extend([GroupedBackend::StreamPool, GroupedBackend::InOrder]);
    out
}

/// The way [`GroupedSettings::choose_list`] picks when nothing is forced: in order where at
/// most one GEMM has work; else, as the grouped product's rule ([`super::streams::rule`])
/// does for a forward or backward data, cuBLAS's grouped call where it applies and the GEMMs
/// with work average at most [`SMALL_GROUP_MACS`] multiply-adds, the pool otherwise. A list
/// cannot tell a backward weight's GEMMs (small inner dimensions, large outputs), for which
/// the product's rule takes the pool, as measured faster: force
/// [`GroupedBackend::StreamPool`] for such lists.
pub fn rule(gemms: &[GemmProblem]) -> GroupedBackend {
    let busy: Vec<&GemmProblem> = gemms.iter().filter(|p| !p.is_empty()).collect();
    let total: f64 = busy.iter().map(|p| macs(p) as f64).sum();
    let small = !busy.is_empty() && total / busy.len() as f64 <= SMALL_GROUP_MACS as f64;
    if busy.len() <= 1 {
        GroupedBackend::InOrder
    } else if small && candidates(gemms).contains(&GroupedBackend::GroupedBatched) {
        GroupedBackend::GroupedBatched
    } else {
        GroupedBackend::StreamPool
    }
}

impl GroupedSettings {
    /// The way for the list `gemms` ([`candidates`]): the forced one if it applies, else
    /// [`rule`].
    ///
    /// # Errors
    /// [`Error::Unsupported`]: the forced way is not a candidate (naming why).
    pub fn choose_list(&self, gemms: &[GemmProblem]) -> Result<GroupedBackend> {
        match self.backend {
            None => Ok(rule(gemms)),
            Some(b) if candidates(gemms).contains(&b) => Ok(b),
            Some(b) => {
                let why = match b {
                    GroupedBackend::StridedBatch => "one strided batch is for a grouped product's layout".to_string(),
                    GroupedBackend::ChunkedBatched => "row chunks are for a grouped product's layout".to_string(),
                    GroupedBackend::SplitPool if why_not_batched(gemms).is_none() => {
                        let (large, small) = split_counts(gemms);
                        split_needs(large, small)
                    }
                    _ => why_not_batched(gemms).unwrap_or_default(),
                };
                let what = format!("{b:?} for a list of {} GEMMs: {why}", gemms.len());
                Err(Error::Unsupported { backend: "grouped GEMM", what })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;
    use GroupedBackend::*;

    fn linear(m: usize, n: usize, k: usize) -> GemmProblem {
        GemmProblem::linear(m, n, k, Precision::BF16).unwrap()
    }

    #[test]
    fn small_plain_lists_go_to_the_grouped_call_and_the_rest_to_the_pool() {
        let small =
            [linear(64, 128, 256), linear(7, 300, 64), GemmProblem::matmul(33, 8, 16, Precision::BF16).unwrap()];
        assert_eq!(candidates(&small), [GroupedBatched, StreamPool, InOrder]);
        assert_eq!(rule(&small), GroupedBatched);
        // large GEMMs: the pool; one large beside two small: the split pool is a candidate
        let large = [linear(4096, 4096, 4096), linear(2048, 4096, 4096)];
        assert_eq!(rule(&large), StreamPool);
        let mixed = [linear(4096, 4096, 4096), linear(8, 64, 64), linear(16, 64, 64)];
        assert_eq!(candidates(&mixed), [GroupedBatched, SplitPool, StreamPool, InOrder]);
        // one GEMM with work (the rest empty): in order; an empty list likewise
        assert_eq!(rule(&[linear(64, 64, 64), linear(0, 64, 64)]), InOrder);
        assert_eq!((candidates(&[]), rule(&[])), (vec![StreamPool, InOrder], InOrder));
        // an empty GEMM of another precision is not judged: it launches nothing
        let with_empty = [linear(64, 64, 64), linear(8, 8, 8), GemmProblem::linear(0, 4, 4, Precision::F16).unwrap()];
        assert_eq!(candidates(&with_empty), [GroupedBatched, StreamPool, InOrder]);
    }

    #[test]
    fn what_the_grouped_call_does_not_take_is_named_when_forced() {
        let with_bias = [linear(8, 8, 8), linear(8, 8, 8).with_epilogue(Epilogue::Bias).unwrap()];
        let mixed_precision = [linear(8, 8, 8), GemmProblem::linear(8, 8, 8, Precision::F16).unwrap()];
        let wide_out = [GemmProblem::linear(8, 8, 8, Precision::BF16_F32OUT).unwrap()];
        let k0 = [linear(8, 8, 0)];
        let many = vec![linear(4, 4, 4); MAX_GROUPED_CALL_GEMMS + 1];
        for (list, words) in [
            (&with_bias[..], "GEMM 1 has the epilogue"),
            (&mixed_precision[..], "GEMM 1 is f16"),
            (&wide_out[..], "output type differs"),
            (&k0[..], "k = 0"),
            (&many[..], "more than the"),
        ] {
            assert_eq!(candidates(list), [StreamPool, InOrder], "{words}");
            let forced = GroupedSettings { backend: Some(GroupedBatched), ..Default::default() };
            let e = forced.choose_list(list).unwrap_err().to_string();
            assert!(e.contains(words), "{e}");
        }
        for way in [StridedBatch, ChunkedBatched] {
            let forced = GroupedSettings { backend: Some(way), ..Default::default() };
            assert!(forced.choose_list(&[linear(8, 8, 8)]).unwrap_err().to_string().contains("layout"), "{way:?}");
        }
        let pool = GroupedSettings { backend: Some(StreamPool), ..Default::default() };
        assert_eq!(pool.choose_list(&with_bias).unwrap(), StreamPool);
    }
}
