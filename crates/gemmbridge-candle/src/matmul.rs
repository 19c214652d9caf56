//! `matmul` (broadcast batched): one strided-batch GEMM, and its backward.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::cpu::{self, by_dtype};
use crate::plan::{self, MatmulPlan};
use crate::{device_served, Served};

/// `a[..., m, k]·b[..., k, n]` with the batch dimensions broadcast (candle's
/// `Tensor::broadcast_matmul`): one strided-batch GEMM, an operand broadcast over the whole
/// batch read once (batch stride 0), transposed views read as `op = T`.
///
/// # Errors
/// candle's errors for shapes that do not agree (candle's own matmul reports them); a
/// gemmbridge error from the GPU, wrapped.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    matmul_served(a, b).map(|(t, _)| t)
}

/// [`matmul`], and which path ran it.
///
/// # Errors
/// As [`matmul`].
pub fn matmul_served(a: &Tensor, b: &Tensor) -> Result<(Tensor, Served)> {
    let candle = || Ok((a.broadcast_matmul(b)?, Served::Candle));
    let (ra, rb) = (a.rank(), b.rank());
    if !device_served(a.device()) || ra < 2 || rb < 2 || a.dtype() != b.dtype() || a.dims()[ra - 1] != b.dims()[rb - 2]
    {
        return candle();
    }
    let batch =
        Shape::from(&a.dims()[..ra - 2]).broadcast_shape_binary_op(&Shape::from(&b.dims()[..rb - 2]), "matmul")?;
    let batch = batch.dims().to_vec();
    if let Some(plan) = plan::matmul(a.layout(), b.layout(), &batch, a.dtype()) {
        return Ok((apply(a, b, plan, &batch)?, Served::Gemmbridge));
    }
    // an operand whose strides cannot be read in place: broadcast to the full batch, copied
    let full = |x: &Tensor| -> Result<Tensor> {
        if plan::operand_in_place(x.layout(), &batch) {
            return Ok(x.clone());
        }
        let mut dims = batch.clone();
        dims.extend_from_slice(&x.dims()[x.rank() - 2..]);
        x.broadcast_as(dims)?.contiguous()
    };
    let (a2, b2) = (full(a)?, full(b)?);
    match plan::matmul(a2.layout(), b2.layout(), &batch, a.dtype()) {
        Some(plan) => Ok((apply(&a2, &b2, plan, &batch)?, Served::AfterCopy)),
        None => candle(),
    }
}

/// Runs the planned matmul as a custom operation with a backward.
fn apply(a: &Tensor, b: &Tensor, plan: MatmulPlan, batch: &[usize]) -> Result<Tensor> {
    let mut out = batch.to_vec();
    out.extend([plan.problem.m(), plan.problem.n()]);
    a.apply_op2(b, MatmulOp { plan, out: Shape::from(out) })
}

/// The planned matmul, as candle's custom operation.
struct MatmulOp {
    plan: MatmulPlan,
    out: Shape,
}

impl CustomOp2 for MatmulOp {
    fn name(&self) -> &'static str {
        "gemmbridge-matmul"
    }

    fn cpu_fwd(&self, a: &CpuStorage, _: &Layout, b: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let c = by_dtype!("matmul", [a, b], |T| cpu::matmul::<T>(&self.plan, a, b));
        Ok((c, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &candle_core::CudaStorage,
        _: &Layout,
        b: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = a.device.clone();
        let c = crate::cuda::by_dtype!("matmul", dev, [a, b], |T| crate::cuda::matmul::<T>(&dev, &self.plan, a, b));
        Ok((c, self.out.clone()))
    }

    /// `dA = dC·Bᵀ`, `dB = Aᵀ·dC` (through [`matmul`]), each summed over the batch dimensions
    /// its operand was broadcast along.
    fn bwd(&self, a: &Tensor, b: &Tensor, _: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let da = reduce_to(&matmul(grad, &b.t()?)?, a.dims())?;
        let db = reduce_to(&matmul(&a.t()?, grad)?, b.dims())?;
        Ok((Some(da), Some(db)))
    }
}

/// `g` summed down to `dims` (leading dimensions `dims` lacks summed away, dimensions of size
/// 1 in `dims` summed with the dimension kept).
fn reduce_to(g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let mut g = g.clone();
    while g.rank() > dims.len() {
        g = g.sum(0)?;
    }
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && g.dims()[i] != 1 {
            g = g.sum_keepdim(i)?;
        }
    }
    Ok(g)
}
