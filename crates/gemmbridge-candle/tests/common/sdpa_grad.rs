//! The float64 forward and backward of attention by its definition, and the cases the
//! backward tests run on the CPU and on a GPU (included by `#[path]` from both test files).

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge_candle::{sdpa, sdpa_candle, sdpa_served, Served};
use rand::rngs::StdRng;

use crate::common::{assert_close, band, f64s, random, rel_err};

/// `o = softmax(scale·q·kᵀ + mask)·v` and the gradients of `Σ o ∘ do` in float64.
pub struct Grads {
    pub o: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// [`Grads`] of `q[b, h_q, s_q, d]`, `k`, `v[b, h_kv, s_kv, d]` (any strides: their values in
/// logical order) and `d_o` (logical order): the top-left causal mask (query `i` sees keys
/// `j ≤ i`), query head `h` reading key/value head `h / (h_q / h_kv)`. For each query row,
/// `P = softmax(s)`, `o = P·v`, `dP = do·vᵀ`, `dS = P ∘ (dP − Σ_j P·dP)`, `dq = scale·dS·k`,
/// and `dk += scale·dSᵀ·q`, `dv += Pᵀ·do` summed over every query row and head that reads them.
pub fn sdpa_grads(q: &Tensor, k: &Tensor, v: &Tensor, d_o: &[f64], causal: bool, scale: f64) -> Result<Grads> {
    let (b, hq, sq, d) = q.dims4()?;
    let (_, hkv, skv, _) = k.dims4()?;
    let (qv, kv, vv) = (f64s(q)?, f64s(k)?, f64s(v)?);
    let mut g =
        Grads { o: vec![0.0; qv.len()], dq: vec![0.0; qv.len()], dk: vec![0.0; kv.len()], dv: vec![0.0; kv.len()] };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for (n, h, i) in (0..b).flat_map(|n| (0..hq).flat_map(move |h| (0..sq).map(move |i| (n, h, i)))) {
        let at = ((n * hq + h) * sq + i) * d;
        let row = |j: usize| ((n * hkv + h / (hq / hkv)) * skv + j) * d;
        let keys: Vec<usize> = (0..skv).filter(|&j| !causal || j <= i).collect();
        let s: Vec<f64> = keys.iter().map(|&j| scale * dot(&qv[at..at + d], &kv[row(j)..row(j) + d])).collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
        let p: Vec<f64> = s.iter().map(|x| (x - max).exp() / z).collect();
        let dp: Vec<f64> = keys.iter().map(|&j| dot(&d_o[at..at + d], &vv[row(j)..row(j) + d])).collect();
        let mean: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
        for (t, &j) in keys.iter().enumerate() {
            let ds = p[t] * (dp[t] - mean);
            for e in 0..d {
                g.o[at + e] += p[t] * vv[row(j) + e];
                g.dq[at + e] += scale * ds * kv[row(j) + e];
                g.dk[row(j) + e] += scale * ds * qv[at + e];
                g.dv[row(j) + e] += p[t] * d_o[at + e];
            }
        }
    }
    Ok(g)
}

/// One backward test's shapes.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub b: usize,
    pub heads: (usize, usize),
    pub seq: (usize, usize),
    pub d: usize,
    pub causal: bool,
    pub scale: Option<f32>,
    /// q, k and v made as `[b, s, h, d]` projections and transposed to `[b, h, s, d]`.
    pub bshd: [bool; 3],
}

/// The cases: 37 rows, 5 query heads over 1 key/value head and 4 over 2, `d` 64 and 128,
/// causal and not, `s_q ≠ s_kv`, transposed `[b, s, h, d]` inputs, a given scale.
pub fn cases() -> Vec<Case> {
    let c = |b, heads, seq, d, causal, scale, bshd| Case { b, heads, seq, d, causal, scale, bshd };
    vec![
        c(2, (5, 1), (37, 37), 64, true, None, [false; 3]),
        c(2, (5, 1), (37, 37), 64, false, None, [false; 3]),
        c(1, (5, 1), (37, 37), 128, true, None, [true, false, false]),
        c(2, (4, 2), (37, 37), 128, false, None, [true; 3]),
        c(2, (5, 1), (37, 53), 64, false, Some(0.3), [false; 3]),
        c(1, (4, 2), (23, 37), 64, false, None, [false, true, true]),
    ]
}

/// One input of a case: a variable, seen as `[b, h, s, d]`.
pub struct Input {
    pub var: Var,
    bshd: bool,
}

impl Input {
    /// A random `[b, h, s, d]` input of `dtype` on `dev`, made as `[b, s, h, d]` and transposed
    /// where `bshd`.
    pub fn new(rng: &mut StdRng, [b, h, s, d]: [usize; 4], bshd: bool, dtype: DType, dev: &Device) -> Result<Input> {
        let dims = if bshd { [b, s, h, d] } else { [b, h, s, d] };
        Ok(Input { var: Var::from_tensor(&random(rng, &dims, dtype, dev)?)?, bshd })
    }

