//! [`Mlp::backward`]: per layer, from the last, the activation's backward (a kernel, or fused
//! into the next layer's data-gradient GEMM), the weight gradient with the bias gradient fused,
//! and the data gradient; in FP8 layers, `fp8.rs`'s GEMMs.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::buffers::alloc;
use super::fp8::{self, Fp8Step, WeightGrads};
use super::grads::{accumulate_bias_grad, bias_grad_out};
use super::instruments::{gemm, DynRef, GemmRole, TrainGemm};
use super::kernels::DactLaunch;
use super::mlp::Mlp;
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::gemm::operands::Extras;
use crate::dtype::Element;
use crate::epilogue::{Epilogue, VectorUse};
use crate::error::{Error, Result};
use crate::layout::{MatrixLayout, Operand};
use crate::problem::GemmProblem;
use crate::train::{check_len, Activation, GradMode};

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// The backward of the last training forward, on [`Gpu::stream`]: every layer's weight
    /// and bias gradient (overwritten or accumulated per `mode`) and, if `dx` is given, the
    /// input gradient `dx[tokens, in]`. `x` is the forward's input (the same buffer),
    /// `dy[tokens, out]` the gradient of its output (not modified).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::TrainingOrder`] without a training forward or
    /// with another `x`; [`Error::LayerShape`] for `dy` or `dx` of the wrong length. Then as
    /// [`Gpu::gemm_fused`]; an error of the GEMM observer ([`Mlp::set_gemm_observer`]).
    pub fn backward<X, D, DX>(&mut self, gpu: &Gpu, x: &X, dy: &D, dx: Option<&mut DX>, mode: GradMode) -> Result<()>
    where
        X: DevicePtr<T>,
        D: DevicePtr<T>,
        DX: DevicePtrMut<T>,
    {
        let f = match self.last {
            Some(f) if f.train => f,
            _ => return Err(self.order_error("backward needs the last forward to have run with train = true")),
        };
        let (px, guard) = x.device_ptr(gpu.stream());
        drop(guard);
        if (px, x.len()) != f.x {
            return Err(Error::TrainingOrder {
                problem: format!(
                    "backward was given another input ({px:#x}, {} elements) than the training forward read ({:#x}, {})",
                    x.len(),
                    f.x.0,
                    f.x.1
                ),
            });
        }
        let (tokens, last) = (f.tokens, self.layers.len() - 1);
        check_len(last, "dy length (tokens × out_features)", dy.len(), tokens, self.layers[last].out_features)?;
        if let Some(dx) = dx.as_ref() {
            check_len(0, "dx length (tokens × in_features)", dx.len(), tokens, self.layers[0].in_features)?;
        }
        if mode == GradMode::Accumulate && self.fp8.is_none() {
            for (i, l) in self.layers.iter().enumerate() {
                if l.bias && self.db_tmp[i].is_none() {
                    self.db_tmp[i] = Some(alloc(gpu, l.out_features)?);
                }
            }
        }
        let mut dx = dx;
        for i in (0..self.layers.len()).rev() {
            self.layer_backward(gpu, i, x, dy, dx.as_deref_mut(), mode)?;
        }
        Ok(())
    }

    /// Layer `i`'s backward: its activation's backward unless the GEMM of layer `i + 1`
    /// applied it, then its weight gradient (bias gradient fused), then its data gradient
    /// (layer `i - 1`'s tanh-GELU backward fused) into `grad[i - 1]` or `dx`.
    fn layer_backward<X, D, DX>(
        &mut self,
        gpu: &Gpu,
        i: usize,
        x: &X,
        dy: &D,
        dx: Option<&mut DX>,
        mode: GradMode,
    ) -> Result<()>
    where
        X: DevicePtr<T>,
        D: DevicePtr<T>,
        DX: DevicePtrMut<T>,
    {
        // 1. dpre: the gradient of the pre-activation
        self.activation_backward(gpu, i, dy)?;
        if let Some(recipe) = self.fp8 {
            // 2.–3. in FP8: dw, db (its own GEMM, β accumulates), then the data gradient
            let tokens = self.bufs.as_ref().expect("a training forward allocated them").tokens;
            let st = Fp8Step { recipe, layer: i, spec: self.layers[i], tokens, precision: self.precision };
            return self.fp8_grad_gemms(gpu, st, x, dy, dx, mode);
        }
        // 2. dw[out, in] = dpreᵀ·x (β = 1 accumulates), db = Σ_tokens dpre (BiasGradA)
        self.weight_grad_gemm(gpu, i, x, dy, mode)?;
        // 3. the data gradient dpre·w[out, in] → [tokens, in]
        self.data_grad_gemm(gpu, i, dy, dx, mode)
    }

    /// Step 1 of layer `i`'s backward: `grad[i] = d ⊙ act′(saved)`, `d` the caller's `dy` for
    /// the last layer and `grad[i]` itself (in place) for the others, `saved` the layer's
    /// output (ReLU) or pre-activation (GELU); one kernel. Nothing for a layer without an
    /// activation or one whose backward the next layer's data-gradient GEMM applies.
    fn activation_backward<D: DevicePtr<T>>(&mut self, gpu: &Gpu, i: usize, dy: &D) -> Result<()> {
        let places = self.placements();
        let bufs = self.bufs.as_mut().expect("a training forward allocated them");
        let (tokens, l, last) = (bufs.tokens, self.layers[i], i + 1 == self.layers.len());
        let fused_by_next = !last && places.fused_backward(&l).is_some();
        if l.activation == Activation::None || fused_by_next {
            return Ok(());
        }
        let s = gpu.stream();
        let (saved, ld) = match l.activation {
            Activation::Relu => (&bufs.out[i], l.out_features),
            _ => (bufs.pre[i].as_ref().expect("GELU layers keep pre"), places.pre_ld(&l)),
        };
        let (ps, _gs) = saved.device_ptr(s);
        let g = bufs.grad[i].as_mut().expect("allocated for every layer with an activation");
        let (pg, _gg) = g.device_ptr_mut(s);
        let (pd, _gd) = if last {
            let (p, g) = dy.device_ptr(s);
            (p, Some(g))
        } else {
            (pg, None)
        };
        let shape = (tokens, l.out_features, ld);
        let launch = DactLaunch { act: l.activation, dtype: T::DTYPE, dy: pd, saved: ps, out: pg, shape };
        // SAFETY: dy (or grad[i], in place) and grad[i] hold tokens × out elements; saved
        // holds tokens rows of ld; all of this context.
        unsafe { gpu.enqueue_dact(launch) }
    }

    /// Steps 2 and 3 of an FP8 layer's backward (`fp8.rs`): the weight gradient and, with a
    /// bias, the bias gradient (its own GEMM; β accumulates both under
    /// [`GradMode::Accumulate`]), then the data gradient into `dx` (layer 0, when asked for)
    /// or `grad[i - 1]`.
    fn fp8_grad_gemms<X, D, DX>(
        &mut self,
        gpu: &Gpu,
        st: Fp8Step,
        x: &X,
        dy: &D,
        dx: Option<&mut DX>,
        mode: GradMode,
    ) -> Result<()>
    where
        X: DevicePtr<T>,
        D: DevicePtr<T>,
        DX: DevicePtrMut<T>,
    {
        let (i, last) = (st.layer, st.layer + 1 == self.layers.len());
        let bufs = self.bufs.as_mut().expect("a training forward allocated them");
        let dpre = layer_grad(&bufs.grad[i], last, dy);
        let input: &dyn DevicePtr<T> = if i == 0 { x } else { &bufs.out[i - 1] };
        let ones = bufs.ones.as_ref();
        let db = self.db[i].as_mut().map(|d| (d, ones.expect("allocated for FP8 layers with a bias")));
        let (ins, dw) = (&mut self.ins, &mut self.dw[i]);
        let grads = WeightGrads { g: &DynRef(dpre), h: &DynRef(input), beta: grad_beta(mode), dw, db };
        fp8::weight_grads(gpu, ins, st, grads)?;
        let (before, rest) = bufs.grad.split_at_mut(i);
        let dpre = layer_grad(&rest[0], last, dy);
        match (i, dx) {
            (0, None) => Ok(()),
            (0, Some(dx)) => fp8::data_grad(gpu, ins, st, &DynRef(dpre), &self.w[i], dx),
            _ => {
                let out = before[i - 1].as_mut().expect("every layer but the last has a gradient buffer");
                fp8::data_grad(gpu, ins, st, &DynRef(dpre), &self.w[i], out)
            }
        }
    }

    /// Step 2 of layer `i`'s backward: `dw[out, in] = dpreᵀ·x` (β = 1 accumulates) with the
    /// bias gradient `db = Σ_tokens dpre` fused (`BiasGradA`) unless the next layer's
    /// data-gradient GEMM writes it; under [`GradMode::Accumulate`] the fused bias gradient,
    /// written to the layer's temporary, is then added to `db`.
    fn weight_grad_gemm<X, D>(&mut self, gpu: &Gpu, i: usize, x: &X, dy: &D, mode: GradMode) -> Result<()>
    where
        X: DevicePtr<T>,
        D: DevicePtr<T>,
    {
        let places = self.placements();
        let bufs = self.bufs.as_ref().expect("a training forward allocated them");
        let (tokens, prec, l, last) = (bufs.tokens, self.precision, self.layers[i], i + 1 == self.layers.len());
        let dpre = layer_grad(&bufs.grad[i], last, dy);
        let input: &dyn DevicePtr<T> = if i == 0 { x } else { &bufs.out[i - 1] };
        // the bias gradient here unless the next layer's data-gradient GEMM wrote it
        let own_bias_grad = l.bias && (last || !places.bias_grad_by_next(&l));
        let pw = GemmProblem::new(
            Operand::t(MatrixLayout::row_major(tokens, l.out_features)),
            Operand::n(MatrixLayout::row_major(tokens, l.in_features)),
            MatrixLayout::row_major(l.out_features, l.in_features),
            1,
            prec,
        )?
        .with_epilogue(if own_bias_grad { Epilogue::BiasGradA } else { Epilogue::None })?;
        let db = bias_grad_out(mode, &mut self.db[i], &mut self.db_tmp[i]).filter(|_| own_bias_grad);
        let extras = Extras { bias_grad: db, ..Extras::default() };
        let (a, b, c, beta) = (&DynRef(dpre), &DynRef(input), &mut self.dw[i], grad_beta(mode));
        let call = TrainGemm { layer: i, role: GemmRole::WeightGrad, problem: &pw, a, b, beta, c, extras };
        gemm(gpu, &mut self.ins, call)?;
        if own_bias_grad {
            accumulate_bias_grad(gpu, mode, &self.db_tmp[i], &mut self.db[i])?;
        }
        Ok(())
    }

    /// Step 3 of layer `i`'s backward: `dpre·w[out, in]` → `[tokens, in]`, into `dx` for
    /// layer 0 (nothing without it), else into `grad[i - 1]` with layer `i - 1`'s activation
    /// backward fused where its placement puts it in this GEMM's epilogue (its saved
    /// pre-activation read as aux) and, with `DGeluBiasGrad`, its bias gradient written too
    /// (then, under [`GradMode::Accumulate`], added to its `db`).
    fn data_grad_gemm<D, DX>(&mut self, gpu: &Gpu, i: usize, dy: &D, dx: Option<&mut DX>, mode: GradMode) -> Result<()>
    where
        D: DevicePtr<T>,
        DX: DevicePtrMut<T>,
    {
        if i == 0 && dx.is_none() {
            return Ok(());
        }
        let places = self.placements();
        let bufs = self.bufs.as_mut().expect("a training forward allocated them");
        let (tokens, prec, l, last) = (bufs.tokens, self.precision, self.layers[i], i + 1 == self.layers.len());
        let prev = (i > 0).then(|| self.layers[i - 1]);
        let e = prev.and_then(|p| places.fused_backward(&p)).unwrap_or(Epilogue::None);
        let mut px = GemmProblem::matmul(tokens, l.in_features, l.out_features, prec)?.with_epilogue(e)?;
        let (before, rest) = bufs.grad.split_at_mut(i);
        let dpre = layer_grad(&rest[0], last, dy);
        match (i, dx) {
            (0, Some(dx)) => {
                let (role, a, b, extras) = (GemmRole::DataGrad, &DynRef(dpre), &self.w[i], Extras::default());
                let call = TrainGemm { layer: i, role, problem: &px, a, b, beta: 0.0, c: dx, extras };
                gemm(gpu, &mut self.ins, call)
            }
            _ => {
                let out = before[i - 1].as_mut().expect("every layer but the last has a gradient buffer");
                let aux_in = if px.uses_aux() {
                    let p = prev.expect("i > 0");
                    px =
                        px.with_aux_layout(MatrixLayout::row_major(tokens, p.out_features).with_ld(places.pre_ld(&p)))?;
                    bufs.pre[i - 1].as_ref().map(|v| v as &dyn DevicePtr<T>)
                } else {
                    None
                };
                // DGeluBiasGrad: the previous layer's bias gradient
                let by_here = e.vector() == VectorUse::WritesGrad;
                let db = bias_grad_out(mode, &mut self.db[i - 1], &mut self.db_tmp[i - 1]).filter(|_| by_here);
                let extras = Extras { aux_in, bias_grad: db, ..Extras::default() };
                let (role, a, b) = (GemmRole::DataGrad, &DynRef(dpre), &self.w[i]);
                let call = TrainGemm { layer: i, role, problem: &px, a, b, beta: 0.0, c: out, extras };
                gemm(gpu, &mut self.ins, call)?;
                match by_here {
                    true => accumulate_bias_grad(gpu, mode, &self.db_tmp[i - 1], &mut self.db[i - 1]),
                    false => Ok(()),
                }
            }
        }
    }
}

/// β of the gradient GEMMs: 1 adds to the gradients ([`GradMode::Accumulate`]), 0 overwrites.
fn grad_beta(mode: GradMode) -> f32 {
    if mode == GradMode::Accumulate {
        1.0
    } else {
        0.0
    }
}

/// The gradient a layer's GEMMs read once its activation's backward has run (of its
/// pre-activation, or of its output without an activation): its gradient buffer `grad`, or
/// the caller's `dy` for the last layer when that has none.
fn layer_grad<'a, T, D: DevicePtr<T>>(grad: &'a Option<CudaSlice<T>>, last: bool, dy: &'a D) -> &'a dyn DevicePtr<T> {
    match (grad, last) {
        (Some(g), _) => g,
        (None, true) => dy,
        (None, false) => unreachable!("every layer but the last has a gradient buffer"),
    }
}
