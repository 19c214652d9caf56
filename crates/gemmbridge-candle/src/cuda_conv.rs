//! The CUDA path of [`crate::conv2d`]: one NCHW [`Conv2d`] problem on cuDNN through
//! gemmbridge's engine, on candle's buffers (read at their start offsets) and on the stream of
//! the storage given (as [`crate::cuda`]), outputs allocated by candle's device. The forward
//! and both backward directions are candle custom operations; no host synchronisation.

use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::CudaDevice;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
use gemmbridge::conv::{Conv2d, ConvActivation};
use gemmbridge::{Element, Precision};

use crate::conv_params::ConvAct;
use crate::cpu::wrap;
use crate::cuda::{by_dtype, engine, output};
use crate::Served;

/// The problem in x's dtype where the engine takes it: f32 (strict), f16 or bf16, and a
/// problem [`Conv2d::validate`] accepts (within cuDNN's `int` sizes, nothing empty).
fn plan(p: &Conv2d, dtype: DType) -> Option<Conv2d> {
    let precision = match dtype {
        DType::F32 => Precision::F32,
        DType::F16 => Precision::F16,
        DType::BF16 => Precision::BF16,
        _ => return None,
    };
    let p = p.with_precision(precision);
    p.validate().is_ok().then_some(p)
}

/// The call on the engine where it takes it (`None`: candle's fallback): in place where x, w
/// and the bias are contiguous (any start offset: the NCHW layout's strides are the dense
/// ones), after copying them contiguous otherwise.
pub(crate) fn conv2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: ConvAct,
    problem: &Conv2d,
) -> Result<Option<(Tensor, Served)>> {
    let Some(p) = plan(problem, x.dtype()) else { return Ok(None) };
    if x.is_contiguous() && w.is_contiguous() && bias.is_none_or(Tensor::is_contiguous) {
        return Ok(Some((apply(p, [x, w], bias, act)?, Served::Gemmbridge)));
    }
    let (x2, w2, b2) = (x.contiguous()?, w.contiguous()?, bias.map(Tensor::contiguous).transpose()?);
    Ok(Some((apply(p, [&x2, &w2], b2.as_ref(), act)?, Served::AfterCopy)))
}

/// Runs the planned forward as a custom operation: the fused form with a bias, the plain
/// convolution (then candle's `relu` for [`ConvAct::Relu`]) without one.
fn apply(p: Conv2d, [x, w]: [&Tensor; 2], bias: Option<&Tensor>, act: ConvAct) -> Result<Tensor> {
    let out = Shape::from(p.y_dims().to_vec());
    match bias {
        Some(b) => {
            let act = match act {
                ConvAct::None => ConvActivation::Identity,
                ConvAct::Relu => ConvActivation::Relu,
            };
            x.apply_op3(w, b, ConvOp { problem: p, act: Some(act), out })
        }
        None => act.apply(x.apply_op2(w, ConvOp { problem: p, act: None, out })?),
    }
}

/// What a custom operation's CPU side says: the CPU never runs these operations.
fn no_cpu<T>() -> Result<T> {
    candle_core::bail!("conv2d: gemmbridge has no CPU convolution (the CPU path is candle's own conv2d)")
}

/// The planned forward (x, w; with a bias, the fused form and its activation), as candle's
/// custom operation; its backward is [`grads`].
struct ConvOp {
    problem: Conv2d,
    act: Option<ConvActivation>,
    out: Shape,
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "gemmbridge-conv2d"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        no_cpu()
    }

    fn cuda_fwd(&self, x: &CudaStorage, lx: &Layout, w: &CudaStorage, lw: &Layout) -> Result<(CudaStorage, Shape)> {
        let (dev, starts) = (x.device.clone(), [lx.start_offset(), lw.start_offset()]);
        let y = by_dtype!("conv2d", dev, [x, w], |T| forward::<T>(&dev, &self.problem, ([x, w], starts), None));
        Ok((y, self.out.clone()))
    }

    /// `dx` and `dw` ([`grads`]).
    fn bwd(&self, x: &Tensor, w: &Tensor, y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = grads(&self.problem, [x, w], false, (y, dy), false)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// A three-operand custom operation's gradients.
type Grads3 = Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)>;

