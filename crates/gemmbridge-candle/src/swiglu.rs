//! SwiGLU on a fused gate/up projection, with the backward.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

use crate::cpu::by_dtype;
use crate::layer_plan::GluPlan;
use crate::{cpu_layer_ops, device_served, plan, Served};

/// SwiGLU over a fused gate/up projection: `gu[.., 2·f]` (a LLaMA MLP's gate and up weights
/// concatenated into one linear layer, the gate first) gives `y[.., f] = silu(g)·u` with
/// `g = gu[.., :f]`, `u = gu[.., f:]` and `silu(g) = g·σ(g)`; see [`swiglu_served`].
///
/// # Errors
/// As [`swiglu_served`].
pub fn swiglu(gu: &Tensor) -> Result<Tensor> {
    swiglu_served(gu).map(|(t, _)| t)
}

/// [`swiglu`], and which path ran it.
///
/// - `gu[.., 2·f]`: any rank from 1, an even last dimension; any float dtype, any strides.
/// - Output `[.., f]` (gu's leading dimensions), contiguous, gu's dtype. gemmbridge's
///   arithmetic ([`gemmbridge::layer_ops::arith::swiglu`]): the sigmoid, the product with `g`
///   and with `u` in f32, rounded once; the CPU and the CUDA path give the same bits.
/// - Backward (candle's autograd): `dgu[.., 2·f]` holds `dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))`
///   in its first half and `du = dy·silu(g)` in its second (gemmbridge's SwiGLU backward, f32,
///   one rounding; it reads gu as the forward did).
///
/// Served for f32, f16 and bf16 on the CPU (gemmbridge's CPU backend) and on CUDA
/// (gemmbridge's layer kernels, `cuda` feature) as one `SwiGlu` problem
/// ([`gemmbridge::layer_ops::GluLayout::Halves`]) over gu's rows: in place where gu's leading
/// dimensions merge into one row stride with a contiguous last dimension (a contiguous gu, rows
/// narrowed from wider ones: [`Served::Gemmbridge`]), after copying gu contiguous otherwise
/// ([`Served::AfterCopy`]: a transposed batch, a strided last dimension). With padded rows the
/// backward's `dgu` is a view of a buffer padded the same way. Other dtypes (f64), an empty gu,
/// other devices and [`crate::set_enabled`]`(false)` run [`swiglu_candle`] ([`Served::Candle`]).
///
/// # Errors
/// Before anything runs, candle's `Error::Msg` starting `swiglu:`: gu of rank 0 or with an odd
/// last dimension; a dtype that is not a float type. A gemmbridge error from the GPU, wrapped.
pub fn swiglu_served(gu: &Tensor) -> Result<(Tensor, Served)> {
    half_width(gu)?;
    if !device_served(gu.device()) || plan::element(gu.dtype()).is_none() {
        return Ok((swiglu_candle(gu)?, Served::Candle));
    }
    if let Some(plan) = GluPlan::new(gu.layout(), gu.dtype()) {
        return Ok((gu.apply_op1(GluOp::new(plan, gu))?, Served::Gemmbridge));
    }
    let gu2 = gu.contiguous()?;
    match GluPlan::new(gu2.layout(), gu2.dtype()) {
        Some(plan) => Ok((gu2.apply_op1(GluOp::new(plan, &gu2))?, Served::AfterCopy)),
        None => Ok((swiglu_candle(gu)?, Served::Candle)),
    }
}

/// candle's own operations for SwiGLU (`narrow`, `silu`, a product), in f32 (f64 for an f64
/// gu) and rounded to gu's dtype once at the end: what the fallback runs, and what the tests
/// compare with. Shapes and dtypes as [`swiglu_served`]; output contiguous. Its backward is
/// candle's autograd through those operations.
///
/// # Errors
/// As [`swiglu_served`]'s shape and dtype errors.
pub fn swiglu_candle(gu: &Tensor) -> Result<Tensor> {
    let f = half_width(gu)?;
    let wide = if gu.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let g = gu.narrow(D::Minus1, 0, f)?.to_dtype(wide)?;
    let u = gu.narrow(D::Minus1, f, f)?.to_dtype(wide)?;
    (g.silu()? * u)?.to_dtype(gu.dtype())
}

/// `f`, half of gu's last dimension; the named errors of [`swiglu_served`].
fn half_width(gu: &Tensor) -> Result<usize> {
    if !gu.dtype().is_float() {
        candle_core::bail!("swiglu: gu must be of a float dtype, not {:?}", gu.dtype());
    }
    match gu.dims().last() {
        Some(&n) if n % 2 == 0 => Ok(n / 2),
        _ => candle_core::bail!("swiglu: gu must be [.., 2·f] with an even last dimension, not {:?}", gu.dims()),
    }
}

/// The planned forward, as candle's custom operation; `y` is `[.., f]`.
struct GluOp {
    plan: GluPlan,
    out: Shape,
}

impl GluOp {
    fn new(plan: GluPlan, gu: &Tensor) -> GluOp {
        let mut dims = gu.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = plan.problem.f;
        }
        GluOp { plan, out: Shape::from(dims) }
    }
}

impl CustomOp1 for GluOp {
    fn name(&self) -> &'static str {
        "gemmbridge-swiglu"
    }

    fn cpu_fwd(&self, gu: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = by_dtype!("swiglu", [gu], |T| cpu_layer_ops::swiglu::<T>(&self.plan, gu));
        Ok((y, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, gu: &candle_core::CudaStorage, _: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = gu.device.clone();
        let y =
            crate::cuda::by_dtype!("swiglu", dev, [gu], |T| crate::cuda_layer_ops::swiglu::<T>(&dev, &self.plan, gu));
        Ok((y, self.out.clone()))
    }

    /// `dgu` (gu's shape): from a buffer with gu's row stride, narrowed to `2·f` where gu's
    /// rows are padded.
    fn bwd(&self, gu: &Tensor, _: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let p = &self.plan.problem;
        let dy = grad.contiguous()?;
        let mut dims = gu.dims().to_vec();
        let last = dims.len() - 1;
        dims[last] = p.ld_in;
        let buf = gu.apply_op2_no_bwd(&dy, &GluBwdOp { plan: self.plan, out: Shape::from(dims) })?;
        Ok(Some(if p.ld_in == 2 * p.f { buf } else { buf.narrow(last, 0, 2 * p.f)? }))
    }
}

/// The planned backward: `dgu` in a `[.., ld_in]` buffer (gu's row stride; the padding past
/// `2·f` is not written) from gu and a contiguous dy.
struct GluBwdOp {
    plan: GluPlan,
    out: Shape,
}

impl CustomOp2 for GluBwdOp {
    fn name(&self) -> &'static str {
        "gemmbridge-swiglu-backward"
    }

    fn cpu_fwd(&self, gu: &CpuStorage, _: &Layout, dy: &CpuStorage, ldy: &Layout) -> Result<(CpuStorage, Shape)> {
        let start = ldy.start_offset();
        let dgu = by_dtype!("swiglu backward", [gu, dy], |T| cpu_layer_ops::swiglu_backward::<T>(
            &self.plan,
            gu,
            (dy, start)
        ));
        Ok((dgu, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gu: &candle_core::CudaStorage,
        _: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (dev, start) = (gu.device.clone(), ldy.start_offset());
        let dgu = crate::cuda::by_dtype!("swiglu backward", dev, [gu, dy], |T| {
            crate::cuda_layer_ops::swiglu_backward::<T>(&dev, &self.plan, gu, (dy, start))
        });
        Ok((dgu, self.out.clone()))
    }
}
