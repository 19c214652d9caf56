//! Which pointers keep cuBLAS's grouped call, and the way taken instead.

use super::*;
use crate::grouped::GroupedOp;
use crate::precision::Precision;
use GroupedBackend::*;

const AT: [u64; 3] = [0x1000, 0x2000, 0x3000];

fn p(n: usize, k: usize) -> GroupedProblem {
    GroupedProblem::new(GroupedOp::Forward, &[8, 3, 0, 5], n, k, Precision::BF16).unwrap()
}

#[test]
fn rows_and_bases_on_16_bytes_keep_the_grouped_call() {
    assert_eq!(grouped_call_misalignment(&p(64, 32), AT), None);
    for moe in [false, true] {
        assert_eq!(candidates_at(&p(64, 32), AT, moe), super::super::streams::candidates(&p(64, 32), moe));
    }
    assert!(candidates_at(&p(64, 32), AT, false).contains(&GroupedBatched));
}

#[test]
fn a_misaligned_base_or_row_leaves_only_the_per_gemm_ways() {
    // N = 33 bf16: 66-byte rows; K = 17: 34-byte rows; a base 8 bytes off
    for (q, bases, words) in [
        (p(33, 64), AT, "N = 33 elements is 66 bytes"),
        (p(64, 17), AT, "K = 17 elements is 34 bytes"),
        (p(64, 32), [0x1000, 0x2008, 0x3000], "grouped GEMM's w at 0x2008"),
    ] {
        let why = grouped_call_misalignment(&q, bases).expect(words);
        assert!(why.contains(words), "{why}");
        assert_eq!(candidates_at(&q, bases, false), [StreamPool]);
        // cuDNN's MoE operation sees every pointer: it stays
        assert_eq!(candidates_at(&q, bases, true), [Cudnn, StreamPool]);
    }
}

#[test]
fn a_chosen_grouped_call_on_misaligned_pointers_becomes_the_pool_and_a_forced_one_an_error() {
    let why = || Some("B at 0x2008 is off".to_string());
    let how = GroupedBatched;
    assert_eq!(off_grouped_call(how, why(), false, String::new).unwrap(), StreamPool);
    let e = off_grouped_call(how, why(), true, || "the call".into()).unwrap_err().to_string();
    assert!(e.contains("the call") && e.contains("0x2008"), "{e}");
    assert_eq!(off_grouped_call(how, None, true, String::new).unwrap(), how);
    for how in [StreamPool, Cudnn, StridedBatch] {
        assert_eq!(off_grouped_call(how, why(), true, String::new).unwrap(), how);
    }
}
