//! The CPU emulation of an FP8 grouped forward, the reference an FP8 grouped GEMM is judged
//! by: each group's `x_e[m_e, K]` and `w_e[N, K]` quantised to E4M3 on their own with the
//! recipe's scalings ([`crate::fp8::quantize`] exactly, as the crate's kernels do per group),
//! then `y_e = x̂_e · ŵ_eᵀ` in float64 on the dequantised values (a bias added in float64). Its
//! error against the float64 product of the unquantised operands is the recipe's own error; an
//! FP8 path may be no worse than 1.5× of it.

use super::{GroupedOp, GroupedProblem};
use crate::error::{Error, Result};
use crate::fp8::{dequantize, quantize, Fp8Format, Scaling, Source};

/// `y` of an FP8 grouped forward (module documentation), every group's rows written; rows past
/// the last group keep their value. Empty groups are skipped (nothing to quantise).
///
/// # Errors
/// [`Error::GroupedShape`] for a backward product or buffers of the wrong lengths; the
/// quantisation's errors ([`quantize`]).
pub fn forward(
    p: &GroupedProblem,
    (x, w): (&[f32], &[f32]),
    bias: Option<&[f64]>,
    (x_scaling, w_scaling): (Scaling, Scaling),
    y: &mut [f64],
) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
    if p.op() != GroupedOp::Forward {
        return bad("the FP8 emulation is of the forward", format!("{:?}", p.op()));
    }
    let [lx, lw, ly] = p.lens();
    if (x.len(), w.len(), y.len()) != (lx, lw, ly) {
        return bad(
            "a buffer has another length than the problem's",
            format!("x {}, w {}, y {} where {lx}, {lw}, {ly}", x.len(), w.len(), y.len()),
        );
    }
    let want_bias = p.has_bias().then(|| p.groups() * p.n());
    if bias.map(<[f64]>::len) != want_bias {
        return bad(
            "the bias has another length than E·N",
            format!("{:?} where {want_bias:?}", bias.map(<[f64]>::len)),
        );
    }
    // the dequantised operands, each group quantised on its own, then the float64 product
    let (n, k) = (p.n(), p.k());
    let (mut xd, mut wd) = (vec![0.0; lx], vec![0.0; lw]);
    for (e, &m) in p.sizes().iter().enumerate().filter(|(_, &m)| m > 0) {
        let (xs, ws) = (p.row_start(e) * k..(p.row_start(e) + m) * k, e * n * k..(e + 1) * n * k);
        let q = |src: &[f32], rows, scaling| {
            dequantize(&quantize(src, rows, k, Source::RowMajor, Fp8Format::E4M3, scaling)?)
        };
        xd[xs.clone()].copy_from_slice(&q(&x[xs], m, x_scaling)?);
        wd[ws.clone()].copy_from_slice(&q(&w[ws], n, w_scaling)?);
    }
    super::reference::run(p, &xd, &wd, bias, y);
    Ok(())
}
