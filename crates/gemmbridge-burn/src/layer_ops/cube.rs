//! The CUDA backend: [`LayerOps`] for every `CubeBackend<R, …>`, served by gemmbridge when `R`
//! is `CudaRuntime` (checked at run time by type) and the call fits; burn's ops otherwise.

use std::any::Any;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use gemmbridge::cuda::{Gpu, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved};
use gemmbridge::layer_ops::{GluLayout, Positions, Rope, RopeTables, SwiGlu};
use gemmbridge::norm::{NormTensor, RmsNorm};

use super::run::{run, served, Cuda, Raw};
use super::{burn_ops, row_layout, LayerOps, RopeDirection, RopeStyle};
use crate::layout::Fallback;

/// Runs `$body` with `$T` the element type of gemmbridge dtype `$d` (f32, f16 or bf16).
macro_rules! by_dtype {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            gemmbridge::DType::F16 => {
                type $T = gemmbridge::half::f16;
                $body
            }
            gemmbridge::DType::BF16 => {
                type $T = gemmbridge::half::bf16;
                $body
            }
            _ => {
                type $T = f32;
                $body
            }
        }
    };
}

/// The tensor as a CUDA tensor when the runtime `R` is `CudaRuntime`.
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Result<&Cuda, Fallback> {
    (t as &dyn Any).downcast_ref::<Cuda>().ok_or_else(|| Fallback::Problem("not a CUDA backend".into()))
}

/// A CUDA tensor back as `CubeTensor<R>` (`R` is `CudaRuntime` whenever `as_cuda` succeeded).
fn from_cuda<R: CubeRuntime>(t: Cuda) -> CubeTensor<R> {
    *(Box::new(t) as Box<dyn Any>).downcast::<CubeTensor<R>>().expect("as_cuda succeeded, so R is CudaRuntime")
}

/// A tensor's shape and strides, in elements.
fn geometry<R: CubeRuntime>(t: &CubeTensor<R>) -> (&[usize], &[usize]) {
    (t.meta.shape(), t.meta.strides())
}

/// gemmbridge's dtype of tensors that share one of f32, f16, bf16.
fn io_dtype(ts: &[&Cuda]) -> Result<gemmbridge::DType, Fallback> {
    let d = ts[0].dtype;
    let g = match d {
        DType::F32 => gemmbridge::DType::F32,
        DType::F16 => gemmbridge::DType::F16,
        DType::BF16 => gemmbridge::DType::BF16,
        _ => return Err(Fallback::Problem(format!("dtype {d:?}"))),
    };
    match ts.iter().all(|t| t.dtype == d) {
        true => Ok(g),
        false => Err(Fallback::Problem(format!("dtypes {:?}", ts.iter().map(|t| t.dtype).collect::<Vec<_>>()))),
    }
}

/// `(rows, cols, ld)` of a 2-D tensor whose rows gemmbridge reads in place.
fn rows(t: &Cuda, what: &str) -> Result<(usize, usize, usize), Fallback> {
    let (s, st) = geometry(t);
    row_layout(s, st).ok_or_else(|| Fallback::Layout(format!("{what}: shape {s:?} strides {st:?}")))
}

/// A contiguous vector of `len` elements.
fn vector(t: &Cuda, len: usize, what: &str) -> Result<(), Fallback> {
    match geometry(t) {
        (&[n], &[s]) if n == len && (s == 1 || n <= 1) => Ok(()),
        (s, st) => Err(Fallback::Layout(format!("{what}: shape {s:?} strides {st:?}, [{len}] contiguous expected"))),
    }
}

/// A fresh contiguous tensor from burn's allocator on `like`'s device and stream.
fn empty(like: &Cuda, shape: &[usize], dtype: DType) -> Cuda {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape.to_vec()),
        dtype,
    )
}

/// The row stride of a fresh `[rows, cols]` tensor.
fn ld_of(t: &Cuda) -> usize {
    match geometry(t) {
        (&[r, c], &[s, _]) if r > 1 => s.max(c),
        (s, _) => s.last().copied().unwrap_or(1),
    }
}

fn problem(e: gemmbridge::Error) -> Fallback {
    Fallback::Problem(e.to_string())
}

