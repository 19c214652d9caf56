//! `fp8_linear`: a linear layer on an FP8 (E4M3) weight quantised once ([`Fp8Weight`]), its
//! activations quantised on every call, row-wise or block scales ([`Fp8Scaling`]); on CUDA
//! gemmbridge's quantisation kernels and FP8 GEMM (`cuda_fp8.rs`), on the CPU gemmbridge's
//! quantisation with an f32 product on the dequantised operands (the emulation below).

use std::sync::{Arc, OnceLock};

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use gemmbridge::fp8::{self, Fp8Format, Quantized, Scaling, Source};
use gemmbridge::{Element, GemmProblem, Precision};

use crate::cpu::{by_dtype, wrap};
use crate::{device_served, Served};

/// The scaling recipe of an FP8 linear layer: how the weight's and the activations' scales are
/// grouped (gemmbridge's [`Scaling`], cuBLASLt's scaling modes; both need a Hopper GPU,
/// compute capability 9.0, and cuBLASLt 12.9 or later: [`gemmbridge::fp8::check_support`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Scaling {
    /// One scale per output row of the weight (`[out]`) and one per row of `x` (`[rows]`):
    /// cuBLASLt's `OUTER_VEC_32F` on both operands.
    RowWise,
    /// One scale per 128×128 block of the weight (`[⌈out/128⌉, ⌈in/128⌉]`) and one per 1×128
    /// block of each row of `x` (`[rows, ⌈in/128⌉]`): DeepSeek-V3's recipe, cuBLASLt's
    /// `BLK128x128_32F` and `VEC128_32F`.
    Block,
}

impl Fp8Scaling {
    /// The activations' (x's) scaling.
    pub fn x_scaling(self) -> Scaling {
        match self {
            Fp8Scaling::RowWise => Scaling::Row,
            Fp8Scaling::Block => Scaling::Block1x128,
        }
    }

    /// The weight's scaling.
    pub fn w_scaling(self) -> Scaling {
        match self {
            Fp8Scaling::RowWise => Scaling::Row,
            Fp8Scaling::Block => Scaling::Block128x128,
        }
    }
}

/// Where a quantised weight lives.
enum Store {
    /// Host bytes and scales: a CPU weight, or one whose device gemmbridge's FP8 path does not
    /// serve (its calls then run [`fp8_linear_candle`]).
    Host(Quantized),
    /// gemmbridge's FP8 operand on the GPU (its FP8 GEMM takes no other).
    #[cfg(feature = "cuda")]
    Gpu(gemmbridge::cuda::Fp8Tensor),
}

struct Inner {
    out_features: usize,
    in_features: usize,
    scaling: Fp8Scaling,
    device: Device,
    store: Store,
    /// The dequantised weight, f32 `[out, in]` on `device`, made on first need.
    dequantized: OnceLock<Tensor>,
}

/// A linear layer's weight `w[out, in]` (candle-nn's `Linear` layout) quantised once to FP8
/// E4M3 with the weight scales of an [`Fp8Scaling`]; cheap to clone (shared).
///
/// On a CUDA device where gemmbridge serves the recipe (the crate's `cuda` feature, a Hopper
/// GPU, cuBLASLt ≥ 12.9, [`crate::enabled`] at quantisation), it holds gemmbridge's GPU operand
/// (`gemmbridge::cuda::Fp8Tensor`, made by `GpuFp8::quantize` on candle's buffer and stream): the
/// bytes row-major `[out rounded up to 16, in rounded up to 16]` with zero padding, and the f32
/// dequantisation scales in cuBLASLt's layout ([`gemmbridge::fp8::Fp8Layout`]). gemmbridge's FP8
/// GEMM takes only operands its own quantisation made, so the weight is kept in that form
/// rather than as candle tensors. Elsewhere it holds the same bytes and scales on the host
/// ([`gemmbridge::fp8::quantize`], bit for bit what the GPU kernels write).
///
/// An FP8 weight is frozen: it takes no gradient (only `x` and the bias get one through
/// [`fp8_linear`]).
#[derive(Clone)]
pub struct Fp8Weight(Arc<Inner>);

impl std::fmt::Debug for Fp8Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gpu = !matches!(self.0.store, Store::Host(_));
        f.debug_struct("Fp8Weight")
            .field("out_features", &self.0.out_features)
            .field("in_features", &self.0.in_features)
            .field("scaling", &self.0.scaling)
            .field("gpu", &gpu)
            .finish()
    }
}