    /// The input as `[b, h, s, d]` (a transposed view where it was made `[b, s, h, d]`).
    pub fn t(&self) -> Result<Tensor> {
        let t = self.var.as_tensor();
        if self.bshd {
            t.transpose(1, 2)
        } else {
            Ok(t.clone())
        }
    }

    /// The variable's gradient in `grads`, as `[b, h, s, d]`.
    pub fn grad(&self, grads: &GradStore) -> Result<Tensor> {
        let g = grads.get(&self.var).expect("a gradient for every input").clone();
        assert_eq!(g.dims(), self.var.dims(), "the gradient has the variable's shape");
        if self.bshd {
            g.transpose(1, 2)
        } else {
            Ok(g)
        }
    }
}

/// The gradient `name` of `got` (ours) and `candle` (through [`sdpa_candle`]) against the
/// float64 `want`, and against each other, within `dtype`'s band.
fn compare(name: &str, got: &Tensor, candle: &Tensor, want: &[f64], dtype: DType) -> Result<()> {
    assert_eq!(got.dtype(), dtype, "{name}");
    assert_close(name, got, want, dtype)?;
    assert_close(&format!("{name}, through sdpa_candle"), candle, want, dtype)?;
    let e = rel_err(&f64s(got)?, &f64s(candle)?);
    assert!(e <= band(dtype), "{name}: {e:e} from candle's autograd through sdpa_candle");
    Ok(())
}

/// `case` at `dtype` on `dev`: the forward served by gemmbridge, `o` and the gradients of
/// `Σ o ∘ dy` (candle's autograd through `sdpa`) against float64 and beside candle's autograd
/// through [`sdpa_candle`].
pub fn check_case(rng: &mut StdRng, case: Case, dtype: DType, dev: &Device) -> Result<()> {
    let (Case { b, d, causal, scale, bshd, .. }, (hq, hkv), (sq, skv)) = (case, case.heads, case.seq);
    let q = Input::new(rng, [b, hq, sq, d], bshd[0], dtype, dev)?;
    let k = Input::new(rng, [b, hkv, skv, d], bshd[1], dtype, dev)?;
    let v = Input::new(rng, [b, hkv, skv, d], bshd[2], dtype, dev)?;
    let dy = random(rng, &[b, hq, sq, d], dtype, dev)?;
    let s = scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let (qt, kt, vt) = (q.t()?, k.t()?, v.t()?);
    let want = sdpa_grads(&qt, &kt, &vt, &f64s(&dy)?, causal, s)?;
    let what = format!("{case:?} {dtype:?} on {dev:?}");
    let (o, served) = sdpa_served(&qt, &kt, &vt, causal, scale)?;
    assert_eq!(served, Served::Gemmbridge, "{what}");
    assert_close(&format!("o {what}"), &o, &want.o, dtype)?;
    let ours = o.mul(&dy)?.sum_all()?.backward()?;
    let theirs = sdpa_candle(&qt, &kt, &vt, causal, scale)?.mul(&dy)?.sum_all()?.backward()?;
    for (name, x, want) in [("dq", &q, &want.dq), ("dk", &k, &want.dk), ("dv", &v, &want.dv)] {
        compare(&format!("{name} {what}"), &x.grad(&ours)?, &x.grad(&theirs)?, want, dtype)?;
    }
    Ok(())
}

/// q, k, v as views into one fused projection's output `qkv[b, s, 3, h, d]` (one variable):
/// the forward reads them in place, the backward copies them (strides that are no dense order);
/// qkv's gradient, taken apart, against float64 and candle's autograd.
pub fn check_fused_qkv(rng: &mut StdRng, dtype: DType, dev: &Device) -> Result<()> {
    let (b, s, h, d) = (2, 37, 4, 64);
    let qkv = Var::from_tensor(&random(rng, &[b, s, 3, h, d], dtype, dev)?)?;
    let part = |t: &Tensor, i| t.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2);
    let [q, k, v] = [0, 1, 2].map(|i| part(qkv.as_tensor(), i));
    let (q, k, v) = (q?, k?, v?);
    let dy = random(rng, &[b, h, s, d], dtype, dev)?;
    let want = sdpa_grads(&q, &k, &v, &f64s(&dy)?, true, 1.0 / (d as f64).sqrt())?;
    let (o, served) = sdpa_served(&q, &k, &v, true, None)?;
    assert_eq!(served, Served::Gemmbridge);
    assert_close("fused qkv o", &o, &want.o, dtype)?;
    let ours = o.mul(&dy)?.sum_all()?.backward()?;
    let theirs = sdpa_candle(&q, &k, &v, true, None)?.mul(&dy)?.sum_all()?.backward()?;
    let (ours, theirs) = (ours.get(&qkv).expect("d qkv"), theirs.get(&qkv).expect("d qkv"));
    assert_eq!(ours.dims(), qkv.dims());
    for (i, (name, want)) in [("dq", &want.dq), ("dk", &want.dk), ("dv", &want.dv)].into_iter().enumerate() {
        let what = format!("fused qkv {name} {dtype:?} on {dev:?}");
        compare(&what, &part(ours, i)?, &part(theirs, i)?, want, dtype)?;
    }
    Ok(())
}

