//! [`Mlp`]: a sequence of linear layers on the GPU, forward and backward on cuBLASLt GEMMs with
//! fused epilogues (the plan is in [`crate::train`]). This file holds the layers' state, their
//! creation, parameters and update; the forward is in `forward.rs`, the backward in
//! `backward.rs`, the activation buffers in `buffers.rs`.

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::buffers::Buffers;
use super::grads::to_host;
use super::instruments::Instruments;
use super::placement::Placements;
use crate::cuda::api::engine::Gpu;
use crate::cuda::device::Relaxed;
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, Which};
use crate::precision::Precision;
use crate::train::fp8::Fp8Training;
use crate::train::{check_layers, check_params, GeluPlacement, LayerParams, LinearSpec, Params};

/// What the last forward was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Forward {
    pub tokens: usize,
    pub train: bool,
    /// The input's address and length, to check the backward gets the same buffer.
    pub x: (u64, usize),
}

/// How an [`Mlp`] runs beside its layers and precision: given at creation
/// ([`Mlp::with_options`]; [`Mlp::new`] and [`Mlp::new_fp8`] take the defaults), read with
/// [`Mlp::options`]. Build from `MlpOptions::default()` (fields may be added).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MlpOptions {
    /// Where GELU-tanh layers apply the activation and its backward in tf32, f16 and bf16
    /// ([`GeluPlacement`]; default: both in cuBLASLt epilogues). FP8 and f32 layers keep
    /// gemmbridge's kernels whatever is set; the backward reads the saved pre-activation the
    /// same way whichever placement wrote it.
    pub gelu: GeluPlacement,
}

impl MlpOptions {
    /// These options with [`MlpOptions::gelu`] set.
    #[must_use = "returns new options; give them to Mlp::with_options"]
    pub fn gelu(mut self, gelu: GeluPlacement) -> Self {
        self.gelu = gelu;
        self
    }
}

/// A sequence of linear layers on the GPU, one dtype throughout (the precision's), parameters
/// and activations in device memory it owns, every call enqueued on [`Gpu::stream`] without a
/// host wait (except the `*_to_host` copies).
///
/// Per step: [`Mlp::forward`] (`train = true` keeps what the backward needs: every layer's
/// output and, for GELU layers, the pre-activation), the caller's loss gradient `dy`, then
/// [`Mlp::backward`] with the same input, then an update ([`Mlp::sgd_step`], or the caller's
/// own optimiser over [`Mlp::weight_grad`] / [`Mlp::bias_grad`]). The GEMMs per layer: one
/// forward, one weight gradient (bias gradient fused), one data gradient (the previous layer's
/// GELU-tanh backward fused, by default: [`MlpOptions::gelu`]); not the first layer's
/// data gradient unless `dx` is asked for.
///
/// Buffers for a token count are kept between steps and reallocated (stream-ordered) when it
/// changes.
///
/// FP8 layers ([`Mlp::new_fp8`]): the same calls, with every GEMM in FP8 and the tensors in
/// bf16 or f16 ([`crate::train::fp8`] says what is quantised how).
pub struct Mlp<T: Element> {
    pub(super) layers: Vec<LinearSpec>,
    pub(super) precision: Precision,
    /// FP8 layers: the recipe; `precision` is then the tensors' own (bf16 or f16), that of
    /// the bias-gradient GEMMs.
    pub(super) fp8: Option<Fp8Training>,
    /// How it runs ([`MlpOptions`]).
    pub(super) options: MlpOptions,
    pub(super) w: Vec<CudaSlice<T>>,
    pub(super) b: Vec<Option<CudaSlice<T>>>,
    pub(super) dw: Vec<CudaSlice<T>>,
    pub(super) db: Vec<Option<CudaSlice<T>>>,
    /// Per layer with a bias, under [`GradMode::Accumulate`](crate::train::GradMode::Accumulate):
    /// the fused bias gradient before it is added to `db`.
    pub(super) db_tmp: Vec<Option<CudaSlice<T>>>,
    pub(super) bufs: Option<Buffers<T>>,
    pub(super) last: Option<Forward>,
    /// The GEMM observer ([`Mlp::set_gemm_observer`]) and tuning ([`Mlp::autotune`]).
    pub(super) ins: Instruments,
}