impl Fp8Weight {
    /// Quantises `w[out, in]` (f32, f16 or bf16, any strides, on any device) to E4M3 with the
    /// weight scales of `scaling`: per group `scale = amax / 448`, values multiplied by
    /// `448 / amax`, rounded to nearest even and saturated ([`gemmbridge::fp8`] specifies it).
    /// On CUDA by gemmbridge's kernels on candle's stream; elsewhere, and on a GPU or cuBLASLt
    /// that lacks the recipe, on the host (a copy of `w` to the host first).
    ///
    /// # Errors
    /// Before anything is quantised: `w` not of rank 2; a dtype other than f32, f16, bf16; an
    /// empty weight (FP8 operands need at least one row and column); NaN or ±∞ in `w` (their
    /// group's scale would be NaN; counted on the device, one synchronisation). gemmbridge's
    /// errors, wrapped (sizes past `gemmbridge::fp8::MAX_ROWS`).
    pub fn quantize(w: &Tensor, scaling: Fp8Scaling) -> Result<Fp8Weight> {
        let Ok((out_features, in_features)) = w.dims2() else {
            bail!("Fp8Weight::quantize: the weight must be [out, in], not of shape {:?}", w.dims())
        };
        if crate::plan::element(w.dtype()).is_none() {
            bail!("Fp8Weight::quantize: the weight must be f32, f16 or bf16, not {:?}", w.dtype())
        }
        if out_features == 0 || in_features == 0 {
            bail!("Fp8Weight::quantize: the weight [{out_features}, {in_features}] is empty; FP8 needs at least one row and column")
        }
        let wf = w.to_dtype(DType::F32)?;
        let z = (&wf * 0.0)?; // NaN exactly where w is NaN or infinite
        let bad = z.ne(&z)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        if bad > 0.0 {
            bail!(
                "Fp8Weight::quantize: the weight [{out_features}, {in_features}] holds {bad} NaN or infinite values; \
                 their groups' FP8 scales would be NaN"
            )
        }
        let store = match gpu_store(w, scaling)? {
            Some(s) => s,
            None => {
                let host = wf.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
                let q = fp8::quantize(
                    &host,
                    out_features,
                    in_features,
                    Source::RowMajor,
                    Fp8Format::E4M3,
                    scaling.w_scaling(),
                );
                Store::Host(q.map_err(wrap)?)
            }
        };
        let device = w.device().clone();
        let dequantized = OnceLock::new();
        Ok(Fp8Weight(Arc::new(Inner { out_features, in_features, scaling, device, store, dequantized })))
    }

    /// Output features (the weight's rows).
    pub fn out_features(&self) -> usize {
        self.0.out_features
    }

    /// Input features (the weight's columns, the product's K).
    pub fn in_features(&self) -> usize {
        self.0.in_features
    }

    /// The recipe it was quantised with.
    pub fn scaling(&self) -> Fp8Scaling {
        self.0.scaling
    }

    /// The device of the tensor it was quantised from.
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// Whether [`fp8_linear`] serves calls with it through gemmbridge: a CPU weight (the
    /// emulation) or a CUDA weight quantised by the GPU (the FP8 GEMM); `false` for a weight
    /// whose device, GPU or cuBLASLt the FP8 path does not serve, or quantised while
    /// [`crate::enabled`] was off (its calls run [`fp8_linear_candle`]).
    pub fn served(&self) -> bool {
        match self.0.store {
            Store::Host(_) => self.0.device.is_cpu(),
            #[cfg(feature = "cuda")]
            Store::Gpu(_) => true,
        }
    }

    /// The FP8 bytes and scales on the host, in gemmbridge's layout
    /// ([`gemmbridge::fp8::Fp8Layout`]); a GPU weight is copied back (waits for its stream).
    ///
    /// # Errors
    /// gemmbridge's copy errors, wrapped.
    pub fn to_quantized(&self) -> Result<Quantized> {
        match &self.0.store {
            Store::Host(q) => Ok(q.clone()),
            #[cfg(feature = "cuda")]
            Store::Gpu(t) => t.to_host().map_err(wrap),
        }
    }

