//! Autodiff through a composition of the adapter's operations: a pre-norm decoder block
//!
//! ```text
//! h = rms_norm(x, g1);  q, k, v = h·Wq, h·Wk, h·Wv  (4 query heads over 2 key/value heads)
//! q, k = rope(q), rope(k);  o = attention(q, k, v, causal)
//! y = x + o·Wo;  out = y + swiglu(rms_norm(y, g2)·Wgu)·Wd
//! ```
//!
//! with the loss `Σ out∘dy`. On the CPU (burn's NdArray in f32, where every operation falls back
//! to burn's own) each gradient is checked by central finite differences along a random
//! direction; on the GPU (burn's CUDA backend in f16, where gemmbridge serves every operation)
//! the output and every gradient against the same block run in float64 on NdArray.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor, TensorData};
use gemmbridge_burn::{
    attention, matmul, rms_norm, rope, swiglu, AttentionOps, AttnMask, GemmOps, LayerOps, RopeStyle,
};
use rand::Rng;

use super::cpu_common::{rel, rng};

/// Sequences, positions, model width, query and key/value heads, head size, MLP width.
const B: usize = 2;
const S: usize = 5;
const D: usize = 24;
const HQ: usize = 4;
const HKV: usize = 2;
const HD: usize = 6;
const F: usize = 16;

/// The block's tensors (inputs and weights), each row-major by its shape, as f64 values.
const SHAPES: [(&str, &[usize]); 10] = [
    ("x", &[B * S, D]),
    ("g1", &[D]),
    ("wq", &[D, HQ * HD]),
    ("wk", &[D, HKV * HD]),
    ("wv", &[D, HKV * HD]),
    ("wo", &[HQ * HD, D]),
    ("g2", &[D]),
    ("wgu", &[D, 2 * F]),
    ("wd", &[F, D]),
    ("dy", &[B * S, D]),
];

/// Values for every tensor of [`SHAPES`]: uniform, the norms' weights near 1, the projections
/// scaled by `1/√in`.
fn values_of(seed: u64) -> Vec<Vec<f64>> {
    let mut r = rng(seed);
    SHAPES
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let scale =
                if shape.len() == 2 && !matches!(*name, "x" | "dy") { 1.0 / (shape[0] as f64).sqrt() } else { 1.0 };
            (0..n)
                .map(|_| {
                    let u = r.random_range(-1.0..1.0);
                    if name.starts_with('g') {
                        1.0 + 0.2 * u
                    } else {
                        scale * u
                    }
                })
                .collect()
        })
        .collect()
}

/// RoPE's tables `[S, HD/2]`: `pos·10000^(−2j/HD)`'s cosine and sine.
fn tables<Bk: Backend>(dtype: FloatDType, dev: &Bk::Device) -> (Tensor<Bk, 2>, Tensor<Bk, 2>) {
    let angle = |p: usize, j: usize| p as f64 * 10_000f64.powf(-2.0 * j as f64 / HD as f64);
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..S {
        for j in 0..HD / 2 {
            c.push(angle(p, j).cos() as f32);
            s.push(angle(p, j).sin() as f32);
        }
    }
    let t = |v: Vec<f32>| Tensor::<Bk, 2>::from_data(TensorData::new(v, [S, HD / 2]), dev).cast(dtype);
    (t(c), t(s))
}

/// `[rows, heads·HD]` → `[B, heads, S, HD]`, and back.
fn heads<Bk: Backend>(t: Tensor<Bk, 2>, h: usize) -> Tensor<Bk, 4> {
    t.reshape([B, S, h, HD]).swap_dims(1, 2)
}
fn rows<Bk: Backend>(t: Tensor<Bk, 4>) -> Tensor<Bk, 2> {
    t.swap_dims(1, 2).reshape([B * S, HQ * HD])
}

/// The block's output from its nine tensors (all but `dy`).
fn block<Bk: GemmOps + LayerOps + AttentionOps>(
    t: &[Tensor<Bk, 2>],
    g: [&Tensor<Bk, 1>; 2],
    rope_tables: &(Tensor<Bk, 2>, Tensor<Bk, 2>),
) -> Tensor<Bk, 2> {
    let [x, wq, wk, wv, wo, wgu, wd] = [&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6]];
    let (cos, sin) = rope_tables;
    let h = rms_norm(x.clone(), g[0].clone(), 1e-5);
    let turn = |m: Tensor<Bk, 2>, n| rope(heads(m, n), cos.clone(), sin.clone(), RopeStyle::RotateHalf);
    let q = turn(matmul(h.clone(), wq.clone()), HQ);
    let k = turn(matmul(h.clone(), wk.clone()), HKV);
    let v = heads(matmul(h, wv.clone()), HKV);
    let y = x.clone() + matmul(rows(attention(q, k, v, AttnMask::Causal)), wo.clone());
    let gu = matmul(rms_norm(y.clone(), g[1].clone(), 1e-5), wgu.clone());
    y.clone() + matmul(swiglu(gu), wd.clone())
}

/// The block's tensors on `Bk` in `dtype` (the 2-D ones, the two norm weights, `dy`).
struct Tensors<Bk: Backend> {
    two_d: Vec<Tensor<Bk, 2>>,
    norms: [Tensor<Bk, 1>; 2],
    dy: Tensor<Bk, 2>,
}

