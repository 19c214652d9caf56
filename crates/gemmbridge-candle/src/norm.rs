//! RMSNorm with its backward.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use crate::cpu::{self, by_dtype};
use crate::plan::{self, NormPlan};
use crate::{device_served, Served};

/// RMSNorm over the last dimension: `y = x / √(mean(x²) + eps) · w` for `x[.., c]`, `w[c]`,
/// with the sum of squares and the products in f32 and `y` rounded once (gemmbridge's CPU
/// backend on the CPU, cuDNN's norm graph on CUDA). The rows of `x` are read in place where
/// its leading dimensions merge into one row stride (on CUDA: into dense rows, as cuDNN's norm
/// graph takes no other; padded rows are copied contiguous there first). The backward gives `dx` and `dw`
/// (gemmbridge's backward on both paths; it runs the forward again for the rows' inverse RMS).
///
/// # Errors
/// `eps` not finite and positive (candle's `Error::Msg` naming the value; refused on every
/// path, the fallback included, as gemmbridge's RMSNorm refuses it); candle's errors for shapes
/// that do not agree; a gemmbridge error from the GPU, wrapped.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    rms_norm_served(x, w, eps).map(|(t, _)| t)
}

/// [`rms_norm`], and which path ran it.
///
/// # Errors
/// As [`rms_norm`].
pub fn rms_norm_served(x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Served)> {
    if !(eps.is_finite() && eps > 0.0) {
        candle_core::bail!("rms_norm: eps = {eps:?} is not finite and positive");
    }
    let dtype = x.dtype();
    if !device_served(x.device()) || w.dtype() != dtype || x.rank() < 1 {
        return Ok((rms_norm_candle(x, w, eps)?, Served::Candle));
    }
    // cuDNN's norm graph takes dense rows only (plan::rms_norm)
    let dense_rows = x.device().is_cuda();
    if let Some(plan) = plan::rms_norm(x.layout(), w.layout(), eps, dtype, dense_rows) {
        return Ok((x.apply_op2(w, NormOp::new(plan, x))?, Served::Gemmbridge));
    }
    let (x2, w2) = (x.contiguous()?, w.contiguous()?);
    match plan::rms_norm(x2.layout(), w2.layout(), eps, dtype, dense_rows) {
        Some(plan) => Ok((x2.apply_op2(&w2, NormOp::new(plan, &x2))?, Served::AfterCopy)),
        None => Ok((rms_norm_candle(x, w, eps)?, Served::Candle)),
    }
}

/// candle's own operations for RMSNorm, in f32 and rounded to `x`'s dtype at the end (what
/// the fallback runs, and what the tests compare with).
///
/// # Errors
/// candle's errors for shapes that do not agree.
pub fn rms_norm_candle(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let r = (x32.sqr()?.mean_keepdim(D::Minus1)? + f64::from(eps))?.sqrt()?.recip()?;
    x32.broadcast_mul(&r)?.broadcast_mul(&w.to_dtype(DType::F32)?)?.to_dtype(x.dtype())
}

/// The planned forward, as candle's custom operation; `y` has x's shape.
struct NormOp {
    plan: NormPlan,
    out: Shape,
}

impl NormOp {
    fn new(plan: NormPlan, x: &Tensor) -> NormOp {
        NormOp { plan, out: x.shape().clone() }
    }

    fn shape(&self) -> Shape {
        self.out.clone()
    }
}

impl CustomOp2 for NormOp {
    fn name(&self) -> &'static str {
        "gemmbridge-rms-norm"
    }

    fn cpu_fwd(&self, x: &CpuStorage, _: &Layout, w: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = by_dtype!("rms_norm", [x, w], |T| cpu::rms_norm::<T>(&self.plan, x, w));
        Ok((y, self.shape()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        _: &Layout,
        w: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = x.device.clone();
        let y = crate::cuda::by_dtype!("rms_norm", dev, [x, w], |T| crate::cuda::rms_norm::<T>(&dev, &self.plan, x, w));
        Ok((y, self.shape()))
    }

    /// `dx` (x's shape) and `dw` from one backward call.
    fn bwd(&self, x: &Tensor, w: &Tensor, _: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, c) = (self.plan.problem.rows, self.plan.problem.features);
        let dy = grad.contiguous()?;
        let both = x.apply_op3_no_bwd(w, &dy, &NormBwdOp { plan: self.plan })?;
        let dx = both.narrow(0, 0, rows * c)?.reshape(x.dims())?;
        let dw = both.narrow(0, rows * c, c)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// The planned backward: `[dx | dw]` flat, from x, w and a contiguous dy.
struct NormBwdOp {
    plan: NormPlan,
}

impl CustomOp3 for NormBwdOp {
    fn name(&self) -> &'static str {
        "gemmbridge-rms-norm-backward"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        _: &Layout,
        w: &CpuStorage,
        _: &Layout,
        dy: &CpuStorage,
        ldy: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let p = &self.plan.problem;
        let out = by_dtype!("rms_norm backward", [x, w, dy], |T| cpu::rms_norm_backward::<T>(
            &self.plan,
            x,
            w,
            (dy, ldy.start_offset())
        ));
        Ok((out, Shape::from(p.rows * p.features + p.features)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        _: &Layout,
        w: &candle_core::CudaStorage,
        _: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let p = &self.plan.problem;
        let dev = x.device.clone();
        let out = crate::cuda::by_dtype!("rms_norm backward", dev, [x, w, dy], |T| {
            crate::cuda::rms_norm_backward::<T>(&dev, &self.plan, [x, w], (dy, ldy.start_offset()))
        });
        Ok((out, Shape::from(p.rows * p.features + p.features)))
    }
}
