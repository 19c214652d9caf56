//! The decoder layer's forward and backward in float64, following the definitions in
//! [`super`]'s documentation step by step on the problems the CPU and GPU layers run, each
//! step by the crate's own float64 reference of its problem (`f64ops.rs`), for tests and for
//! the check file. O(T·weights + b·h_q·s²·hd) work on one thread: for small layers.

use super::f64ops::{self, product};
use super::{DecoderLayer, LayerWeight, Proj, Step, Tokens, AFTER_ATTENTION, BACKWARD, FORWARD};
use crate::error::{Error, Result};
use crate::layer_ops::{Positions, RopeDirection};

/// The layer's weights in float64, each row-major in its layout ([`LayerWeight`]); also the
/// weight gradients' container.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights {
    /// `[(h_q + 2·h_kv)·hd, d]`.
    pub w_qkv: Vec<f64>,
    /// `[d, h_q·hd]`.
    pub w_o: Vec<f64>,
    /// `[2·ffn, d]`, gate rows first.
    pub w_gate_up: Vec<f64>,
    /// `[d, ffn]`.
    pub w_down: Vec<f64>,
    /// `[d]`.
    pub w_norm1: Vec<f64>,
    /// `[d]`.
    pub w_norm2: Vec<f64>,
}

/// Most f64 elements the six weights of one layer may hold on the host in [`Weights`]
/// (2³⁴ elements, 128 GiB): past it [`Weights::from_fn`] refuses the layer.
pub const MAX_HOST_WEIGHT_ELEMS: usize = 1 << 34;

impl Weights {
    /// Every weight of `l` filled by `f(weight, index)`.
    ///
    /// # Errors
    /// Before anything is allocated: as [`DecoderLayer::validate`];
    /// [`Error::DimensionTooLarge`] for weights past [`MAX_HOST_WEIGHT_ELEMS`] elements.
    /// [`Error::Unsupported`] where the host cannot allocate a weight (named in bytes).
    pub fn from_fn(l: &DecoderLayer, mut f: impl FnMut(LayerWeight, usize) -> f64) -> Result<Weights> {
        l.validate()?;
        let total = LayerWeight::ALL.iter().fold(0usize, |a, &w| a.saturating_add(l.weight_len(w)));
        if total > MAX_HOST_WEIGHT_ELEMS {
            let what = "the decoder layer's weights, in f64 on the host";
            return Err(Error::DimensionTooLarge { what, value: total, max: MAX_HOST_WEIGHT_ELEMS });
        }
        let mut w = Weights::default();
        for which in LayerWeight::ALL {
            let n = l.weight_len(which);
            let v = w.get_mut(which);
            v.try_reserve_exact(n).map_err(|_| Error::Unsupported {
                backend: "the host",
                what: format!("{} bytes for the {which:?} weight could not be allocated", n.saturating_mul(8)),
            })?;
            v.extend((0..n).map(|i| f(which, i)));
        }
        Ok(w)
    }

    /// One weight.
    pub fn get(&self, w: LayerWeight) -> &Vec<f64> {
        match w {
            LayerWeight::Qkv => &self.w_qkv,
            LayerWeight::O => &self.w_o,
            LayerWeight::GateUp => &self.w_gate_up,
            LayerWeight::Down => &self.w_down,
            LayerWeight::Norm1 => &self.w_norm1,
            LayerWeight::Norm2 => &self.w_norm2,
        }
    }

    /// One weight, to change.
    pub fn get_mut(&mut self, w: LayerWeight) -> &mut Vec<f64> {
        match w {
            LayerWeight::Qkv => &mut self.w_qkv,
            LayerWeight::O => &mut self.w_o,
            LayerWeight::GateUp => &mut self.w_gate_up,
            LayerWeight::Down => &mut self.w_down,
            LayerWeight::Norm1 => &mut self.w_norm1,
            LayerWeight::Norm2 => &mut self.w_norm2,
        }
    }

