//! `matmul` (broadcast batched) and `linear` with a fused bias and activation.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use gemmbridge::Epilogue;

use crate::cpu::{self, by_dtype};
use crate::linear_bwd::linear_grads;
use crate::plan::{self, LinearPlan, MatmulPlan};
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

/// The activation fused into [`linear`]'s epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// `max(·, 0)`.
    Relu,
    /// GELU, its tanh approximation (candle's `Tensor::gelu`, cuBLASLt's GELU epilogue).
    Gelu,
}

impl Activation {
    /// The epilogue of this activation, with or without a bias.
    fn epilogue(self, bias: bool) -> Epilogue {
        match (self, bias) {
            (Activation::None, false) => Epilogue::None,
            (Activation::None, true) => Epilogue::Bias,
            (Activation::Relu, false) => Epilogue::Relu,
            (Activation::Relu, true) => Epilogue::ReluBias,
            (Activation::Gelu, false) => Epilogue::Gelu,
            (Activation::Gelu, true) => Epilogue::GeluBias,
        }
    }
}

/// A linear layer, `y[.., n] = act(x[.., k]·w[n, k]ᵀ + bias[n])` (candle-nn's `Linear`
/// layout: `w` is `[out_features, in_features]`), as one GEMM over the rows of `x` (its leading
/// dimensions merged) with the bias and activation in the GEMM's epilogue: computed in f32 and
/// rounded once. The backward gives `dx`, `dw` and `db`: the activation's derivative on the
/// incoming gradient (GELU's at the pre-activation, computed again with one more GEMM), then
/// `dx = g·w` and `dw = gᵀ·x` through [`matmul`] and `db` as a row sum.
///
/// # Errors
/// candle's errors for shapes that do not agree; a gemmbridge error from the GPU, wrapped.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> Result<Tensor> {
    linear_served(x, w, bias, act).map(|(t, _)| t)
}

/// [`linear`], and which path ran it.
///
/// # Errors
/// As [`linear`].
pub fn linear_served(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> Result<(Tensor, Served)> {
    let dtype = x.dtype();
    let same = w.dtype() == dtype && bias.is_none_or(|b| b.dtype() == dtype);
    let shapes = x.rank() >= 1 && w.rank() == 2 && x.dims()[x.rank() - 1] == w.dims()[1];
    if !device_served(x.device()) || !same || !shapes {
        return Ok((linear_candle(x, w, bias, act)?, Served::Candle));
    }
    let epilogue = act.epilogue(bias.is_some());
    let planned = |x: &Tensor, w: &Tensor, b: Option<&Tensor>| {
        plan::linear(x.layout(), w.layout(), b.map(|b| b.layout()), epilogue, dtype)
    };
    if let Some(plan) = planned(x, w, bias) {
        return Ok((apply_linear(x, w, bias, plan, act)?, Served::Gemmbridge));
    }
    let (x2, w2, b2) = (x.contiguous()?, w.contiguous()?, bias.map(Tensor::contiguous).transpose()?);
    match planned(&x2, &w2, b2.as_ref()) {
        Some(plan) => Ok((apply_linear(&x2, &w2, b2.as_ref(), plan, act)?, Served::AfterCopy)),
        None => Ok((linear_candle(x, w, bias, act)?, Served::Candle)),
    }
}

/// Runs the planned linear layer as a custom operation.
fn apply_linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: LinearPlan, act: Activation) -> Result<Tensor> {
    let mut out = x.dims()[..x.rank() - 1].to_vec();
    out.push(plan.problem.n());
    let op = LinearOp { plan, out: Shape::from(out), act };
    match bias {
        Some(b) => x.apply_op3(w, b, op),
        None => x.apply_op2(w, op),
    }
}

/// candle's own linear layer: `x·wᵀ` (`broadcast_matmul`), the bias (`broadcast_add`), the
/// activation (`relu`, `gelu`), each rounded to `x`'s dtype — what the fallback runs, and
/// what the tests and the benchmark compare with.
///
/// # Errors
/// candle's errors for shapes that do not agree.
pub fn linear_candle(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> Result<Tensor> {
    let y = x.broadcast_matmul(&w.t()?)?;
    let y = match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    match act {
        Activation::None => Ok(y),
        Activation::Relu => y.relu(),
        Activation::Gelu => y.gelu(),
    }
}

/// A three-operand custom operation's gradients.
type Grads3 = Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)>;

/// The planned linear layer, as candle's custom operation (two operands without a bias,
/// three with one); its backward is [`linear_grads`].
struct LinearOp {
    plan: LinearPlan,
    out: Shape,
    act: Activation,
}

impl CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "gemmbridge-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, _: &Layout, w: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = by_dtype!("linear", [x, w], |T| cpu::linear::<T>(&self.plan, x, w, None));
        Ok((y, self.out.clone()))
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
        let y =
            crate::cuda::by_dtype!("linear", dev, [x, w], |T| crate::cuda::linear::<T>(&dev, &self.plan, [x, w], None));
        Ok((y, self.out.clone()))
    }

    /// `dx` and `dw` ([`linear_grads`]).
    fn bwd(&self, x: &Tensor, w: &Tensor, y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = linear_grads([x, w], None, (y, dy), self.act)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "gemmbridge-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        _: &Layout,
        w: &CpuStorage,
        _: &Layout,
        b: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let y = by_dtype!("linear", [x, w, b], |T| cpu::linear::<T>(&self.plan, x, w, Some(b)));
        Ok((y, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        _: &Layout,
        w: &candle_core::CudaStorage,
        _: &Layout,
        b: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = x.device.clone();
        let y = crate::cuda::by_dtype!("linear", dev, [x, w, b], |T| crate::cuda::linear::<T>(
            &dev,
            &self.plan,
            [x, w],
            Some(b)
        ));
        Ok((y, self.out.clone()))
    }

    /// `dx`, `dw` and `db` ([`linear_grads`]).
    fn bwd(&self, x: &Tensor, w: &Tensor, b: &Tensor, y: &Tensor, dy: &Tensor) -> Grads3 {
        let (dx, dw, db) = linear_grads([x, w], Some(b), (y, dy), self.act)?;
        Ok((Some(dx), Some(dw), db))
    }
}
