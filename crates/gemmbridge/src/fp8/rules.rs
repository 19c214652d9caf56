//! Hopper's FP8 rules, checked on the host before anything is launched, each failure a named
//! [`Fp8Rule`].
//!
//! Measured on the H200 with cuBLASLt 13.1 (`bench/probes/fp8_support.py`, each configuration
//! asked of the heuristic and launched once) and stated by the cuBLAS documentation:
//! - the product is "TN" (`op(A)` transposed, `op(B)` not): gemmbridge's layout is always that
//!   (`w[N, K]` is cuBLASLt's transposed A, `x[M, K]` its B), a `[K, N]` weight is transposed
//!   when it is quantised ([`super::Source::Transposed`]);
//! - K a multiple of 16 (leading dimensions of 16 bytes): the quantised data is padded with
//!   zero columns, so every K works;
//! - the output's rows 16-byte aligned (N · element size a multiple of 16) and, with 1×128
//!   scales on an operand, that operand's rows a multiple of 4 (M = 70 fails, 72 runs): met by
//!   running on an aligned copy of the output (see `cuda::fp8`), so every M and N works;
//! - E5M2 × E5M2 is not offered (`CUBLAS_STATUS_NOT_SUPPORTED`);
//! - both operands use the same kind of scales (tensor with tensor, row with row, blocks with
//!   blocks), and 128×128 with 128×128 is not offered;
//! - an FP8 output only with tensor-wise scales, and only E4M3 (an E5M2 output is refused);
//! - fast accumulation is not offered with block scales;
//! - row-wise and block scales need compute capability 9.0 and cuBLASLt ≥ 12.9 (PyTorch checks
//!   the same before using them); FP8 at all needs compute capability ≥ 8.9.

use super::{Fp8Format, Scaling};
use crate::dtype::DType;
use crate::error::{Error, Fp8Rule, Result};

/// What an FP8 GEMM writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputKind {
    /// A high-precision output (f32, f16 or bf16).
    Dense(DType),
    /// An FP8 output with a D scale and the amax of the result.
    Fp8(Fp8Format),
}

impl std::fmt::Display for OutputKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputKind::Dense(d) => write!(f, "{d}"),
            OutputKind::Fp8(x) => write!(f, "{x}"),
        }
    }
}

/// The (x, w) scaling pairs cuBLASLt offers, every recipe [`check_pair`] accepts: tensor·tensor,
/// row·row, 1×128·128×128 (DeepSeek-V3's), 1×128·1×128 and 128×128·1×128.
pub const SCALING_PAIRS: [(Scaling, Scaling); 5] = [
    (Scaling::Tensor, Scaling::Tensor),
    (Scaling::Row, Scaling::Row),
    (Scaling::Block1x128, Scaling::Block128x128),
    (Scaling::Block1x128, Scaling::Block1x128),
    (Scaling::Block128x128, Scaling::Block1x128),
];

fn broken(rule: Fp8Rule, detail: String) -> Error {
    Error::Fp8 { rule, detail }
}

/// Checks the pairing of `x` (`[M, K]`) and `w` (`[N, K]`) operands, the output and the
/// options against the rules every GPU shares (see the module documentation).
///
/// # Errors
/// [`Error::Fp8`] naming the rule broken and the values that broke it.
pub fn check_pair(
    x: (Fp8Format, Scaling),
    w: (Fp8Format, Scaling),
    out: OutputKind,
    bias: Option<DType>,
    fast_accum: bool,
) -> Result<()> {
    use Scaling::*;
    if x.0 == Fp8Format::E5M2 && w.0 == Fp8Format::E5M2 {
        return Err(broken(Fp8Rule::NoE5m2Pair, "x and w are both e5m2; make one of them e4m3".into()));
    }
    if !SCALING_PAIRS.contains(&(x.1, w.1)) {
        return Err(broken(
            Fp8Rule::ScalingPair,
            format!(
                "x scaled {} with w scaled {}; cuBLASLt offers tensor·tensor, row·row, 1x128·128x128, \
                 1x128·1x128 and 128x128·1x128",
                x.1, w.1
            ),
        ));
    }
    let blocks = x.1 != Tensor && x.1 != Row;
    match out {
        OutputKind::Fp8(Fp8Format::E5M2) => {
            return Err(broken(
                Fp8Rule::OutputDtype,
                "an e5m2 output is not offered; write e4m3, bf16, f16 or f32".into(),
            ))
        }
        OutputKind::Fp8(Fp8Format::E4M3) if x.1 != Tensor => {
            return Err(broken(
                Fp8Rule::OutputDtype,
                format!("an FP8 output needs tensor-wise scales (x {}, w {}); write bf16, f16 or f32", x.1, w.1),
            ))
        }
        _ => {}
    }
    match (out, bias) {
        (OutputKind::Dense(DType::F32), Some(b)) => {
            return Err(broken(
                Fp8Rule::Bias,
                format!("an f32 output with an {b} bias is not offered; add the bias separately"),
            ))
        }
        (OutputKind::Dense(d), Some(b)) if b != d => {
            return Err(broken(Fp8Rule::Bias, format!("a {d} output takes a {d} bias, not {b}")))
        }
        (OutputKind::Fp8(_), Some(b)) if b != DType::BF16 => {
            return Err(broken(Fp8Rule::Bias, format!("an FP8 output takes a bf16 bias, not {b}")))
        }
        _ => {}
    }
    if fast_accum && blocks {
        return Err(broken(Fp8Rule::FastAccum, format!("fast accumulation with {}·{} block scales", x.1, w.1)));
    }
    Ok(())
}

