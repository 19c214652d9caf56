//! The layer's forward, and the planning step made at construction.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::steps::{self, NormBackward, NormDw};
use super::{GpuDecoderLayer, LastForward};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::cuda::api::AttnSaved;
use crate::cuda::call::Scale;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layer::{LayerWeight, Proj, Step, FORWARD};
use crate::norm::GradType;

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecoderLayer<T> {
    /// The forward on `x[T, d]` (this layer's tokens), on [`Gpu::stream`]: `y` in
    /// [`GpuDecoderLayer::output`]. With `train`, the norms also write their inverse RMS and
    /// attention its statistics, and the step may be followed by [`GpuDecoderLayer::backward`]
    /// on the same `x`, which must then be left unchanged until it (the first norm's backward
    /// reads it); without, the norms run in cuDNN's inference phase. No device allocation, no
    /// host wait.
    ///
    /// The step, in order: norm 1 (`x → h1`, `rstd1`), `qkv = h1·w_qkvᵀ`, RoPE on q and k in
    /// place, attention (`qkv → o`, `lse`), `x2 = x + o·w_oᵀ` (x as the GEMM's C, β = 1),
    /// norm 2 (`x2 → h2`, `rstd2`), `gu = h2·w_gate_upᵀ`, SwiGLU (`gu → act`),
    /// `y = x2 + act·w_downᵀ` (x2 as the GEMM's C) — 9 library or kernel calls (plus, in FP8,
    /// the quantisation of each projection's input: one or two kernels).
    ///
    /// # Errors
    /// [`Error::DecoderShape`] for `x` shorter than `T·d` elements; as the GEMM, attention,
    /// RMSNorm and RoPE/SwiGLU entries (after construction only a buffer from another context,
    /// or an input overlapping the layer's buffers, can be refused).
    pub fn forward<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X, train: bool) -> Result<()> {
        let (l, n) = (self.layer, self.tokens.count());
        let want = n * l.d_model * T::DTYPE.size_bytes();
        if x.num_bytes() < want {
            let detail = format!("{} bytes, expected {want} ({} tokens of {})", x.num_bytes(), n, l.d_model);
            return Err(Error::DecoderShape { what: "the input x is too short", detail });
        }
        self.last = None;
        for step in FORWARD {
            self.forward_step(gpu, step, x, train)?;
        }
        let s = gpu.stream();
        self.last = Some(LastForward { x: (x.device_ptr(s).0, x.num_bytes()), train });
        Ok(())
    }

    /// One step of the forward ([`Step`]) on the layer's input `x` (`train`: the norms keep
    /// their inverse RMS, attention its statistics).
    fn forward_step(&mut self, gpu: &Gpu, step: Step, x: &dyn DevicePtr<T>, train: bool) -> Result<()> {
        let lt = (&self.layer, self.tokens);
        let a = &mut *self.acts;
        match step {
            Step::Norm1 => {
                let rstd = if train { Some(&mut a.rstd1) } else { None };
                steps::norm_forward(gpu, lt, steps::NormForward { x, weight: &self.w.norm1, h: &mut a.h1, rstd })
            }
            Step::Project(p) => self.project(gpu, p, x),
            Step::Rope => steps::rope(gpu, lt, &mut a.qkv, false),
            Step::Attention => self.attend(gpu, train),
            Step::Norm2 => {
                let rstd = if train { Some(&mut a.rstd2) } else { None };
                steps::norm_forward(gpu, lt, steps::NormForward { x: &a.x2, weight: &self.w.norm2, h: &mut a.h2, rstd })
            }
            Step::SwiGlu => steps::swiglu_forward(gpu, lt, &a.gu, &mut a.act),
        }
    }

    /// One forward projection: `qkv = h1·w_qkvᵀ`, `x2 = x + o·w_oᵀ`, `gu = h2·w_gate_upᵀ` or
    /// `y = x2 + act·w_downᵀ` (the residual as the GEMM's separate C, β = 1); `x` is the
    /// layer's input (read by the O projection only). In FP8 where the layer runs so.
    fn project(&mut self, gpu: &Gpu, p: Proj, x: &dyn DevicePtr<T>) -> Result<()> {
        let a = &mut *self.acts;
        let (input, c_in, out): (&CudaSlice<T>, Option<&dyn DevicePtr<T>>, &mut CudaSlice<T>) = match p {
            Proj::Qkv => (&a.h1, None, &mut a.qkv),
            Proj::O => (&a.o, Some(x), &mut a.x2),
            Proj::GateUp => (&a.h2, None, &mut a.gu),
            Proj::Down => (&a.act, Some(&a.x2), &mut a.y),
        };
        if let Some(f) = self.fp8.as_mut() {
            return f.project(gpu, p, (input, c_in), out);
        }
        let (scale, ex) = match c_in {
            Some(c) => (Scale::new(1.0, 1.0), Extras { c_in: Some(c), ..Extras::default() }),
            None => (Scale::PRODUCT, Extras::default()),
        };
        let w = self.w.get(p.weight());
        gpu.gemm_fused(&self.gemms.fwd[p as usize], scale, input, w, out, ex)
    }

    /// Attention on the q, k, v views of `qkv` into `o` (and `lse` with `train`).
    fn attend(&mut self, gpu: &Gpu, train: bool) -> Result<()> {
        let p = self.layer.attention(self.tokens);
        let [_, ok, ov] = self.layer.qkv_offsets();
        let a = &mut *self.acts;
        let (q, k, v) = (a.qkv.slice(..), a.qkv.slice(ok..), a.qkv.slice(ov..));
        let stats: Option<&mut dyn DevicePtrMut<f32>> = if train { Some(&mut a.lse) } else { None };
        gpu.attention().forward(&p, [&q, &k, &v], &mut a.o, stats, None)
    }

    /// Chooses the norms' weight-gradient type: one RMSNorm backward on the layer's own
    /// buffers with an f32 `dw`; where cuDNN refuses it ([`Error::Unsupported`]), the I/O type.
    pub(super) fn choose_norm_dw(&mut self, gpu: &Gpu) -> Result<GradType> {
        let (l, t) = (self.layer, self.tokens);
        let (a, g, ng) = (&*self.acts, &mut *self.grads, &mut *self.norm_grads);
        let step = NormBackward {
            x: &a.x2,
            weight: &self.w.norm2,
            rstd: &a.rstd2,
            dh: &g.dh,
            dx: &mut g.dx2,
            dw: NormDw { f32: &mut ng.scratch_f32, io: &mut ng.scratch_io },
        };
        match steps::norm_backward(gpu, (&l, t, GradType::F32), step) {
            Ok(()) => Ok(GradType::F32),
            Err(Error::Unsupported { backend, what }) => {
                tracing::info!(
                    layer = %l.describe(),
                    "{backend} refused an f32 RMSNorm weight gradient ({what}); the layer's norm gradients are {}",
                    l.dtype
                );
                Ok(GradType::Io)
            }
            Err(e) => Err(e),
        }
    }

    /// One inference forward and one training step on zeros (every plan made, every kernel
    /// compiled), then the weight gradients zeroed.
    pub(super) fn prewarm(&mut self, gpu: &Gpu) -> Result<()> {
        let s = gpu.stream();
        let stand_in: CudaSlice<T> = super::zeros(gpu, self.tokens.count() * self.layer.d_model)?;
        self.forward(gpu, &stand_in, false)?;
        self.forward(gpu, &stand_in, true)?;
        self.backward(gpu, &stand_in, &stand_in)?;
        self.last = None;
        for w in LayerWeight::ALL {
            s.memset_zeros(self.dw.get_mut(w)).map_err(status::driver("cuMemsetD8Async"))?;
        }
        for g in self.norm_grads.f32.iter_mut() {
            s.memset_zeros(g).map_err(status::driver("cuMemsetD8Async"))?;
        }
        Ok(())
    }
}

/// The saved tensors attention's backward reads: the q, k, v views of `qkv`, `o`, `do` and `lse`.
pub(super) fn saved<'a, T>(
    qkv: &'a [cudarc::driver::CudaView<'a, T>; 3],
    o: &'a dyn DevicePtr<T>,
    d_o: &'a dyn DevicePtr<T>,
    lse: &'a dyn DevicePtr<f32>,
) -> AttnSaved<'a, T> {
    AttnSaved { q: &qkv[0], k: &qkv[1], v: &qkv[2], o, d_o, stats: lse }
}