impl CustomOp3 for ConvOp {
    fn name(&self) -> &'static str {
        "gemmbridge-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        no_cpu()
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        b: &CudaStorage,
        lb: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device.clone();
        let (starts, act) = ([lx.start_offset(), lw.start_offset()], self.act.unwrap_or_default());
        let y = by_dtype!("conv2d", dev, [x, w, b], |T| forward::<T>(
            &dev,
            &self.problem,
            ([x, w], starts),
            Some((b, lb.start_offset(), act))
        ));
        Ok((y, self.out.clone()))
    }

    /// `dx`, `dw` and `db` ([`grads`]).
    fn bwd(&self, x: &Tensor, w: &Tensor, _: &Tensor, y: &Tensor, dy: &Tensor) -> Grads3 {
        let relu = self.act == Some(ConvActivation::Relu);
        let (dx, dw, db) = grads(&self.problem, [x, w], relu, (y, dy), true)?;
        Ok((Some(dx), Some(dw), db))
    }
}

/// The gradients of `y = act(x ⋆ w + bias)` for the forward's x and w (the tensors the custom
/// operation was applied to: contiguous), its output `y` and the gradient `dy`: with
/// `g = dy` (for ReLU, `dy` where `y > 0`, 0 elsewhere), made contiguous, `dx` by cuDNN's
/// backward-data and `dw` by its backward-filter convolution, and (`with_bias`) `db` as the
/// sum of `g` over `n`, `p`, `q` in f32, rounded to the dtype once.
fn grads(
    p: &Conv2d,
    [x, w]: [&Tensor; 2],
    relu: bool,
    (y, dy): (&Tensor, &Tensor),
    with_bias: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let g = if relu { (dy * y.gt(0f64)?.to_dtype(dy.dtype())?)? } else { dy.clone() };
    let g = g.contiguous()?;
    let dx = w.apply_op2_no_bwd(&g, &BwdOp { problem: *p, data: true })?;
    let dw = x.apply_op2_no_bwd(&g, &BwdOp { problem: *p, data: false })?;
    let db = with_bias.then(|| g.to_dtype(DType::F32)?.sum((0, 2, 3))?.to_dtype(dy.dtype())).transpose()?;
    Ok((dx, dw, db))
}

/// One backward direction as a custom operation on a contiguous `dy`: backward data (`data`:
/// operands w and dy, output dx `[n, c, h, w]`) or backward filter (operands x and dy, output
/// dw `[k, c/groups, r, s]`).
struct BwdOp {
    problem: Conv2d,
    data: bool,
}

impl CustomOp2 for BwdOp {
    fn name(&self) -> &'static str {
        if self.data {
            "gemmbridge-conv2d-backward-data"
        } else {
            "gemmbridge-conv2d-backward-filter"
        }
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        no_cpu()
    }

    fn cuda_fwd(&self, a: &CudaStorage, la: &Layout, dy: &CudaStorage, ldy: &Layout) -> Result<(CudaStorage, Shape)> {
        let (dev, p) = (a.device.clone(), &self.problem);
        let starts = [la.start_offset(), ldy.start_offset()];
        let out = by_dtype!("conv2d backward", dev, [a, dy], |T| backward::<T>(&dev, p, self.data, [a, dy], starts));
        let dims = if self.data { p.x_dims() } else { p.w_dims() };
        Ok((out, Shape::from(dims.to_vec())))
    }
}

/// The forward on the engine: `y` dense NCHW `[n, k, p, q]` (every element written: cuDNN's
/// output with β = 0), fused with the bias and its activation where one is given.
fn forward<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    p: &Conv2d,
    ([x, w], [sx, sw]): ([&CudaSlice<T>; 2], [usize; 2]),
    bias: Option<(&CudaSlice<T>, usize, ConvActivation)>,
) -> Result<CudaSlice<T>> {
    let gpu = engine(dev)?;
    let (x, w) = (x.slice(sx..), w.slice(sw..));
    let mut y = output::<T>(dev, p.lens()[2])?;
    match bias {
        Some((b, sb, act)) => gpu.conv().fused(p, &x, &w, &b.slice(sb..), act, &mut y),
        None => gpu.conv().forward(p, &x, &w, &mut y),
    }
    .map_err(wrap)?;
    Ok(y)
}

/// A backward direction on the engine from `a` (w for `data`, else x) and a dense `dy`, each
/// at its start: dx (`data`) or dw, dense, every element written.
fn backward<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    p: &Conv2d,
    data: bool,
    [a, dy]: [&CudaSlice<T>; 2],
    [sa, sdy]: [usize; 2],
) -> Result<CudaSlice<T>> {
    let gpu = engine(dev)?;
    let (a, dy) = (a.slice(sa..), dy.slice(sdy..));
    let [lx, lw, _] = p.lens();
    let mut out = output::<T>(dev, if data { lx } else { lw })?;
    if data {
        gpu.conv().backward_data(p, &a, &dy, &mut out)
    } else {
        gpu.conv().backward_filter(p, &a, &dy, &mut out)
    }
    .map_err(wrap)?;
    Ok(out)
}