/// `(y, inv_rms)` through cuDNN's norm graph; `inv_rms` only for `training`.
fn try_rms_norm(x: &Cuda, w: &Cuda, eps: f64, training: bool) -> Result<(Cuda, Option<Cuda>), Fallback> {
    let dtype = io_dtype(&[x, w])?;
    let (n, f, ldx) = rows(x, "x")?;
    vector(w, f, "weight")?;
    let y = empty(x, &[n, f], x.dtype);
    let inv = training.then(|| empty(x, &[n], DType::F32));
    let p = RmsNorm::new(n, f, eps as f32, dtype).with_ld(NormTensor::X, ldx).with_ld(NormTensor::Y, ld_of(&y));
    p.validate().map_err(problem)?;
    let mut ts = vec![x, w, &y];
    ts.extend(inv.as_ref());
    run(
        &ts,
        Box::new(move |gpu: &Gpu, b: &[(u64, usize)]| {
            by_dtype!(dtype, T => {
                let (xb, wb, mut yb) = (Raw::<T>::new(gpu, b[0]), Raw::<T>::new(gpu, b[1]), Raw::<T>::new(gpu, b[2]));
                let mut ib = b.get(3).map(|&i| Raw::<f32>::new(gpu, i));
                let mut out = RmsNormOut::new(&mut yb);
                if let Some(ib) = ib.as_mut() {
                    out = out.training(ib);
                }
                gpu.rms_norm_forward::<T>(&p, RmsNormIn::new(&xb, &wb), out).map(|_| ())
            })
        }),
    )?;
    Ok((y, inv))
}

/// `(dx, dw)` through cuDNN's norm graph.
fn try_rms_norm_backward(x: &Cuda, w: &Cuda, inv: &Cuda, dy: &Cuda) -> Result<(Cuda, Cuda), Fallback> {
    let dtype = io_dtype(&[x, w, dy])?;
    let ((n, f, ldx), (n2, f2, lddy)) = (rows(x, "x")?, rows(dy, "dy")?);
    if (n, f) != (n2, f2) || inv.dtype != DType::F32 {
        return Err(Fallback::Shape(format!("x [{n}, {f}], dy [{n2}, {f2}], inv_rms {:?}", inv.dtype)));
    }
    vector(w, f, "weight")?;
    vector(inv, n, "inv_rms")?;
    let (dx, dw) = (empty(x, &[n, f], x.dtype), empty(x, &[f], w.dtype));
    // ε is the forward's (saved in inv_rms); the backward's graph does not read it
    let p = RmsNorm::new(n, f, 1e-5, dtype)
        .with_ld(NormTensor::X, ldx)
        .with_ld(NormTensor::Dy, lddy)
        .with_ld(NormTensor::Dx, ld_of(&dx));
    p.validate().map_err(problem)?;
    run(
        &[x, w, inv, dy, &dx, &dw],
        Box::new(move |gpu: &Gpu, b: &[(u64, usize)]| {
            by_dtype!(dtype, T => {
                let (xb, wb, ib, dyb) =
                    (Raw::<T>::new(gpu, b[0]), Raw::<T>::new(gpu, b[1]), Raw::<f32>::new(gpu, b[2]), Raw::<T>::new(gpu, b[3]));
                let (mut dxb, mut dwb) = (Raw::<T>::new(gpu, b[4]), Raw::<T>::new(gpu, b[5]));
                let saved = RmsNormSaved { x: &xb, w: &wb, inv_rms: &ib, dy: &dyb };
                gpu.rms_norm_backward::<T>(&p, saved, &mut dxb, RmsNormDw::Io(&mut dwb))
            })
        }),
    )?;
    Ok((dx, dw))
}

