//! [`Mlp`]: a sequence of linear layers on the GPU, forward and backward on cuBLASLt GEMMs with
//! fused epilogues (the plan is in [`crate::train`]).

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::fp8::{self, Fp8Step};
use super::grads::{accumulate_bias_grad, bias_grad_out, to_host};
use super::instruments::{gemm, DynRef, GemmRole, Instruments};
use super::placement::Placements;
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::operands::Extras;
use crate::cuda::device::Relaxed;
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::epilogue::{Epilogue, VectorUse};
use crate::error::{Error, Result, Which};
use crate::layout::{MatrixLayout, Operand};
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::train::fp8::Fp8Training;
use crate::train::{
    check_layers, check_len, check_params, Activation, GeluPlacement, GradMode, LayerParams, LinearSpec, Params,
};

/// Activations and gradients for one token count.
struct Buffers<T> {
    tokens: usize,
    /// Per layer: its output `act(pre)`, `[tokens, out]`.
    out: Vec<CudaSlice<T>>,
    /// Per GELU layer: the pre-activation, `[tokens, ld]` ([`Placements::pre_ld`]).
    pre: Vec<Option<CudaSlice<T>>>,
    /// Per layer: the gradient of its output, or of its pre-activation where the next layer's
    /// GEMM or a kernel has applied the activation's backward (`[tokens, out]`). The last
    /// layer has one only when it has an activation (the caller's dy is left untouched).
    grad: Vec<Option<CudaSlice<T>>>,
    /// FP8 layers with a bias: `[tokens]` ones, the bias gradient GEMM's `A`.
    ones: Option<CudaSlice<T>>,
}

/// What the last forward was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Forward {
    tokens: usize,
    train: bool,
    /// The input's address and length, to check the backward gets the same buffer.
    x: (u64, usize),
}

/// A sequence of linear layers on the GPU, one dtype throughout (the precision's), parameters
/// and activations in device memory it owns, every call enqueued on [`Gpu::stream`] without a
/// host wait (except the `*_to_host` copies and [`Mlp::gemm_ms`]).
///
/// Per step: [`Mlp::forward`] (`train = true` keeps what the backward needs: every layer's
/// output and, for GELU layers, the pre-activation), the caller's loss gradient `dy`, then
/// [`Mlp::backward`] with the same input, then an update ([`Mlp::sgd_step`], or the caller's
/// own optimiser over [`Mlp::weight_grad`] / [`Mlp::bias_grad`]). The GEMMs per layer: one
/// forward, one weight gradient (bias gradient fused), one data gradient (the previous layer's
/// GELU-tanh backward fused, by default: [`Mlp::set_gelu_placement`]); not the first layer's
/// data gradient unless `dx` is asked for.
///
/// Buffers for a token count are kept between steps and reallocated (stream-ordered) when it
/// changes.
///
/// FP8 layers ([`Mlp::new_fp8`]): the same calls, with every GEMM in FP8 and the tensors in
/// bf16 or f16 ([`crate::train::fp8`] says what is quantised how).
pub struct Mlp<T: Element> {
    layers: Vec<LinearSpec>,
    precision: Precision,
    /// FP8 layers: the recipe; `precision` is then the tensors' own (bf16 or f16), that of
    /// the bias-gradient GEMMs.
    fp8: Option<Fp8Training>,
    /// Where GELU-tanh runs ([`Mlp::set_gelu_placement`]).
    gelu: GeluPlacement,
    /// Whether a placement change dropped the last forward (named in the order errors).
    dropped: bool,
    w: Vec<CudaSlice<T>>,
    b: Vec<Option<CudaSlice<T>>>,
    dw: Vec<CudaSlice<T>>,
    db: Vec<Option<CudaSlice<T>>>,
    /// Per layer with a bias, under [`GradMode::Accumulate`]: the fused bias gradient before
    /// it is added to `db`.
    db_tmp: Vec<Option<CudaSlice<T>>>,
    bufs: Option<Buffers<T>>,
    last: Option<Forward>,
    /// GEMM timing ([`Mlp::set_gemm_timing`]) and tuning ([`Mlp::autotune`]).
    pub(super) ins: Instruments,
}