    /// Whether every weight has `l`'s length.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] naming the weight and both lengths.
    pub fn check(&self, l: &DecoderLayer) -> Result<()> {
        for w in LayerWeight::ALL {
            if self.get(w).len() != l.weight_len(w) {
                return Err(Error::DecoderShape {
                    what: "a weight has the wrong length",
                    detail: format!("{} has {}, expected {}", w.name(), self.get(w).len(), l.weight_len(w)),
                });
            }
        }
        Ok(())
    }
}

/// The forward's output and what the backward reads.
#[derive(Clone, Debug, Default)]
pub struct Saved {
    /// The output `y[T, d]`.
    pub y: Vec<f64>,
    /// `h1 = rms_norm(x)∘w_norm1`, `[T, d]`.
    pub h1: Vec<f64>,
    /// `qkv[T, (h_q + 2·h_kv)·hd]` after RoPE.
    pub qkv: Vec<f64>,
    /// Attention's output `o[T, h_q·hd]`.
    pub o: Vec<f64>,
    /// Attention's statistics `lse[b, h_q, s]` (natural log).
    pub lse: Vec<f64>,
    /// `x2 = x + o·w_oᵀ`, `[T, d]`.
    pub x2: Vec<f64>,
    /// `h2 = rms_norm(x2)∘w_norm2`, `[T, d]`.
    pub h2: Vec<f64>,
    /// `gu[T, 2·ffn]` (gate columns first).
    pub gate_up: Vec<f64>,
    /// `a = silu(gate)∘up`, `[T, ffn]`.
    pub act: Vec<f64>,
    /// The first norm's `1/sqrt(mean(x²) + eps)` per token, `[T]`.
    pub rstd1: Vec<f64>,
    /// The second norm's, `[T]`.
    pub rstd2: Vec<f64>,
}

impl Saved {
    /// Whether every field has the length a forward of `l` on `t` gives it.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] naming the first field of another length, with both lengths.
    pub fn check(&self, l: &DecoderLayer, t: Tokens) -> Result<()> {
        let (n, d) = (t.count(), l.d_model);
        let fields = [
            ("y", self.y.len(), n * d),
            ("h1", self.h1.len(), n * d),
            ("qkv", self.qkv.len(), n * l.qkv_width()),
            ("o", self.o.len(), n * l.q_width()),
            ("lse", self.lse.len(), l.attention(t).stats_elems()),
            ("x2", self.x2.len(), n * d),
            ("h2", self.h2.len(), n * d),
            ("gate_up", self.gate_up.len(), n * 2 * l.ffn),
            ("act", self.act.len(), n * l.ffn),
            ("rstd1", self.rstd1.len(), n),
            ("rstd2", self.rstd2.len(), n),
        ];
        match fields.iter().find(|(_, got, want)| got != want) {
            Some((name, got, want)) => Err(Error::DecoderShape {
                what: "the saved forward is not of this layer and these tokens",
                detail: format!("{name} has {got} elements, expected {want}"),
            }),
            None => Ok(()),
        }
    }
}

/// The backward's results: `dx[T, d]` and every weight's gradient in its layout.
#[derive(Clone, Debug)]
pub struct Grads {
    /// The input's gradient.
    pub dx: Vec<f64>,
    /// The weights' gradients (`dw.w_qkv` is `dL/dw_qkv`, and so on).
    pub dw: Weights,
}

impl Grads {
    /// A result by its check-file name ([`super::check_names`]: `dx`, `d_w_qkv`, …).
    pub fn named(&self, name: &str) -> Option<&[f64]> {
        if name == "dx" {
            return Some(&self.dx);
        }
        LayerWeight::ALL.into_iter().find(|w| name.strip_prefix("d_") == Some(w.name())).map(|w| &self.dw.get(w)[..])
    }
}

fn check_len(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::DecoderShape { what, detail: format!("{got} elements, expected {want}") })
    }
}

