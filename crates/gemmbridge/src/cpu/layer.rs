//! RoPE and SwiGLU on the CPU: [`crate::layer_ops`]'s f32 arithmetic ([`crate::layer_ops::arith`])
//! over host slices, element by element in the GPU kernels' order, each result rounded once to
//! the storage type, so the CPU and the GPU give the same bits.

use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::layer_ops::{arith, Positions, Rope, RopeDirection, RopeTables, SwiGlu};

/// RoPE on the CPU, in place: every query and key head of `qkv` rotated by its token's
/// angles (forward) or by the opposite angles (backward, on `dq`, `dk`), as
/// [`crate::layer_ops`] defines it; value heads, the elements past the rotary dimension and the
/// row padding are not written. `tables` are given exactly for a problem whose angles come from
/// tables.
///
/// # Errors
/// Before anything is written: [`Error::LayerOp`] (the problem's rules, [`Rope::check_call`];
/// a position outside `0..`[`Rope::position_limit`]); [`Error::BufferTooSmall`] for `qkv`
/// shorter than [`Rope::qkv_elems`], fewer positions than tokens, or a table shorter than
/// [`Rope::table_elems`].
pub fn rope<T: Element>(
    op: &Rope,
    direction: RopeDirection,
    qkv: &mut [T],
    positions: Positions<&[i32]>,
    tables: Option<RopeTables<&[f32]>>,
) -> Result<()> {
    op.check_call(tables.is_some())?;
    let e = T::DTYPE.size_bytes();
    Error::check_len(Which::LayerOp("qkv"), qkv.len(), op.qkv_elems(), e)?;
    if let Some(t) = &tables {
        Error::check_len(Which::LayerOp("cos table"), t.cos.len(), op.table_elems(), 4)?;
        Error::check_len(Which::LayerOp("sin table"), t.sin.len(), op.table_elems(), 4)?;
    }
    match positions {
        Positions::Contiguous { start } => op.check_start(start)?,
        Positions::Given(p) => op.check_positions(p)?,
    }
    let freqs = op.inv_freqs();
    let half = op.rotary_dim / 2;
    let mut cs = vec![(0f32, 0f32); half];
    for t in 0..op.tokens() {
        let p = op.position(&positions, t);
        for (i, v) in cs.iter_mut().enumerate() {
            *v = op.cos_sin_at((p, i), &freqs, tables.as_ref(), direction);
        }
        for h in 0..op.heads_q + op.heads_kv {
            let head = &mut qkv[t * op.ld + h * op.head_dim..][..op.head_dim];
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (e1, e2) = op.pair(i);
                let (o1, o2) = arith::rotate(head[e1].to_f32(), head[e2].to_f32(), c, s);
                (head[e1], head[e2]) = (T::from_f32(o1), T::from_f32(o2));
            }
        }
    }
    Ok(())
}

/// The buffer checks of both SwiGLU directions: each `(which, length, elements needed)`.
fn check_swiglu<T: Element>(op: &SwiGlu, buffers: &[(Which, usize, usize)]) -> Result<()> {
    op.validate()?;
    for &(w, len, need) in buffers {
        Error::check_len(w, len, need, T::DTYPE.size_bytes())?;
    }
    Ok(())
}

/// `y = silu(g)·u` on the CPU ([`crate::layer_ops`], [`arith::swiglu`]): `gu` the `[rows, 2·f]`
/// input (`ld_in`), `y` the `[rows, f]` output (`ld_out`; its row padding is not written).
///
/// # Errors
/// Before anything is written: [`Error::LayerOp`] ([`SwiGlu::validate`]);
/// [`Error::BufferTooSmall`] for `gu` or `y`.
pub fn swiglu<T: Element>(op: &SwiGlu, gu: &[T], y: &mut [T]) -> Result<()> {
    let (gi, yi) = (op.in_elems(), op.out_elems());
    check_swiglu::<T>(op, &[(Which::LayerOp("gate/up"), gu.len(), gi), (Which::LayerOp("y"), y.len(), yi)])?;
    for r in 0..op.rows {
        for j in 0..op.f {
            let (g, u) = op.gate_up_index(r, j);
            y[r * op.ld_out + j] = T::from_f32(arith::swiglu(gu[g].to_f32(), gu[u].to_f32()));
        }
    }
    Ok(())
}

/// SwiGLU's backward on the CPU ([`arith::swiglu_grad`]): from `dy` (`[rows, f]`, `ld_out`)
/// and the forward's input `gu`, the gradients `dg`, `du` written into `dgu` where `g` and `u`
/// lie in `gu` (`[rows, 2·f]`, `ld_in`; its row padding is not written).
///
/// # Errors
/// Before anything is written: [`Error::LayerOp`] ([`SwiGlu::validate`]);
/// [`Error::BufferTooSmall`] for `dy`, `gu` or `dgu`.
pub fn swiglu_backward<T: Element>(op: &SwiGlu, dy: &[T], gu: &[T], dgu: &mut [T]) -> Result<()> {
    let (gi, yi) = (op.in_elems(), op.out_elems());
    check_swiglu::<T>(
        op,
        &[
            (Which::LayerOp("dy"), dy.len(), yi),
            (Which::LayerOp("gate/up"), gu.len(), gi),
            (Which::LayerOp("gate/up gradient"), dgu.len(), gi),
        ],
    )?;
    for r in 0..op.rows {
        for j in 0..op.f {
            let (g, u) = op.gate_up_index(r, j);
            let d = dy[r * op.ld_out + j].to_f32();
            let (dg, du) = arith::swiglu_grad(d, gu[g].to_f32(), gu[u].to_f32());
            (dgu[g], dgu[u]) = (T::from_f32(dg), T::from_f32(du));
        }
    }
    Ok(())
}
