//! RMSNorm on the CPU ([`crate::norm`] has the definition): f32 arithmetic on the storage
//! types — every element widened to f32, each row's sum of squares, dot product and the
//! weight gradient's sums accumulated in f32, the results rounded to their storage type once.

use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::norm::{NormTensor, RmsNorm};

/// The weight gradient `dw[features]` a CPU backward writes: in the I/O type or in f32, as the
/// problem's [`RmsNorm::dw`] says. What must agree is the element type
/// ([`RmsNorm::dw_dtype`]): for an f32 problem both forms hold f32 and either is taken.
#[derive(Debug)]
pub enum DwSlice<'a, T> {
    /// `dw` in the I/O type (the problem's [`GradType::Io`](crate::norm::GradType::Io)).
    Io(&'a mut [T]),
    /// `dw` in f32 (the problem's [`GradType::F32`](crate::norm::GradType::F32), or any f32 problem).
    F32(&'a mut [f32]),
}

/// The problem's rules (the leading dimensions of the tensors in `used`) and the element type.
fn check_problem<T: Element>(p: &RmsNorm, used: &[NormTensor]) -> Result<()> {
    p.validate_tensors(used)?;
    if T::DTYPE != p.dtype {
        return Err(Error::DTypeMismatch { operand: Which::Norm("x"), expected: p.dtype, got: T::DTYPE });
    }
    Ok(())
}

/// A slice of `have` elements holds what tensor `t` needs.
fn check_tensor(p: &RmsNorm, t: NormTensor, have: usize, elem: usize) -> Result<()> {
    Error::check_len(Which::Norm(t.name()), have, p.required_elems(t), elem)
}

/// The forward on the CPU: `y` (and, with `inv_rms`, the inverse RMS of every row, f32) from
/// `x` and the weight `w`, strided as `p` says; `y`'s elements between rows are left
/// untouched. Each row: `ss = Σ x²` in f32, `r = 1/√(ss/C + ε)`, `y = T(x·r·w)`.
///
/// # Errors
/// [`Error::NormShape`] (the problem's rules, [`RmsNorm::validate`]; of the leading dimensions
/// only those of `x` and `y`: the residual, sum and gradients are not used here),
/// [`Error::DTypeMismatch`] (an element type other
/// than the problem's), [`Error::BufferTooSmall`] (a slice shorter than its layout); nothing
/// is written then.
pub fn rms_norm_forward<T: Element>(
    p: &RmsNorm,
    x: &[T],
    w: &[T],
    y: &mut [T],
    inv_rms: Option<&mut [f32]>,
) -> Result<()> {
    check_problem::<T>(p, &[NormTensor::X, NormTensor::Y])?;
    let elem = T::DTYPE.size_bytes();
    check_tensor(p, NormTensor::X, x.len(), elem)?;
    Error::check_len(Which::Norm("w"), w.len(), p.features, elem)?;
    check_tensor(p, NormTensor::Y, y.len(), elem)?;
    if let Some(s) = inv_rms.as_ref() {
        Error::check_len(Which::Norm("inv_rms"), s.len(), p.rows, 4)?;
    }
    let c = p.features;
    let w: Vec<f32> = w[..c].iter().map(|v| v.to_f32()).collect();
    let mut saved = inv_rms;
    for i in 0..p.rows {
        let xr = &x[p.index(NormTensor::X, i, 0)..][..c];
        let r = row_inv_rms(xr, p.eps);
        if let Some(s) = saved.as_deref_mut() {
            s[i] = r;
        }
        let yr = &mut y[p.index(NormTensor::Y, i, 0)..][..c];
        for ((out, v), w) in yr.iter_mut().zip(xr).zip(&w) {
            *out = T::from_f32(v.to_f32() * r * w);
        }
    }
    Ok(())
}

/// `1/√(Σ x² / C + ε)` of one row, in f32.
fn row_inv_rms<T: Element>(row: &[T], eps: f32) -> f32 {
    let ss: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
    1.0 / (ss / row.len() as f32 + eps).sqrt()
}

/// The backward on the CPU: `dx` (strided as `p` says; elements between rows untouched) and
/// `dw` from the forward's `x`, the weight `w`, its saved `inv_rms[rows]` and the output's
/// gradient `dy`. Each row, with `r = inv_rms[i]`, `x̂ = x·r`, `g = dy·w`: `dot = Σ g·x̂ / C`,
/// `dx = T(r·(g − x̂·dot))`; `dw[j] = Σ_i dy·x̂`, accumulated in f32 and rounded once.
///
/// # Errors
/// As [`rms_norm_forward`] (of the leading dimensions only those of `x`, `dy` and `dx`);
/// [`Error::DTypeMismatch`] for a `dw` whose element type is not
/// [`RmsNorm::dw_dtype`] (an f32 `dw` beside f16/bf16 I/O with [`GradType::Io`](crate::norm::GradType::Io), or an I/O-type
/// one with [`GradType::F32`](crate::norm::GradType::F32)).
pub fn rms_norm_backward<T: Element>(
    p: &RmsNorm,
    x: &[T],
    w: &[T],
    inv_rms: &[f32],
    dy: &[T],
    dx: &mut [T],
    dw: DwSlice<'_, T>,
) -> Result<()> {
    check_problem::<T>(p, &[NormTensor::X, NormTensor::Dy, NormTensor::Dx])?;
    let elem = T::DTYPE.size_bytes();
    check_tensor(p, NormTensor::X, x.len(), elem)?;
    Error::check_len(Which::Norm("w"), w.len(), p.features, elem)?;
    Error::check_len(Which::Norm("inv_rms"), inv_rms.len(), p.rows, 4)?;
    check_tensor(p, NormTensor::Dy, dy.len(), elem)?;
    check_tensor(p, NormTensor::Dx, dx.len(), elem)?;
    let (dw_len, got) = match &dw {
        DwSlice::Io(d) => (d.len(), p.dtype),
        DwSlice::F32(d) => (d.len(), crate::DType::F32),
    };
    if got != p.dw_dtype() {
        return Err(Error::DTypeMismatch { operand: Which::Norm("dw"), expected: p.dw_dtype(), got });
    }
    Error::check_len(Which::Norm("dw"), dw_len, p.features, p.dw_dtype().size_bytes())?;
    let c = p.features;
    let w: Vec<f32> = w[..c].iter().map(|v| v.to_f32()).collect();
    let mut acc = vec![0.0f32; c];
    for (i, &r) in inv_rms[..p.rows].iter().enumerate() {
        let xr = &x[p.index(NormTensor::X, i, 0)..][..c];
        let gr = &dy[p.index(NormTensor::Dy, i, 0)..][..c];
        let dot: f32 = xr.iter().zip(gr).zip(&w).map(|((x, g), w)| g.to_f32() * w * (x.to_f32() * r)).sum();
        let dot = dot / c as f32;
        let out = &mut dx[p.index(NormTensor::Dx, i, 0)..][..c];
        for (j, (((o, x), g), w)) in out.iter_mut().zip(xr).zip(gr).zip(&w).enumerate() {
            let xh = x.to_f32() * r;
            *o = T::from_f32(r * (g.to_f32() * w - xh * dot));
            acc[j] += g.to_f32() * xh;
        }
    }
    match dw {
        DwSlice::Io(d) => d[..c].iter_mut().zip(&acc).for_each(|(o, a)| *o = T::from_f32(*a)),
        DwSlice::F32(d) => d[..c].copy_from_slice(&acc),
    }
    Ok(())
}
