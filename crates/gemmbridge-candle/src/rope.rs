//! Rotary position embedding: candle-nn's `rope` (rotate-half pairs) and `rope_i` (interleaved
//! pairs), with the backward.
//!
//! gemmbridge's RoPE ([`gemmbridge::layer_ops::Rope`]) rotates the query and key heads of a
//! fused QKV buffer `[batch, seq, (h_q + 2·h_kv)·d]` in place, and refuses a problem without a
//! key head. Neither a query-only form nor an exact in-place description of `x[b, h, t, d]`
//! exists (heads of one token sharing a position lie `t·d` apart in x, and rows of a fused
//! buffer may not overlap), so the `b·h` sequences of x are copied, two by two, into a scratch
//! buffer laid out as a fused QKV buffer with one query, one key and one value head per token:
//! `[m, t, 3·d]`, `m = ⌈b·h/2⌉`, sequence `j < m` as the query head of group `j` and sequence
//! `m + j` as its key head (for an odd `b·h` the last group's key head holds a second copy of
//! its query head); the value heads are never read or written. The scratch is rotated in place
//! ([`RopePlan`]'s problem), then its query and key heads are copied out into `[b, h, t, d]`.
//! The CPU path and the CUDA path run the same copies ([`RopePlan::blocks`]) and the same
//! problem.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use gemmbridge::layer_ops::{RopeDirection, RopeStyle};

use crate::cpu::by_dtype;
use crate::layer_plan::RopePlan;
use crate::{cpu_layer_ops, device_served, plan, Served};

/// candle-nn's `rotary_emb::rope`: RoPE with rotate-half pairs `(x[i], x[i + d/2])` (LLaMA,
/// GPT-NeoX), served by gemmbridge's RoPE; see [`rope_served`] for shapes, dtypes, layouts,
/// the backward and the paths.
///
/// # Errors
/// As [`rope_served`].
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope_served(x, cos, sin, RopeStyle::RotateHalf).map(|(t, _)| t)
}

/// candle-nn's `rotary_emb::rope_i`: RoPE with interleaved pairs `(x[2i], x[2i + 1])`
/// (GPT-J), served by gemmbridge's RoPE; see [`rope_served`].
///
/// # Errors
/// As [`rope_served`].
pub fn rope_i(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope_served(x, cos, sin, RopeStyle::Interleaved).map(|(t, _)| t)
}