/// SwiGLU forward (`dy` None: `y[rows, f]`) or backward (`dgu[rows, 2f]`) on gemmbridge's
/// layer kernels.
fn try_swiglu(gu: &Cuda, dy: Option<&Cuda>) -> Result<Cuda, Fallback> {
    let dtype = io_dtype(&[gu].into_iter().chain(dy).collect::<Vec<_>>())?;
    let (n, f2, ld_in) = rows(gu, "gate/up")?;
    let f = f2 / 2;
    if n == 0 || f == 0 {
        return Err(Fallback::Shape(format!("empty gate/up [{n}, {f2}]")));
    }
    let out = empty(gu, &[n, if dy.is_some() { f2 } else { f }], gu.dtype);
    let ld_out = match dy {
        Some(dy) => match rows(dy, "dy")? {
            (n2, f_, ld) if (n2, f_) == (n, f) && ld_of(&out) == ld_in => ld,
            (n2, f_, _) => {
                // gemmbridge writes the gradient with gu's row stride: a fresh [n, 2f] tensor
                // has it only when gu's rows are contiguous
                return Err(Fallback::Layout(format!("dy [{n2}, {f_}], gate/up [{n}, {f2}] with row stride {ld_in}")));
            }
        },
        None => ld_of(&out),
    };
    let op = SwiGlu::new(n, f, GluLayout::Halves).with_ld(ld_in, ld_out);
    op.validate().map_err(problem)?;
    let ts: Vec<&Cuda> = [gu].into_iter().chain(dy).chain([&out]).collect();
    run(
        &ts,
        Box::new(move |gpu: &Gpu, b: &[(u64, usize)]| {
            by_dtype!(dtype, T => {
                let gub = Raw::<T>::new(gpu, b[0]);
                match b {
                    [_, dyb, outb] => {
                        let (dyb, mut outb) = (Raw::<T>::new(gpu, *dyb), Raw::<T>::new(gpu, *outb));
                        gpu.swiglu_backward::<T>(&op, &dyb, &gub, &mut outb)
                    }
                    _ => gpu.swiglu::<T>(&op, &gub, &mut Raw::<T>::new(gpu, b[1])),
                }
            })
        }),
    )?;
    Ok(out)
}

