//! A validated call by address, as the dispatch and the misaligned-operand path pass it on.

use cudarc::driver::sys::CUstream;

use crate::mapping::ColMajorCall;
use crate::problem::GemmProblem;

/// A validated call by address: the row-major problem, its column-major call, the scalars,
/// A, B and C, the epilogue's operands, and the caller's stream.
pub(crate) struct GemmCall<'a> {
    pub problem: &'a GemmProblem,
    /// `column_major_call(problem)`, computed once.
    pub cm: ColMajorCall,
    pub alpha: f32,
    pub beta: f32,
    /// Row-major A, B, C.
    pub abc: (u64, u64, u64),
    pub bias: Option<u64>,
    pub aux: Option<u64>,
    pub stream: CUstream,
}
