//! The decoder layer of [`crate::layer`] on the CPU backend ([`crate::cpu`]) ([`CpuDecoderLayer`]): the same
//! steps, in the same order, on the same problems ([`crate::layer::LayerGemms`] and the
//! layer's RMSNorm, RoPE, SwiGLU and attention problems) as the GPU layer, each through this
//! backend's function ([`crate::cpu::gemm`], [`crate::cpu::gemm_c_in`], [`crate::cpu::rms_norm_forward`],
//! [`crate::cpu::rope`], [`crate::cpu::swiglu`], [`crate::cpu::attention_forward`] and their backwards), in
//! f32 arithmetic on f16/bf16 storage. For tests, the example and machines without a GPU: one
//! thread per call, small layers.

use crate::cpu::{attention_backward, attention_forward, gemm, gemm_c_in, rms_norm_backward, rms_norm_forward};
use crate::cpu::{rope, swiglu, swiglu_backward, DwSlice};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::fp8::{self, Fp8Format, Scaling, Source};
use crate::layer::reference::Weights;
use crate::layer::{DecoderLayer, LayerGemms, LayerOptions, LayerWeight, Proj, Step, Tokens, BACKWARD, FORWARD};
use crate::layer_ops::{Positions, RopeDirection};
use crate::norm::GradType;
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::train::GradMode;

/// What the forward keeps and the backward writes, `T = b·s` tokens (names as in
/// [`crate::layer`]).
#[derive(Clone, Debug, Default)]
struct Buffers<T> {
    h1: Vec<T>,
    rstd1: Vec<f32>,
    qkv: Vec<T>,
    o: Vec<T>,
    lse: Vec<f32>,
    x2: Vec<T>,
    h2: Vec<T>,
    rstd2: Vec<f32>,
    gu: Vec<T>,
    act: Vec<T>,
    y: Vec<T>,
    d_act: Vec<T>,
    d_gu: Vec<T>,
    dh: Vec<T>,
    dx2: Vec<T>,
    d_o: Vec<T>,
    /// dq, dk, dv as the CPU attention writes them (each its own buffer of the packed size).
    d_packed: [Vec<T>; 3],
    dqkv: Vec<T>,
    dx: Vec<T>,
}

/// One decoder layer ([`crate::layer`] defines it) on the CPU for a fixed token batch, in `T`
/// (bf16 or f16; f32 arithmetic, each step's result rounded to `T` once, the norms' inverse
/// RMS and weight gradients in f32). Mirrors the GPU layer: [`CpuDecoderLayer::forward`], then
/// with `train` [`CpuDecoderLayer::backward`] on the same input.
#[derive(Clone, Debug)]
pub struct CpuDecoderLayer<T> {
    layer: DecoderLayer,
    tokens: Tokens,
    gemms: LayerGemms,
    grad_mode: GradMode,
    /// The weights, in [`LayerWeight::ALL`]'s order.
    w: [Vec<T>; 6],
    /// The projections' weight gradients (`[..4]`) and the norms' (`[4..]`, unused: f32 below).
    dw: [Vec<T>; 6],
    dw_norm: [Vec<f32>; 2],
    /// With an FP8 forward: its recipe and the four projections' weights quantised and
    /// dequantised to f32.
    fp8: Option<(Scaling, [Vec<f32>; 4])>,
    b: Buffers<T>,
    /// The last forward's input (address, length) and whether it was a training forward.
    last: Option<((usize, usize), bool)>,
}

fn slot(w: LayerWeight) -> usize {
    LayerWeight::ALL.iter().position(|&x| x == w).unwrap_or(0)
}

/// `y[i] = T(f32(y[i]) + f32(x[i]))`: a residual's gradient added, as the GPU's `axpy`.
fn add_into<T: Element>(x: &[T], y: &mut [T]) {
    y.iter_mut().zip(x).for_each(|(a, b)| *a = T::from_f32(a.to_f32() + b.to_f32()));
}

/// One forward projection in FP8 on the CPU: `input[m, k]` quantised as `scaling` says
/// ([`crate::fp8::quantize`], the GPU kernels' rounding) and dequantised, the f32 product with
/// the dequantised weight `wq[n, k]`, then `out = T(acc + c_in)`.
fn fp8_project<T: Element>(
    p: &GemmProblem,
    scaling: Scaling,
    (input, wq): (&[T], &[f32]),
    c_in: Option<&[T]>,
    out: &mut [T],
) -> Result<()> {
    let (m, n, k) = (p.m(), p.n(), p.k());
    let q = fp8::quantize(&input[..m * k], m, k, Source::RowMajor, Fp8Format::E4M3, scaling)?;
    let xd: Vec<f32> = fp8::dequantize(&q)?.into_iter().map(|v| v as f32).collect();
    let mut acc = vec![0f32; m * n];
    gemm(&GemmProblem::linear(m, n, k, Precision::F32)?, 1.0, &xd, wq, 0.0, &mut acc)?;
    for (i, (o, a)) in out[..m * n].iter_mut().zip(&acc).enumerate() {
        *o = T::from_f32(a + c_in.map_or(0.0, |c| c[i].to_f32()));
    }
    Ok(())
}

