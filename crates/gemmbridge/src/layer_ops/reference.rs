//! The float64 definitions of RoPE and SwiGLU, which accuracy tests compare the f32 arithmetic
//! ([`super::arith`], the GPU kernels and [`crate::cpu`]) against: angles, frequencies, cosines,
//! sines, the sigmoid and every product in f64 from the same stored inputs.

use super::{Positions, Rope, RopeDirection, RopeTables, SwiGlu};

/// `qkv` (the problem's buffer, widened to f64) with every query and key head rotated, in
/// float64: the cosine, the sine and the rotation of each pair in f64, from the angle the
/// problem defines (the f32 product `p·inv_freq_i` of the f32 frequency,
/// [`super::arith::angle`], as Hugging Face's f32 `inv_freq ⊗ positions`: at position `p` it
/// carries up to half an f32 unit of `p`, which no arithmetic after it can undo) or the tables'
/// values; the backward rotates by the opposite angle. Everything else is copied. Positions
/// are taken as given (the caller has checked them).
///
/// # Panics
/// When `qkv`, the positions or the tables are shorter than the problem addresses.
pub fn rope(
    op: &Rope,
    direction: RopeDirection,
    qkv: &[f64],
    positions: &Positions<&[i32]>,
    tables: Option<&RopeTables<&[f32]>>,
) -> Vec<f64> {
    let mut out = qkv.to_vec();
    let half = op.rotary_dim / 2;
    let freqs = op.inv_freqs();
    let sign = if direction == RopeDirection::Forward { 1.0 } else { -1.0 };
    for t in 0..op.tokens() {
        let p = op.position(positions, t);
        for i in 0..half {
            let (c, s) = cos_sin(op, (p, i), &freqs, tables);
            let s = sign * s;
            let (e1, e2) = op.pair(i);
            for h in 0..op.heads_q + op.heads_kv {
                let base = t * op.ld + h * op.head_dim;
                let (x1, x2) = (qkv[base + e1], qkv[base + e2]);
                out[base + e1] = x1 * c - x2 * s;
                out[base + e2] = x2 * c + x1 * s;
            }
        }
    }
    out
}

/// The f64 cosine and sine of pair `i` at position `p`: of the f32 angle, or the tables'.
fn cos_sin(op: &Rope, (p, i): (i32, usize), freqs: &[f32], tables: Option<&RopeTables<&[f32]>>) -> (f64, f64) {
    match tables {
        Some(tb) => {
            let at = p as usize * (op.rotary_dim / 2) + i;
            (tb.cos[at] as f64, tb.sin[at] as f64)
        }
        None => {
            let a = super::arith::angle(p, freqs[i]) as f64;
            (a.cos(), a.sin())
        }
    }
}

/// `σ(x) = 1/(1 + e^{−x})` in f64.
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `g` and `u` of `gu` (the problem's input, widened to f64), row by row, `[rows, f]` each.
fn gate_up<'a>(op: &SwiGlu, gu: &'a [f64]) -> impl Iterator<Item = (f64, f64)> + 'a {
    let op = *op;
    (0..op.rows).flat_map(move |r| {
        (0..op.f).map(move |j| {
            let (gi, ui) = op.gate_up_index(r, j);
            (gu[gi], gu[ui])
        })
    })
}

/// `y = silu(g)·u` in f64, `[rows, f]` dense (not in the output's leading dimension).
///
/// # Panics
/// When `gu` is shorter than [`SwiGlu::in_elems`].
pub fn swiglu(op: &SwiGlu, gu: &[f64]) -> Vec<f64> {
    gate_up(op, gu).map(|(g, u)| g * sigmoid(g) * u).collect()
}

/// `(dg, du)` in f64, `[rows, f]` dense each: `dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))`,
/// `du = dy·g·σ(g)`; `dy` is the output gradient in the output's leading dimension.
///
/// # Panics
/// When `dy` or `gu` is shorter than the problem addresses.
pub fn swiglu_backward(op: &SwiGlu, dy: &[f64], gu: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (mut dg, mut du) = (Vec::with_capacity(op.rows * op.f), Vec::with_capacity(op.rows * op.f));
    for (k, (g, u)) in gate_up(op, gu).enumerate() {
        let d = dy[(k / op.f) * op.ld_out + k % op.f];
        let s = sigmoid(g);
        dg.push(d * u * s * (1.0 + g * (1.0 - s)));
        du.push(d * g * s);
    }
    (dg, du)
}
