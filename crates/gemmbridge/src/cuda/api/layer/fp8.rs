//! The forward projections in FP8 ([`super::LayerOptions::fp8_forward`]): each weight quantised
//! once at construction, each activation quantised by every forward into an FP8 buffer made at
//! construction ([`GpuFp8::quantize`]'s kernels), then one cuBLASLt FP8 GEMM with the layer's
//! dtype out and the residual, where there is one, as its separate C.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::Params;
use crate::cuda::api::engine::Gpu;
use crate::cuda::route::{Fp8Options, Fp8Tensor};
use crate::dtype::Element;
use crate::error::Result;
use crate::fp8::{Fp8Format, Scaling, Source};
use crate::layer::{DecoderLayer, Proj, Tokens};

/// The FP8 operands of the four projections, indexed by [`Proj`].
pub(crate) struct Fp8State {
    pub scaling: Scaling,
    /// The weights `[out, in]`, quantised once.
    w: [Fp8Tensor; 4],
    /// The activations `[T, in]`, overwritten by every forward.
    x: [Fp8Tensor; 4],
}

impl Fp8State {
    /// Quantises the weights and makes the activations' FP8 buffers (by quantising zeros).
    ///
    /// # Errors
    /// [`Error::Fp8`] for a recipe other than tensor- or row-wise, or one the GPU or cuBLASLt
    /// does not offer; as [`GpuFp8::quantize`].
    pub fn new<T: Element + DeviceRepr + ValidAsZeroBits>(
        gpu: &Gpu,
        l: &DecoderLayer,
        t: Tokens,
        w: &Params<T>,
        scaling: Scaling,
    ) -> Result<Fp8State> {
        crate::layer::LayerOptions { fp8_forward: Some(scaling) }.validate()?;
        gpu.check_fp8(scaling)?;
        let widest = Proj::ALL.iter().map(|&p| l.proj_shape(p).1).max().unwrap_or(0);
        let zeros: CudaSlice<T> = super::zeros(gpu, t.count() * widest)?;
        let q = |src: &CudaSlice<T>, rows: usize, cols: usize| {
            gpu.fp8().quantize(src, rows, cols, Source::RowMajor, Fp8Format::E4M3, scaling)
        };
        let mut ws = Vec::with_capacity(4);
        let mut xs = Vec::with_capacity(4);
        for p in Proj::ALL {
            let (out, inp) = l.proj_shape(p);
            ws.push(q(w.get(p.weight()), out, inp)?);
            xs.push(q(&zeros, t.count(), inp)?);
        }
        let four = |v: Vec<Fp8Tensor>| -> [Fp8Tensor; 4] { v.try_into().unwrap_or_else(|_| unreachable!("four")) };
        Ok(Fp8State { scaling, w: four(ws), x: four(xs) })
    }

    /// `out = input·Wᵀ (+ c_in)` for projection `p` in FP8: `input` quantised into the
    /// projection's activation buffer, then the FP8 GEMM (β = 1 with `c_in`).
    pub fn project<T: Element>(
        &mut self,
        gpu: &Gpu,
        p: Proj,
        (input, c_in): (&dyn DevicePtr<T>, Option<&dyn DevicePtr<T>>),
        out: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let i = p as usize;
        gpu.quantize_into(input, &mut self.x[i])?;
        let opts = Fp8Options { beta: if c_in.is_some() { 1.0 } else { 0.0 }, ..Fp8Options::default() };
        gpu.fp8_dense(&self.x[i], &self.w[i], (c_in, out), None, opts)
    }
}