impl<T: Element> CpuDecoderLayer<T> {
    /// [`CpuDecoderLayer::with_options`] with the default options (every GEMM in `T`).
    ///
    /// # Errors
    /// As [`CpuDecoderLayer::with_options`].
    pub fn new(layer: DecoderLayer, tokens: Tokens, weights: &Weights) -> Result<CpuDecoderLayer<T>> {
        CpuDecoderLayer::with_options((layer, tokens), weights, LayerOptions::default())
    }

    /// `layer` with `weights` (rounded to T) for `tokens`, every buffer allocated; with an FP8
    /// forward ([`LayerOptions::fp8_forward`]) the projections' weights quantised.
    ///
    /// # Errors
    /// As [`DecoderLayer::check_tokens`], [`Weights::check`] and [`LayerOptions::validate`];
    /// [`Error::DTypeMismatch`] when T is not the layer's dtype.
    pub fn with_options(
        (layer, tokens): (DecoderLayer, Tokens),
        weights: &Weights,
        options: LayerOptions,
    ) -> Result<CpuDecoderLayer<T>> {
        options.validate()?;
        layer.check_tokens(tokens)?;
        // the CPU attention's limit, refused here rather than at the first forward
        let scores = tokens.s.saturating_mul(tokens.s);
        if scores > crate::cpu::MAX_CPU_SCORES {
            let what = "s·s, one attention head's f32 scores on the CPU";
            return Err(Error::DimensionTooLarge { what, value: scores, max: crate::cpu::MAX_CPU_SCORES });
        }
        weights.check(&layer)?;
        layer.check_element::<T>()?;
        let (n, d, f, wq) = (tokens.count(), layer.d_model, layer.ffn, layer.qkv_width());
        let z = |k: usize| vec![T::from_f32(0.0); k];
        let w: [Vec<T>; 6] = LayerWeight::ALL.map(|w| weights.get(w).iter().map(|&v| T::from_f64(v)).collect());
        let fp8 = match options.fp8_forward {
            Some(scaling) => {
                let mut wq: [Vec<f32>; 4] = Default::default();
                for p in Proj::ALL {
                    let (out, inp) = layer.proj_shape(p);
                    let q = fp8::quantize(&w[p as usize], out, inp, Source::RowMajor, Fp8Format::E4M3, scaling)?;
                    wq[p as usize] = fp8::dequantize(&q)?.into_iter().map(|v| v as f32).collect();
                }
                Some((scaling, wq))
            }
            None => None,
        };
        let b = Buffers {
            h1: z(n * d),
            rstd1: vec![0.0; n],
            qkv: z(n * wq),
            o: z(n * layer.q_width()),
            lse: vec![0.0; layer.attention(tokens).stats_elems()],
            x2: z(n * d),
            h2: z(n * d),
            rstd2: vec![0.0; n],
            gu: z(n * 2 * f),
            act: z(n * f),
            y: z(n * d),
            d_act: z(n * f),
            d_gu: z(n * 2 * f),
            dh: z(n * d),
            dx2: z(n * d),
            d_o: z(n * layer.q_width()),
            d_packed: [z(n * wq), z(n * wq), z(n * wq)],
            dqkv: z(n * wq),
            dx: z(n * d),
        };
        Ok(CpuDecoderLayer {
            layer,
            tokens,
            gemms: layer.gemms(tokens, layer.precision())?,
            grad_mode: GradMode::Overwrite,
            w,
            dw: LayerWeight::ALL.map(|w| z(layer.weight_len(w))),
            dw_norm: [vec![0.0; d], vec![0.0; d]],
            fp8,
            b,
            last: None,
        })
    }

    /// Whether a backward overwrites the weight gradients or adds to them (default: overwrite).
    pub fn set_grad_mode(&mut self, mode: GradMode) {
        self.grad_mode = mode;
    }

    /// The last forward's output `y[T, d]`.
    pub fn output(&self) -> &[T] {
        &self.b.y
    }

    /// The last backward's input gradient `dx[T, d]`.
    pub fn input_grad(&self) -> &[T] {
        &self.b.dx
    }

