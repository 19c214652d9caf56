//! [`GpuDecoderLayer`]: the decoder layer of [`crate::layer`] on the GPU, a client of the
//! entries — every projection and its backward an ordinary [`Gpu::gemm_fused`] (the residual
//! adds as the GEMM's separate C, [`crate::cuda::Extras::c_in`]), attention on cuDNN with q,
//! k, v read in place from the fused projection's output and dq, dk, dv written into one
//! fused gradient ([`GpuAttention::backward_packed`](crate::cuda::GpuAttention::backward_packed)), RMSNorm on cuDNN
//! ([`Gpu::rms_norm_forward`], [`Gpu::rms_norm_backward`]), RoPE and SwiGLU on gemmbridge's
//! own kernels ([`Gpu::rope`], [`Gpu::swiglu`], [`Gpu::swiglu_backward`]); optionally the four
//! forward projections in FP8 ([`crate::layer::LayerOptions::fp8_forward`]). The state and buffers are here,
//! the step in `forward.rs` and `backward.rs`, the RMSNorm, RoPE and SwiGLU calls in
//! `steps.rs`, the FP8 projections in `fp8.rs`. [`GpuDecodeStep`] (`decode.rs`) is the layer's
//! decode step over a paged KV cache, made of the same calls.
//!
//! # What a step moves besides the GEMMs and attention
//! Forward: the two norms (read `x`, write `h` and the f32 inverse RMS), RoPE in place on q and
//! k, SwiGLU (read `gu`, write `act`); the residuals are the O and down GEMMs' C. Backward:
//! SwiGLU's backward, the two norms' backward, RoPE's backward in place on dq and dk, and two
//! residual adds (`dx2 += dy`, `dx += dx2`: cuBLAS `axpy`, each reading two `[T, d]` tensors
//! and writing one) — cuDNN's norm backward has no fused add of a residual gradient, and no
//! GEMM writes a sum with `dy` or `dx2` (each norm's backward comes last on its branch).

mod backward;
mod decode;
mod forward;
mod fp8;
mod steps;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

pub use decode::GpuDecodeStep;

use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{Relaxed, RelaxedDrop};
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;
use crate::fp8::Scaling;
use crate::layer::reference::Weights;
use crate::layer::{DecoderLayer, LayerGemms, LayerOptions, LayerWeight, Tokens};
use crate::norm::GradType;
use crate::train::GradMode;

/// The six weights (or their gradients) on the device, each in its [`LayerWeight`] layout.
pub(super) struct Params<T> {
    pub qkv: CudaSlice<T>,
    pub o: CudaSlice<T>,
    pub gate_up: CudaSlice<T>,
    pub down: CudaSlice<T>,
    pub norm1: CudaSlice<T>,
    pub norm2: CudaSlice<T>,
}

impl<T> Params<T> {
    fn get(&self, w: LayerWeight) -> &CudaSlice<T> {
        match w {
            LayerWeight::Qkv => &self.qkv,
            LayerWeight::O => &self.o,
            LayerWeight::GateUp => &self.gate_up,
            LayerWeight::Down => &self.down,
            LayerWeight::Norm1 => &self.norm1,
            LayerWeight::Norm2 => &self.norm2,
        }
    }

    fn get_mut(&mut self, w: LayerWeight) -> &mut CudaSlice<T> {
        match w {
            LayerWeight::Qkv => &mut self.qkv,
            LayerWeight::O => &mut self.o,
            LayerWeight::GateUp => &mut self.gate_up,
            LayerWeight::Down => &mut self.down,
            LayerWeight::Norm1 => &mut self.norm1,
            LayerWeight::Norm2 => &mut self.norm2,
        }
    }

    /// Every weight of `weights` (f64 on the host) rounded to `T` and copied to the device.
    fn upload(gpu: &Gpu, weights: &Weights) -> Result<Params<T>>
    where
        T: Element + DeviceRepr,
    {
        Params::try_new(|w| {
            let host: Vec<T> = weights.get(w).iter().map(|&v| T::from_f64(v)).collect();
            gpu.stream().clone_htod(&host).map_err(status::driver("cuMemcpyHtoDAsync"))
        })
    }