    /// The dequantised weight, f32 `[out, in]` on the weight's device: element `(r, c)` is
    /// `q[r, c] · s(r, c)` (exact in f64, rounded to f32 once). Made on the first call (a GPU
    /// weight is read back to the host for it: one synchronisation) and kept, 4 bytes per
    /// element, for later calls, [`fp8_linear`]'s backward and [`fp8_linear_candle`].
    ///
    /// # Errors
    /// As [`Fp8Weight::to_quantized`]; candle's copy to the device.
    pub fn dequantize(&self) -> Result<Tensor> {
        if let Some(t) = self.0.dequantized.get() {
            return Ok(t.clone());
        }
        let q = self.to_quantized()?;
        let v: Vec<f32> = fp8::dequantize(&q).map_err(wrap)?.into_iter().map(|v| v as f32).collect();
        let t =
            Tensor::from_vec(v, (self.0.out_features, self.0.in_features), &Device::Cpu)?.to_device(&self.0.device)?;
        Ok(self.0.dequantized.get_or_init(|| t).clone())
    }
}

/// The GPU operand of `w` where gemmbridge's FP8 path serves its device and the recipe.
#[cfg(feature = "cuda")]
fn gpu_store(w: &Tensor, scaling: Fp8Scaling) -> Result<Option<Store>> {
    if !crate::enabled() {
        return Ok(None);
    }
    Ok(crate::cuda_fp8::quantize_weight(w, scaling.w_scaling())?.map(Store::Gpu))
}

/// Without the `cuda` feature every weight is quantised on the host.
#[cfg(not(feature = "cuda"))]
fn gpu_store(_: &Tensor, _: Fp8Scaling) -> Result<Option<Store>> {
    Ok(None)
}

/// An FP8 linear layer, `y[.., out] = x[.., in]·wᵀ + bias[out]` with `w` an [`Fp8Weight`]:
/// `x` (f32, f16 or bf16, any strides; its leading dimensions are the rows) is quantised to
/// E4M3 on every call with the activation scales of the weight's recipe (row-wise: one per
/// row; block: one per 1×128 block of a row), multiplied with f32 accumulation, scaled, the
/// bias (x's dtype, `[out]`) added in f32, and rounded once to x's dtype.
///
/// Paths: on CUDA, gemmbridge's quantisation kernels and FP8 GEMM (cuBLASLt) on candle's
/// buffers and stream; every shape is served (gemmbridge pads K to 16 bytes with zeros and runs
/// outputs whose rows miss cuBLASLt's alignment on an aligned copy). On the CPU, the
/// emulation: x quantised by [`gemmbridge::fp8::quantize`] (bit for bit the GPU's), both
/// operands dequantised to f32 and multiplied by gemmbridge's CPU GEMM. A strided `x` is copied
/// contiguous first ([`Served::AfterCopy`]). A weight whose device or GPU the FP8 path does not
/// serve, other devices and [`crate::set_enabled`]`(false)` run [`fp8_linear_candle`]. `x` with
/// no rows gives an empty output without running anything (reported as [`Served::Candle`]).
/// An f32 `x` takes its bias as a separate add (cuBLASLt offers no bias with an f32 FP8 output).
///
/// Backward: `dx = dy·W` through [`crate::matmul`] on the dequantised weight
/// ([`Fp8Weight::dequantize`], in dy's dtype; made on the first backward and kept: a GPU
/// weight is read back to the host for it once) and `d(bias) = Σ_rows dy`; the weight is
/// frozen (no gradient). A NaN or ±∞ in a row of `x` makes its group's scale NaN: NaN in that row's
/// output, as the GPU computes it.
///
/// # Errors
/// Before anything runs: `x` of rank 0 or not f32/f16/bf16; x's last dimension not the
/// weight's `in_features`; a bias that is not `[out]` of x's dtype; `x`, the weight and the
/// bias not on one device. gemmbridge's errors from the GPU, wrapped.
pub fn fp8_linear(x: &Tensor, w: &Fp8Weight, bias: Option<&Tensor>) -> Result<Tensor> {
    fp8_linear_served(x, w, bias).map(|(t, _)| t)
}

