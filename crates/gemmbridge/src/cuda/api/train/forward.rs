//! [`Mlp::forward`]: each layer's GEMM with its fused epilogue (bias, activation, the saved
//! pre-activation), or its FP8 GEMM, and the activation kernels where no epilogue applies them.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::fp8::{self, Fp8Step};
use super::instruments::{gemm, GemmRole, Instruments};
use super::mlp::{Forward, Mlp};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::operands::Extras;
use crate::dtype::Element;
use crate::error::Result;
use crate::layout::MatrixLayout;
use crate::problem::GemmProblem;
use crate::train::{check_len, Activation};

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// `y[tokens, out] = layers(x[tokens, in])` on [`Gpu::stream`]; the result is
    /// [`Mlp::output`]. With `train`, keeps what [`Mlp::backward`] needs.
    ///
    /// # Errors
    /// [`Error::LayerShape`](crate::Error::LayerShape) when `x` does not hold
    /// `tokens × in_features` elements (checked before anything is enqueued);
    /// [`Error::WrongContext`](crate::Error::WrongContext); as [`Gpu::gemm_fused`].
    pub fn forward<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X, tokens: usize, train: bool) -> Result<()> {
        let x_len = x.len();
        check_len(0, "input length (tokens × in_features)", x_len, tokens, self.layers[0].in_features)?;
        (self.last, self.dropped) = (None, false);
        self.ensure_buffers(gpu, tokens)?;
        let places = self.placements();
        let bufs = self.bufs.as_mut().expect("allocated above");
        let prec = self.precision;
        for i in 0..self.layers.len() {
            let l = self.layers[i];
            if let Some(recipe) = self.fp8 {
                let (done, rest) = bufs.out.split_at_mut(i);
                let st = Fp8Step { recipe, layer: i, spec: l, tokens };
                let (w, b, pre, out) = (&self.w[i], self.b[i].as_ref(), bufs.pre[i].as_mut(), &mut rest[0]);
                match i {
                    0 => fp8::layer_forward(gpu, &mut self.ins, st, x, w, b, pre, out)?,
                    _ => fp8::layer_forward(gpu, &mut self.ins, st, &done[i - 1], w, b, pre, out)?,
                }
                continue;
            }
            let kernel = places.act_kernel(&l);
            let fwd = match kernel {
                true => Activation::None.fused_forward(l.bias, false),
                false => l.activation.fused_forward(l.bias, train && l.activation.saves_pre()),
            };
            let p = GemmProblem::linear(tokens, l.out_features, l.in_features, prec)?.with_epilogue(fwd)?;
            let (done, rest) = bufs.out.split_at_mut(i);
            let out = &mut rest[0];
            let bias = self.b[i].as_ref().map(|b| b as &dyn DevicePtr<T>);
            let pre = bufs.pre[i].as_mut();
            match (kernel, pre) {
                (true, Some(pre)) => {
                    // the GEMM writes the pre-activation (bias fused), a kernel applies the GELU
                    let extras = Extras { bias, ..Extras::default() };
                    gemm_in(gpu, &mut self.ins, &p, i, x, done, &self.w[i], pre, extras)?;
                    let n = tokens * l.out_features;
                    let (pp, _g1) = pre.device_ptr(gpu.stream());
                    let (po, _g2) = out.device_ptr_mut(gpu.stream());
                    // SAFETY: pre and out hold n elements of T (allocated for `tokens`).
                    unsafe { gpu.enqueue_act(l.activation, T::DTYPE, pp, po, n) }?;
                }
                (_, pre) => {
                    let p = if p.uses_aux() {
                        p.with_aux_layout(MatrixLayout::row_major(tokens, l.out_features).with_ld(places.pre_ld(&l)))?
                    } else {
                        p
                    };
                    let aux_out = if p.uses_aux() { pre.map(|v| v as &mut dyn DevicePtrMut<T>) } else { None };
                    let extras = Extras { bias, aux_out, ..Extras::default() };
                    gemm_in(gpu, &mut self.ins, &p, i, x, done, &self.w[i], out, extras)?;
                }
            }
        }
        let (px, _g) = x.device_ptr(gpu.stream());
        self.last = Some(Forward { tokens, train, x: (px, x_len) });
        Ok(())
    }
}

/// One forward GEMM of layer `i`: input `x` (i = 0) or the previous layer's output.
#[allow(clippy::too_many_arguments)]
fn gemm_in<T: Element, X: DevicePtr<T>, C: DevicePtrMut<T>>(
    gpu: &Gpu,
    ins: &mut Instruments,
    p: &GemmProblem,
    i: usize,
    x: &X,
    outs: &[CudaSlice<T>],
    w: &CudaSlice<T>,
    c: &mut C,
    extras: Extras<'_, T>,
) -> Result<()> {
    let role = (i, GemmRole::Forward);
    match i {
        0 => gemm(gpu, ins, role, p, x, w, 0.0, c, extras),
        _ => gemm(gpu, ins, role, p, &outs[i - 1], w, 0.0, c, extras),
    }
}
