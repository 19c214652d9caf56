//! The float64 pieces of the layer's reference, each straight from its definition (one row
//! at a time, no blocking): the three GEMM forms a linear layer needs, RMSNorm, causal GQA
//! attention, SiLU. Row-major throughout; sizes are the caller's (checked there).

/// `out[m, n] = a[m, k]·b[n, k]ᵀ` (a projection `x·Wᵀ`).
pub(super) fn nt(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let ar = &a[i * k..(i + 1) * k];
        for j in 0..n {
            out[i * n + j] = ar.iter().zip(&b[j * k..(j + 1) * k]).map(|(x, y)| x * y).sum();
        }
    }
    out
}

/// `out[m, n] = a[m, k]·b[k, n]` (a projection's data gradient `dY·W`).
pub(super) fn nn(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += x * b[p * n + j];
            }
        }
    }
    out
}

/// `out[m, n] = a[k, m]ᵀ·b[k, n]` (a projection's weight gradient `dYᵀ·X`).
pub(super) fn tn(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for p in 0..k {
        for i in 0..m {
            let x = a[p * m + i];
            for j in 0..n {
                out[i * n + j] += x * b[p * n + j];
            }
        }
    }
    out
}

/// RMSNorm of `rows` rows of `d`: `h = x·r·g` with `r = 1/sqrt(mean(x²) + eps)` per row;
/// returns `h` and `r`.
pub(super) fn rms_norm(x: &[f64], g: &[f64], d: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let rows = x.len() / d;
    let mut h = vec![0.0; x.len()];
    let mut rstd = vec![0.0; rows];
    for t in 0..rows {
        let row = &x[t * d..(t + 1) * d];
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        rstd[t] = r;
        for i in 0..d {
            h[t * d + i] = row[i] * r * g[i];
        }
    }
    (h, rstd)
}

/// RMSNorm's backward from `dh`: `dx = r·g∘dh − x·r³·Σ(g∘dh∘x)/d` per row, and
/// `dg = Σ_rows dh∘x·r`.
pub(super) fn rms_norm_backward(x: &[f64], g: &[f64], rstd: &[f64], dh: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let d = g.len();
    let mut dx = vec![0.0; x.len()];
    let mut dg = vec![0.0; d];
    for (t, &r) in rstd.iter().enumerate() {
        let (xr, dr) = (&x[t * d..(t + 1) * d], &dh[t * d..(t + 1) * d]);
        let dot: f64 = (0..d).map(|i| g[i] * dr[i] * xr[i]).sum();
        for i in 0..d {
            dx[t * d + i] = r * g[i] * dr[i] - xr[i] * r * r * r * dot / d as f64;
            dg[i] += dr[i] * xr[i] * r;
        }
    }
    (dx, dg)
}

/// SiLU `g·σ(g)` and its derivative `σ(g)·(1 + g·(1 − σ(g)))`.
pub(super) fn silu(g: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-g).exp());
    (g * s, s * (1.0 + g * (1.0 - s)))
}

/// Sizes of the attention over a fused `qkv[T, w]`: `b` sequences of `s`, `hq`/`hkv` heads of
/// `hd`, q, k, v starting at `offs` in each row.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub b: usize,
    pub s: usize,
    pub hq: usize,
    pub hkv: usize,
    pub hd: usize,
    pub w: usize,
    pub offs: [usize; 3],
}

impl Heads {
    /// Where element 0 of head `h` of tensor `which` (0 q, 1 k, 2 v) is for token `row`.
    fn at(&self, which: usize, row: usize, h: usize) -> usize {
        row * self.w + self.offs[which] + h * self.hd
    }

    /// The probabilities `P[j]` (`j ≤ i`) of query row `i` of sequence `n`, head `h`, and the
    /// row's log-sum-exp.
    fn probs(&self, qkv: &[f64], (n, h, i): (usize, usize, usize)) -> (Vec<f64>, f64) {
        let (hd, kh) = (self.hd, h / (self.hq / self.hkv));
        let scale = 1.0 / (hd as f64).sqrt();
        let q = &qkv[self.at(0, n * self.s + i, h)..][..hd];
        let scores: Vec<f64> = (0..=i)
            .map(|j| {
                let k = &qkv[self.at(1, n * self.s + j, kh)..][..hd];
                scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>()
            })
            .collect();
        let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = mx + scores.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
        (scores.iter().map(|x| (x - lse).exp()).collect(), lse)
    }
}

/// Causal attention: `o[T, hq·hd]` and `lse[b, hq, s]`.
pub(super) fn attention(qkv: &[f64], a: Heads) -> (Vec<f64>, Vec<f64>) {
    let hd = a.hd;
    let mut o = vec![0.0; a.b * a.s * a.hq * hd];
    let mut lse = vec![0.0; a.b * a.hq * a.s];
    for n in 0..a.b {
        for h in 0..a.hq {
            let kh = h / (a.hq / a.hkv);
            for i in 0..a.s {
                let (p, l) = a.probs(qkv, (n, h, i));
                lse[(n * a.hq + h) * a.s + i] = l;
                let out = &mut o[((n * a.s + i) * a.hq + h) * hd..][..hd];
                for (j, pj) in p.iter().enumerate() {
                    let v = &qkv[a.at(2, n * a.s + j, kh)..][..hd];
                    out.iter_mut().zip(v).for_each(|(x, y)| *x += pj * y);
                }
            }
        }
    }
    (o, lse)
}

/// Attention's backward from `d_o[T, hq·hd]`: `dq`, `dk`, `dv` written into a fused
/// `dqkv[T, w]` laid out as `qkv` (`dk`, `dv` summed over the query heads sharing them).
pub(super) fn attention_backward(qkv: &[f64], o: &[f64], d_o: &[f64], a: Heads) -> Vec<f64> {
    let hd = a.hd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut dqkv = vec![0.0; qkv.len()];
    for n in 0..a.b {
        for h in 0..a.hq {
            let kh = h / (a.hq / a.hkv);
            for i in 0..a.s {
                let (p, _) = a.probs(qkv, (n, h, i));
                let at_o = ((n * a.s + i) * a.hq + h) * hd;
                let (oi, doi) = (&o[at_o..][..hd], &d_o[at_o..][..hd]);
                let dsum: f64 = oi.iter().zip(doi).map(|(x, y)| x * y).sum();
                let qi = a.at(0, n * a.s + i, h);
                for (j, pj) in p.iter().enumerate() {
                    let (kj, vj) = (a.at(1, n * a.s + j, kh), a.at(2, n * a.s + j, kh));
                    let dp: f64 = (0..hd).map(|e| doi[e] * qkv[vj + e]).sum();
                    let ds = pj * (dp - dsum);
                    for e in 0..hd {
                        dqkv[vj + e] += pj * doi[e];
                        dqkv[qi + e] += scale * ds * qkv[kj + e];
                        dqkv[kj + e] += scale * ds * qkv[qi + e];
                    }
                }
            }
        }
    }
    dqkv
}