    /// Each weight made by `f(weight)`.
    fn try_new(mut f: impl FnMut(LayerWeight) -> Result<CudaSlice<T>>) -> Result<Params<T>> {
        use LayerWeight::*;
        Ok(Params { qkv: f(Qkv)?, o: f(O)?, gate_up: f(GateUp)?, down: f(Down)?, norm1: f(Norm1)?, norm2: f(Norm2)? })
    }
}

/// What the forward writes (and the backward reads), `T = b·s` tokens: every buffer
/// allocated at construction.
pub(super) struct Acts<T> {
    /// `h1 = rms_norm(x)∘w_norm1`, `[T, d]`.
    pub h1: CudaSlice<T>,
    /// The first norm's `1/sqrt(mean(x²) + eps)`, `[T]`, f32 (written by a training forward).
    pub rstd1: CudaSlice<f32>,
    /// `qkv[T, (h_q + 2·h_kv)·hd]`, after RoPE (in place).
    pub qkv: CudaSlice<T>,
    /// Attention's output `o[T, h_q·hd]`.
    pub o: CudaSlice<T>,
    /// Attention's statistics `lse[b, h_q, s]`, f32 (written by a training forward).
    pub lse: CudaSlice<f32>,
    /// `x2 = x + o·w_oᵀ`, `[T, d]`.
    pub x2: CudaSlice<T>,
    /// `h2 = rms_norm(x2)∘w_norm2`, `[T, d]`.
    pub h2: CudaSlice<T>,
    /// The second norm's, `[T]`, f32.
    pub rstd2: CudaSlice<f32>,
    /// `gu[T, 2·ffn]`, gate columns first.
    pub gu: CudaSlice<T>,
    /// `a = silu(gate)∘up`, `[T, ffn]`.
    pub act: CudaSlice<T>,
    /// The output `y = x2 + a·w_downᵀ`, `[T, d]`.
    pub y: CudaSlice<T>,
}

/// What the backward writes: the gradients of the activations, `dx` last.
pub(super) struct GradBufs<T> {
    /// `da = dy·w_down`, `[T, ffn]`.
    pub d_act: CudaSlice<T>,
    /// `dgu[T, 2·ffn]` (SwiGLU's backward).
    pub d_gu: CudaSlice<T>,
    /// `dh2 = dgu·w_gate_up`, `[T, d]`; also `dh1 = dqkv·w_qkv` (never live together).
    pub dh: CudaSlice<T>,
    /// `dx2 = dy + norm2's backward(dh2)`, `[T, d]`.
    pub dx2: CudaSlice<T>,
    /// `do = dx2·w_o`, `[T, h_q·hd]`.
    pub d_o: CudaSlice<T>,
    /// `dqkv[T, (h_q + 2·h_kv)·hd]`: dq, dk, dv as attention writes them, then RoPE's backward.
    pub dqkv: CudaSlice<T>,
    /// `dx = dx2 + norm1's backward(dh1)`, `[T, d]`.
    pub dx: CudaSlice<T>,
}

/// The norms' weight gradients where cuDNN writes them in f32, and the scratch a
/// [`GradMode::Accumulate`] backward writes each norm's gradient into before adding it.
pub(super) struct NormGrads<T> {
    /// `dw_norm1`, `dw_norm2` in f32 (`[d]` each; used when the norms' `dw` is f32).
    pub f32: [CudaSlice<f32>; 2],
    /// `[d]` f32 scratch.
    pub scratch_f32: CudaSlice<f32>,
    /// `[d]` scratch in the I/O type.
    pub scratch_io: CudaSlice<T>,
}

/// What the last forward was: its input's address and length, and whether it kept what the
/// backward reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LastForward {
    pub x: (u64, usize),
    pub train: bool,
}

