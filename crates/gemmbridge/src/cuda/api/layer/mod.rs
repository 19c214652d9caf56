//! [`GpuDecoderLayer`]: the decoder layer of [`crate::layer`] on the GPU, a client of the
//! entries — every projection and its backward an ordinary [`Gpu::gemm_fused`] (the residual
//! adds as the GEMM's separate C, [`crate::cuda::Extras::c_in`]), attention on cuDNN with q,
//! k, v read in place from the fused projection's output and dq, dk, dv written into one
//! fused gradient ([`Gpu::attention_backward_packed`]). The state and buffers are here, the
//! step in `forward.rs` and `backward.rs`, and the steps that are not GEMMs or attention
//! (RMSNorm, RoPE, SwiGLU) in `steps.rs`.
//!
//! # Not wired yet
//! RMSNorm, RoPE and SwiGLU have no GPU entry in this crate yet: each of their six steps
//! (`steps.rs`: `norm_forward`, `norm_backward`, `rope`, `swiglu_forward`,
//! `swiglu_backward`) answers [`Error::Unsupported`] naming the step, so [`GpuDecoderLayer::forward`]
//! and [`GpuDecoderLayer::backward`] fail by name at their first such step, before anything
//! after it is enqueued. The GEMMs, attention, residual adds and every buffer are in place.

mod backward;
mod forward;
mod steps;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use crate::cuda::api::engine::Gpu;
use crate::cuda::device::{Relaxed, RelaxedDrop};
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, Which};
use crate::layer::reference::Weights;
use crate::layer::{DecoderLayer, LayerWeight, Tokens};
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::train::GradMode;

pub use steps::NOT_WIRED;

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
    /// The first norm's `1/sqrt(mean(x²) + eps)`, `[T]`, f32.
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

/// The GEMM problems of a step, made once.
pub(super) struct Problems {
    pub qkv: GemmProblem,
    pub o: GemmProblem,
    pub gate_up: GemmProblem,
    pub down: GemmProblem,
    /// Data gradients `dX = dY·W`, in the same order.
    pub dx: [GemmProblem; 4],
    /// Weight gradients `dW = dYᵀ·X`, in the same order.
    pub dw: [GemmProblem; 4],
}

impl Problems {
    fn new(l: &DecoderLayer, t: Tokens, prec: Precision) -> Result<Problems> {
        let (n, d, f, wq, qw) = (t.count(), l.d_model, l.ffn, l.qkv_width(), l.q_width());
        // (out, in) of each projection, in the order qkv, o, gate_up, down
        let io = [(wq, d), (d, qw), (2 * f, d), (d, f)];
        let fwd = |(o, i): (usize, usize)| GemmProblem::linear(n, o, i, prec);
        let dx = |(o, i): (usize, usize)| GemmProblem::matmul(n, i, o, prec);
        let dw = |(o, i): (usize, usize)| {
            use crate::layout::{MatrixLayout as M, Operand};
            GemmProblem::new(
                Operand::t(M::row_major(n, o)),
                Operand::n(M::row_major(n, i)),
                M::row_major(o, i),
                1,
                prec,
            )
        };
        Ok(Problems {
            qkv: fwd(io[0])?,
            o: fwd(io[1])?,
            gate_up: fwd(io[2])?,
            down: fwd(io[3])?,
            dx: [dx(io[0])?, dx(io[1])?, dx(io[2])?, dx(io[3])?],
            dw: [dw(io[0])?, dw(io[1])?, dw(io[2])?, dw(io[3])?],
        })
    }
}

/// What the last forward was: its input's address and length, and whether it kept what the
/// backward reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LastForward {
    pub x: (u64, usize),
    pub train: bool,
}

/// One decoder layer ([`crate::layer`] defines it) on the GPU for a fixed token batch, in `T`
/// (bf16 or f16; every GEMM in that precision with f32 accumulation): its weights, their
/// gradients, every activation the backward reads and every gradient buffer, allocated at
/// construction, where every GEMM and attention plan is also made
/// ([`GpuDecoderLayer::new`]). A step — [`GpuDecoderLayer::forward`], then with `train`
/// [`GpuDecoderLayer::backward`] on the same input — allocates no device memory and never waits for
/// the host, so it can be captured into one CUDA graph (a padded GEMM's scratch, for widths
/// off 16 bytes, is a stream-ordered allocation, which a capture takes as a graph node).
///
/// Not complete: see the module's "Not wired yet".
pub struct GpuDecoderLayer<T: Element> {
    pub(super) layer: DecoderLayer,
    pub(super) tokens: Tokens,
    pub(super) precision: Precision,
    pub(super) grad_mode: GradMode,
    pub(super) problems: Problems,
    // every device buffer is freed with the thread's capture mode relaxed (as `Mlp`'s)
    pub(super) w: RelaxedDrop<Params<T>>,
    pub(super) dw: RelaxedDrop<Params<T>>,
    pub(super) acts: RelaxedDrop<Acts<T>>,
    pub(super) grads: RelaxedDrop<GradBufs<T>>,
    pub(super) last: Option<LastForward>,
}

