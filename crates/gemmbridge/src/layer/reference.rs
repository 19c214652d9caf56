//! The decoder layer's forward and backward in float64, following the definitions in
//! [`super`]'s documentation step by step on the problems the CPU and GPU layers run, each
//! step by the crate's own float64 reference of its problem (`f64ops.rs`), for tests and for
//! the check file. O(T·weights + b·h_q·s²·hd) work on one thread: for small layers.

use super::f64ops::{self, product};
use super::{DecoderLayer, LayerWeight, Proj, Tokens};
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
#[derive(Clone, Debug)]
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
    let (n, d) = (t.count(), l.d_model);
    check_len("x has the wrong length", x.len(), n * d)?;
    let (h1, rstd1) = f64ops::rms_norm(l, x, &w.w_norm1);
    let qkv = proj(Proj::Qkv, &h1, &w.w_qkv, (n, l.qkv_width(), d));
    let qkv = f64ops::rope(l, t, &qkv, &Positions::Contiguous { start: 0 }, RopeDirection::Forward);
    let (o, lse) = f64ops::attention(l, t, &qkv);
    let Tail { x2, h2, rstd2, gate_up, act, y } = tail(l, w, (x, &o), proj);
    Ok(Saved { y, h1, qkv, o, lse, x2, h2, gate_up, act, rstd1, rstd2 })
}

/// What follows attention in a forward: the O projection with the residual, norm 2, the
/// gate/up projection, SwiGLU and the down projection with the residual.
pub(super) struct Tail {
    pub x2: Vec<f64>,
    pub h2: Vec<f64>,
    pub rstd2: Vec<f64>,
    pub gate_up: Vec<f64>,
    pub act: Vec<f64>,
    pub y: Vec<f64>,
}

/// [`Tail`] from the layer's input `x[T, d]` and attention's output `o[T, h_q·hd]`.
pub(super) fn tail(l: &DecoderLayer, w: &Weights, (x, o): (&[f64], &[f64]), proj: ProjFn<'_>) -> Tail {
    let (d, f) = (l.d_model, l.ffn);
    let n = x.len() / d;
    let o_proj = proj(Proj::O, o, &w.w_o, (n, d, l.q_width()));
    let x2: Vec<f64> = x.iter().zip(&o_proj).map(|(a, b)| a + b).collect();
    let (h2, rstd2) = f64ops::rms_norm(l, &x2, &w.w_norm2);
    let gate_up = proj(Proj::GateUp, &h2, &w.w_gate_up, (n, 2 * f, d));
    let act = f64ops::swiglu(l, &gate_up);
    let down = proj(Proj::Down, &act, &w.w_down, (n, d, f));
    let y = x2.iter().zip(&down).map(|(a, b)| a + b).collect();
    Tail { x2, h2, rstd2, gate_up, act, y }
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
    let (s, g) = (saved, l.gemms(t, l.precision())?);
    // a projection's weight gradient dW = dYᵀ·X and data gradient dX = dY·W
    let grads = |p: Proj, dy_: &[f64], x_: &[f64], w_: &[f64]| {
        (product(&g.dw[p as usize], dy_, x_), product(&g.dx[p as usize], dy_, w_))
    };
    let (w_down, da) = grads(Proj::Down, dy, &s.act, &w.w_down);
    let mut dw = Weights { w_down, ..Weights::default() };
    let dgu = f64ops::swiglu_backward(l, &da, &s.gate_up);
    let dh2;
    (dw.w_gate_up, dh2) = grads(Proj::GateUp, &dgu, &s.h2, &w.w_gate_up);
    let (dx2_norm, dg2) = f64ops::rms_norm_backward(l, &s.x2, &w.w_norm2, &dh2);
    dw.w_norm2 = dg2;
    let dx2: Vec<f64> = dy.iter().zip(&dx2_norm).map(|(a, b)| a + b).collect();
    let d_o;
    (dw.w_o, d_o) = grads(Proj::O, &dx2, &s.o, &w.w_o);
    let dqkv = f64ops::attention_backward(l, t, &s.qkv, &s.o, &s.lse, &d_o);
    let dqkv = f64ops::rope(l, t, &dqkv, &Positions::Contiguous { start: 0 }, RopeDirection::Backward);
    let dh1;
    (dw.w_qkv, dh1) = grads(Proj::Qkv, &dqkv, &s.h1, &w.w_qkv);
    let (dx_norm, dg1) = f64ops::rms_norm_backward(l, x, &w.w_norm1, &dh1);
    dw.w_norm1 = dg1;
    let dx = dx2.iter().zip(&dx_norm).map(|(a, b)| a + b).collect();
    Ok(Grads { dx, dw })
}
