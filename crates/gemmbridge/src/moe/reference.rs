//! The definitions the GPU is checked against: the router ([`route`], in the f32 arithmetic
//! the kernel uses, bit for bit: the weights' exponentials are the layer kernels' `exp_neg`), the expert
//! product over group starts ([`moe_gemm`], float64) and the combine with its backward
//! ([`combine`], [`combine_backward`], in the kernels' f32 order).

use super::{MoeCombine, MoeGemm, MoeRouter};
use crate::grouped::GroupedOp;
use crate::layer_ops::arith::exp_neg;

/// What [`MoeRouter`] writes (see its documentation), on the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// Each token's experts, largest logit first: `ids[s·k + j]`.
    pub ids: Vec<i32>,
    /// Their weights (softmax over the chosen logits).
    pub weights: Vec<f32>,
    /// Where each expert's sorted rows start.
    pub starts: Vec<i32>,
    /// The token of each sorted row.
    pub index: Vec<i32>,
    /// The slot of each sorted row among its token's.
    pub ks: Vec<i32>,
    /// `index·k + ks` of each sorted row.
    pub slots: Vec<i32>,
    /// The sorted row of each slot (`slots`' inverse).
    pub pos: Vec<i32>,
}

impl Routing {
    /// Rows per expert of the sorted layout (from `starts` over the S·k slots; the same after
    /// [`pad`], whose experts each hold the capacity's rows).
    pub fn sizes(&self) -> Vec<usize> {
        super::sizes_of(&self.starts, self.pos.len())
    }
}

/// Whether logit `(a, ea)` ranks before `(b, eb)`: larger first, NaN last, ties to the lower
/// expert.
fn before((a, ea): (f32, usize), (b, eb): (f32, usize)) -> bool {
    let (a, b) = (if a.is_nan() { f32::NEG_INFINITY } else { a }, if b.is_nan() { f32::NEG_INFINITY } else { b });
    a > b || (a == b && ea < eb)
}

/// The router on host logits `[S, E]` (already f32).
///
/// # Panics
/// For a router that fails [`MoeRouter::validate`] or logits shorter than S·E (a reference:
/// its callers are tests that check their inputs first).
pub fn route(r: &MoeRouter, logits: &[f32]) -> Routing {
    let (s_n, e_n, k) = (r.tokens, r.experts, r.top_k);
    let mut out =
        Routing { ids: Vec::with_capacity(s_n * k), weights: Vec::with_capacity(s_n * k), ..Default::default() };
    for s in 0..s_n {
        let row = &logits[s * e_n..(s + 1) * e_n];
        let mut chosen: Vec<(f32, usize)> = Vec::with_capacity(k);
        for _ in 0..k {
            let last = chosen.last().copied();
            let mut best: Option<(f32, usize)> = None;
            for (e, &v) in row.iter().enumerate() {
                let cand = (v, e);
                if last.is_some_and(|l| !before(l, cand)) {
                    continue;
                }
                if best.is_none_or(|b| before(cand, b)) {
                    best = Some(cand);
                }
            }
            chosen.push(best.expect("top_k ≤ E"));
        }
        let m = chosen[0].0;
        let ex: Vec<f32> = chosen.iter().map(|&(v, _)| exp_neg(v - m)).collect();
        let sum = ex.iter().fold(0.0f32, |a, &x| a + x);
        for (&(_, e), &x) in chosen.iter().zip(&ex) {
            out.ids.push(e as i32);
            out.weights.push(x / sum);
        }
    }
    let mut counts = vec![0usize; e_n];
    for &e in &out.ids {
        counts[e as usize] += 1;
    }
    let mut at = 0;
    for c in counts {
        out.starts.push(at as i32);
        at += c;
    }
    for e in 0..e_n as i32 {
        for (q, _) in out.ids.iter().enumerate().filter(|(_, &id)| id == e) {
            out.index.push((q / k) as i32);
            out.ks.push((q % k) as i32);
            out.slots.push(q as i32);
        }
    }
    out.pos = vec![0; out.slots.len()];
    for (p, &q) in out.slots.iter().enumerate() {
        out.pos[q as usize] = p as i32;
    }
    out
}

/// The capacity layout of `r` ([`crate::cuda::MoeRouting::pad`]) for `cap` rows per expert:
/// `index`, `ks` and `slots` `[E·cap]` with −1 on pad rows, `pos` the slots' new rows (−1 past
/// an expert's `cap`); ids, weights and starts as `r`'s.
///
/// # Panics
/// For a capacity of 0 (the device refuses it by name) or one whose E·cap rows do not fit
/// memory.
pub fn pad(r: &Routing, cap: usize) -> Routing {
    assert!(cap > 0, "a capacity layout needs at least one row per expert");
    let (e_n, rows) = (r.starts.len(), r.index.len());
    let sizes = r.sizes();
    let mut out = Routing { index: vec![-1; e_n * cap], pos: vec![-1; rows], ..r.clone() };
    out.ks = out.index.clone();
    out.slots = out.index.clone();
    for (e, &size) in sizes.iter().enumerate() {
        let s0 = r.starts[e] as usize;
        for i in 0..size.min(cap) {
            out.index[e * cap + i] = r.index[s0 + i];
            out.ks[e * cap + i] = r.ks[s0 + i];
            out.slots[e * cap + i] = r.slots[s0 + i];
        }
    }
    for (q, &p) in r.pos.iter().enumerate() {
        let e = r.ids[q] as usize;
        let i = p as usize - r.starts[e] as usize;
        if i < cap {
            out.pos[q] = (e * cap + i) as i32;
        }
    }
    out
}