/// [`fp8_linear`], and which path ran it.
///
/// # Errors
/// As [`fp8_linear`].
pub fn fp8_linear_served(x: &Tensor, w: &Fp8Weight, bias: Option<&Tensor>) -> Result<(Tensor, Served)> {
    check(x, w, bias)?;
    let n = w.out_features();
    let mut out = x.dims()[..x.rank() - 1].to_vec();
    out.push(n);
    if out.iter().product::<usize>() == 0 {
        return Ok((Tensor::zeros(out, x.dtype(), x.device())?, Served::Candle));
    }
    if !device_served(x.device()) || !w.served() {
        return Ok((fp8_linear_candle(x, w, bias)?, Served::Candle));
    }
    let dense = |t: &Tensor| -> Result<(Tensor, bool)> {
        Ok(if t.is_contiguous() { (t.clone(), false) } else { (t.contiguous()?, true) })
    };
    let (x2, mut copied) = dense(x)?;
    let op = Fp8LinearOp { w: w.clone(), out: Shape::from(out) };
    let y = match bias {
        // f16/bf16: the bias in the GEMM's epilogue
        Some(b) if x.dtype() != DType::F32 => {
            let (b2, b_copied) = dense(b)?;
            copied |= b_copied;
            x2.apply_op2(&b2, op)?
        }
        Some(b) => x2.apply_op1(op)?.broadcast_add(b)?,
        None => x2.apply_op1(op)?,
    };
    let served = if copied { Served::AfterCopy } else { Served::Gemmbridge };
    Ok((y, served))
}

/// The checks of [`fp8_linear`]'s errors.
fn check(x: &Tensor, w: &Fp8Weight, bias: Option<&Tensor>) -> Result<()> {
    if x.rank() == 0 || crate::plan::element(x.dtype()).is_none() {
        bail!("fp8_linear: x must be f32, f16 or bf16 of rank ≥ 1, not {:?} of shape {:?}", x.dtype(), x.dims())
    }
    let k = x.dims()[x.rank() - 1];
    if k != w.in_features() {
        bail!("fp8_linear: x's last dimension is {k} but the weight is [{}, {}]", w.out_features(), w.in_features())
    }
    if !x.device().same_device(w.device()) {
        bail!("fp8_linear: x is on {:?}, the weight on {:?}", x.device(), w.device())
    }
    if let Some(b) = bias {
        if b.dims() != [w.out_features()] || b.dtype() != x.dtype() || !b.device().same_device(x.device()) {
            bail!(
                "fp8_linear: the bias must be [{}] of x's dtype {:?} on x's device, not {:?} {:?} on {:?}",
                w.out_features(),
                x.dtype(),
                b.dims(),
                b.dtype(),
                b.device()
            )
        }
    }
    Ok(())
}