/// Rotates the query and key heads of `scratch[b, t, h_q + 2, d]` (contiguous, ours alone)
/// in place with f32 tables `cos`, `sin` `[T, d/2]` (contiguous).
fn try_rope_in_place(
    scratch: &Cuda,
    cos: &Cuda,
    sin: &Cuda,
    style: RopeStyle,
    dir: RopeDirection,
) -> Result<(), Fallback> {
    let dtype = io_dtype(&[scratch])?;
    let (&[b, t, heads, d], &[tables, half]) = (geometry(scratch).0, geometry(cos).0) else {
        return Err(Fallback::Shape("scratch or table rank".into()));
    };
    for tab in [cos, sin] {
        if tab.dtype != DType::F32 || !tab.is_contiguous() || geometry(tab).0 != [tables, half] {
            return Err(Fallback::Layout(format!("table {:?} {:?}", tab.dtype, tab.meta.strides())));
        }
    }
    if !scratch.is_contiguous() || !scratch.can_mut() {
        return Err(Fallback::Layout("the scratch buffer is not contiguous and ours alone".into()));
    }
    let op = Rope::new(b, t, (heads - 2, 1), d).with_style(style).with_tables(tables);
    op.check_call(true).map_err(problem)?;
    op.check_start(0).map_err(problem)?;
    run(
        &[scratch, cos, sin],
        Box::new(move |gpu: &Gpu, buf: &[(u64, usize)]| {
            by_dtype!(dtype, T => {
                let mut qkv = Raw::<T>::new(gpu, buf[0]);
                let (c, s) = (Raw::<f32>::new(gpu, buf[1]), Raw::<f32>::new(gpu, buf[2]));
                let tabs = RopeTables { cos: &c as &dyn gemmbridge::cudarc::driver::DevicePtr<f32>, sin: &s as _ };
                gpu.rope::<T>(&op, dir, &mut qkv, Positions::Contiguous { start: 0 }, Some(tabs))
            })
        }),
    )
}

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// RoPE through a scratch fused-QKV copy of x (see [`crate::rope`]): `None` where gemmbridge
/// cannot serve.
fn rope_served<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    x: &CubeTensor<R>,
    cos: &CubeTensor<R>,
    sin: &CubeTensor<R>,
    style: RopeStyle,
    dir: RopeDirection,
) -> Option<CubeTensor<R>> {
    use super::{primitive, tensor};
    use burn::tensor::Tensor;
    type B<R, F, I, BT> = Cube<R, F, I, BT>;
    let shapes: [&[usize]; 2] = [x.meta.shape(), cos.meta.shape()];
    let attempt = || {
        io_dtype(&[as_cuda(x)?])?;
        let &[b, h, t, d] = geometry(x).0 else { return Err(Fallback::Shape("x rank".into())) };
        if b * h * t == 0 || d > gemmbridge::layer_ops::MAX_ROTARY_DIM {
            return Err(Fallback::Shape(format!("x [{b}, {h}, {t}, {d}]")));
        }
        // [b, t, h + pad, d]: the heads as h_q = h + pad − 2 query heads and one key head,
        // then one value head the kernels neither read nor write (for h = 1 the key head is a
        // zero pad)
        let pad = if h >= 2 { 1 } else { 2 };
        let xt = tensor::<B<R, F, I, BT>, 4>(x.clone());
        let zeros = Tensor::<B<R, F, I, BT>, 4>::zeros([b, t, pad, d], &xt.device()).cast(xt.dtype());
        let scratch = primitive(Tensor::cat(vec![xt.swap_dims(1, 2), zeros], 2));
        let table = |p: &CubeTensor<R>| {
            let t32 = tensor::<B<R, F, I, BT>, 2>(p.clone()).cast(DType::F32);
            burn_cubecl::kernel::into_contiguous(primitive(t32))
        };
        let (c, s) = (table(cos), table(sin));
        try_rope_in_place(as_cuda(&scratch)?, as_cuda(&c)?, as_cuda(&s)?, style, dir)?;
        Ok(primitive(tensor::<B<R, F, I, BT>, 4>(scratch).narrow(2, 0, h).swap_dims(1, 2)))
    };
    served("rope", &shapes, attempt)
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LayerOps for CubeBackend<R, F, I, BT> {
    fn layer_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [x.meta.shape(), w.meta.shape()];
        let attempt = || try_rms_norm(as_cuda(&x)?, as_cuda(&w)?, eps, false).map(|(y, _)| from_cuda::<R>(y));
        served("rms_norm", &shapes, attempt).unwrap_or_else(|| burn_ops::rms_norm::<Self>(x, w, eps).0)
    }

    fn layer_rms_norm_training(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes: [&[usize]; 2] = [x.meta.shape(), w.meta.shape()];
        let attempt = || {
            let (y, inv) = try_rms_norm(as_cuda(&x)?, as_cuda(&w)?, eps, true)?;
            Ok((from_cuda::<R>(y), from_cuda::<R>(inv.expect("training saves inv_rms"))))
        };
        served("rms_norm (training)", &shapes, attempt).unwrap_or_else(|| burn_ops::rms_norm::<Self>(x, w, eps))
    }

    fn layer_rms_norm_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        inv_rms: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes: [&[usize]; 2] = [x.meta.shape(), dy.meta.shape()];
        let attempt = || {
            let (dx, dw) = try_rms_norm_backward(as_cuda(&x)?, as_cuda(&w)?, as_cuda(&inv_rms)?, as_cuda(&dy)?)?;
            Ok((from_cuda::<R>(dx), from_cuda::<R>(dw)))
        };
        served("rms_norm backward", &shapes, attempt)
            .unwrap_or_else(|| burn_ops::rms_norm_backward::<Self>(x, w, inv_rms, dy))
    }

    fn layer_swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self> {
        let shapes: [&[usize]; 1] = [gu.meta.shape()];
        let attempt = || try_swiglu(as_cuda(&gu)?, None).map(from_cuda::<R>);
        served("swiglu", &shapes, attempt).unwrap_or_else(|| burn_ops::swiglu::<Self>(gu))
    }

    fn layer_swiglu_backward(dy: FloatTensor<Self>, gu: FloatTensor<Self>) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [dy.meta.shape(), gu.meta.shape()];
        let attempt = || try_swiglu(as_cuda(&gu)?, Some(as_cuda(&dy)?)).map(from_cuda::<R>);
        served("swiglu backward", &shapes, attempt).unwrap_or_else(|| burn_ops::swiglu_backward::<Self>(dy, gu))
    }

    fn layer_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        style: RopeStyle,
        direction: RopeDirection,
    ) -> FloatTensor<Self> {
        rope_served::<R, F, I, BT>(&x, &cos, &sin, style, direction)
            .unwrap_or_else(|| burn_ops::rope::<Self>(x, cos, sin, style, direction))
    }
}