/// Checks that a GPU of compute capability `(major, minor)` with cuBLASLt version
/// `lt_version` (`cublasLtGetVersion`, e.g. 130100) runs FP8 with `scaling`.
///
/// # Errors
/// [`Error::Fp8`] with [`Fp8Rule::ComputeCapability`] or [`Fp8Rule::LibraryVersion`].
pub fn check_support(cc: (i32, i32), lt_version: usize, scaling: Scaling) -> Result<()> {
    if cc < (8, 9) {
        return Err(broken(
            Fp8Rule::ComputeCapability,
            format!("FP8 GEMM needs compute capability 8.9 or later; this GPU is {}.{}", cc.0, cc.1),
        ));
    }
    if scaling == Scaling::Tensor {
        return Ok(());
    }
    if cc.0 != 9 {
        return Err(broken(
            Fp8Rule::ComputeCapability,
            format!("{scaling} scales run on compute capability 9.x (Hopper) only; this GPU is {}.{}", cc.0, cc.1),
        ));
    }
    if lt_version < 120900 {
        return Err(broken(
            Fp8Rule::LibraryVersion,
            format!("{scaling} scales need cuBLASLt 12.9 or later; the one loaded is version {lt_version}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fp8Format::*;
    use Scaling::*;

    fn rule(r: Result<()>) -> Fp8Rule {
        match r {
            Err(Error::Fp8 { rule, .. }) => rule,
            other => panic!("expected an FP8 rule error, got {other:?}"),
        }
    }

    #[test]
    fn every_rule_has_its_named_error() {
        let bf16 = OutputKind::Dense(DType::BF16);
        assert!(check_pair((E4M3, Tensor), (E4M3, Tensor), bf16, None, false).is_ok());
        assert!(check_pair((E5M2, Tensor), (E4M3, Tensor), OutputKind::Fp8(E4M3), None, true).is_ok());
        assert!(check_pair((E4M3, Block1x128), (E5M2, Block128x128), bf16, None, false).is_ok());
        assert_eq!(rule(check_pair((E5M2, Tensor), (E5M2, Tensor), bf16, None, false)), Fp8Rule::NoE5m2Pair);
        assert_eq!(
            rule(check_pair((E4M3, Block128x128), (E4M3, Block128x128), bf16, None, false)),
            Fp8Rule::ScalingPair
        );
        assert_eq!(rule(check_pair((E4M3, Tensor), (E4M3, Row), bf16, None, false)), Fp8Rule::ScalingPair);
        assert_eq!(
            rule(check_pair((E4M3, Row), (E4M3, Row), OutputKind::Fp8(E4M3), None, false)),
            Fp8Rule::OutputDtype
        );
        assert_eq!(
            rule(check_pair((E4M3, Tensor), (E4M3, Tensor), OutputKind::Fp8(E5M2), None, false)),
            Fp8Rule::OutputDtype
        );
        assert_eq!(rule(check_pair((E4M3, Block1x128), (E4M3, Block1x128), bf16, None, true)), Fp8Rule::FastAccum);
        assert!(check_pair((E4M3, Row), (E4M3, Row), bf16, Some(DType::BF16), true).is_ok());
        let f32_out = OutputKind::Dense(DType::F32);
        assert_eq!(rule(check_pair((E4M3, Tensor), (E4M3, Tensor), f32_out, Some(DType::F32), false)), Fp8Rule::Bias);
        assert_eq!(rule(check_pair((E4M3, Row), (E4M3, Row), bf16, Some(DType::F16), false)), Fp8Rule::Bias);
        let e4m3_out = OutputKind::Fp8(E4M3);
        assert!(check_pair((E4M3, Tensor), (E4M3, Tensor), e4m3_out, Some(DType::BF16), false).is_ok());
        assert_eq!(rule(check_pair((E4M3, Tensor), (E4M3, Tensor), e4m3_out, Some(DType::F32), false)), Fp8Rule::Bias);
    }

    #[test]
    fn recipes_are_checked_against_the_gpu_and_library() {
        assert!(check_support((9, 0), 130100, Block1x128).is_ok());
        assert!(check_support((8, 9), 120400, Tensor).is_ok());
        assert_eq!(rule(check_support((8, 0), 130100, Tensor)), Fp8Rule::ComputeCapability);
        assert_eq!(rule(check_support((10, 0), 130100, Row)), Fp8Rule::ComputeCapability);
        assert_eq!(rule(check_support((9, 0), 120800, Block128x128)), Fp8Rule::LibraryVersion);
    }
}