impl<T: Element> std::fmt::Debug for GpuDecoderLayer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoderLayer")
            .field("layer", &self.layer)
            .field("tokens", &self.tokens)
            .field("precision", &self.precision)
            .finish()
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecoderLayer<T> {
    /// Uploads `weights` (f64 on the host, rounded to T) of `layer` for `tokens`, allocates
    /// every buffer (zeros) and plans every GEMM and attention call of a step by running it
    /// once on those buffers (so later steps only launch); waits for the stream.
    ///
    /// # Errors
    /// As [`DecoderLayer::check_tokens`] and [`Weights::check`]; [`Error::DTypeMismatch`]
    /// when T is not the layer's dtype; from the planning runs, as [`Gpu::gemm_fused`] and
    /// [`Gpu::attention_forward`]; [`Error::Driver`].
    pub fn new(gpu: &Gpu, layer: DecoderLayer, tokens: Tokens, weights: &Weights) -> Result<GpuDecoderLayer<T>> {
        layer.check_tokens(tokens)?;
        weights.check(&layer)?;
        if T::DTYPE != layer.dtype {
            return Err(Error::DTypeMismatch { operand: Which::A, expected: layer.dtype, got: T::DTYPE });
        }
        let precision = if layer.dtype == DType::F16 { Precision::F16 } else { Precision::BF16 };
        let problems = Problems::new(&layer, tokens, precision)?;
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?;
        let zeros = |n: usize| s.alloc_zeros::<T>(n).map_err(status::driver("cuMemAllocAsync"));
        let zeros32 = |n: usize| s.alloc_zeros::<f32>(n).map_err(status::driver("cuMemAllocAsync"));
        let up = |w: LayerWeight| {
            let host: Vec<T> = weights.get(w).iter().map(|&v| T::from_f64(v)).collect();
            s.clone_htod(&host).map_err(status::driver("cuMemcpyHtoDAsync"))
        };
        let (n, d, f, wq, qw) = (tokens.count(), layer.d_model, layer.ffn, layer.qkv_width(), layer.q_width());
        let stats = layer.attention(tokens).stats_elems();
        let acts = Acts {
            h1: zeros(n * d)?,
            rstd1: zeros32(n)?,
            qkv: zeros(n * wq)?,
            o: zeros(n * qw)?,
            lse: zeros32(stats)?,
            x2: zeros(n * d)?,
            h2: zeros(n * d)?,
            rstd2: zeros32(n)?,
            gu: zeros(n * 2 * f)?,
            act: zeros(n * f)?,
            y: zeros(n * d)?,
        };
        let grads = GradBufs {
            d_act: zeros(n * f)?,
            d_gu: zeros(n * 2 * f)?,
            dh: zeros(n * d)?,
            dx2: zeros(n * d)?,
            d_o: zeros(n * qw)?,
            dqkv: zeros(n * wq)?,
            dx: zeros(n * d)?,
        };
        let (w, dw) = (Params::try_new(up)?, Params::try_new(|w| zeros(layer.weight_len(w)))?);
        let mut me = GpuDecoderLayer {
            layer,
            tokens,
            precision,
            grad_mode: GradMode::Overwrite,
            problems,
            w: RelaxedDrop::new(w),
            dw: RelaxedDrop::new(dw),
            acts: RelaxedDrop::new(acts),
            grads: RelaxedDrop::new(grads),
            last: None,
        };
        me.prewarm(gpu)?;
        s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        Ok(me)
    }

    /// The layer.
    pub fn layer(&self) -> &DecoderLayer {
        &self.layer
    }

    /// The precision of every GEMM (the layer's dtype, f32 accumulation).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The tokens every step runs on.
    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// Whether a backward overwrites the weight gradients or adds to them (default:
    /// overwrite; accumulation runs the weight-gradient GEMMs with β = 1).
    pub fn set_grad_mode(&mut self, mode: GradMode) {
        self.grad_mode = mode;
    }

    /// A weight, in its [`LayerWeight`] layout.
    pub fn weight(&self, w: LayerWeight) -> &CudaSlice<T> {
        self.w.get(w)
    }

    /// A weight's gradient from the last backward, in the weight's layout.
    pub fn weight_grad(&self, w: LayerWeight) -> &CudaSlice<T> {
        self.dw.get(w)
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
    /// [`Error::Driver`].
    pub fn grads_to_host(&self, gpu: &Gpu) -> Result<Weights> {
        let mut out = Weights::default();
        for w in LayerWeight::ALL {
            *out.get_mut(w) = to_host(gpu, self.dw.get(w))?;
        }
        Ok(out)
    }
}

/// A device buffer copied to the host as f64 (waits for the stream).
///
/// # Errors
/// [`Error::Driver`].
pub fn to_host<T: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<T>) -> Result<Vec<f64>> {
    let host = gpu.stream().clone_dtoh(v).map_err(status::driver("cuMemcpyDtoH"))?;
    Ok(host.iter().map(|x| x.to_f64()).collect())
}