/// The product `p` over host group starts in float64: `input` `[R, in]` and `w` (`[E, N, K]`)
/// in f64, the output `[R, out]`. The starts are clamped as the device clamps them
/// ([`super::sizes_of`]); rows before the first clamped start are left NaN (unwritten).
///
/// # Panics
/// For starts of another length than E, or buffers shorter than `p` says.
pub fn moe_gemm(p: &MoeGemm, input: &[f64], w: &[f64], starts: &[i32]) -> Vec<f64> {
    let ((win, wout), r_n, (n, k)) = (p.width(), p.rows(), (p.n(), p.k()));
    assert_eq!(starts.len(), p.experts(), "one start per expert");
    let sizes = super::sizes_of(starts, r_n);
    let first = r_n - sizes.iter().sum::<usize>();
    let mut out = vec![f64::NAN; r_n * wout];
    for r in first..r_n {
        let mut at = first;
        let e = sizes.iter().position(|&m| {
            at += m;
            r < at
        });
        let e = e.expect("the sizes cover the rows from the first start");
        let x = &input[r * win..(r + 1) * win];
        let we = &w[e * n * k..(e + 1) * n * k];
        for o in 0..wout {
            out[r * wout + o] = match p.op() {
                GroupedOp::BackwardData => (0..n).map(|i| x[i] * we[i * k + o]).sum(),
                _ => (0..k).map(|i| x[i] * we[o * k + i]).sum(),
            };
        }
    }
    out
}

/// The combine on host values (see [`MoeCombine`]): `o` (slot q's row at `rows[q]`, clamped
/// below o's rows `o.len() / N` as the device clamps it, a negative one adding nothing; or q
/// without rows) and the weights (or none: ones) in f32, `y[S, N]` in f32 before its rounding
/// to the output type.
///
/// # Panics
/// For a combine that fails [`MoeCombine::validate`], or `o`, `rows` or `w` shorter than it
/// says.
pub fn combine(c: &MoeCombine, (o, rows): (&[f32], Option<&[i32]>), w: Option<&[f32]>) -> Vec<f32> {
    let (k, n) = (c.top_k, c.n);
    let last = (o.len() / n).max(1) - 1;
    let mut y = vec![0.0f32; c.tokens * n];
    for s in 0..c.tokens {
        for col in 0..n {
            let mut acc = 0.0f32;
            for j in 0..k {
                let q = s * k + j;
                let Some(at) = rows.map_or(Some(q), |r| usize::try_from(r[q]).ok().map(|a| a.min(last))) else {
                    continue; // a slot the capacity dropped
                };
                acc = w.map_or(1.0, |w| w[q]).mul_add(o[at * n + col], acc);
            }
            y[s * n + col] = acc;
        }
    }
    y
}

/// Threads of the combine's backward CTA, whose reduction order [`combine_backward`] follows.
pub const COMBINE_BWD_THREADS: usize = 256;

/// The combine's backward on host values (see [`MoeCombine`]): `do` (f32 before its
/// rounding; as many rows as `o`, `o.len() / N`, slot q's at `rows[q]` or q, the rows no slot
/// names zero; a negative `rows[q]` writes nothing and has a zero weight gradient), the
/// weights' gradient `[S·k]` and the logits' gradient `[S, E]` for the router's choices `ids`.
/// Rows past o's are clamped to its last, as the device clamps them. Each weight gradient
/// sums in the kernel's order: thread t of [`COMBINE_BWD_THREADS`] adds columns t, t + 256, …
/// with fused multiply-adds, then the threads' sums are added pairwise, halving (t and
/// t + 128, then t and t + 64, …).
///
/// # Panics
/// For a combine that fails [`MoeCombine::validate`], or `dy`, `o`, `rows`, `w` or `ids`
/// shorter than it says.
pub fn combine_backward(
    c: &MoeCombine,
    experts: usize,
    (dy, o, rows): (&[f32], &[f32], Option<&[i32]>),
    (w, ids): (&[f32], &[i32]),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (k, n, t_n) = (c.top_k, c.n, COMBINE_BWD_THREADS);
    let last = (o.len() / n).max(1) - 1;
    let mut d_o = vec![0.0f32; o.len()];
    let mut dw = vec![0.0f32; c.rows()];
    let mut dlogits = vec![0.0f32; c.tokens * experts];
    for s in 0..c.tokens {
        for j in 0..k {
            let q = s * k + j;
            let Some(at) = rows.map_or(Some(q), |r| usize::try_from(r[q]).ok().map(|a| a.min(last))) else {
                continue; // a slot the capacity dropped: dw[q] stays 0
            };
            let mut part = vec![0.0f32; t_n];
            for (t, p) in part.iter_mut().enumerate() {
                for col in (t..n).step_by(t_n) {
                    *p = dy[s * n + col].mul_add(o[at * n + col], *p);
                }
            }
            let mut half = t_n / 2;
            while half > 0 {
                for t in 0..half {
                    part[t] += part[t + half];
                }
                half /= 2;
            }
            dw[q] = part[0];
            for col in 0..n {
                d_o[at * n + col] = w[q] * dy[s * n + col];
            }
        }
        let dot = (0..k).fold(0.0f32, |a, j| w[s * k + j].mul_add(dw[s * k + j], a));
        for j in 0..k {
            let q = s * k + j;
            if (0..experts as i32).contains(&ids[q]) {
                dlogits[s * experts + ids[q] as usize] = w[q] * (dw[q] - dot);
            }
        }
    }
    (d_o, dw, dlogits)
}