/// A weight's gradient on the device ([`GpuDecoderLayer::weight_grad`]): the projections' in
/// the layer's dtype; the norms' in f32 where the loaded cuDNN writes an f32 `dw` beside
/// f16/bf16 I/O, else in the layer's dtype ([`GpuDecoderLayer::norm_grad_type`]).
#[derive(Clone, Copy, Debug)]
pub enum WeightGrad<'a, T> {
    /// In the layer's dtype.
    Io(&'a CudaSlice<T>),
    /// In f32.
    F32(&'a CudaSlice<f32>),
}

/// One decoder layer ([`crate::layer`] defines it) on the GPU for a fixed token batch, in `T`
/// (bf16 or f16; every GEMM in that precision with f32 accumulation, or the forward's in FP8,
/// [`LayerOptions`]): its weights, their gradients, every activation the backward reads and
/// every gradient buffer, allocated at construction, where every plan (GEMMs, attention, the
/// norms) is also made and gemmbridge's kernels compiled ([`GpuDecoderLayer::new`]). A step —
/// [`GpuDecoderLayer::forward`], then with `train` [`GpuDecoderLayer::backward`] on the same
/// input — enqueues launches on [`Gpu::stream`] only: no host wait and no device allocation
/// (except stream-ordered ones, which a capture takes as graph nodes: a GEMM's padded copies
/// where a width is off 16 bytes, and with tensor-wise FP8 each quantisation's 4-byte amax), so
/// after one eager step it can be captured into one CUDA graph (with cudarc's event tracking
/// off, as any capture of cudarc buffers).
///
/// ```no_run
/// use gemmbridge::cuda::layer::GpuDecoderLayer;
/// use gemmbridge::cuda::Gpu;
/// use gemmbridge::half::bf16;
/// use gemmbridge::layer::reference::Weights;
/// use gemmbridge::layer::{DecoderLayer, Tokens};
///
/// let gpu = Gpu::new(0)?;
/// let (l, t) = (DecoderLayer::llama3_8b(), Tokens { b: 2, s: 4096 });
/// let w = Weights::from_fn(&l, |_, _| 0.01)?;
/// let mut layer = GpuDecoderLayer::<bf16>::new(&gpu, l, t, &w)?;
/// let s = gpu.stream();
/// let x = s.alloc_zeros::<bf16>(t.count() * l.d_model)?;
/// let dy = s.alloc_zeros::<bf16>(t.count() * l.d_model)?;
/// layer.forward(&gpu, &x, true)?; // y in layer.output()
/// layer.backward(&gpu, &x, &dy)?; // dx in layer.input_grad(), dW in layer.weight_grad(..)
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuDecoderLayer<T: Element> {
    pub(super) layer: DecoderLayer,
    pub(super) tokens: Tokens,
    pub(super) grad_mode: GradMode,
    pub(super) gemms: LayerGemms,
    /// The type of the norms' weight gradients (chosen at construction).
    pub(super) norm_dw: GradType,
    // every device buffer is freed with the thread's capture mode relaxed (as `Mlp`'s)
    pub(super) w: RelaxedDrop<Params<T>>,
    pub(super) dw: RelaxedDrop<Params<T>>,
    pub(super) norm_grads: RelaxedDrop<NormGrads<T>>,
    pub(super) acts: RelaxedDrop<Acts<T>>,
    pub(super) grads: RelaxedDrop<GradBufs<T>>,
    pub(super) fp8: Option<fp8::Fp8State>,
    pub(super) last: Option<LastForward>,
}

impl<T: Element> std::fmt::Debug for GpuDecoderLayer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoderLayer")
            .field("layer", &self.layer)
            .field("tokens", &self.tokens)
            .field("norm_dw", &self.norm_dw)
            .field("fp8_forward", &self.fp8.as_ref().map(|f| f.scaling))
            .finish()
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecoderLayer<T> {
    /// [`GpuDecoderLayer::with_options`] with the default options (every GEMM in `T`).
    ///
    /// # Errors
    /// As [`GpuDecoderLayer::with_options`].
    pub fn new(gpu: &Gpu, layer: DecoderLayer, tokens: Tokens, weights: &Weights) -> Result<GpuDecoderLayer<T>> {
        GpuDecoderLayer::with_options(gpu, (layer, tokens), weights, LayerOptions::default())
    }

    /// Uploads `weights` (f64 on the host, rounded to T) of `layer` for `tokens`, allocates
    /// every buffer, chooses the norms' weight-gradient type (f32 where the loaded cuDNN takes
    /// it, else T: [`GpuDecoderLayer::norm_grad_type`]) and runs one inference forward and one
    /// training step on zeros, so that every plan exists and every kernel is compiled (later
    /// steps only launch); the weight gradients are zeroed after; waits for the stream.
    ///
    /// # Errors
    /// As [`DecoderLayer::check_tokens`] and [`Weights::check`]; [`crate::Error::DTypeMismatch`]
    /// when T is not the layer's dtype; with FP8, [`crate::Error::Fp8`] where the GPU or cuBLASLt
    /// does not offer the recipe (or it is neither tensor- nor row-wise) or a width breaks an
    /// FP8 rule; from the planning step, as [`Gpu::gemm_fused`], [`GpuAttention::forward`](crate::cuda::GpuAttention::forward),
    /// [`Gpu::rms_norm_forward`], [`Gpu::rope`] (e.g. [`crate::Error::Unsupported`] where cuDNN has
    /// no engine); [`crate::Error::Driver`].
    pub fn with_options(
        gpu: &Gpu,
        (layer, tokens): (DecoderLayer, Tokens),
        weights: &Weights,
        options: LayerOptions,
    ) -> Result<GpuDecoderLayer<T>> {
        layer.check_tokens(tokens)?;
        weights.check(&layer)?;
        layer.check_element::<T>()?;
        let gemms = layer.gemms(tokens, layer.precision())?;
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?;
        let w = Params::upload(gpu, weights)?;
        let fp8 = match options.fp8_forward {
            Some(scaling) => Some(fp8::Fp8State::new(gpu, &layer, tokens, &w, scaling)?),
            None => None,
        };
        let mut me = GpuDecoderLayer {
            layer,
            tokens,
            grad_mode: GradMode::Overwrite,
            gemms,
            norm_dw: GradType::F32,
            w: RelaxedDrop::new(w),
            dw: RelaxedDrop::new(Params::try_new(|w| zeros(gpu, layer.weight_len(w)))?),
            norm_grads: RelaxedDrop::new(NormGrads {
                f32: [zeros(gpu, layer.d_model)?, zeros(gpu, layer.d_model)?],
                scratch_f32: zeros(gpu, layer.d_model)?,
                scratch_io: zeros(gpu, layer.d_model)?,
            }),
            acts: RelaxedDrop::new(Acts::new(gpu, &layer, tokens)?),
            grads: RelaxedDrop::new(GradBufs::new(gpu, &layer, tokens)?),
            fp8,
            last: None,
        };
        me.norm_dw = me.choose_norm_dw(gpu)?;
        me.prewarm(gpu)?;
        s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        Ok(me)
    }

    /// The layer.
    pub fn layer(&self) -> &DecoderLayer {
        &self.layer
    }

    /// The tokens every step runs on.
    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// The FP8 recipe of the forward projections, if they run in FP8.
    pub fn fp8_forward(&self) -> Option<Scaling> {
        self.fp8.as_ref().map(|f| f.scaling)
    }

    /// The type the norms' weight gradients are written in: [`GradType::F32`] where the loaded
    /// cuDNN's RMSNorm backward takes an f32 `dw` beside f16/bf16 I/O (`gemmbridge probe
    /// --only norm` tells), else [`GradType::Io`] (chosen at construction by asking cuDNN for
    /// the f32 plan; its refusal is logged at `info`).
    pub fn norm_grad_type(&self) -> GradType {
        self.norm_dw
    }

    /// Whether a backward overwrites the weight gradients or adds to them (default:
    /// overwrite; accumulation runs the weight-gradient GEMMs with β = 1, and adds each norm's
    /// gradient, written to a scratch buffer, with `axpy`).
    pub fn set_grad_mode(&mut self, mode: GradMode) {
        self.grad_mode = mode;
    }

    /// A weight, in its [`LayerWeight`] layout.
    pub fn weight(&self, w: LayerWeight) -> &CudaSlice<T> {
        self.w.get(w)
    }

    /// A weight's gradient from the last backward (or the sum of the backwards since
    /// construction under [`GradMode::Accumulate`]), in the weight's layout.
    pub fn weight_grad(&self, w: LayerWeight) -> WeightGrad<'_, T> {
        match (w, self.norm_dw) {
            (LayerWeight::Norm1, GradType::F32) => WeightGrad::F32(&self.norm_grads.f32[0]),
            (LayerWeight::Norm2, GradType::F32) => WeightGrad::F32(&self.norm_grads.f32[1]),
            _ => WeightGrad::Io(self.dw.get(w)),
        }
    }

    /// The last forward's output `y[T, d]` (valid until the next forward).
    pub fn output(&self) -> &CudaSlice<T> {
        &self.acts.y
    }

    /// The last backward's input gradient `dx[T, d]`.
    pub fn input_grad(&self) -> &CudaSlice<T> {
        &self.grads.dx
    }

    /// The weight gradients copied to the host as f64 (waits for the stream).
    ///
    /// # Errors
    /// [`crate::Error::Driver`].
    pub fn grads_to_host(&self, gpu: &Gpu) -> Result<Weights> {
        let mut out = Weights::default();
        for w in LayerWeight::ALL {
            *out.get_mut(w) = match self.weight_grad(w) {
                WeightGrad::Io(v) => to_host(gpu, v)?,
                WeightGrad::F32(v) => to_host(gpu, v)?,
            };
        }
        Ok(out)
    }
}

