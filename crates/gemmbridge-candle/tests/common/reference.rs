//! float64 references of the adapter's operations, from the tensors' values.

use candle_core::{Result, Tensor};
use gemmbridge::attention::{Attention, AttnMask};
use gemmbridge::norm::{reference, RmsNorm};
use gemmbridge_candle::Activation;

use super::{bcast_index, f64s};

/// RMSNorm's ε in the tests.
pub const EPS: f32 = 1e-5;

/// `a[.., m, k]·b[.., k, n]` in float64 with the batch dimensions broadcast.
pub fn matmul_f64(a: &Tensor, b: &Tensor) -> Result<(Vec<f64>, Vec<usize>)> {
    let (ad, bd) = (a.dims().to_vec(), b.dims().to_vec());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = candle_core::Shape::from(&ad[..ad.len() - 2])
        .broadcast_shape_binary_op(&candle_core::Shape::from(&bd[..bd.len() - 2]), "ref")?
        .dims()
        .to_vec();
    let (av, bv) = (f64s(a)?, f64s(b)?);
    let count: usize = batch.iter().product();
    let mut out = Vec::with_capacity(count * m * n);
    for t in 0..count {
        let mut idx = vec![0; batch.len()];
        let mut r = t;
        for i in (0..batch.len()).rev() {
            idx[i] = r % batch[i];
            r /= batch[i];
        }
        let at = |i: usize, j: usize| {
            let mut full = idx.clone();
            full.extend([i, j]);
            av[bcast_index(&ad, &full)]
        };
        let bt = |i: usize, j: usize| {
            let mut full = idx.clone();
            full.extend([i, j]);
            bv[bcast_index(&bd, &full)]
        };
        for i in 0..m {
            for j in 0..n {
                out.push((0..k).map(|l| at(i, l) * bt(l, j)).sum());
            }
        }
    }
    let mut dims = batch;
    dims.extend([m, n]);
    Ok((out, dims))
}

/// `act(x·wᵀ + bias)` in float64, GELU's tanh form.
pub fn linear_f64(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> Result<Vec<f64>> {
    let (want, _) = matmul_f64(x, &w.t()?)?;
    let n = w.dims()[0];
    let bias = bias.map(f64s).transpose()?;
    Ok(want
        .iter()
        .enumerate()
        .map(|(e, v)| {
            let v = v + bias.as_ref().map_or(0.0, |b| b[e % n]);
            match act {
                Activation::None => v,
                Activation::Relu => v.max(0.0),
                Activation::Gelu => gemmbridge::epilogue::gelu_tanh(v),
            }
        })
        .collect())
}

/// The float64 forward and backward of RMSNorm over the last dimension of `x` (dense values).
pub fn norm_f64(x: &Tensor, w: &Tensor, dy: &[f64]) -> Result<(reference::Forward, reference::Backward)> {
    let c = w.dims()[0];
    let (xv, wv) = (f64s(x)?, f64s(w)?);
    let p = RmsNorm::new(xv.len() / c, c, EPS, gemmbridge::DType::F32);
    Ok((reference::forward(&p, &xv, &wv), reference::backward(&p, &xv, &wv, dy)))
}

/// The float64 attention of dense `[b, h, s, d]` tensors.
pub fn sdpa_f64(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Vec<f64>> {
    let (b, hq, sq, d) = q.dims4()?;
    let (_, hkv, skv, _) = k.dims4()?;
    let mut p = Attention::new(b, (hq, hkv), (sq, skv), d, gemmbridge::DType::BF16).bhsd();
    if causal {
        p = p.with_mask(AttnMask::Causal);
    }
    Ok(gemmbridge::attention::reference::forward(&p, &f64s(q)?, &f64s(k)?, &f64s(v)?, None).o)
}

/// The float64 attention of dense `[b, h, s, d]` tensors by its definition, for any `d`
/// (top-left causal mask, grouped heads).
pub fn sdpa_loops(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> Result<Vec<f64>> {
    let (b, hq, sq, d) = q.dims4()?;
    let (_, hkv, skv, _) = k.dims4()?;
    let (qv, kv, vv) = (f64s(q)?, f64s(k)?, f64s(v)?);
    let mut o = vec![0.0; b * hq * sq * d];
    for (n, h, i) in (0..b).flat_map(|n| (0..hq).flat_map(move |h| (0..sq).map(move |i| (n, h, i)))) {
        let hk = h / (hq / hkv);
        let qi = &qv[((n * hq + h) * sq + i) * d..][..d];
        let row = |j: usize| ((n * hkv + hk) * skv + j) * d;
        let keys: Vec<usize> = (0..skv).filter(|&j| !causal || j <= i).collect();
        let s: Vec<f64> = keys.iter().map(|&j| scale * (0..d).map(|e| qi[e] * kv[row(j) + e]).sum::<f64>()).collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
        for e in 0..d {
            o[((n * hq + h) * sq + i) * d + e] =
                keys.iter().zip(&s).map(|(&j, x)| (x - max).exp() / z * vv[row(j) + e]).sum();
        }
    }
    Ok(o)
}

/// The three grouped products of `x[R, K]`, `w[E, N, K]` and `dy[R, N]` (rows sorted by expert,
/// expert e owning `sizes[e]` rows), by gemmbridge's float64 definitions
/// (`gemmbridge::grouped::reference`): `y[R, N]`, `dx[R, K]` and `dw[E, N, K]` (zero for an
/// expert of no rows).
pub fn grouped_f64(x: &Tensor, w: &Tensor, dy: &Tensor, sizes: &[usize]) -> Result<[Vec<f64>; 3]> {
    use gemmbridge::grouped::{reference::run, GroupedOp, GroupedProblem};
    let (e, n, k) = w.dims3()?;
    let (x, w, dy) = (f64s(x)?, f64s(w)?, f64s(dy)?);
    let r: usize = sizes.iter().sum();
    let product = |op, a: &[f64], b: &[f64], len: usize| -> Result<Vec<f64>> {
        let p = GroupedProblem::new(op, sizes, n, k, gemmbridge::Precision::F32).map_err(candle_core::Error::wrap)?;
        let mut c = vec![0.0; len];
        run(&p, a, b, None, &mut c);
        Ok(c)
    };
    Ok([
        product(GroupedOp::Forward, &x, &w, r * n)?,
        product(GroupedOp::BackwardData, &dy, &w, r * k)?,
        product(GroupedOp::BackwardWeight, &dy, &x, e * n * k)?,
    ])
}