/// Only k tracks a gradient, the loss is `Σ o` (its gradient a stride-0 broadcast, copied),
/// and the backward runs twice on one graph (the statistics are kept, not used up): the same
/// `dk` both times, against float64; q and v get none.
pub fn check_sum_twice(rng: &mut StdRng, dtype: DType, dev: &Device) -> Result<()> {
    let (b, hq, hkv, sq, skv, d) = (1, 5, 1, 37, 37, 64);
    let q = random(rng, &[b, hq, sq, d], dtype, dev)?;
    let k = Var::from_tensor(&random(rng, &[b, hkv, skv, d], dtype, dev)?)?;
    let v = random(rng, &[b, hkv, skv, d], dtype, dev)?;
    let ones = vec![1.0; b * hq * sq * d];
    let want = sdpa_grads(&q, k.as_tensor(), &v, &ones, true, 1.0 / (d as f64).sqrt())?;
    let loss = sdpa(&q, k.as_tensor(), &v, true, None)?.sum_all()?;
    let (first, second) = (loss.backward()?, loss.backward()?);
    let what = format!("dk of a sum {dtype:?} on {dev:?}");
    assert_close(&what, first.get(&k).expect("dk"), &want.dk, dtype)?;
    assert_eq!(f64s(first.get(&k).expect("dk"))?, f64s(second.get(&k).expect("dk"))?, "{what}: twice");
    assert!(first.get(&q).is_none() && first.get(&v).is_none(), "{what}: q and v track no gradient");
    Ok(())
}

/// One tensor as q, k and v at once (self-attention on one variable, read in place three
/// times): its gradient is `dq + dk + dv`, against float64.
pub fn check_one_tensor_as_q_k_v(rng: &mut StdRng, dtype: DType, dev: &Device) -> Result<()> {
    let (b, h, s, d) = (2, 3, 37, 64);
    let x = Var::from_tensor(&random(rng, &[b, h, s, d], dtype, dev)?)?;
    let dy = random(rng, &[b, h, s, d], dtype, dev)?;
    let t = x.as_tensor();
    let want = sdpa_grads(t, t, t, &f64s(&dy)?, true, 1.0 / (d as f64).sqrt())?;
    let sum: Vec<f64> = (0..want.dq.len()).map(|e| want.dq[e] + want.dk[e] + want.dv[e]).collect();
    let (o, served) = sdpa_served(t, t, t, true, None)?;
    assert_eq!(served, Served::Gemmbridge);
    let grads = o.mul(&dy)?.sum_all()?.backward()?;
    assert_close(&format!("dx of sdpa(x, x, x) {dtype:?} on {dev:?}"), grads.get(&x).expect("dx"), &sum, dtype)
}

/// Where gemmbridge has no attention (f32; a head dimension of 12) the call falls back to
/// [`sdpa_candle`], and the backward is candle's own autograd: against float64.
pub fn check_fallback(rng: &mut StdRng, dev: &Device) -> Result<()> {
    for (dtype, d) in [(DType::F32, 64), (DType::BF16, 12)] {
        let q = Input::new(rng, [2, 5, 37, d], true, dtype, dev)?;
        let k = Input::new(rng, [2, 1, 37, d], false, dtype, dev)?;
        let v = Input::new(rng, [2, 1, 37, d], false, dtype, dev)?;
        let dy = random(rng, &[2, 5, 37, d], dtype, dev)?;
        let (qt, kt, vt) = (q.t()?, k.t()?, v.t()?);
        let want = sdpa_grads(&qt, &kt, &vt, &f64s(&dy)?, true, 0.3)?;
        let (o, served) = sdpa_served(&qt, &kt, &vt, true, Some(0.3))?;
        assert_eq!(served, Served::Candle, "{dtype:?} d {d}");
        let grads = o.mul(&dy)?.sum_all()?.backward()?;
        for (name, x, want) in [("dq", &q, &want.dq), ("dk", &k, &want.dk), ("dv", &v, &want.dv)] {
            assert_close(&format!("fallback {name} {dtype:?} d {d} on {dev:?}"), &x.grad(&grads)?, want, dtype)?;
        }
    }
    Ok(())
}