/// candle's own layer on the dequantised weight: `x·Wᵀ + bias` by `broadcast_matmul` with `W`
/// ([`Fp8Weight::dequantize`]) in x's dtype (`x` is not quantised), then `broadcast_add`;
/// what [`fp8_linear`] falls back to. Differentiable through candle's autograd (x and the bias).
///
/// # Errors
/// candle's errors for shapes or dtypes that do not agree; as [`Fp8Weight::dequantize`].
pub fn fp8_linear_candle(x: &Tensor, w: &Fp8Weight, bias: Option<&Tensor>) -> Result<Tensor> {
    let wd = w.dequantize()?.to_dtype(x.dtype())?;
    let y = x.broadcast_matmul(&wd.t()?)?;
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// The FP8 product as candle's custom operation: one operand (x) or two (x and a bias fused
/// into the GEMM); its backward is [`fp8_grads`]. `x` (and the bias) arrive contiguous.
struct Fp8LinearOp {
    w: Fp8Weight,
    out: Shape,
}

impl Fp8LinearOp {
    /// The host weight of a CPU call.
    fn host(&self) -> Result<&Quantized> {
        match &self.w.0.store {
            Store::Host(q) => Ok(q),
            #[cfg(feature = "cuda")]
            Store::Gpu(_) => bail!("fp8_linear: a GPU weight reached the CPU path"),
        }
    }

    /// The GPU weight of a CUDA call.
    #[cfg(feature = "cuda")]
    fn gpu(&self) -> Result<&gemmbridge::cuda::Fp8Tensor> {
        match &self.w.0.store {
            Store::Gpu(t) => Ok(t),
            Store::Host(_) => bail!("fp8_linear: a host weight reached the CUDA path"),
        }
    }

    fn rows(&self) -> usize {
        self.out.elem_count() / self.w.out_features()
    }
}

impl CustomOp1 for Fp8LinearOp {
    fn name(&self) -> &'static str {
        "gemmbridge-fp8-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (q, m, s) = (self.host()?, self.rows(), self.w.scaling().x_scaling());
        let y = by_dtype!("fp8_linear", [x], |T| emulate::<T>(q, (&x[l.start_offset()..], m), None, s));
        Ok((y, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, x: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (dev, wq, m, s) = (x.device.clone(), self.gpu()?, self.rows(), self.w.scaling().x_scaling());
        let xo = l.start_offset();
        let y = crate::cuda::by_dtype!("fp8_linear", dev, [x], |T| crate::cuda_fp8::forward::<T>(
            &dev,
            wq,
            (x, xo, m),
            None,
            s
        ));
        Ok((y, self.out.clone()))
    }

    /// `dx` ([`fp8_grads`]).
    fn bwd(&self, x: &Tensor, _: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(fp8_grads(x, &self.w, dy, false)?.0))
    }
}

impl CustomOp2 for Fp8LinearOp {
    fn name(&self) -> &'static str {
        "gemmbridge-fp8-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, l: &Layout, b: &CpuStorage, bl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (q, m, s, (xo, bo)) =
            (self.host()?, self.rows(), self.w.scaling().x_scaling(), (l.start_offset(), bl.start_offset()));
        let y = by_dtype!("fp8_linear", [x, b], |T| emulate::<T>(q, (&x[xo..], m), Some(&b[bo..]), s));
        Ok((y, self.out.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        l: &Layout,
        b: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (dev, wq, m, s) = (x.device.clone(), self.gpu()?, self.rows(), self.w.scaling().x_scaling());
        let (xo, bo) = (l.start_offset(), bl.start_offset());
        let y = crate::cuda::by_dtype!("fp8_linear", dev, [x, b], |T| crate::cuda_fp8::forward::<T>(
            &dev,
            wq,
            (x, xo, m),
            Some((b, bo)),
            s
        ));
        Ok((y, self.out.clone()))
    }

    /// `dx` and `d(bias)` ([`fp8_grads`]).
    fn bwd(&self, x: &Tensor, _: &Tensor, _: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, db) = fp8_grads(x, &self.w, dy, true)?;
        Ok((Some(dx), db))
    }
}

/// The gradients of `y = x·Wᵀ + bias` for the dequantised weight `W[n, k]` and `dy[.., n]`:
/// `dx = dy·W` (x's shape, dy's dtype) through [`crate::matmul`], and with `bias`
/// `d(bias) = Σ_rows dy` (`[n]`, summed in f32 and rounded to dy's dtype once).
fn fp8_grads(x: &Tensor, w: &Fp8Weight, dy: &Tensor, bias: bool) -> Result<(Tensor, Option<Tensor>)> {
    let dy2 = dy.reshape(((), w.out_features()))?;
    let wd = w.dequantize()?.to_dtype(dy.dtype())?;
    let dx = crate::matmul::matmul(&dy2, &wd)?.reshape(x.dims())?;
    let db = bias.then(|| dy2.to_dtype(DType::F32)?.sum(0)?.to_dtype(dy.dtype())).transpose()?;
    Ok((dx, db))
}

/// The CPU emulation of the FP8 product: `x[m, k]` (from its first element, dense) quantised
/// with `x_scaling` ([`gemmbridge::fp8::quantize`], the GPU kernels' rounding), both operands
/// dequantised to f32, their product by gemmbridge's f32 CPU GEMM, the bias added in f32 and
/// each element rounded to `T` once.
fn emulate<T: Element>(w: &Quantized, (x, m): (&[T], usize), bias: Option<&[T]>, x_scaling: Scaling) -> Result<Vec<T>> {
    let (n, k) = (w.layout.rows, w.layout.cols);
    let q = fp8::quantize(&x[..m * k], m, k, Source::RowMajor, Fp8Format::E4M3, x_scaling).map_err(wrap)?;
    let f32s = |q: &Quantized| -> Result<Vec<f32>> {
        Ok(fp8::dequantize(q).map_err(wrap)?.into_iter().map(|v| v as f32).collect())
    };
    let (xd, wd) = (f32s(&q)?, f32s(w)?);
    let mut acc = vec![f32::NAN; m * n];
    let p = GemmProblem::linear(m, n, k, Precision::F32).map_err(wrap)?;
    gemmbridge::cpu::gemm(&p, 1.0, &xd, &wd, 0.0, &mut acc).map_err(wrap)?;
    let b: Option<Vec<f32>> = bias.map(|b| b[..n].iter().map(|v| v.to_f32()).collect());
    let y = acc
        .chunks(n)
        .flat_map(|row| row.iter().enumerate())
        .map(|(j, &v)| T::from_f32(v + b.as_ref().map_or(0.0, |b| b[j])));
    Ok(y.collect())
}
