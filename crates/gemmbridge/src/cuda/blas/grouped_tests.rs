//! The runs of a cuBLAS grouped call.

use super::*;
use crate::mapping::column_major_call;
use crate::{GemmProblem, Precision};

fn gemm(m: usize, alpha: f32, at: u64) -> BlasGemm {
    let p = GemmProblem::linear(m, 96, 64, Precision::BF16).unwrap();
    BlasGemm {
        call: column_major_call(&p),
        precision: p.precision(),
        alpha,
        beta: 0.0,
        first: at,
        second: at + 1,
        c: at + 2,
    }
}

#[test]
fn runs_of_alike_gemms_become_one_group_each() {
    let list = [
        gemm(128, 1.0, 0),
        gemm(128, 1.0, 100),
        gemm(128, 1.0, 200),
        gemm(64, 1.0, 300),
        gemm(128, 1.0, 400),
        gemm(128, 2.0, 500),
    ];
    let (heads, sizes) = runs(&list);
    assert_eq!(sizes, [3, 1, 1, 1]);
    assert_eq!(heads.iter().map(|g| g.first).collect::<Vec<_>>(), [0, 300, 400, 500]);
    assert_eq!(runs(&[]).1, Vec::<i32>::new());
}