/// RoPE in the pairs of `style`, and which path ran it.
///
/// - `x[b, h, t, d]`: `b` sequences of `h` heads of `t` tokens, `d` even; any float dtype, any
///   strides (candle-nn asks for a contiguous x).
/// - `cos`, `sin`: `[T, d/2]` with `T ≥ t`, row `p` the cosines and sines of x's token `p`
///   (rows past `t` are not read; narrow a longer table to start at an offset), or `[b, T,
///   d/2]`, one table per sequence; any float dtype and strides. They are converted to f32
///   (exactly for f16 and bf16) for gemmbridge's tables.
/// - Output `[b, h, t, d]`, contiguous, x's dtype: every pair `(x₁, x₂)` of token `p`, pair
///   index `i < d/2`, becomes `(x₁·c − x₂·s, x₂·c + x₁·s)` with `c = cos[p, i]`,
///   `s = sin[p, i]`: products and sums in f32, rounded once (candle-nn's kernels compute in
///   the storage type).
/// - Backward (candle's autograd): `dx` is `dy` rotated by the opposite angles (gemmbridge's
///   `RopeDirection::Backward`); `cos` and `sin` get no gradient (they enter the operation
///   detached; [`rope_candle`] differentiates them).
///
/// Served for f32, f16 and bf16 with `2 ≤ d ≤ 512`, `[T, d/2]` tables (or `[1, T, d/2]`),
/// on the CPU (gemmbridge's CPU backend) and on CUDA (gemmbridge's layer kernels, `cuda`
/// feature), through a scratch copy: gemmbridge's RoPE rotates the query and key heads of a
/// fused QKV buffer in place and needs a key head, so x's `b·h` sequences are copied two by two
/// into a buffer `[⌈b·h/2⌉, t, 3·d]` laid out as a fused QKV buffer with one query, one key and
/// one unused value head per token (1.5 times x's size), rotated there (token `p` at position
/// `p` of the f32 tables) and copied out into the output. x is read for that copy in place
/// where its `b`, `h`, `t` dimensions merge into one row stride over contiguous rows of `d`
/// (a contiguous x, or rows narrowed from wider ones): [`Served::Gemmbridge`]; otherwise x is
/// copied contiguous first ([`Served::AfterCopy`]: a `[b, t, h, d]` projection transposed to
/// `[b, h, t, d]`). Other dtypes (f64), larger or empty shapes, per-sequence tables with
/// `b > 1`, other devices and [`crate::set_enabled`]`(false)` run [`rope_candle`]
/// ([`Served::Candle`]).
///
/// # Errors
/// Before anything runs, candle's `Error::Msg` starting `rope:` and naming the shapes or
/// dtypes: x not 4-D; `cos` or `sin` neither `[T, d/2]` nor `[b, T, d/2]` with `T ≥ t` (an odd
/// `d` included), or one 2-D and the other 3-D; a dtype that is not a float type; tensors on
/// different devices. A gemmbridge error from the GPU, wrapped.
pub fn rope_served(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<(Tensor, Served)> {
    let g = Geometry::of(x, cos, sin)?;
    if !device_served(x.device()) || plan::element(x.dtype()).is_none() || (g.per_sequence && g.b > 1) {
        return Ok((rope_candle(x, cos, sin, style)?, Served::Candle));
    }
    // detached: the operation gives the tables no gradient, and a tracked input without one
    // would stop candle's backward
    let (c, s) = (g.table_f32(cos)?.detach(), g.table_f32(sin)?.detach());
    let planned = |x: &Tensor| RopePlan::new(x.layout(), [c.layout(), s.layout()], style, RopeDirection::Forward);
    if let Some(plan) = planned(x) {
        return Ok((x.apply_op3(&c, &s, RopeOp::new(plan, x))?, Served::Gemmbridge));
    }
    let x2 = x.contiguous()?;
    match planned(&x2) {
        Some(plan) => Ok((x2.apply_op3(&c, &s, RopeOp::new(plan, &x2))?, Served::AfterCopy)),
        None => Ok((rope_candle(x, cos, sin, style)?, Served::Candle)),
    }
}

/// candle's own operations for RoPE (narrow, broadcast products, concatenation), in f32 (f64
/// for an f64 x) and rounded to x's dtype once at the end: what the fallback runs, and what
/// the tests compare with. Shapes, dtypes and pairs as [`rope_served`]; any strides; output
/// contiguous. Its backward is candle's autograd through those operations.
///
/// # Errors
/// As [`rope_served`]'s shape, dtype and device errors.
pub fn rope_candle(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<Tensor> {
    let g = Geometry::of(x, cos, sin)?;
    let wide = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let (c, s) = (g.table_broadcast(cos, wide)?, g.table_broadcast(sin, wide)?);
    let xw = x.to_dtype(wide)?;
    let half = g.d / 2;
    let rotate = |x1: &Tensor, x2: &Tensor, c: &Tensor, s: &Tensor| -> Result<(Tensor, Tensor)> {
        let y1 = (x1.broadcast_mul(c)? - x2.broadcast_mul(s)?)?;
        let y2 = (x2.broadcast_mul(c)? + x1.broadcast_mul(s)?)?;
        Ok((y1, y2))
    };
    let y = match style {
        RopeStyle::RotateHalf => {
            let (y1, y2) = rotate(&xw.narrow(3, 0, half)?, &xw.narrow(3, half, half)?, &c, &s)?;
            Tensor::cat(&[y1, y2], 3)?
        }
        RopeStyle::Interleaved => {
            let pairs = xw.reshape((g.b, g.h, g.t, half, 2))?;
            let (c, s) = (c.unsqueeze(D::Minus1)?, s.unsqueeze(D::Minus1)?);
            let (y1, y2) = rotate(&pairs.narrow(4, 0, 1)?, &pairs.narrow(4, 1, 1)?, &c, &s)?;
            Tensor::cat(&[y1, y2], 4)?.reshape((g.b, g.h, g.t, g.d))?
        }
    };
    y.to_dtype(x.dtype())
}

/// The checked shapes of a call: `x[b, h, t, d]` and whether the tables are per sequence.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    b: usize,
    h: usize,
    t: usize,
    d: usize,
    per_sequence: bool,
}

impl Geometry {
    /// The shapes, dtypes and devices checked as [`rope_served`] says.
    fn of(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Geometry> {
        let &[b, h, t, d] = x.dims() else {
            candle_core::bail!("rope: x must be [b, h, t, d], not {:?}", x.dims());
        };
        if !(x.dtype().is_float() && cos.dtype().is_float() && sin.dtype().is_float()) {
            let (xd, cd, sd) = (x.dtype(), cos.dtype(), sin.dtype());
            candle_core::bail!("rope: x, cos and sin must be of float dtypes, not {xd:?}, {cd:?}, {sd:?}");
        }
        if !(x.device().same_device(cos.device()) && x.device().same_device(sin.device())) {
            let (xl, cl, sl) = (x.device().location(), cos.device().location(), sin.device().location());
            candle_core::bail!("rope: x, cos and sin are not on one device ({xl:?}, {cl:?}, {sl:?})");
        }
        // Some(per sequence) for a table that fits x
        let fits = |tab: &Tensor| match *tab.dims() {
            [rows, half] if rows >= t && half * 2 == d => Some(false),
            [n, rows, half] if n == b && rows >= t && half * 2 == d => Some(true),
            _ => None,
        };
        match (fits(cos), fits(sin)) {
            (Some(pc), Some(ps)) if pc == ps => Ok(Geometry { b, h, t, d, per_sequence: pc }),
            _ => candle_core::bail!(
                "rope: cos {:?} and sin {:?} do not fit x {:?}: both must be [T, d/2] or [b, T, d/2] with T ≥ t = {t} \
                 and d = {d} even",
                cos.dims(),
                sin.dims(),
                x.dims()
            ),
        }
    }

    /// The table's first `t` rows (per sequence: `[b, t, d/2]`).
    fn rows(&self, tab: &Tensor) -> Result<Tensor> {
        tab.narrow(if self.per_sequence { 1 } else { 0 }, 0, self.t)
    }

    /// The table as gemmbridge takes it: `[t, d/2]` f32, contiguous (a table per sequence only
    /// with `b = 1`).
    fn table_f32(&self, tab: &Tensor) -> Result<Tensor> {
        self.rows(tab)?.reshape((self.t, self.d / 2))?.to_dtype(DType::F32)?.contiguous()
    }

    /// The table in `dtype`, shaped to broadcast against `x[b, h, t, d/2]`.
    fn table_broadcast(&self, tab: &Tensor, dtype: DType) -> Result<Tensor> {
        let rows = self.rows(tab)?.to_dtype(dtype)?;
        if self.per_sequence {
            rows.unsqueeze(1)
        } else {
            Ok(rows)
        }
    }
}

/// The planned rotation, as candle's custom operation on `(x, cos, sin)`; the output is
/// `[b, h, t, d]`, contiguous.
struct RopeOp {
    plan: RopePlan,
    out: Shape,
}

impl RopeOp {
    fn new(plan: RopePlan, x: &Tensor) -> RopeOp {
        RopeOp { plan, out: x.shape().clone() }
    }
}

impl CustomOp3 for RopeOp {
    fn name(&self) -> &'static str {
        "gemmbridge-rope"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        _: &Layout,
        cos: &CpuStorage,
        _: &Layout,
        sin: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(cos), CpuStorage::F32(sin)) = (cos, sin) else {
            candle_core::bail!("rope: f32 tables expected");
        };
        let out = by_dtype!("rope", [x], |T| cpu_layer_ops::rope::<T>(&self.plan, x, [cos, sin]));
        Ok((out, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        _: &Layout,
        cos: &candle_core::CudaStorage,
        _: &Layout,
        sin: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda_layer_ops::rope(&self.plan, x, [cos, sin])?, self.out.clone()))
    }

    /// `dx`: the gradient rotated by the opposite angles (itself an operation with a
    /// backward); no gradient for the tables.
    fn bwd(
        &self,
        _: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = grad.contiguous()?;
        let direction = match self.plan.direction {
            RopeDirection::Forward => RopeDirection::Backward,
            RopeDirection::Backward => RopeDirection::Forward,
        };
        let style = self.plan.problem.style;
        let Some(plan) = RopePlan::new(dy.layout(), [cos.layout(), sin.layout()], style, direction) else {
            candle_core::bail!("rope backward: no plan for the gradient {:?}", dy.dims());
        };
        Ok((Some(dy.apply_op3(cos, sin, RopeOp { plan, out: self.out.clone() })?), None, None))
    }
}
