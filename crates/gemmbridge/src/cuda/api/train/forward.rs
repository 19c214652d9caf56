//! [`Mlp::forward`]: each layer's GEMM with its fused epilogue (bias, activation, the saved
//! pre-activation), or its FP8 GEMM, and the activation kernels where no epilogue applies them.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::buffers::{alloc, Buffers};
use super::fp8::{self, Fp8Step, LayerForward};
use super::instruments::{gemm, DynRef, GemmRole, TrainGemm};
use super::mlp::{Forward, Mlp};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::cuda::device::Relaxed;
use crate::cuda::status;
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
    /// [`Error::WrongContext`](crate::Error::WrongContext); as [`Gpu::gemm_fused`]; an error of
    /// the GEMM observer ([`Mlp::set_gemm_observer`]).
    pub fn forward<X: DevicePtr<T>>(&mut self, gpu: &Gpu, x: &X, tokens: usize, train: bool) -> Result<()> {
        let x_len = x.len();
        check_len(0, "input length (tokens × in_features)", x_len, tokens, self.layers[0].in_features)?;
        self.last = None;
        self.ensure_buffers(gpu, tokens)?;
        for i in 0..self.layers.len() {
            self.layer_forward(gpu, i, x, train)?;
        }
        let (px, _g) = x.device_ptr(gpu.stream());
        self.last = Some(Forward { tokens, train, x: (px, x_len) });
        Ok(())
    }

    /// Layer `i`'s forward from `x` (layer 0) or the previous layer's output: in FP8 layers,
    /// `fp8.rs`'s GEMM and the activation kernel; otherwise the GEMM with the epilogue the
    /// placements give (bias, activation, the saved pre-activation) or, where the activation is
    /// a kernel, the GEMM into the pre-activation (bias fused) and then that kernel.
    fn layer_forward<X: DevicePtr<T>>(&mut self, gpu: &Gpu, i: usize, x: &X, train: bool) -> Result<()> {
        let (places, l, prec) = (self.placements(), self.layers[i], self.precision);
        let bufs = self.bufs.as_mut().expect("allocated by ensure_buffers");
        let tokens = bufs.tokens;
        let (done, rest) = bufs.out.split_at_mut(i);
        let input: &dyn DevicePtr<T> = if i == 0 { x } else { &done[i - 1] };
        let input = &DynRef(input);
        let (w, out, pre) = (&self.w[i], &mut rest[0], bufs.pre[i].as_mut());
        if let Some(recipe) = self.fp8 {
            let st = Fp8Step { recipe, layer: i, spec: l, tokens, precision: prec };
            let io = LayerForward { h: input, w, b: self.b[i].as_ref(), pre, out };
            return fp8::layer_forward(gpu, &mut self.ins, st, io);
        }
        let kernel = places.act_kernel(&l);
        let fwd = match kernel {
            true => Activation::None.fused_forward(l.bias, false),
            false => l.activation.fused_forward(l.bias, train && l.activation.saves_pre()),
        };
        let p = GemmProblem::linear(tokens, l.out_features, l.in_features, prec)?.with_epilogue(fwd)?;
        let bias = self.b[i].as_ref().map(|b| b as &dyn DevicePtr<T>);
        let (layer, role) = (i, GemmRole::Forward);
        match (kernel, pre) {
            (true, Some(pre)) => {
                // the GEMM writes the pre-activation (bias fused), a kernel applies the GELU
                let extras = Extras { bias, ..Extras::default() };
                let call = TrainGemm { layer, role, problem: &p, a: input, b: w, beta: 0.0, c: pre, extras };
                gemm(gpu, &mut self.ins, call)?;
                let n = tokens * l.out_features;
                let (pp, _g1) = pre.device_ptr(gpu.stream());
                let (po, _g2) = out.device_ptr_mut(gpu.stream());
                // SAFETY: pre and out hold n elements of T (allocated for `tokens`).
                unsafe { gpu.enqueue_act(l.activation, T::DTYPE, pp, po, n) }
            }
            (_, pre) => {
                let p = if p.uses_aux() {
                    p.with_aux_layout(MatrixLayout::row_major(tokens, l.out_features).with_ld(places.pre_ld(&l)))?
                } else {
                    p
                };
                let aux_out = if p.uses_aux() { pre.map(|v| v as &mut dyn DevicePtrMut<T>) } else { None };
                let extras = Extras { bias, aux_out, ..Extras::default() };
                let call = TrainGemm { layer, role, problem: &p, a: input, b: w, beta: 0.0, c: out, extras };
                gemm(gpu, &mut self.ins, call)
            }
        }
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Allocates the activation and gradient buffers for `tokens` unless they exist.
    pub(super) fn ensure_buffers(&mut self, gpu: &Gpu, tokens: usize) -> Result<()> {
        if self.bufs.as_ref().is_some_and(|b| b.tokens == tokens) {
            return Ok(());
        }
        self.bufs = None; // freed in stream order before the new ones are allocated
        let (last, places) = (self.layers.len() - 1, self.placements());
        let _relaxed = Relaxed::enter()?;
        let ones = match self.fp8.is_some() && self.layers.iter().any(|l| l.bias) {
            true => Some(
                gpu.stream()
                    .clone_htod(&vec![T::from_f32(1.0); tokens])
                    .map_err(status::driver("cuMemcpyHtoDAsync"))?,
            ),
            false => None,
        };
        let mut b = Buffers { tokens, out: Vec::new(), pre: Vec::new(), grad: Vec::new(), ones };
        for (i, l) in self.layers.iter().enumerate() {
            let n = tokens * l.out_features;
            b.out.push(alloc(gpu, n)?);
            let ld = places.pre_ld(l);
            let pre = l.activation.saves_pre().then(|| alloc(gpu, tokens * ld)).transpose()?;
            b.pre.push(pre);
            let needs_grad = i < last || l.activation != Activation::None;
            b.grad.push(if needs_grad { Some(alloc(gpu, n)?) } else { None });
        }
        self.bufs = Some(b);
        Ok(())
    }
}
