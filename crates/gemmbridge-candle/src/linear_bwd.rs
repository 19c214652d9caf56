//! The backward of [`crate::linear`]: the activation's derivative applied to the incoming
//! gradient, then two GEMMs through [`crate::matmul`] and a row sum for the bias.

use candle_core::{DType, Result, Tensor};

use crate::matmul::{linear, matmul};
use crate::Activation;

/// The gradients of `y = act(z)`, `z = x·wᵀ + bias`, for `x[.., k]`, `w[n, k]`, `bias[n]`, the
/// forward's output `y` and its gradient `dy` (both `[.., n]`): with `g = dy·act'(z)`,
/// `dx = g·w` (x's shape), `dw = gᵀ·x` summed over the rows (`[n, k]`) and `db = Σ_rows g`
/// (`[n]`, where there is a bias), each in x's dtype.
///
/// `act'`: 1 for none; for ReLU, 1 where `y > 0` (where `z > 0`, as candle's own ReLU
/// backward takes it); for GELU, the derivative of its tanh form at `z`, which is computed
/// again here (one more GEMM; the forward keeps nothing) and differentiated in f32.
pub(crate) fn linear_grads(
    [x, w]: [&Tensor; 2],
    bias: Option<&Tensor>,
    (y, dy): (&Tensor, &Tensor),
    act: Activation,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let g = match act {
        Activation::None => dy.clone(),
        Activation::Relu => (dy * y.gt(0f64)?.to_dtype(dy.dtype())?)?,
        Activation::Gelu => {
            let z = linear(x, w, bias, Activation::None)?;
            (dy.to_dtype(DType::F32)? * gelu_tanh_grad(&z.to_dtype(DType::F32)?)?)?.to_dtype(dy.dtype())?
        }
    };
    let (k, n) = (w.dims()[1], w.dims()[0]);
    let g2 = g.reshape(((), n))?;
    let dx = matmul(&g2, w)?.reshape(x.dims())?;
    let dw = matmul(&g2.t()?, &x.reshape(((), k))?)?;
    let db = bias.map(|_| g2.sum(0)).transpose()?;
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