/// A forward projection's product `out[T, out] = input[T, in]·weight[out, in]ᵀ` for
/// [`forward_with`]: `(projection, input, weight, (T, out, in))`.
pub type ProjFn<'a> = &'a dyn Fn(Proj, &[f64], &[f64], (usize, usize, usize)) -> Vec<f64>;

/// The forward on `x[T, d]`.
///
/// # Errors
/// As [`DecoderLayer::check_tokens`]; [`Error::DecoderShape`] for a weight or `x` of the
/// wrong length.
pub fn forward(l: &DecoderLayer, t: Tokens, w: &Weights, x: &[f64]) -> Result<Saved> {
    l.check_tokens(t)?;
    let g = l.gemms(t, l.precision())?;
    forward_with(l, t, w, x, &|p, a, b, _| product(&g.fwd[p as usize], a, b))
}

/// [`forward`] with each forward projection's product computed by `proj` (the residual added
/// after, as in [`forward`]) — e.g. on operands rounded as an FP8 recipe rounds them, to check a
/// layer whose forward projections run in FP8. [`backward`] on its result uses the saved
/// (unrounded) activations, as such a layer's backward does.
///
/// # Errors
/// As [`forward`].
pub fn forward_with(l: &DecoderLayer, t: Tokens, w: &Weights, x: &[f64], proj: ProjFn<'_>) -> Result<Saved> {
    l.check_tokens(t)?;
    w.check(l)?;
    check_len("x has the wrong length", x.len(), t.count() * l.d_model)?;
    let mut s = Saved::default();
    for step in FORWARD {
        forward_step(l, t, w, (x, proj), step, &mut s);
    }
    Ok(s)
}

/// The forward's steps after attention ([`FORWARD`] from [`AFTER_ATTENTION`] on) on the layer's
/// input `x[T, d]` and attention's output `o[T, h_q·hd]`: their results in a [`Saved`].
pub(super) fn tail(l: &DecoderLayer, w: &Weights, (x, o): (&[f64], &[f64]), proj: ProjFn<'_>) -> Saved {
    let t = Tokens { b: x.len() / l.d_model, s: 1 };
    let mut s = Saved { o: o.to_vec(), ..Saved::default() };
    for step in &FORWARD[AFTER_ATTENTION..] {
        forward_step(l, t, w, (x, proj), *step, &mut s);
    }
    s
}