/// `n` zeros of `V` on the engine's stream.
fn zeros<V: DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, n: usize) -> Result<CudaSlice<V>> {
    gpu.stream().alloc_zeros::<V>(n).map_err(status::driver("cuMemAllocAsync"))
}

impl<T: DeviceRepr + ValidAsZeroBits> Acts<T> {
    fn new(gpu: &Gpu, l: &DecoderLayer, t: Tokens) -> Result<Acts<T>> {
        let (n, d, f) = (t.count(), l.d_model, l.ffn);
        Ok(Acts {
            h1: zeros(gpu, n * d)?,
            rstd1: zeros(gpu, n)?,
            qkv: zeros(gpu, n * l.qkv_width())?,
            o: zeros(gpu, n * l.q_width())?,
            lse: zeros(gpu, l.attention(t).stats_elems())?,
            x2: zeros(gpu, n * d)?,
            h2: zeros(gpu, n * d)?,
            rstd2: zeros(gpu, n)?,
            gu: zeros(gpu, n * 2 * f)?,
            act: zeros(gpu, n * f)?,
            y: zeros(gpu, n * d)?,
        })
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> GradBufs<T> {
    fn new(gpu: &Gpu, l: &DecoderLayer, t: Tokens) -> Result<GradBufs<T>> {
        let (n, d, f) = (t.count(), l.d_model, l.ffn);
        Ok(GradBufs {
            d_act: zeros(gpu, n * f)?,
            d_gu: zeros(gpu, n * 2 * f)?,
            dh: zeros(gpu, n * d)?,
            dx2: zeros(gpu, n * d)?,
            d_o: zeros(gpu, n * l.q_width())?,
            dqkv: zeros(gpu, n * l.qkv_width())?,
            dx: zeros(gpu, n * d)?,
        })
    }
}

/// A device buffer copied to the host as f64 (waits for the stream).
///
/// # Errors
/// [`crate::Error::Driver`].
pub fn to_host<V: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<V>) -> Result<Vec<f64>> {
    let host = gpu.stream().clone_dtoh(v).map_err(status::driver("cuMemcpyDtoH"))?;
    Ok(host.iter().map(|x| x.to_f64()).collect())
}
