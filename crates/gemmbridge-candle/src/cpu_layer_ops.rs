//! The CPU path of RoPE and SwiGLU: the plans of [`crate::rope`] and [`crate::swiglu`] run by
//! gemmbridge's CPU backend (the same copies and problems the CUDA path runs).

use candle_core::Result;
use gemmbridge::layer_ops::{Positions, RopeTables};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::layer_plan::{GluPlan, RopePlan};

/// A buffer of `n` elements, NaN until written: an element the call leaves unwritten shows.
fn poisoned<T: Element>(n: usize) -> Vec<T> {
    vec![T::from_f32(f32::NAN); n]
}

/// Copies `rows` rows of `width` elements from `src` (first row at `so`, rows `ss` apart) to
/// `dst` (at `dof`, rows `ds` apart).
fn copy_rows<T: Copy>(
    rows: usize,
    width: usize,
    (src, so, ss): (&[T], usize, usize),
    (dst, dof, ds): (&mut [T], usize, usize),
) {
    for r in 0..rows {
        dst[dof + r * ds..][..width].copy_from_slice(&src[so + r * ss..][..width]);
    }
}

/// RoPE: x copied into the scratch fused QKV buffer, rotated there by gemmbridge's CPU RoPE
/// (tables `[t, d/2]` f32 at the plan's offsets), copied out dense `[b, h, t, d]`.
pub(crate) fn rope<T: Element>(plan: &RopePlan, x: &[T], [cos, sin]: [&[f32]; 2]) -> Result<Vec<T>> {
    let p = &plan.problem;
    let d = p.head_dim;
    let blocks = plan.blocks();
    let mut scratch = poisoned::<T>(p.qkv_elems());
    for b in &blocks {
        copy_rows(b.rows, d, (x, plan.x_start + b.row * plan.x_rs, plan.x_rs), (&mut scratch, b.slot, p.ld));
    }
    let tables = RopeTables { cos: &cos[plan.table_starts[0]..], sin: &sin[plan.table_starts[1]..] };
    gemmbridge::cpu::rope(p, plan.direction, &mut scratch, Positions::Contiguous { start: 0 }, Some(tables))
        .map_err(wrap)?;
    let mut out = poisoned::<T>(plan.out_elems());
    for b in blocks.iter().filter(|b| b.copy_out) {
        copy_rows(b.rows, d, (&scratch, b.slot, p.ld), (&mut out, b.row * d, d));
    }
    Ok(out)
}

/// SwiGLU's forward: `y` dense `[rows, f]`.
pub(crate) fn swiglu<T: Element>(plan: &GluPlan, gu: &[T]) -> Result<Vec<T>> {
    let p = &plan.problem;
    let mut y = poisoned::<T>(p.rows * p.f);
    gemmbridge::cpu::swiglu(p, &gu[plan.start..], &mut y).map_err(wrap)?;
    Ok(y)
}

/// SwiGLU's backward from a dense `dy[rows, f]` starting at `dy_start`: `dgu` `[rows, ld_in]`
/// (gu's row stride; the padding past `2·f` stays NaN).
pub(crate) fn swiglu_backward<T: Element>(plan: &GluPlan, gu: &[T], (dy, dy_start): (&[T], usize)) -> Result<Vec<T>> {
    let p = &plan.problem;
    let mut dgu = poisoned::<T>(p.rows * p.ld_in);
    gemmbridge::cpu::swiglu_backward(p, &dy[dy_start..], &gu[plan.start..], &mut dgu).map_err(wrap)?;
    Ok(dgu)
}
