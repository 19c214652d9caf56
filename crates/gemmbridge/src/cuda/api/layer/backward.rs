//! The layer's backward.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::forward::saved;
use super::steps::{self, NormBackward, NormDw};
use super::GpuDecoderLayer;
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::cuda::call::Scale;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layer::{Proj, Step, BACKWARD};
use crate::norm::GradType;
use crate::problem::GemmProblem;
use crate::train::GradMode;

/// One projection's gradients: `d_weight (+)= d_outᵀ·input` and `d_in = d_out·weight`.
struct ProjGrad<'a, T, O> {
    d_out: &'a O,
    input: &'a CudaSlice<T>,
    weight: &'a CudaSlice<T>,
    d_in: &'a mut CudaSlice<T>,
    d_weight: &'a mut CudaSlice<T>,
}

/// A [`ProjGrad`] of its five buffers.
fn from<'a, T, O>(
    d_out: &'a O,
    input: &'a CudaSlice<T>,
    weight: &'a CudaSlice<T>,
    d_in: &'a mut CudaSlice<T>,
    d_weight: &'a mut CudaSlice<T>,
) -> ProjGrad<'a, T, O> {
    ProjGrad { d_out, input, weight, d_in, d_weight }
}

/// The two GEMMs of a [`ProjGrad`] (the weight gradient with `beta`, no epilogue).
fn proj_grads<T: Element, O: DevicePtr<T>>(
    gpu: &Gpu,
    (dw, dx): (&GemmProblem, &GemmProblem),
    beta: f32,
    g: ProjGrad<'_, T, O>,
) -> Result<()> {
    gpu.gemm_fused(dw, Scale::new(1.0, beta), g.d_out, g.input, g.d_weight, Extras::default())?;
    gpu.gemm_fused(dx, Scale::PRODUCT, g.d_out, g.weight, g.d_in, Extras::default())
}