    /// Every weight gradient as f64 (the projections' stored in T, the norms' in f32).
    pub fn grads(&self) -> Weights {
        let mut out = Weights::default();
        for w in LayerWeight::ALL {
            *out.get_mut(w) = match w {
                LayerWeight::Norm1 => self.dw_norm[0].iter().map(|&v| f64::from(v)).collect(),
                LayerWeight::Norm2 => self.dw_norm[1].iter().map(|&v| f64::from(v)).collect(),
                _ => self.dw[slot(w)].iter().map(|v| v.to_f64()).collect(),
            };
        }
        out
    }

    /// The forward on `x[T, d]` (the GPU layer's steps, in order): `y` in
    /// [`CpuDecoderLayer::output`]; `train` keeps the inverse RMS and attention's statistics
    /// for [`CpuDecoderLayer::backward`] on the same `x`.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] for `x` shorter than `T·d`; as the CPU functions of the steps.
    pub fn forward(&mut self, x: &[T], train: bool) -> Result<()> {
        let (l, t) = (self.layer, self.tokens);
        let need = t.count() * l.d_model;
        if x.len() < need {
            let detail = format!("{} elements, expected {need}", x.len());
            return Err(Error::DecoderShape { what: "the input x is too short", detail });
        }
        self.last = None;
        // the backward recognises x by the buffer given (address and whole length), as the GPU
        // layer does; the step reads its first T·d elements
        let given = (x.as_ptr() as usize, x.len());
        let x = &x[..need];
        for step in FORWARD {
            self.forward_step(step, x)?;
        }
        self.last = Some((given, train));
        Ok(())
    }

    /// One step of the forward ([`Step`]) on the layer's input `x`.
    fn forward_step(&mut self, step: Step, x: &[T]) -> Result<()> {
        let (l, t) = (self.layer, self.tokens);
        let norm = l.norm_problem(t, GradType::F32);
        let b = &mut self.b;
        match step {
            Step::Norm1 => rms_norm_forward(&norm, x, &self.w[slot(LayerWeight::Norm1)], &mut b.h1, Some(&mut b.rstd1)),
            Step::Project(p) => self.project(p, x),
            Step::Rope => {
                rope(&l.rope_problem(t), RopeDirection::Forward, &mut b.qkv, Positions::Contiguous { start: 0 }, None)
            }
            Step::Attention => {
                let [_, ok, ov] = l.qkv_offsets();
                let qkv = [&b.qkv[..], &b.qkv[ok..], &b.qkv[ov..]];
                attention_forward(&l.attention(t), qkv, &mut b.o, Some(&mut b.lse), None)
            }
            Step::Norm2 => {
                rms_norm_forward(&norm, &b.x2, &self.w[slot(LayerWeight::Norm2)], &mut b.h2, Some(&mut b.rstd2))
            }
            Step::SwiGlu => swiglu(&l.swiglu_problem(t), &b.gu, &mut b.act),
        }
    }

