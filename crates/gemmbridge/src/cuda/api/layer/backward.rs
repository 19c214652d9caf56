//! The layer's backward.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::forward::saved;
use super::steps::{self, NormBackward, Rope, SwigluBackward};
use super::GpuDecoderLayer;
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::operands::Extras;
use crate::cuda::call::Scale;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::problem::GemmProblem;
use crate::train::GradMode;

/// `c = a·b` (or `+=`, β) with no epilogue: one of the backward's GEMMs.
fn gemm<T: Element>(
    gpu: &Gpu,
    p: &GemmProblem,
    beta: f32,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    c: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    gpu.gemm_fused(p, Scale::new(1.0, beta), a, b, c, Extras::default())
}

/// `y += x` over `y`'s elements (cuBLAS `axpy`, f32 arithmetic): a residual's gradient added
/// to the gradient through its branch.
fn add_into<T: Element>(gpu: &Gpu, x: &dyn DevicePtr<T>, y: &mut CudaSlice<T>) -> Result<()> {
    let s = gpu.stream();
    let n = y.len();
    let (px, _gx) = x.device_ptr(s);
    let (py, _gy) = y.device_ptr_mut(s);
    // SAFETY: both hold n elements of T (the caller's x was checked to hold T·d, as y does),
    // distinct buffers.
    unsafe { gpu.enqueue_axpy(T::DTYPE, n, 1.0, px, py) }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecoderLayer<T> {
    /// The backward from `dy[T, d]`, after a training forward on the same `x` (unchanged since):
    /// `dx` in [`GpuDecoderLayer::input_grad`], every weight's gradient in
    /// [`GpuDecoderLayer::weight_grad`] (overwritten, or added to under
    /// [`GradMode::Accumulate`]). No device allocation, no host wait.
    ///
    /// The step, in order: `dW_down = dyᵀ·act`, `d_act = dy·w_down`, SwiGLU's backward
    /// (`→ d_gu`), `dW_gate_up = d_guᵀ·h2`, `dh2 = d_gu·w_gate_up`, norm 2's backward
    /// (`→ dx2`, `dw_norm2`), `dx2 += dy` (`axpy`), `dW_o = dx2ᵀ·o`, `do = dx2·w_o`,
    /// attention's backward into the fused `dqkv`, RoPE's backward on it, `dW_qkv = dqkvᵀ·h1`,
    /// `dh1 = dqkv·w_qkv`, norm 1's backward (`→ dx`, `dw_norm1`), `dx += dx2` (`axpy`).
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] without a training forward on this `x` (same address and
    /// length); [`Error::DecoderShape`] for `dy` too short; [`Error::Unsupported`] from a step
    /// not wired yet ([`super::NOT_WIRED`]); as the GEMM and attention entries.
    pub fn backward<X: DevicePtr<T>, D: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X, dy: &D) -> Result<()> {
        let (l, n) = (self.layer, self.tokens.count());
        let want = n * l.d_model * T::DTYPE.size_bytes();
        if dy.num_bytes() < want {
            let detail = format!("{} bytes, expected {want} ({n} tokens of {})", dy.num_bytes(), l.d_model);
            return Err(Error::DecoderShape { what: "the output gradient dy is too short", detail });
        }
        let here = (x.device_ptr(gpu.stream()).0, x.num_bytes());
        match self.last {
            Some(f) if f.train && f.x == here => {}
            _ => {
                let problem =
                    "the decoder layer's backward needs a training forward (train = true) on the same x".into();
                return Err(Error::TrainingOrder { problem });
            }
        }
        let (rows, d, ffn, acc) = (n, l.d_model, l.ffn, self.grad_mode == GradMode::Accumulate);
        self.down_backward(gpu, dy)?;
        let (a, g) = (&*self.acts, &mut *self.grads);
        steps::swiglu_backward(gpu, SwigluBackward { gu: &a.gu, d_act: &g.d_act, d_gu: &mut g.d_gu, rows, ffn })?;
        self.gate_up_backward(gpu)?;
        let (a, g) = (&*self.acts, &mut *self.grads);
        let norm2 = NormBackward {
            which: "the second RMSNorm",
            x: &a.x2,
            weight: &self.w.norm2,
            rstd: &a.rstd2,
            dh: &g.dh,
            dx: &mut g.dx2,
            d_weight: &mut self.dw.norm2,
            accumulate: acc,
            rows,
            d,
        };
        steps::norm_backward(gpu, norm2)?;
        add_into(gpu, dy, &mut self.grads.dx2)?;
        self.o_backward(gpu)?;
        self.attention_backward(gpu)?;
        steps::rope(gpu, Rope { qkv: &mut self.grads.dqkv, layer: l, tokens: self.tokens, inverse: true })?;
        self.qkv_backward(gpu)?;
        let (a, g) = (&*self.acts, &mut *self.grads);
        let norm1 = NormBackward {
            which: "the first RMSNorm",
            x,
            weight: &self.w.norm1,
            rstd: &a.rstd1,
            dh: &g.dh,
            dx: &mut g.dx,
            d_weight: &mut self.dw.norm1,
            accumulate: acc,
            rows,
            d,
        };
        steps::norm_backward(gpu, norm1)?;
        let g = &mut *self.grads;
        add_into(gpu, &g.dx2, &mut g.dx)
    }

    /// β of the weight-gradient GEMMs.
    fn dw_beta(&self) -> f32 {
        if self.grad_mode == GradMode::Accumulate {
            1.0
        } else {
            0.0
        }
    }

    /// `dW_down (+)= dyᵀ·act`, `d_act = dy·w_down`.
    fn down_backward(&mut self, gpu: &Gpu, dy: &impl DevicePtr<T>) -> Result<()> {
        let beta = self.dw_beta();
        let (p, a, g) = (&self.problems, &*self.acts, &mut *self.grads);
        gemm(gpu, &p.dw[3], beta, dy, &a.act, &mut self.dw.down)?;
        gemm(gpu, &p.dx[3], 0.0, dy, &self.w.down, &mut g.d_act)
    }

    /// `dW_gate_up (+)= d_guᵀ·h2`, `dh2 = d_gu·w_gate_up`.
    fn gate_up_backward(&mut self, gpu: &Gpu) -> Result<()> {
        let beta = self.dw_beta();
        let (p, a, g) = (&self.problems, &*self.acts, &mut *self.grads);
        gemm(gpu, &p.dw[2], beta, &g.d_gu, &a.h2, &mut self.dw.gate_up)?;
        gemm(gpu, &p.dx[2], 0.0, &g.d_gu, &self.w.gate_up, &mut g.dh)
    }

    /// `dW_o (+)= dx2ᵀ·o`, `do = dx2·w_o`.
    fn o_backward(&mut self, gpu: &Gpu) -> Result<()> {
        let beta = self.dw_beta();
        let (p, a, g) = (&self.problems, &*self.acts, &mut *self.grads);
        gemm(gpu, &p.dw[1], beta, &g.dx2, &a.o, &mut self.dw.o)?;
        gemm(gpu, &p.dx[1], 0.0, &g.dx2, &self.w.o, &mut g.d_o)
    }

    /// Attention's backward: dq, dk, dv into the fused `dqkv`.
    fn attention_backward(&mut self, gpu: &Gpu) -> Result<()> {
        let p = self.layer.attention(self.tokens);
        let offsets = self.layer.qkv_offsets();
        let (a, g) = (&*self.acts, &mut *self.grads);
        let views = [a.qkv.slice(..), a.qkv.slice(offsets[1]..), a.qkv.slice(offsets[2]..)];
        gpu.attention_backward_packed(&p, saved(&views, &a.o, &g.d_o, &a.lse), &mut g.dqkv, offsets, None)
    }

    /// `dW_qkv (+)= dqkvᵀ·h1`, `dh1 = dqkv·w_qkv`.
    fn qkv_backward(&mut self, gpu: &Gpu) -> Result<()> {
        let beta = self.dw_beta();
        let (p, a, g) = (&self.problems, &*self.acts, &mut *self.grads);
        gemm(gpu, &p.dw[0], beta, &g.dqkv, &a.h1, &mut self.dw.qkv)?;
        gemm(gpu, &p.dx[0], 0.0, &g.dqkv, &self.w.qkv, &mut g.dh)
    }

    /// The backward's GEMMs and attention call alone (no step that is not wired), on `dy`:
    /// the planning runs of construction.
    pub(super) fn backward_gemms_and_attention(&mut self, gpu: &Gpu, dy: &CudaSlice<T>) -> Result<()> {
        self.down_backward(gpu, dy)?;
        self.gate_up_backward(gpu)?;
        self.o_backward(gpu)?;
        self.attention_backward(gpu)?;
        self.qkv_backward(gpu)
    }
}
