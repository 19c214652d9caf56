//! The grouped matmul of a mixture-of-experts layer (rows sorted by expert), with the backward.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::Element;

use crate::cpu::{by_dtype, wrap};
use crate::{device_served, plan, Served};

/// A mixture-of-experts layer's product over rows sorted by expert: `x[R, K]` (expert `e`
/// owns `sizes[e]` consecutive rows), `w[E, N, K]`, `y[R, N]` with `y[r] = x[r]·w[e]ᵀ` for
/// every row `r` of expert `e`; f32, f16 or bf16 served by gemmbridge, with its backward. See
/// [`grouped_matmul_served`] for the layouts, dtypes and paths.
///
/// # Errors
/// As [`grouped_matmul_served`].
pub fn grouped_matmul(x: &Tensor, w: &Tensor, sizes: &[usize]) -> Result<Tensor> {
    grouped_matmul_served(x, w, sizes).map(|(t, _)| t)
}

/// [`grouped_matmul`], and which path ran it.
///
/// - `x[R, K]`: the rows routed to the experts, sorted by expert: expert `e` owns the
///   `sizes[e]` consecutive rows from `Σ_{f<e} sizes[f]` (host counts, any of them 0,
///   `Σ sizes = R`).
/// - `w[E, N, K]`: one weight per expert in `nn.Linear`'s layout (`[out, in]`), `E = sizes.len()`.
/// - Output `y[R, N]`, contiguous, x's dtype: each expert's rows times its weight transposed.
///   f32 is strict f32; f16 and bf16 accumulate in f32 and are rounded once.
/// - Backward (candle's autograd): `dx[R, K] = dy·w[e]` per expert's rows and
///   `dw[E, N, K]` with `dw[e] = dy[e]ᵀ·x[e]` over expert e's rows (zeros for an expert of 0
///   rows), gemmbridge's grouped backward data and backward weight products.
///
/// Served for f32, f16 and bf16 on the CPU (`gemmbridge::cpu::grouped_gemm`) and on CUDA
/// (`Gpu::grouped_gemm`, `cuda` feature) as one `GroupedProblem` per product: x and w read in
/// place where they are contiguous (at any start offset: [`Served::Gemmbridge`]), after copying
/// them contiguous otherwise ([`Served::AfterCopy`]: a transposed x, a strided w). Other dtypes
/// (f64), an empty product (R, N, K or E zero), other devices and
/// [`crate::set_enabled`]`(false)` run [`grouped_matmul_candle`] ([`Served::Candle`]).
///
/// # Errors
/// Before anything runs, candle's `Error::Msg` starting `grouped_matmul:`: x not 2-D, w not
/// 3-D, `sizes.len()` not w's E, `Σ sizes` not x's R, x's K not w's, x and w of different
/// dtypes or devices. A gemmbridge error from the GPU, wrapped.
pub fn grouped_matmul_served(x: &Tensor, w: &Tensor, sizes: &[usize]) -> Result<(Tensor, Served)> {
    let (_, n, k) = check(x, w, sizes)?;
    let Some(precision) = plan::precision(x.dtype(), false) else {
        return Ok((grouped_matmul_candle(x, w, sizes)?, Served::Candle));
    };
    if !device_served(x.device()) || x.elem_count() == 0 || n == 0 || k == 0 {
        return Ok((grouped_matmul_candle(x, w, sizes)?, Served::Candle));
    }
    let Ok(problem) = GroupedProblem::new(GroupedOp::Forward, sizes, n, k, precision) else {
        return Ok((grouped_matmul_candle(x, w, sizes)?, Served::Candle));
    };
    let op = GroupedCall::new(problem);
    if x.is_contiguous() && w.is_contiguous() {
        return Ok((x.apply_op2(w, op)?, Served::Gemmbridge));
    }
    Ok((x.contiguous()?.apply_op2(&w.contiguous()?, op)?, Served::AfterCopy))
}

/// candle's own operations for the grouped matmul: per expert with rows, `x`'s rows narrowed
/// and multiplied by `w[e]ᵀ` (candle's matmul), in f32 (f64 for f64) and rounded to x's dtype
/// once at the end; the experts' outputs concatenated. What the fallback runs, and what the
/// tests compare with. Shapes and dtypes as [`grouped_matmul_served`] (any float dtype, any
/// strides); output contiguous. Its backward is candle's autograd through those operations.
///
/// # Errors
/// As [`grouped_matmul_served`]'s shape errors.
pub fn grouped_matmul_candle(x: &Tensor, w: &Tensor, sizes: &[usize]) -> Result<Tensor> {
    let (_, n, _) = check(x, w, sizes)?;
    let wide = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let mut parts = Vec::new();
    let mut r0 = 0;
    for (e, &m) in sizes.iter().enumerate() {
        if m > 0 {
            // contiguous: candle's CUDA matmul refuses some strided views (a column-major x
            // whose leading dimension exceeds its rows, say)
            let xe = x.narrow(0, r0, m)?.to_dtype(wide)?.contiguous()?;
            let we = w.narrow(0, e, 1)?.squeeze(0)?.to_dtype(wide)?.contiguous()?;
            parts.push(xe.matmul(&we.t()?)?);
        }
        r0 += m;
    }
    if parts.is_empty() {
        return Tensor::zeros((0, n), x.dtype(), x.device());
    }
    Tensor::cat(&parts, 0)?.to_dtype(x.dtype())
}