/// One step of the forward ([`Step`]) on `x[T, d]`, writing its results into `s`.
fn forward_step(l: &DecoderLayer, t: Tokens, w: &Weights, (x, proj): (&[f64], ProjFn<'_>), step: Step, s: &mut Saved) {
    let contiguous = Positions::Contiguous { start: 0 };
    match step {
        Step::Norm1 => (s.h1, s.rstd1) = f64ops::rms_norm(l, x, &w.w_norm1),
        Step::Project(p) => {
            let n = x.len() / l.d_model;
            let (out_w, in_w) = l.proj_shape(p);
            let (input, residual) = match p {
                Proj::Qkv => (&s.h1, None),
                Proj::O => (&s.o, Some(x)),
                Proj::GateUp => (&s.h2, None),
                Proj::Down => (&s.act, Some(&s.x2[..])),
            };
            let mut out = proj(p, input, w.get(p.weight()), (n, out_w, in_w));
            if let Some(r) = residual {
                out.iter_mut().zip(r).for_each(|(o, r)| *o += r);
            }
            *match p {
                Proj::Qkv => &mut s.qkv,
                Proj::O => &mut s.x2,
                Proj::GateUp => &mut s.gate_up,
                Proj::Down => &mut s.y,
            } = out;
        }
        Step::Rope => s.qkv = f64ops::rope(l, t, &s.qkv, &contiguous, RopeDirection::Forward),
        Step::Attention => (s.o, s.lse) = f64ops::attention(l, t, &s.qkv),
        Step::Norm2 => (s.h2, s.rstd2) = f64ops::rms_norm(l, &s.x2, &w.w_norm2),
        Step::SwiGlu => s.act = f64ops::swiglu(l, &s.gate_up),
    }
}

/// The backward from `dy[T, d]`, with the forward's `saved` on the same `x` and weights.
///
/// # Errors
/// As [`forward`]; [`Error::DecoderShape`] for `dy` of the wrong length or `saved` not of this
/// layer and tokens ([`Saved::check`]).
pub fn backward(l: &DecoderLayer, t: Tokens, w: &Weights, x: &[f64], saved: &Saved, dy: &[f64]) -> Result<Grads> {
    l.check_tokens(t)?;
    w.check(l)?;
    let (n, d) = (t.count(), l.d_model);
    check_len("x has the wrong length", x.len(), n * d)?;
    check_len("dy has the wrong length", dy.len(), n * d)?;
    saved.check(l, t)?;
    let mut b = Backward { g: Some(l.gemms(t, l.precision())?), dw: Weights::default(), ..Backward::default() };
    for step in BACKWARD {
        b.step(l, t, w, (x, saved, dy), step);
    }
    Ok(Grads { dx: b.dx, dw: b.dw })
}

/// The backward's running state: the step's GEMMs, the weight gradients, and the gradients
/// flowing between the steps.
#[derive(Default)]
struct Backward {
    g: Option<super::LayerGemms>,
    dw: Weights,
    /// `d_act`, then `dh2`, `dh1`: a projection's data gradient.
    d_in: Vec<f64>,
    d_gu: Vec<f64>,
    dx2: Vec<f64>,
    d_o: Vec<f64>,
    dqkv: Vec<f64>,
    dx: Vec<f64>,
}

impl Backward {
    /// One step of the backward ([`Step`]).
    fn step(&mut self, l: &DecoderLayer, t: Tokens, w: &Weights, (x, s, dy): (&[f64], &Saved, &[f64]), step: Step) {
        let contiguous = Positions::Contiguous { start: 0 };
        match step {
            Step::Project(p) => {
                let g = self.g.as_ref().expect("made by backward");
                let (d_out, input) = match p {
                    Proj::Down => (dy, &s.act),
                    Proj::GateUp => (&self.d_gu[..], &s.h2),
                    Proj::O => (&self.dx2[..], &s.o),
                    Proj::Qkv => (&self.dqkv[..], &s.h1),
                };
                // the weight gradient dW = dYᵀ·X and the data gradient dX = dY·W
                let dw = product(&g.dw[p as usize], d_out, input);
                let dx = product(&g.dx[p as usize], d_out, w.get(p.weight()));
                *self.dw.get_mut(p.weight()) = dw;
                *if p == Proj::O { &mut self.d_o } else { &mut self.d_in } = dx;
            }
            Step::SwiGlu => self.d_gu = f64ops::swiglu_backward(l, &self.d_in, &s.gate_up),
            Step::Norm2 => {
                let (dx2_norm, dg2) = f64ops::rms_norm_backward(l, &s.x2, &w.w_norm2, &self.d_in);
                self.dw.w_norm2 = dg2;
                self.dx2 = dy.iter().zip(&dx2_norm).map(|(a, b)| a + b).collect();
            }
            Step::Attention => self.dqkv = f64ops::attention_backward(l, t, &s.qkv, &s.o, &s.lse, &self.d_o),
            Step::Rope => self.dqkv = f64ops::rope(l, t, &self.dqkv, &contiguous, RopeDirection::Backward),
            Step::Norm1 => {
                let (dx_norm, dg1) = f64ops::rms_norm_backward(l, x, &w.w_norm1, &self.d_in);
                self.dw.w_norm1 = dg1;
                self.dx = self.dx2.iter().zip(&dx_norm).map(|(a, b)| a + b).collect();
            }
        }
    }
}