    /// The backward from `dy[T, d]` after a training forward on the same `x`: `dx` in
    /// [`CpuDecoderLayer::input_grad`], the weight gradients in [`CpuDecoderLayer::grads`]
    /// (overwritten, or added to under [`GradMode::Accumulate`]).
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] without a training forward on this `x`;
    /// [`Error::DecoderShape`] for `dy` shorter than `T·d`; as the CPU functions of the steps.
    pub fn backward(&mut self, x: &[T], dy: &[T]) -> Result<()> {
        let (l, t) = (self.layer, self.tokens);
        let need = t.count() * l.d_model;
        let here = (x.as_ptr() as usize, x.len());
        if self.last != Some((here, true)) {
            let problem = format!(
                "the decoder layer's backward needs a training forward (train = true) on the same x buffer, \
                 recognised by its address and length, not its values: x at {:#x}, {} elements; the last forward {}",
                here.0,
                here.1,
                match self.last {
                    Some(((a, n), train)) => format!("at {a:#x}, {n} elements, train = {train}"),
                    None => "none".into(),
                }
            );
            return Err(Error::TrainingOrder { problem });
        }
        if dy.len() < need {
            let detail = format!("{} elements, expected {need}", dy.len());
            return Err(Error::DecoderShape { what: "the output gradient dy is too short", detail });
        }
        let dy = &dy[..need];
        for step in BACKWARD {
            self.backward_step(step, x, dy)?;
        }
        Ok(())
    }

    /// One step of the backward ([`Step`]) from `dy`, on the layer's input `x`.
    fn backward_step(&mut self, step: Step, x: &[T], dy: &[T]) -> Result<()> {
        let (l, t) = (self.layer, self.tokens);
        match step {
            Step::Project(p) => self.proj_backward(p, dy),
            Step::SwiGlu => {
                let b = &mut self.b;
                swiglu_backward(&l.swiglu_problem(t), &b.d_act, &b.gu, &mut b.d_gu)
            }
            Step::Norm2 => {
                self.norm_backward(1, x)?;
                add_into(dy, &mut self.b.dx2);
                Ok(())
            }
            Step::Attention => self.attention_backward(),
            Step::Rope => {
                let b = &mut self.b;
                rope(&l.rope_problem(t), RopeDirection::Backward, &mut b.dqkv, Positions::Contiguous { start: 0 }, None)
            }
            Step::Norm1 => {
                self.norm_backward(0, x)?;
                add_into(&self.b.dx2, &mut self.b.dx);
                Ok(())
            }
        }
    }

    /// One forward projection (`x`: the layer's input, the O projection's C), in FP8 where the
    /// layer runs so.
    fn project(&mut self, p: Proj, x: &[T]) -> Result<()> {
        let (b, g, w, i) = (&mut self.b, &self.gemms, &self.w, p as usize);
        let (input, c_in, out): (&[T], Option<&[T]>, &mut [T]) = match p {
            Proj::Qkv => (&b.h1, None, &mut b.qkv),
            Proj::O => (&b.o, Some(x), &mut b.x2),
            Proj::GateUp => (&b.h2, None, &mut b.gu),
            Proj::Down => (&b.act, Some(&b.x2), &mut b.y),
        };
        match (&self.fp8, c_in) {
            (Some((scaling, wq)), _) => fp8_project(&g.fwd[i], *scaling, (input, &wq[i]), c_in, out),
            (None, Some(c)) => gemm_c_in(&g.fwd[i], (1.0, 1.0), input, &w[i], c, out),
            (None, None) => gemm(&g.fwd[i], 1.0, input, &w[i], 0.0, out),
        }
    }

    /// One projection's weight gradient (`dW (+)= dYᵀ·X`) and data gradient (`dX = dY·W`).
    fn proj_backward(&mut self, p: Proj, dy: &[T]) -> Result<()> {
        let beta = if self.grad_mode == GradMode::Accumulate { 1.0 } else { 0.0 };
        let i = p as usize;
        let (b, g) = (&mut self.b, &self.gemms);
        let w = &self.w[slot(p.weight())];
        let (d_out, input, d_in): (&[T], &[T], &mut Vec<T>) = match p {
            Proj::Down => (dy, &b.act, &mut b.d_act),
            Proj::GateUp => (&b.d_gu, &b.h2, &mut b.dh),
            Proj::O => (&b.dx2, &b.o, &mut b.d_o),
            Proj::Qkv => (&b.dqkv, &b.h1, &mut b.dh),
        };
        gemm(&g.dw[i], 1.0, d_out, input, beta, &mut self.dw[slot(p.weight())])?;
        gemm(&g.dx[i], 1.0, d_out, w, 0.0, d_in)
    }

    /// Norm `k`'s backward (0: the first, on `x`, into `dx`; 1: the second, on `x2`, into
    /// `dx2`) from `dh`, its f32 weight gradient overwritten or added to.
    fn norm_backward(&mut self, k: usize, x: &[T]) -> Result<()> {
        let p = self.layer.norm_problem(self.tokens, GradType::F32);
        let b = &mut self.b;
        let (x, rstd, dx) = if k == 0 { (x, &b.rstd1, &mut b.dx) } else { (&b.x2[..], &b.rstd2, &mut b.dx2) };
        let w = &self.w[slot(if k == 0 { LayerWeight::Norm1 } else { LayerWeight::Norm2 })];
        let mut dw = vec![0f32; self.layer.d_model];
        rms_norm_backward(&p, x, w, rstd, &b.dh, dx, DwSlice::F32(&mut dw))?;
        let target = &mut self.dw_norm[k];
        if self.grad_mode == GradMode::Accumulate {
            target.iter_mut().zip(&dw).for_each(|(a, b)| *a += b);
        } else {
            *target = dw;
        }
        Ok(())
    }

    /// Attention's backward into three packed-size buffers, then their q, k and v columns
    /// gathered into `dqkv`.
    fn attention_backward(&mut self) -> Result<()> {
        let (l, t) = (self.layer, self.tokens);
        let b = &mut self.b;
        let [_, ok, ov] = l.qkv_offsets();
        let qkv = &b.qkv;
        let [dq, dk, dv] = &mut b.d_packed;
        let grads = [&mut dq[..], &mut dk[ok..], &mut dv[ov..]];
        attention_backward(&l.attention(t), [qkv, &qkv[ok..], &qkv[ov..], &b.o, &b.d_o], &b.lse, grads, None)?;
        let w = l.qkv_width();
        for row in 0..t.count() {
            for (which, (from, to)) in [(0, ok), (ok, ov), (ov, w)].into_iter().enumerate() {
                let at = row * w;
                b.dqkv[at + from..at + to].copy_from_slice(&b.d_packed[which][at + from..at + to]);
            }
        }
        Ok(())
    }
}