impl<T: Element> Drop for Mlp<T> {
    /// The device buffers are freed with the thread's capture mode relaxed (see
    /// `RelaxedDrop`): a drop while another thread captures in global mode neither fails nor
    /// breaks that capture.
    fn drop(&mut self) {
        let _relaxed = Relaxed::enter();
        self.bufs = None;
        self.w.clear();
        self.b.clear();
        self.dw.clear();
        self.db.clear();
        self.db_tmp.clear();
    }
}

impl<T: Element> std::fmt::Debug for Mlp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlp")
            .field("layers", &self.layers)
            .field("precision", &self.precision)
            .field("tokens", &self.bufs.as_ref().map(|b| b.tokens))
            .finish()
    }
}

fn alloc<T: Element + DeviceRepr>(gpu: &Gpu, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every buffer allocated here is written before it is read (the forward writes
    // outputs and pre-activations, the backward gradients) — except the accumulate-mode
    // gradients, which are zeroed at creation (`alloc_zeros` in Mlp::new).
    let _relaxed = Relaxed::enter()?;
    unsafe { gpu.stream().alloc::<T>(n.max(1)) }.map_err(status::driver("cuMemAllocAsync"))
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> Mlp<T> {
    /// Uploads `params` (f32 on the host, rounded to T) for `layers`; gradients start at zero.
    ///
    /// # Errors
    /// [`Error::LayerShape`] when the layers do not chain or a parameter has the wrong length;
    /// [`Error::DTypeMismatch`] when T is not the precision's input dtype;
    /// [`Error::Unsupported`] for a precision whose output dtype differs from its input's
    /// (layers keep one dtype); [`Error::Driver`].
    pub fn new(gpu: &Gpu, layers: &[LinearSpec], precision: Precision, params: &[LayerParams]) -> Result<Mlp<T>> {
        if T::DTYPE != precision.input() {
            return Err(Error::DTypeMismatch { operand: Which::A, expected: precision.input(), got: T::DTYPE });
        }
        if precision.output() != precision.input() {
            return Err(Error::Unsupported {
                backend: "the training layers",
                what: format!("precision {precision} (a layer's output feeds the next: one dtype throughout)"),
            });
        }
        Mlp::build(gpu, layers, precision, None, params)
    }

    /// FP8 layers: uploads `params` (rounded to T, bf16 or f16) for `layers`, every GEMM of
    /// a step to run in FP8 by `recipe` ([`crate::train::fp8`]); gradients start at zero.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when T is neither bf16 nor f16; [`Error::LayerShape`] as
    /// [`Mlp::new`]; [`Error::Fp8`] when the recipe breaks an FP8 rule for a layer
    /// ([`Fp8Training::check`]) or this GPU / cuBLASLt does not offer its scalings;
    /// [`Error::Driver`].
    pub fn new_fp8(gpu: &Gpu, layers: &[LinearSpec], recipe: Fp8Training, params: &[LayerParams]) -> Result<Mlp<T>> {
        let precision = match T::DTYPE {
            DType::BF16 => Precision::BF16,
            DType::F16 => Precision::F16,
            d => {
                return Err(Error::Unsupported {
                    backend: "the FP8 training layers",
                    what: format!("{d} tensors (FP8 layers keep bf16 or f16 tensors)"),
                })
            }
        };
        Mlp::build(gpu, layers, precision, Some(recipe), params)
    }

    /// Checks and uploads (the part [`Mlp::new`] and [`Mlp::new_fp8`] share).
    fn build(
        gpu: &Gpu,
        layers: &[LinearSpec],
        precision: Precision,
        fp8: Option<Fp8Training>,
        params: &[LayerParams],
    ) -> Result<Mlp<T>> {
        check_layers(layers)?;
        check_params(layers, params)?;
        if let Some(r) = fp8 {
            for l in layers {
                r.check(T::DTYPE, l.bias)?;
            }
            gpu.check_fp8(r.x_scaling)?;
            gpu.check_fp8(r.w_scaling)?;
        }
        let s = gpu.stream();
        let _relaxed = Relaxed::enter()?; // uploads and allocations
        let up = |v: &[f32]| -> Result<CudaSlice<T>> {
            let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
            s.clone_htod(&host).map_err(status::driver("cuMemcpyHtoDAsync"))
        };
        let zeros = |n: usize| s.alloc_zeros::<T>(n.max(1)).map_err(status::driver("cuMemAllocAsync"));
        let mut mlp = Mlp {
            layers: layers.to_vec(),
            precision,
            fp8,
            gelu: GeluPlacement::default(),
            dropped: false,
            w: Vec::new(),
            b: Vec::new(),
            dw: Vec::new(),
            db: Vec::new(),
            db_tmp: Vec::new(),
            bufs: None,
            last: None,
            ins: Instruments::default(),
        };
        for (l, p) in layers.iter().zip(params) {
            mlp.w.push(up(&p.w)?);
            mlp.b.push(if l.bias { Some(up(&p.b)?) } else { None });
            mlp.dw.push(zeros(p.w.len())?);
            mlp.db.push(if l.bias { Some(zeros(l.out_features)?) } else { None });
            mlp.db_tmp.push(None);
        }
        Ok(mlp)
    }

    /// The layers.
    pub fn layers(&self) -> &[LinearSpec] {
        &self.layers
    }

    /// The precision every GEMM runs in (FP8 layers: the tensors' precision, that of the
    /// bias-gradient GEMMs; see [`Mlp::fp8`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// FP8 layers' recipe; `None` for high-precision layers.
    pub fn fp8(&self) -> Option<Fp8Training> {
        self.fp8
    }

    /// Where GELU-tanh layers apply the activation and its backward in tf32, f16 and bf16
    /// ([`GeluPlacement`]; default: both in cuBLASLt epilogues), from the next call on. FP8
    /// and f32 layers keep their kernels whatever is set. A change that alters a saved
    /// pre-activation's row stride (a kernel forward on a width not a multiple of 8) drops the
    /// activation buffers and the last forward: [`Mlp::output`] and [`Mlp::backward`] then
    /// answer [`Error::TrainingOrder`] until a new forward runs. Any other change keeps them:
    /// the backward reads the saved pre-activation the same way whichever placement wrote it.
    pub fn set_gelu_placement(&mut self, gelu: GeluPlacement) {
        let lds = |m: &Self| m.layers.iter().map(|l| m.placements().pre_ld(l)).collect::<Vec<_>>();
        let before = lds(self);
        self.gelu = gelu;
        if lds(self) != before {
            self.bufs = None;
            self.dropped |= self.last.take().is_some();
        }
    }

    /// The placement asked for ([`Mlp::set_gelu_placement`]); f32 and FP8 layers, and the
    /// cases that page names, run otherwise.
    pub fn gelu_placement(&self) -> GeluPlacement {
        self.gelu
    }

    /// The [`Error::TrainingOrder`] for a call that needs a forward (`what` it needs).
    fn order_error(&self, what: &str) -> Error {
        let why = if self.dropped { " (a GELU placement change dropped the last one)" } else { "" };
        Error::TrainingOrder { problem: format!("{what}{why}") }
    }

    /// What decides where each activation step runs.
    fn placements(&self) -> Placements {
        Placements { precision: self.precision, fp8: self.fp8.is_some(), gelu: self.gelu }
    }

    /// Layer `i`'s weight `w[out, in]`. Panics if `i` is not a layer.
    pub fn weight(&self, i: usize) -> &CudaSlice<T> {
        &self.w[i]
    }

    /// Layer `i`'s bias `b[out]`, if it has one.
    pub fn bias(&self, i: usize) -> Option<&CudaSlice<T>> {
        self.b[i].as_ref()
    }

    /// Layer `i`'s weight gradient `dw[out, in]` from the last backward.
    pub fn weight_grad(&self, i: usize) -> &CudaSlice<T> {
        &self.dw[i]
    }

    /// Layer `i`'s bias gradient `db[out]` from the last backward.
    pub fn bias_grad(&self, i: usize) -> Option<&CudaSlice<T>> {
        self.db[i].as_ref()
    }

    /// The parameters, copied to the host as f32 (waits for the stream).
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn params_to_host(&self, gpu: &Gpu) -> Result<Params> {
        to_host(gpu, &self.w, &self.b)
    }

    /// The gradients of the last backward, copied to the host as f32 (waits for the stream).
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn grads_to_host(&self, gpu: &Gpu) -> Result<Params> {
        to_host(gpu, &self.dw, &self.db)
    }

    /// The last forward's output `y[tokens, out]` (a view of the layers' own buffer: valid
    /// until the next forward).
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] before any forward.
    pub fn output(&self) -> Result<CudaView<'_, T>> {
        let (Some(f), Some(bufs)) = (self.last, self.bufs.as_ref()) else {
            return Err(self.order_error("no forward has run yet"));
        };
        let last = self.layers.len() - 1;
        Ok(bufs.out[last].slice(..f.tokens * self.layers[last].out_features))
    }

    /// `y[tokens, out] = layers(x[tokens, in])` on [`Gpu::stream`]; the result is
    /// [`Mlp::output`]. With `train`, keeps what [`Mlp::backward`] needs.
    ///
    /// # Errors
    /// [`Error::LayerShape`] when `x` does not hold `tokens × in_features` elements (checked
    /// before anything is enqueued); [`Error::WrongContext`]; as [`Gpu::gemm_fused`].
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

    /// The backward of the last training forward, on [`Gpu::stream`]: every layer's weight
    /// and bias gradient (overwritten or accumulated per `mode`) and, if `dx` is given, the
    /// input gradient `dx[tokens, in]`. `x` is the forward's input (the same buffer),
    /// `dy[tokens, out]` the gradient of its output (not modified).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::TrainingOrder`] without a training forward or
    /// with another `x`; [`Error::LayerShape`] for `dy` or `dx` of the wrong length. Then as
    /// [`Gpu::gemm_fused`].
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
        let places = self.placements();
        let bufs = self.bufs.as_mut().expect("a training forward allocated them");
        let (tokens, prec, l, fp8) = (bufs.tokens, self.precision, self.layers[i], self.fp8);
        let last = i + 1 == self.layers.len();
        let s = gpu.stream();
        // 1. dpre: the gradient of the pre-activation
        let fused_by_next = !last && places.fused_backward(&l).is_some();
        if l.activation != Activation::None && !fused_by_next {
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
            // SAFETY: dy (or grad[i], in place) and grad[i] hold tokens × out elements; saved
            // holds tokens rows of ld; all of this context.
            unsafe { gpu.enqueue_dact(l.activation, T::DTYPE, pd, ps, pg, (tokens, l.out_features, ld)) }?;
        }
        let dpre: &dyn DevicePtr<T> = match (&bufs.grad[i], last) {
            (Some(g), _) => g,
            (None, true) => dy,
            (None, false) => unreachable!("every layer but the last has a gradient buffer"),
        };
        // 2. dw[out, in] = dpreᵀ·x (β = 1 accumulates), db = Σ_tokens dpre (BiasGradA)
        let input: &dyn DevicePtr<T> = if i == 0 { x } else { &bufs.out[i - 1] };
        let beta = if mode == GradMode::Accumulate { 1.0 } else { 0.0 };
        if let Some(recipe) = fp8 {
            // 2.–3. in FP8: dw, db (its own GEMM, β accumulates), then the data gradient
            let st = Fp8Step { recipe, layer: i, spec: l, tokens };
            let ones = bufs.ones.as_ref();
            let db = self.db[i].as_mut().map(|d| (d, ones.expect("allocated for FP8 layers with a bias")));
            let (ins, dw) = (&mut self.ins, &mut self.dw[i]);
            fp8::weight_grads(gpu, ins, st, prec, &DynRef(dpre), &DynRef(input), beta, dw, db)?;
            let (before, rest) = bufs.grad.split_at_mut(i);
            let dpre = rest[0].as_ref().map_or(dy as &dyn DevicePtr<T>, |g| g as &dyn DevicePtr<T>);
            return match (i, dx) {
                (0, None) => Ok(()),
                (0, Some(dx)) => fp8::data_grad(gpu, ins, st, &DynRef(dpre), &self.w[i], dx),
                _ => {
                    let out = before[i - 1].as_mut().expect("every layer but the last has a gradient buffer");
                    fp8::data_grad(gpu, ins, st, &DynRef(dpre), &self.w[i], out)
                }
            };
        }
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
        let role = (i, GemmRole::WeightGrad);
        gemm(gpu, &mut self.ins, role, &pw, &DynRef(dpre), &DynRef(input), beta, &mut self.dw[i], extras)?;
        if own_bias_grad {
            accumulate_bias_grad(gpu, mode, &self.db_tmp[i], &mut self.db[i])?;
        }
        // 3. the data gradient dpre·w[out, in] → [tokens, in]
        if i == 0 && dx.is_none() {
            return Ok(());
        }
        let prev = (i > 0).then(|| self.layers[i - 1]);
        let e = prev.and_then(|p| places.fused_backward(&p)).unwrap_or(Epilogue::None);
        let mut px = GemmProblem::matmul(tokens, l.in_features, l.out_features, prec)?.with_epilogue(e)?;
        let (before, rest) = bufs.grad.split_at_mut(i);
        let dpre: &dyn DevicePtr<T> = match (&rest[0], last) {
            (Some(g), _) => g,
            _ => dy,
        };
        match (i, dx) {
            (0, Some(dx)) => {
                let role = (i, GemmRole::DataGrad);
                gemm(gpu, &mut self.ins, role, &px, &DynRef(dpre), &self.w[i], 0.0, dx, Extras::default())
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
                let (role, extras) = ((i, GemmRole::DataGrad), Extras { aux_in, bias_grad: db, ..Extras::default() });
                gemm(gpu, &mut self.ins, role, &px, &DynRef(dpre), &self.w[i], 0.0, out, extras)?;
                match by_here {
                    true => accumulate_bias_grad(gpu, mode, &self.db_tmp[i - 1], &mut self.db[i - 1]),
                    false => Ok(()),
                }
            }
        }
    }

    /// Plain SGD on [`Gpu::stream`]: `w -= lr·dw`, `b -= lr·db` for every layer (cuBLAS
    /// `axpy`, f32 arithmetic, rounded to T).
    ///
    /// # Errors
    /// [`Error::Cublas`], [`Error::Driver`].
    pub fn sgd_step(&mut self, gpu: &Gpu, lr: f32) -> Result<()> {
        let s = gpu.stream();
        let pairs = self.w.iter_mut().zip(&self.dw);
        let bias_pairs = self.b.iter_mut().zip(&self.db).filter_map(|(p, g)| Some((p.as_mut()?, g.as_ref()?)));
        for (p, g) in pairs.chain(bias_pairs) {
            let n = p.len();
            let (pg, _gg) = g.device_ptr(s);
            let (pp, _gp) = p.device_ptr_mut(s);
            // SAFETY: parameter and gradient hold n elements of T each, distinct allocations.
            unsafe { gpu.enqueue_axpy(T::DTYPE, n, -lr, pg, pp) }?;
        }
        Ok(())
    }

    /// Allocates the activation and gradient buffers for `tokens` unless they exist.
    fn ensure_buffers(&mut self, gpu: &Gpu, tokens: usize) -> Result<()> {
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
