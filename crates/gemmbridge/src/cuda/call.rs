//! The one value a GEMM call is carried in, from the entry point that validated it to the
//! library room that launches it ([`GemmCall`]), and the scalars of a call ([`Scale`]).

use cudarc::driver::sys::CUstream;

use crate::mapping::ColMajorCall;
use crate::problem::GemmProblem;

/// α and β of `C = α·op(A)·op(B) + β·C` (with β = 0, C is never read: BLAS semantics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    /// α, the product's factor.
    pub alpha: f32,
    /// β, C's factor.
    pub beta: f32,
}

impl Scale {
    /// α = 1, β = 0: `C = op(A)·op(B)`.
    pub const PRODUCT: Scale = Scale { alpha: 1.0, beta: 0.0 };

    /// The scalars `alpha` and `beta`.
    pub const fn new(alpha: f32, beta: f32) -> Scale {
        Scale { alpha, beta }
    }
}

impl Default for Scale {
    /// [`Scale::PRODUCT`].
    fn default() -> Self {
        Scale::PRODUCT
    }
}

/// A validated call by address: the row-major problem, its column-major call, the scalars,
/// A, B and C, the epilogue's operands, and the caller's stream. Built once at the entry
/// point; the routing floor may replace it by another (an aligned copy's, a fallback's), and
/// each library room lowers it to its own launch.
pub(crate) struct GemmCall<'a> {
    pub problem: &'a GemmProblem,
    /// `column_major_call(problem)`, computed once.
    pub cm: ColMajorCall,
    pub alpha: f32,
    pub beta: f32,
    /// Row-major A, B, C (C is the output, cuBLASLt's D).
    pub abc: (u64, u64, u64),
    /// A read-only C laid out as C, read instead of C (validated apart from every written
    /// operand); `None`: C is read in place. Never C's own address.
    pub c_in: Option<u64>,
    pub bias: Option<u64>,
    pub aux: Option<u64>,
    pub stream: CUstream,
}
