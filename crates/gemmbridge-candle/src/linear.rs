//! `linear` with a fused bias and activation (one GEMM and its epilogue) and its backward: the
//! activation's derivative applied to the incoming gradient, then two GEMMs through
//! [`crate::matmul`] and a row sum for the bias.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
use gemmbridge::Epilogue;

use crate::cpu::{self, by_dtype};
use crate::matmul::matmul;
use crate::plan::{self, LinearPlan};
use crate::{device_served, Served};

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

/// The gradients of `y = act(z)`, `z = x·wᵀ + bias`, for `x[.., k]`, `w[n, k]`, `bias[n]`, the
/// forward's output `y` and its gradient `dy` (both `[.., n]`): with `g = dy·act'(z)`,
/// `dx = g·w` (x's shape), `dw = gᵀ·x` summed over the rows (`[n, k]`) and `db = Σ_rows g`
/// (`[n]`, where there is a bias), each in x's dtype.
///
/// `act'`: 1 for none; for ReLU, 1 where `y > 0` (where `z > 0`, as PyTorch's ReLU backward and
/// cuBLASLt's ReLU mask take it; candle's own takes `z ≥ 0`, which differs where `z` is exactly
/// 0, a subgradient convention); for GELU, the derivative of its tanh form at `z`, which is computed
/// again here (one more GEMM; the forward keeps nothing) and differentiated in f32. `db` is
/// summed in f32 from g before g is rounded to x's dtype (a bias gradient over rows of mixed
/// sign cancels: summing rounded terms in a half type doubled its error against float64).
pub(crate) fn linear_grads(
    [x, w]: [&Tensor; 2],
    bias: Option<&Tensor>,
    (y, dy): (&Tensor, &Tensor),
    act: Activation,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    // g in f32 (exact for none and ReLU: dy's own values), then in x's dtype for the GEMMs
    let g32 = match act {
        Activation::None => dy.to_dtype(DType::F32)?,
        Activation::Relu => (dy * y.gt(0f64)?.to_dtype(dy.dtype())?)?.to_dtype(DType::F32)?,
        Activation::Gelu => {
            let z = linear(x, w, bias, Activation::None)?;
            (dy.to_dtype(DType::F32)? * gelu_tanh_grad(&z.to_dtype(DType::F32)?)?)?
        }
    };
    let (k, n) = (w.dims()[1], w.dims()[0]);
    let g2 = g32.to_dtype(dy.dtype())?.reshape(((), n))?;
    let dx = matmul(&g2, w)?.reshape(x.dims())?;
    let dw = matmul(&g2.t()?, &x.reshape(((), k))?)?;
    let db = bias.map(|_| g32.reshape(((), n))?.sum(0)?.to_dtype(dy.dtype())).transpose()?;
    Ok((dx, dw, db))
}

/// The derivative of GELU's tanh form, `0.5·z·(1 + tanh u)` with `u = √(2/π)·(z + 0.044715·z³)`:
/// `0.5·(1 + tanh u) + 0.5·z·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·z²)`.
fn gelu_tanh_grad(z: &Tensor) -> Result<Tensor> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let z2 = z.sqr()?;
    let t = ((z * (z2.clone() * 0.044715)?.affine(1.0, 1.0)?)? * c)?.tanh()?;
    let left = (t.affine(0.5, 0.5))?;
    let sech2 = t.sqr()?.affine(-1.0, 1.0)?;
    let du = (z2.affine(3.0 * 0.044715, 1.0)? * c)?;
    let right = ((z * sech2)? * du)?.affine(0.5, 0.0)?;
    left + right
}
