//! The layer's forward, and the planning runs made at construction.

use cudarc::driver::{DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::steps::{self, NormForward, Rope, SwigluForward};
use super::{GpuDecoderLayer, LastForward};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::operands::Extras;
use crate::cuda::api::AttnSaved;
use crate::cuda::call::Scale;
use crate::dtype::Element;
use crate::error::{Error, Result};

impl<T: Element + DeviceRepr + ValidAsZeroBits> GpuDecoderLayer<T> {
    /// The forward on `x[T, d]` (this layer's tokens), on [`Gpu::stream`]: `y` in
    /// [`GpuDecoderLayer::output`]. With `train`, attention also writes its statistics and the
    /// step may be followed by [`GpuDecoderLayer::backward`] on the same `x`, which must then
    /// be left unchanged until it (the first norm's backward reads it). No device allocation, no
    /// host wait.
    ///
    /// The step, in order: norm 1 (`x → h1, rstd1`), `qkv = h1·w_qkvᵀ`, RoPE on q and k in
    /// place, attention (`qkv → o`, `lse`), `x2 = x + o·w_oᵀ` (x as the GEMM's C, β = 1),
    /// norm 2 (`x2 → h2, rstd2`), `gu = h2·w_gate_upᵀ`, SwiGLU (`gu → act`),
    /// `y = x2 + act·w_downᵀ`.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] for `x` of another length; [`Error::Unsupported`] from a step not
    /// wired yet ([`super::NOT_WIRED`]); as the GEMM and attention entries.
    pub fn forward<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X, train: bool) -> Result<()> {
        let (l, t, n) = (self.layer, self.tokens, self.tokens.count());
        let want = n * l.d_model * T::DTYPE.size_bytes();
        if x.num_bytes() < want {
            let detail = format!("{} bytes, expected {want} ({} tokens of {})", x.num_bytes(), n, l.d_model);
            return Err(Error::DecoderShape { what: "the input x is too short", detail });
        }
        self.last = None;
        let a = &mut *self.acts;
        let eps = l.eps;
        let (rows, d) = (n, l.d_model);
        let norm1 = NormForward {
            which: "the first RMSNorm",
            x,
            weight: &self.w.norm1,
            h: &mut a.h1,
            rstd: &mut a.rstd1,
            rows,
            d,
            eps,
        };
        steps::norm_forward(gpu, norm1)?;
        self.qkv_projection(gpu)?;
        steps::rope(gpu, Rope { qkv: &mut self.acts.qkv, layer: l, tokens: t, inverse: false })?;
        self.attend(gpu, train)?;
        self.o_projection(gpu, x)?;
        let a = &mut *self.acts;
        let norm2 = NormForward {
            which: "the second RMSNorm",
            x: &a.x2,
            weight: &self.w.norm2,
            h: &mut a.h2,
            rstd: &mut a.rstd2,
            rows,
            d,
            eps,
        };
        steps::norm_forward(gpu, norm2)?;
        self.gate_up_projection(gpu)?;
        let a = &mut *self.acts;
        steps::swiglu_forward(gpu, SwigluForward { gu: &a.gu, act: &mut a.act, rows, ffn: l.ffn })?;
        self.down_projection(gpu)?;
        let s = gpu.stream();
        self.last = Some(LastForward { x: (x.device_ptr(s).0, x.num_bytes()), train });
        Ok(())
    }

    /// `qkv = h1·w_qkvᵀ`.
    pub(super) fn qkv_projection(&mut self, gpu: &Gpu) -> Result<()> {
        let (p, a) = (&self.problems.qkv, &mut *self.acts);
        gpu.gemm_fused(p, Scale::PRODUCT, &a.h1, &self.w.qkv, &mut a.qkv, Extras::default())
    }

    /// Attention on the q, k, v views of `qkv` into `o` (and `lse` with `train`).
    pub(super) fn attend(&mut self, gpu: &Gpu, train: bool) -> Result<()> {
        let p = self.layer.attention(self.tokens);
        let [_, ok, ov] = self.layer.qkv_offsets();
        let a = &mut *self.acts;
        let (q, k, v) = (a.qkv.slice(..), a.qkv.slice(ok..), a.qkv.slice(ov..));
        let stats: Option<&mut dyn cudarc::driver::DevicePtrMut<f32>> = if train { Some(&mut a.lse) } else { None };
        gpu.attention_forward(&p, [&q, &k, &v], &mut a.o, stats, None)
    }

    /// `x2 = x + o·w_oᵀ` (the residual `x` as the GEMM's separate C).
    pub(super) fn o_projection(&mut self, gpu: &Gpu, x: &dyn DevicePtr<T>) -> Result<()> {
        let (p, a) = (&self.problems.o, &mut *self.acts);
        let ex = Extras { c_in: Some(x), ..Extras::default() };
        gpu.gemm_fused(p, Scale::new(1.0, 1.0), &a.o, &self.w.o, &mut a.x2, ex)
    }

    /// `gu = h2·w_gate_upᵀ`.
    pub(super) fn gate_up_projection(&mut self, gpu: &Gpu) -> Result<()> {
        let (p, a) = (&self.problems.gate_up, &mut *self.acts);
        gpu.gemm_fused(p, Scale::PRODUCT, &a.h2, &self.w.gate_up, &mut a.gu, Extras::default())
    }

    /// `y = x2 + act·w_downᵀ` (the residual `x2` as the GEMM's separate C).
    pub(super) fn down_projection(&mut self, gpu: &Gpu) -> Result<()> {
        let (p, a) = (&self.problems.down, &mut *self.acts);
        let ex = Extras { c_in: Some(&a.x2), ..Extras::default() };
        gpu.gemm_fused(p, Scale::new(1.0, 1.0), &a.act, &self.w.down, &mut a.y, ex)
    }

    /// Runs every GEMM and attention call of a step once on the layer's own (zeroed) buffers,
    /// so that their plans exist and later steps only launch (and can be captured): the
    /// forward's (attention with and without statistics), then the backward's. The gradient
    /// buffers are zeroed again after.
    pub(super) fn prewarm(&mut self, gpu: &Gpu) -> Result<()> {
        let stand_in = self.grads.dx.clone();
        self.qkv_projection(gpu)?;
        self.attend(gpu, false)?;
        self.attend(gpu, true)?;
        self.o_projection(gpu, &stand_in)?;
        self.gate_up_projection(gpu)?;
        self.down_projection(gpu)?;
        self.backward_gemms_and_attention(gpu, &stand_in)?;
        let s = gpu.stream();
        for w in crate::layer::LayerWeight::ALL {
            s.memset_zeros(self.dw.get_mut(w)).map_err(crate::cuda::status::driver("cuMemsetD8Async"))?;
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
