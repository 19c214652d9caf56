//! The CPU emulation of an FP8 grouped product, the reference an FP8 grouped GEMM is judged by:
//! each group's two operands in the TN form of [`GroupedProblem::tn_operand`] quantised on
//! their own with the recipe's formats and scalings ([`crate::fp8::quantize`] exactly, as the
//! crate's kernels do per group), then `c_e = Â_e · B̂_eᵀ` in float64 on the dequantised values
//! (a forward's bias added in float64). Its error against the float64 product of the
//! unquantised operands is the recipe's own error; an FP8 path may be no worse than 1.5× of it.

use super::{GroupedOp, GroupedOperand, GroupedProblem};
use crate::error::{Error, Result};
use crate::fp8::{check_pair, dequantize, quantize, Fp8Format, OutputKind, Scaling};

/// `c` of the FP8 grouped product `p` (argument order `a, b` as [`GroupedOp::names`]), `a`
/// quantised with `recipe.0`, `b` with `recipe.1`: every group's output written (a backward
/// weight's empty group: zeros); rows past the last group keep their value.
///
/// # Errors
/// [`Error::GroupedShape`] for buffers of the wrong lengths; [`Error::Fp8`] for a recipe the
/// GPU refuses ([`check_pair`] with the problem's output type and bias: E5M2 on both sides, a
/// scaling pair cuBLASLt does not offer, …); the quantisation's errors ([`quantize`]).
pub fn run(
    p: &GroupedProblem,
    (a, b): (&[f32], &[f32]),
    bias: Option<&[f64]>,
    recipe: ((Fp8Format, Scaling), (Fp8Format, Scaling)),
    c: &mut [f64],
) -> Result<()> {
    check_lengths(p, [a.len(), b.len(), c.len()], bias)?;
    let out = p.precision().output();
    check_pair(recipe.0, recipe.1, OutputKind::Dense(out), p.has_bias().then_some(out), false)?;
    for e in 0..p.groups() {
        let (c0, [rows, cols]) = p.tn_output(e);
        let out = &mut c[c0..c0 + rows * cols];
        let (Some(ta), Some(tb)) = (p.tn_operand(GroupedOperand::A, e), p.tn_operand(GroupedOperand::B, e)) else {
            if p.op() == GroupedOp::BackwardWeight {
                out.fill(0.0); // no rows: a zero gradient
            }
            continue;
        };
        let q = |src: &[f32], t: super::TnOperand, (format, scaling)| {
            let slice = &src[t.start..t.start + t.rows * t.inner];
            dequantize(&quantize(slice, t.rows, t.inner, t.source, format, scaling)?)
        };
        let (da, db) = (q(a, ta, recipe.0)?, q(b, tb, recipe.1)?);
        let inner = ta.inner;
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                let dot: f64 = (0..inner).map(|t| da[i * inner + t] * db[j * inner + t]).sum();
                *v = dot + bias.map_or(0.0, |bb| bb[e * cols + j]);
            }
        }
    }
    Ok(())
}

/// The buffers `[a, b, c]` and the bias against the problem's lengths.
fn check_lengths(p: &GroupedProblem, got: [usize; 3], bias: Option<&[f64]>) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
    let want = p.lens();
    if got != want {
        return bad("a buffer has another length than the problem's", format!("{got:?} where {want:?} (a, b, c)"));
    }
    let want_bias = p.has_bias().then(|| p.groups() * p.n());
    if bias.map(<[f64]>::len) != want_bias {
        return bad(
            "the bias has another length than E·N",
            format!("{:?} where {want_bias:?}", bias.map(<[f64]>::len)),
        );
    }
    Ok(())
}