/// `(E, N, K)`; the named errors of [`grouped_matmul_served`].
fn check(x: &Tensor, w: &Tensor, sizes: &[usize]) -> Result<(usize, usize, usize)> {
    let &[r, k] = x.dims() else {
        candle_core::bail!("grouped_matmul: x must be 2-D [R, K], not {:?}", x.dims());
    };
    let &[e, n, kw] = w.dims() else {
        candle_core::bail!("grouped_matmul: w must be 3-D [E, N, K], not {:?}", w.dims());
    };
    if sizes.len() != e {
        candle_core::bail!("grouped_matmul: {} group sizes for the E = {e} experts of w", sizes.len());
    }
    let total = sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m));
    if total != Some(r) {
        candle_core::bail!("grouped_matmul: the group sizes {sizes:?} do not add up to x's R = {r} rows");
    }
    if kw != k {
        candle_core::bail!("grouped_matmul: x's K = {k} is not w's K = {kw} (w is [E, N, K])");
    }
    if x.dtype() != w.dtype() {
        candle_core::bail!("grouped_matmul: x is {:?} but w is {:?}", x.dtype(), w.dtype());
    }
    if !x.device().same_device(w.device()) {
        candle_core::bail!("grouped_matmul: x and w are on different devices");
    }
    Ok((e, n, k))
}

/// One of gemmbridge's grouped products on two contiguous operands in
/// [`GroupedOp::names`]' order (forward `(x, w)`, backward data `(dy, w)`, backward weight
/// `(dy, x)`), as candle's custom operation; the output is dense, of
/// [`GroupedProblem::lens`]' third length (`[R, N]`, `[R, K]` or `[E, N, K]`). The forward's
/// backward runs the other two.
struct GroupedCall {
    problem: GroupedProblem,
    out: Shape,
}

impl GroupedCall {
    fn new(problem: GroupedProblem) -> GroupedCall {
        let (r, e, n, k) = (problem.rows(), problem.groups(), problem.n(), problem.k());
        let out = match problem.op() {
            GroupedOp::Forward => Shape::from((r, n)),
            GroupedOp::BackwardData => Shape::from((r, k)),
            GroupedOp::BackwardWeight => Shape::from((e, n, k)),
        };
        GroupedCall { problem, out }
    }

    /// The same sizes and precision for another of the three products.
    fn sibling(&self, op: GroupedOp) -> Result<GroupedCall> {
        let p = &self.problem;
        let problem = GroupedProblem::new(op, p.sizes(), p.n(), p.k(), p.precision()).map_err(wrap)?;
        Ok(GroupedCall::new(problem))
    }

    /// The operands' start offsets; an error for a layout that is not contiguous (the callers
    /// hand contiguous tensors only).
    fn starts(&self, a: &Layout, b: &Layout) -> Result<[usize; 2]> {
        if !a.is_contiguous() || !b.is_contiguous() {
            candle_core::bail!("grouped_matmul: {:?} expects contiguous operands", self.problem.op());
        }
        Ok([a.start_offset(), b.start_offset()])
    }
}

/// The grouped product on the CPU: `c` dense (NaN until written; every element is).
fn cpu_grouped<T: Element>(p: &GroupedProblem, a: &[T], b: &[T]) -> Result<Vec<T>> {
    let mut c = vec![T::from_f32(f32::NAN); p.lens()[2]];
    gemmbridge::cpu::grouped_gemm::<T, T>(p, a, b, &mut c, None).map_err(wrap)?;
    Ok(c)
}

impl CustomOp2 for GroupedCall {
    fn name(&self) -> &'static str {
        match self.problem.op() {
            GroupedOp::Forward => "gemmbridge-grouped-matmul",
            GroupedOp::BackwardData => "gemmbridge-grouped-matmul-backward-data",
            GroupedOp::BackwardWeight => "gemmbridge-grouped-matmul-backward-weight",
        }
    }

    fn cpu_fwd(&self, a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<(CpuStorage, Shape)> {
        let [sa, sb] = self.starts(la, lb)?;
        let c = by_dtype!("grouped_matmul", [a, b], |T| cpu_grouped::<T>(&self.problem, &a[sa..], &b[sb..]));
        Ok((c, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &candle_core::CudaStorage,
        la: &Layout,
        b: &candle_core::CudaStorage,
        lb: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let [sa, sb] = self.starts(la, lb)?;
        let dev = a.device.clone();
        let c = crate::cuda::by_dtype!("grouped_matmul", dev, [a, b], |T| {
            crate::cuda_grouped::grouped::<T>(&dev, &self.problem, (a, sa), (b, sb))
        });
        Ok((c, self.out.clone()))
    }

    /// `dx = dy·w[e]` (backward data) and `dw[e] = dy[e]ᵀ·x[e]` (backward weight), from a
    /// contiguous dy and the forward's own (contiguous) x and w.
    fn bwd(&self, x: &Tensor, w: &Tensor, _: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if self.problem.op() != GroupedOp::Forward {
            candle_core::bail!("grouped_matmul: the backward products have no backward here");
        }
        let dy = grad.contiguous()?;
        let dx = dy.apply_op2_no_bwd(w, &self.sibling(GroupedOp::BackwardData)?)?;
        let dw = dy.apply_op2_no_bwd(x, &self.sibling(GroupedOp::BackwardWeight)?)?;
        Ok((Some(dx), Some(dw)))
    }
}
