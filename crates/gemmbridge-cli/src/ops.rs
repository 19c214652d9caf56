//! The GEMM ops as bench/peer.py names them, the dtypes it takes, and the problem each
//! (op, shape, precision) names: shared by `bench`, `tune` and `firstcall`.

use anyhow::bail;
use gemmbridge::{Epilogue, GemmProblem, Precision};

use crate::suites::Shape;

/// The GEMM ops, as bench/peer.py names them. `bmm` is not run unless asked for (`--ops`).
pub const OPS: [&str; 5] = ["matmul", "linear", "linear_bias", "linear_bias_gelu", "bmm"];

/// The batch count of the `bmm` op (a strided batch of contiguous matrices, as `torch.bmm`).
pub const BMM_BATCH: usize = 4;

/// Whether bench/peer.py runs `op` for `dtype` (the fused linear ops only for f16/bf16).
pub fn op_applies(op: &str, dtype: &str) -> bool {
    !(op.starts_with("linear_bias") && (dtype == "f32" || dtype == "tf32"))
}

/// The precision a bench/peer.py dtype name stands for (`None` for an unknown name).
pub fn precision_of(dtype: &str) -> Option<Precision> {
    Some(match dtype {
        "f32" => Precision::F32,
        "tf32" => Precision::TF32,
        "f16" => Precision::F16,
        "bf16" => Precision::BF16,
        _ => return None,
    })
}

/// The problem an op names: matmul x[m,k]·w[k,n]; linear x[m,k]·w[n,k]ᵀ, plus bias, plus
/// bias and GELU (tanh approximation, as PyTorch's `_addmm_activation` through cuBLASLt);
/// bmm: [`BMM_BATCH`] matmuls x[b,m,k]·w[b,k,n] stored one after another (`torch.bmm`).
pub fn problem(op: &str, (m, n, k): Shape, precision: Precision) -> anyhow::Result<GemmProblem> {
    Ok(match op {
        "matmul" => GemmProblem::matmul(m, n, k, precision)?,
        "linear" => GemmProblem::linear(m, n, k, precision)?,
        "linear_bias" => GemmProblem::linear(m, n, k, precision)?.with_epilogue(Epilogue::Bias)?,
        "linear_bias_gelu" => GemmProblem::linear(m, n, k, precision)?.with_epilogue(Epilogue::GeluBias)?,
        "bmm" => GemmProblem::matmul(m, n, k, precision)?.batched(BMM_BATCH)?,
        other => bail!("unknown op {other:?}; choose from {}", OPS.join(", ")),
    })
}