fn tensors<Bk: Backend>(v: &[Vec<f64>], dtype: FloatDType, dev: &Bk::Device) -> Tensors<Bk> {
    let make2 = |i: usize| {
        let s = SHAPES[i].1;
        let data: Vec<f32> = v[i].iter().map(|&e| e as f32).collect();
        Tensor::<Bk, 2>::from_data(TensorData::new(data, [s[0], s[1]]), dev).cast(dtype)
    };
    let make1 = |i: usize| {
        let data: Vec<f32> = v[i].iter().map(|&e| e as f32).collect();
        Tensor::<Bk, 1>::from_data(TensorData::new(data, [D]), dev).cast(dtype)
    };
    Tensors { two_d: [0, 2, 3, 4, 5, 7, 8].map(make2).to_vec(), norms: [make1(1), make1(6)], dy: make2(9) }
}

/// `Σ out∘dy` and every gradient (in [`SHAPES`]' order, without `dy`) under `Autodiff<Bk>`.
fn loss_and_grads<Bk>(v: &[Vec<f64>], dtype: FloatDType, dev: &Bk::Device) -> (Vec<f64>, Vec<Vec<f64>>)
where
    Bk: AutodiffBackend + GemmOps + LayerOps + AttentionOps,
{
    let t = tensors::<Bk>(v, dtype, dev);
    let two_d: Vec<_> = t.two_d.into_iter().map(|x| x.require_grad()).collect();
    let norms = t.norms.map(|g| g.require_grad());
    let out = block(&two_d, [&norms[0], &norms[1]], &tables(dtype, dev));
    let grads = (out.clone() * t.dy).sum().backward();
    let wide = |d: Vec<f32>| d.into_iter().map(f64::from).collect::<Vec<_>>();
    let g2 = |x: &Tensor<Bk, 2>| {
        wide(x.grad(&grads).expect("a gradient").cast(FloatDType::F32).into_data().to_vec().unwrap())
    };
    let g1 = |x: &Tensor<Bk, 1>| {
        wide(x.grad(&grads).expect("a gradient").cast(FloatDType::F32).into_data().to_vec().unwrap())
    };
    let mut all = vec![g2(&two_d[0]), g1(&norms[0])];
    all.extend(two_d[1..5].iter().map(g2));
    all.push(g1(&norms[1]));
    all.extend(two_d[5..].iter().map(g2));
    (wide(out.cast(FloatDType::F32).into_data().to_vec().unwrap()), all)
}

/// `Σ out∘dy` on NdArray f32, no autodiff.
fn loss_f32(v: &[Vec<f64>]) -> f64 {
    let dev = Default::default();
    let t = tensors::<NdArray<f32>>(v, FloatDType::F32, &dev);
    let out = block(&t.two_d, [&t.norms[0], &t.norms[1]], &tables(FloatDType::F32, &dev));
    f64::from((out * t.dy).sum().into_scalar())
}

#[test]
fn every_gradient_of_a_decoder_block_matches_finite_differences_on_the_cpu() {
    let v = values_of(71);
    let (_, grads) = loss_and_grads::<Autodiff<NdArray<f32>>>(&v, FloatDType::F32, &Default::default());
    let mut r = rng(72);
    for (i, (name, _)) in SHAPES[..9].iter().enumerate() {
        let dir: Vec<f64> = v[i].iter().map(|_| r.random_range(-1.0..1.0)).collect();
        let eps = 1e-2;
        let shifted = |sign: f64| {
            let mut w = v.clone();
            w[i].iter_mut().zip(&dir).for_each(|(a, b)| *a += sign * eps * b);
            loss_f32(&w)
        };
        let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
        let analytic: f64 = grads[i].iter().zip(&dir).map(|(g, d)| g * d).sum();
        let err = (fd - analytic).abs() / analytic.abs().max(1e-3);
        // f32 losses of size ~10 differenced over 2·10⁻²: about 10⁻⁵ of rounding, and the
        // central difference's own O(ε²) term
        assert!(err <= 1e-2, "d{name}: finite difference {fd} vs autodiff {analytic} ({err:e})");
    }
}

/// The same block through gemmbridge on burn's CUDA backend in f16 against float64.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_decoder_block_through_gemmbridge_matches_float64_on_the_gpu() {
    let _s = super::shared();
    // the inputs as f16 holds them, so that the reference reads what the GPU reads
    let v: Vec<Vec<f64>> = values_of(81)
        .into_iter()
        .map(|t| t.into_iter().map(|e| gemmbridge::half::f16::from_f64(e).to_f64()).collect())
        .collect();
    let (want_out, want) = loss_and_grads::<Autodiff<NdArray<f64>>>(&v, FloatDType::F64, &Default::default());
    let dev = Default::default();
    let (got_out, got) = loss_and_grads::<Autodiff<burn::backend::Cuda>>(&v, FloatDType::F16, &dev);
    let e = rel(&got_out, &want_out);
    assert!(e <= 1e-2, "out: {e:e}");
    for (i, (name, _)) in SHAPES[..9].iter().enumerate() {
        let e = rel(&got[i], &want[i]);
        assert!(e <= 1e-2, "d{name}: ‖err‖/‖ref‖ = {e:e}");
    }
}
