//! Grouped GEMMs on the CPU: each group through [`gemm`] on its slices.

use super::gemm;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::grouped::GroupedProblem;
use crate::precision::Precision;
use crate::problem::GemmProblem;

/// The grouped product `p` ([`crate::grouped`]: a mixture-of-experts layer's forward or either
/// backward product) on the CPU: each group's GEMM through [`gemm`] on its slices of `a`, `b`
/// and `c` (the buffers [`crate::grouped::reference::run`] and the GPU's `grouped_gemm` take:
/// row-major, contiguous, argument order as [`crate::grouped::GroupedOp::names`], lengths as
/// [`GroupedProblem::lens`]), the forward's `bias[E, N]` added in f32 before the output is
/// rounded (as the GPU's bias epilogue adds it). An empty group writes nothing in the forward
/// and backward data and zeros into its `dw[e]`; rows past the last group are not written.
/// Unlike the GPU's `grouped_gemm`, which takes one element type for every buffer, this also
/// runs precisions whose output type differs from the inputs' (f16 or bf16 in, f32 out).
///
/// # Errors
/// Before anything is written: [`Error::DTypeMismatch`] when `TI` is not the precision's input
/// type or `TO` (the output's and the bias's) not its output type;
/// [`Error::BufferTooSmall`] for `a`, `b`, `c` or the bias (`E · N`);
/// [`Error::EpilogueOperand`] for a bias given to a problem without one
/// ([`GroupedProblem::with_bias`]) or missing from one with it.
pub fn grouped_gemm<TI: Element, TO: Element>(
    p: &GroupedProblem,
    a: &[TI],
    b: &[TI],
    c: &mut [TO],
    bias: Option<&[TO]>,
) -> Result<()> {
    check_grouped::<TI, TO>(p, [a.len(), b.len(), c.len()], bias.map(<[TO]>::len))?;
    for e in 0..p.groups() {
        let (g, [a0, b0, c0]) = p.group(e)?;
        match bias {
            Some(bias) if p.sizes()[e] > 0 => {
                let (m, n) = (g.m(), g.n());
                // the product in f32, then the bias, then one rounding to the output type
                let wide = Precision::new(p.precision().input(), p.precision().compute(), crate::DType::F32)?;
                let plain = GemmProblem::linear(m, n, g.k(), wide)?;
                let mut out = vec![0f32; m * n];
                gemm(&plain, 1.0, &a[a0..], &b[b0..], 0.0, &mut out)?;
                let row = &bias[e * n..(e + 1) * n];
                for (dst, (v, bv)) in c[c0..c0 + m * n].iter_mut().zip(out.iter().zip(row.iter().cycle())) {
                    *dst = TO::from_f32(v + bv.to_f32());
                }
            }
            Some(_) => {}
            None => gemm(&g, 1.0, &a[a0..], &b[b0..], 0.0, &mut c[c0..])?,
        }
    }
    Ok(())
}

/// [`grouped_gemm`]'s checks: element types, lengths (`a`, `b`, `c`, bias), the bias against
/// the problem.
fn check_grouped<TI: Element, TO: Element>(p: &GroupedProblem, lens: [usize; 3], bias: Option<usize>) -> Result<()> {
    let pr = p.precision();
    let [wa, wb, wc] = p.op().operands();
    for (operand, expected, got) in
        [(wa, pr.input(), TI::DTYPE), (wb, pr.input(), TI::DTYPE), (wc, pr.output(), TO::DTYPE)]
    {
        if expected != got {
            return Err(Error::DTypeMismatch { operand, expected, got });
        }
    }
    p.check_bias(bias.is_some())?;
    let needed = p.lens().into_iter().chain(bias.map(|_| p.groups() * p.n()));
    let have = lens.into_iter().chain(bias);
    let elem = |w: Which| if w == wc || w == Which::Bias { TO::DTYPE } else { TI::DTYPE }.size_bytes();
    let mut named = [wa, wb, wc, Which::Bias].into_iter().zip(have).zip(needed);
    named.try_for_each(|((operand, have), needed)| Error::check_len(operand, have, needed, elem(operand)))
}