impl<T: Element> Drop for Mlp<T> {
    /// The device buffers are freed with the thread's capture mode relaxed (see
    /// `RelaxedDrop`): a drop while another thread captures in global mode neither fails nor
    /// breaks that capture.
    fn drop(&mut self) {
        let _relaxed = Relaxed::enter();
        self.bufs = None;
        self.w.clear();
        self.b.clear();
        self.dw.clear();
        self.db.clear();
        self.db_tmp.clear();
    }
}

impl<T: Element> std::fmt::Debug for Mlp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlp")
            .field("layers", &self.layers)
            .field("precision", &self.precision)
            .field("tokens", &self.bufs.as_ref().map(|b| b.tokens))
            .finish()
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Uploads `params` (f32 on the host, rounded to T) for `layers`; gradients start at zero.
    ///
    /// # Errors
    /// [`Error::LayerShape`] when the layers do not chain or a parameter has the wrong length;
    /// [`Error::DTypeMismatch`] when T is not the precision's input dtype;
    /// [`Error::Unsupported`] for a precision whose output dtype differs from its input's
    /// (layers keep one dtype); [`Error::Driver`].
    pub fn new(gpu: &Gpu, layers: &[LinearSpec], precision: Precision, params: &[LayerParams]) -> Result<Mlp<T>> {
        Mlp::with_options(gpu, layers, precision, params, MlpOptions::default())
    }

    /// [`Mlp::new`] with `options` ([`MlpOptions`]: where GELU-tanh runs).
    ///
    /// # Errors
    /// As [`Mlp::new`].
    pub fn with_options(
        gpu: &Gpu,
        layers: &[LinearSpec],
        precision: Precision,
        params: &[LayerParams],
        options: MlpOptions,
    ) -> Result<Mlp<T>> {
        if T::DTYPE != precision.input() {
            return Err(Error::DTypeMismatch { operand: Which::A, expected: precision.input(), got: T::DTYPE });
        }
        if precision.output() != precision.input() {
            return Err(Error::Unsupported {
                backend: "the training layers",
                what: format!("precision {precision} (a layer's output feeds the next: one dtype throughout)"),
            });
        }
        Mlp::build(gpu, (layers, params), precision, None, options)
    }

    /// FP8 layers: uploads `params` (rounded to T, bf16 or f16) for `layers`, every GEMM of
    /// a step to run in FP8 by `recipe` ([`crate::train::fp8`]); gradients start at zero.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when T is neither bf16 nor f16; [`Error::LayerShape`] as
    /// [`Mlp::new`]; [`Error::Fp8`] when the recipe breaks an FP8 rule for a layer
    /// ([`Fp8Training::check`]) or this GPU / cuBLASLt does not offer its scalings;
    /// [`Error::Driver`].
    pub fn new_fp8(gpu: &Gpu, layers: &[LinearSpec], recipe: Fp8Training, params: &[LayerParams]) -> Result<Mlp<T>> {
        let precision = match T::DTYPE {
            DType::BF16 => Precision::BF16,
            DType::F16 => Precision::F16,
            d => {
                return Err(Error::Unsupported {
                    backend: "the FP8 training layers",
                    what: format!("{d} tensors (FP8 layers keep bf16 or f16 tensors)"),
                })
            }
        };
        Mlp::build(gpu, (layers, params), precision, Some(recipe), MlpOptions::default())
    }

    /// Checks and uploads (the part [`Mlp::new`] and [`Mlp::new_fp8`] share).
    fn build(
        gpu: &Gpu,
        (layers, params): (&[LinearSpec], &[LayerParams]),
        precision: Precision,
        fp8: Option<Fp8Training>,
        options: MlpOptions,
    ) -> Result<Mlp<T>> {
        check_layers(layers)?;
        check_params(layers, params)?;
        if let Some(r) = fp8 {
            for l in layers {
                r.check(T::DTYPE, l.bias)?;
            }
            gpu.check_fp8(r.x_scaling)?;
            gpu.check_fp8(r.w_scaling)?;
        }
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?; // uploads and allocations
        let up = |v: &[f32]| -> Result<CudaSlice<T>> {
            let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
            s.clone_htod(&host).map_err(status::driver("cuMemcpyHtoDAsync"))
        };
        let zeros = |n: usize| s.alloc_zeros::<T>(n.max(1)).map_err(status::driver("cuMemAllocAsync"));
        let mut mlp = Mlp {
            layers: layers.to_vec(),
            precision,
            fp8,
            options,
            w: Vec::new(),
            b: Vec::new(),
            dw: Vec::new(),
            db: Vec::new(),
            db_tmp: Vec::new(),
            bufs: None,
            last: None,
            ins: Instruments::default(),
        };
        for (l, p) in layers.iter().zip(params) {
            mlp.w.push(up(&p.w)?);
            mlp.b.push(if l.bias { Some(up(&p.b)?) } else { None });
            mlp.dw.push(zeros(p.w.len())?);
            mlp.db.push(if l.bias { Some(zeros(l.out_features)?) } else { None });
            mlp.db_tmp.push(None);
        }
        Ok(mlp)
    }

    /// The layers.
    pub fn layers(&self) -> &[LinearSpec] {
        &self.layers
    }

    /// The precision every GEMM runs in (FP8 layers: the tensors' precision, that of the
    /// bias-gradient GEMMs; see [`Mlp::fp8`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// FP8 layers' recipe; `None` for high-precision layers.
    pub fn fp8(&self) -> Option<Fp8Training> {
        self.fp8
    }

    /// The options it was made with ([`MlpOptions`]).
    pub fn options(&self) -> MlpOptions {
        self.options
    }

    /// The [`Error::TrainingOrder`] for a call that needs a forward (`what` it needs).
    pub(super) fn order_error(&self, what: &str) -> Error {
        Error::TrainingOrder { problem: what.to_string() }
    }

    /// What decides where each activation step runs.
    pub(super) fn placements(&self) -> Placements {
        Placements { precision: self.precision, fp8: self.fp8.is_some(), gelu: self.options.gelu }
    }

    /// Layer `i`'s weight `w[out, in]`. Panics if `i` is not a layer.
    pub fn weight(&self, i: usize) -> &CudaSlice<T> {
        &self.w[i]
    }

    /// Layer `i`'s bias `b[out]`, if it has one.
    pub fn bias(&self, i: usize) -> Option<&CudaSlice<T>> {
        self.b[i].as_ref()
    }

    /// Layer `i`'s weight gradient `dw[out, in]` from the last backward.
    pub fn weight_grad(&self, i: usize) -> &CudaSlice<T> {
        &self.dw[i]
    }

    /// Layer `i`'s bias gradient `db[out]` from the last backward.
    pub fn bias_grad(&self, i: usize) -> Option<&CudaSlice<T>> {
        self.db[i].as_ref()
    }

    /// The parameters, copied to the host as f32 (waits for the stream).
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn params_to_host(&self, gpu: &Gpu) -> Result<Params> {
        to_host(gpu, &self.w, &self.b)
    }

    /// The gradients of the last backward, copied to the host as f32 (waits for the stream).
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn grads_to_host(&self, gpu: &Gpu) -> Result<Params> {
        to_host(gpu, &self.dw, &self.db)
    }

    /// The last forward's output `y[tokens, out]` (a view of the layers' own buffer: valid
    /// until the next forward).
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] before any forward.
    pub fn output(&self) -> Result<CudaView<'_, T>> {
        let (Some(f), Some(bufs)) = (self.last, self.bufs.as_ref()) else {
            return Err(self.order_error("no forward has run yet"));
        };
        let last = self.layers.len() - 1;
        Ok(bufs.out[last].slice(..f.tokens * self.layers[last].out_features))
    }

    /// Plain SGD on [`Gpu::stream`]: `w -= lr·dw`, `b -= lr·db` for every layer (cuBLAS
    /// `axpy`, f32 arithmetic, rounded to T).
    ///
    /// # Errors
    /// [`Error::Cublas`], [`Error::Driver`].
    pub fn sgd_step(&mut self, gpu: &Gpu, lr: f32) -> Result<()> {
        let s = gpu.stream();
        let pairs = self.w.iter_mut().zip(&self.dw);
        let bias_pairs = self.b.iter_mut().zip(&self.db).filter_map(|(p, g)| Some((p.as_mut()?, g.as_ref()?)));
        for (p, g) in pairs.chain(bias_pairs) {
            let n = p.len();
            let (pg, _gg) = g.device_ptr(s);
            let (pp, _gp) = p.device_ptr_mut(s);
            // SAFETY: parameter and gradient hold n elements of T each, distinct allocations.
            unsafe { gpu.enqueue_axpy(T::DTYPE, n, -lr, pg, pp) }?;
        }
        Ok(())
    }
}