/// Which norm a backward step is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Norm {
    First,
    Second,
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
    /// `dh1 = dqkv·w_qkv`, norm 1's backward (`→ dx`, `dw_norm1`), `dx += dx2` (`axpy`) — 16 calls
    /// (18 under [`GradMode::Accumulate`]: each norm's gradient added with `axpy`).
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] without a training forward on this `x` (same address and
    /// length); [`Error::DecoderShape`] for `dy` shorter than `T·d` elements; as the GEMM,
    /// attention, RMSNorm and RoPE/SwiGLU entries.
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
            last => {
                let problem = format!(
                    "the decoder layer's backward needs a training forward (train = true) on the same x buffer, \
                     recognised by its device address and bytes, not its values: x at {:#x}, {} bytes; the last \
                     forward {}",
                    here.0,
                    here.1,
                    last.map_or("none".into(), |f| format!("at {:#x}, {} bytes, train = {}", f.x.0, f.x.1, f.train))
                );
                return Err(Error::TrainingOrder { problem });
            }
        }
        for step in BACKWARD {
            self.backward_step(gpu, step, x, dy)?;
        }
        Ok(())
    }

    /// One step of the backward ([`Step`]) from `dy`, on the layer's input `x`.
    fn backward_step<D: DevicePtr<T>>(&mut self, gpu: &Gpu, step: Step, x: &dyn DevicePtr<T>, dy: &D) -> Result<()> {
        let lt = (&self.layer, self.tokens);
        match step {
            Step::Project(p) => self.proj_backward(gpu, p, dy),
            Step::SwiGlu => {
                let (a, g) = (&*self.acts, &mut *self.grads);
                steps::swiglu_backward(gpu, lt, (&a.gu, &g.d_act), &mut g.d_gu)
            }
            Step::Norm2 => {
                self.norm_backward(gpu, Norm::Second, x)?;
                steps::add_buffers(gpu, dy, &mut self.grads.dx2)
            }
            Step::Attention => self.attention_backward(gpu),
            Step::Rope => steps::rope(gpu, lt, &mut self.grads.dqkv, true),
            Step::Norm1 => {
                self.norm_backward(gpu, Norm::First, x)?;
                let g = &mut *self.grads;
                steps::add_buffers(gpu, &g.dx2, &mut g.dx)
            }
        }
    }

    /// One projection's backward: its weight gradient (`dW (+)= dYᵀ·X`) and its data gradient
    /// (`dX = dY·W`): down from `dy` and `act` into `d_act`, gate/up from `d_gu` and `h2` into
    /// `dh`, O from `dx2` and `o` into `do`, QKV from `dqkv` and `h1` into `dh`.
    fn proj_backward<D: DevicePtr<T>>(&mut self, gpu: &Gpu, p: Proj, dy: &D) -> Result<()> {
        let beta = if self.grad_mode == GradMode::Accumulate { 1.0 } else { 0.0 };
        let (a, g, dw, w) = (&*self.acts, &mut *self.grads, &mut *self.dw, &*self.w);
        let i = p as usize;
        let problems = (&self.gemms.dw[i], &self.gemms.dx[i]);
        match p {
            Proj::Down => proj_grads(gpu, problems, beta, from(dy, &a.act, &w.down, &mut g.d_act, &mut dw.down)),
            Proj::GateUp => {
                proj_grads(gpu, problems, beta, from(&g.d_gu, &a.h2, &w.gate_up, &mut g.dh, &mut dw.gate_up))
            }
            Proj::O => proj_grads(gpu, problems, beta, from(&g.dx2, &a.o, &w.o, &mut g.d_o, &mut dw.o)),
            Proj::Qkv => proj_grads(gpu, problems, beta, from(&g.dqkv, &a.h1, &w.qkv, &mut g.dh, &mut dw.qkv)),
        }
    }

    /// A norm's backward from `dh`: the second writes `dx2`, the first `dx` (each overwritten;
    /// the residual's gradient is added after), and its weight gradient — directly, or under
    /// [`GradMode::Accumulate`] into the scratch, then added.
    fn norm_backward(&mut self, gpu: &Gpu, which: Norm, x: &dyn DevicePtr<T>) -> Result<()> {
        let (l, t, dw_type) = (self.layer, self.tokens, self.norm_dw);
        let acc = self.grad_mode == GradMode::Accumulate;
        let (a, g, ng, dw) = (&*self.acts, &mut *self.grads, &mut *self.norm_grads, &mut *self.dw);
        let k = if which == Norm::First { 0 } else { 1 };
        let (x, weight, rstd, dx, io): (&dyn DevicePtr<T>, _, _, _, _) = match which {
            Norm::First => (x, &self.w.norm1, &a.rstd1, &mut g.dx, &mut dw.norm1),
            Norm::Second => (&a.x2, &self.w.norm2, &a.rstd2, &mut g.dx2, &mut dw.norm2),
        };
        let (f32_target, io_target) =
            if acc { (&mut ng.scratch_f32, &mut ng.scratch_io) } else { (&mut ng.f32[k], io) };
        let dw_out = NormDw { f32: f32_target, io: io_target };
        steps::norm_backward(gpu, (&l, t, dw_type), NormBackward { x, weight, rstd, dh: &g.dh, dx, dw: dw_out })?;
        if !acc {
            return Ok(());
        }
        let s = gpu.stream();
        let d = l.d_model;
        // SAFETY (both arms): the scratch and the target are distinct `[d]` buffers of this
        // layer, in this context, of the named type.
        match dw_type {
            GradType::F32 => {
                let (px, _gx) = ng.scratch_f32.device_ptr(s);
                let (py, _gy) = ng.f32[k].device_ptr_mut(s);
                unsafe { steps::add_into(gpu, DType::F32, d, px, py) }
            }
            GradType::Io => {
                let target = if which == Norm::First { &mut dw.norm1 } else { &mut dw.norm2 };
                let (px, _gx) = ng.scratch_io.device_ptr(s);
                let (py, _gy) = target.device_ptr_mut(s);
                unsafe { steps::add_into(gpu, T::DTYPE, d, px, py) }
            }
        }
    }

    /// Attention's backward: dq, dk, dv into the fused `dqkv`.
    fn attention_backward(&mut self, gpu: &Gpu) -> Result<()> {
        let p = self.layer.attention(self.tokens);
        let offsets = self.layer.qkv_offsets();
        let (a, g) = (&*self.acts, &mut *self.grads);
        let views = [a.qkv.slice(..), a.qkv.slice(offsets[1]..), a.qkv.slice(offsets[2]..)];
        gpu.attention().backward_packed(&p, saved(&views, &a.o, &g.d_o, &a.lse), &mut g.dqkv, offsets, None)
    }
}
