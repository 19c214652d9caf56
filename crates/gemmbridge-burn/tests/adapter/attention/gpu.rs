//! Attention on burn's CUDA backend (ignored elsewhere): cuDNN's forward and backward, plain
//! and under fusion, f16 and bf16, against float64 (gemmbridge's reference on the rounded
//! inputs) and against burn's own attention (`burn::tensor::module::attention` in f32 on the
//! same values), and inside a residual block against the chain rule in float64. These run beside the other GPU tests, with the adapter in its default state
//! ([`crate::shared`]).

use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, FloatDType, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{attention, attention_counts, matmul, AttentionOps, AttnMask, GemmOps};

use super::{cases, rel, tensor, values, Case};

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;
type Fused = burn_fusion::Fusion<Plain>;

const HALVES: [FloatDType; 2] = [FloatDType::F16, FloatDType::BF16];

/// Forward band (‖err‖/‖ref‖ against float64): f32 softmax and accumulation, the output and
/// the probabilities fed to `P·v` rounded to the inputs' 8 (bf16) or 11 (f16) bits.
fn band(dtype: FloatDType) -> f64 {
    if dtype == FloatDType::BF16 {
        1e-2
    } else {
        2e-3
    }
}

/// Gradient band: the backward rounds `dS` and `P` as well.
fn grad_band(dtype: FloatDType) -> f64 {
    if dtype == FloatDType::BF16 {
        2e-2
    } else {
        5e-3
    }
}

fn inputs<B: Backend>(c: &Case, seed: u64, dtype: FloatDType) -> [Tensor<B, 4>; 3] {
    let dev = Default::default();
    let (q, kv) = (c.q_shape(), c.kv_shape());
    [tensor(q, seed, dtype, &dev), tensor(kv, seed + 1, dtype, &dev), tensor(kv, seed + 2, dtype, &dev)]
}

/// burn's own attention (`module::attention`) in f32 on the same values: key/value heads
/// repeated, the mask as burn's bool tensor (`true`: hidden).
fn burns_own<B: Backend>(c: &Case, [q, k, v]: [Tensor<B, 4>; 3]) -> Tensor<B, 4> {
    let ([b, h, s_q, d], [_, kv, s_kv, _]) = (c.q_shape(), c.kv_shape());
    let rep = |t: Tensor<B, 4>| t.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, s_kv, d]).reshape([b, h, s_kv, d]);
    let hidden: Vec<bool> = (0..b)
        .flat_map(|n| (0..s_q).flat_map(move |i| (0..s_kv).map(move |j| (n, i, j))))
        .map(|(n, i, j)| !c.mask.visible(n, i, j, s_q, s_kv))
        .collect();
    let mask = Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [b, 1, s_q, s_kv]), &q.device());
    let f32 = |t: Tensor<B, 4>| t.cast(FloatDType::F32);
    let opts = AttentionModuleOptions::default();
    burn::tensor::module::attention(f32(q), rep(f32(k)), rep(f32(v)), Some(mask.expand([b, h, s_q, s_kv])), None, opts)
}

fn forward_cases<B: AttentionOps>() {
    for dtype in HALVES {
        for c in cases() {
            let ins = inputs::<B>(&c, 100, dtype);
            let want = c.forward(&values(ins[0].clone()), &values(ins[1].clone()), &values(ins[2].clone())).0;
            let burn = values(burns_own(&c, ins.clone()));
            let before = attention_counts().0;
            let [q, k, v] = ins;
            let got = values(attention(q, k, v, c.mask.clone()));
            assert!(attention_counts().0 > before, "{c:?} {dtype:?}: cuDNN did not serve the call");
            let (e, eb, burn_e) = (rel(&got, &want), rel(&got, &burn), rel(&burn, &want));
            eprintln!("{c:?} {dtype:?}: vs f64 {e:e} (burn's own f32 vs f64 {burn_e:e}), vs burn {eb:e}");
            assert!(e <= band(dtype) && eb <= band(dtype), "{c:?} {dtype:?}: vs f64 {e:e}, vs burn {eb:e}");
        }
    }
    // a [b, s, h, d] projection seen as [b, h, s, d]: read in place
    let c = cases()[2].clone();
    let dev = Default::default();
    let bshd =
        |[b, h, s, d]: [usize; 4], seed| tensor::<B, 4>([b, s, h, d], seed, FloatDType::BF16, &dev).swap_dims(1, 2);
    let ins = [bshd(c.q_shape(), 110), bshd(c.kv_shape(), 111), bshd(c.kv_shape(), 112)];
    let want = c.forward(&values(ins[0].clone()), &values(ins[1].clone()), &values(ins[2].clone())).0;
    let [q, k, v] = ins;
    let e = rel(&values(attention(q, k, v, c.mask.clone())), &want);
    assert!(e <= band(FloatDType::BF16), "strided views: vs f64 {e:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_plain_backend() {
    let _shared = crate::shared();
    forward_cases::<Plain>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_under_fusion() {
    let _shared = crate::shared();
    forward_cases::<Fused>();
}

/// f32 runs burn's own attention (counted as a fallback) and equals it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_runs_burns_own_attention() {
    let _shared = crate::shared();
    let c = cases()[1].clone();
    let ins = inputs::<Plain>(&c, 120, FloatDType::F32);
    let burn = values(burns_own(&c, ins.clone()));
    let before = attention_counts().1;
    let [q, k, v] = ins;
    let got = values(attention(q, k, v, c.mask.clone()));
    assert!(attention_counts().1 > before, "an f32 call is left to burn");
    assert!(rel(&got, &burn) <= 1e-5, "f32: vs burn's own {:e}", rel(&got, &burn));
}

fn gradient_cases<B: AutodiffBackend + AttentionOps>() {
    for dtype in HALVES {
        for c in cases() {
            let dev = Default::default();
            let ins = inputs::<B>(&c, 130, dtype).map(|t| t.require_grad());
            let g = tensor::<B, 4>(c.q_shape(), 133, dtype, &dev);
            let (qv, kv, vv, gv) =
                (values(ins[0].clone()), values(ins[1].clone()), values(ins[2].clone()), values(g.clone()));
            let before = attention_counts().0;
            let o = attention(ins[0].clone(), ins[1].clone(), ins[2].clone(), c.mask.clone());
            let grads = (o * g).sum().backward();
            assert!(attention_counts().0 >= before + 2, "{c:?} {dtype:?}: forward and backward on cuDNN");
            let want = c.grads(&qv, &kv, &vv, &gv);
            for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
                let e = rel(&values(ins[i].grad(&grads).expect("a gradient")), &want[i]);
                eprintln!("{c:?} {dtype:?} {name}: vs f64 {e:e}");
                assert!(e <= grad_band(dtype), "{c:?} {dtype:?} {name}: vs f64 {e:e}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_plain_backend() {
    let _shared = crate::shared();
    gradient_cases::<Autodiff<Plain>>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_under_fusion() {
    let _shared = crate::shared();
    gradient_cases::<Autodiff<Fused>>();
}

/// The parameters of [`block`]: `[x, w_q, w_k, w_v, w_o]`.
const SHAPES: [[usize; 3]; 5] = [[2, 37, 64], [1, 64, 64], [1, 64, 32], [1, 64, 32], [1, 64, 64]];

/// `x + attention(heads(x·w_q), heads(x·w_k), heads(x·w_v), causal)·w_o` with gemmbridge's
/// `matmul` and `attention`: 4 query heads over 2 key/value heads of 16.
fn block<B: GemmOps + AttentionOps>(p: &[Tensor<B, 3>; 5]) -> Tensor<B, 3> {
    let [x, wq, wk, wv, wo] = p.clone();
    let heads = |t: Tensor<B, 3>, n: usize| t.reshape([2, 37, n, 16]).swap_dims(1, 2);
    let (q, k, v) = (heads(matmul(x.clone(), wq), 4), heads(matmul(x.clone(), wk), 2), heads(matmul(x.clone(), wv), 2));
    let o = attention(q, k, v, AttnMask::Causal);
    x + matmul(o.swap_dims(1, 2).reshape([2, 37, 64]), wo)
}

/// The residual block's gradients (input and every weight) of `sum(block ⊙ g)` on cuDNN in
/// bf16 and f16, plain and fused, against the float64 chain rule on the same (rounded) values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn residual_block_gradients_against_float64() {
    let _shared = crate::shared();
    for dtype in HALVES {
        for fused in [false, true] {
            let before = attention_counts().0;
            let (got, host) =
                if fused { block_grads::<Autodiff<Fused>>(dtype) } else { block_grads::<Autodiff<Plain>>(dtype) };
            assert!(attention_counts().0 >= before + 2, "{dtype:?}: the block's attention on cuDNN");
            let want = reference_block(&host);
            for (i, p) in ["x", "w_q", "w_k", "w_v", "w_o"].into_iter().enumerate() {
                let e = rel(&got[i], &want[i]);
                eprintln!("block fused {fused} {dtype:?} d{p}: vs f64 {e:e}");
                assert!(e <= 3e-2, "block fused {fused} {dtype:?} d{p}: vs f64 {e:e}");
            }
        }
    }
}

/// The float64 chain rule of [`reference_block`] against burn's own f32 ops on the CPU (where
/// `block` runs burn's matmul and the composed attention): the reference the GPU test trusts
/// is itself checked where CI runs.
#[test]
fn the_block_reference_agrees_with_the_cpu() {
    let (got, host) = block_grads::<Autodiff<burn::backend::NdArray<f32>>>(FloatDType::F32);
    let want = reference_block(&host);
    for (i, p) in ["x", "w_q", "w_k", "w_v", "w_o"].into_iter().enumerate() {
        let e = rel(&got[i], &want[i]);
        assert!(e <= 1e-5, "block on the CPU d{p}: vs f64 {e:e}");
    }
}

/// Gradients of `sum(block ⊙ g)` for every parameter, on `B` in `dtype`, and the values the
/// parameters and `g` hold: `[x, w_q, w_k, w_v, w_o, g]`.
fn block_grads<B: AutodiffBackend + GemmOps + AttentionOps>(dtype: FloatDType) -> ([Vec<f64>; 5], [Vec<f64>; 6]) {
    let dev = Default::default();
    let p: [Tensor<B, 3>; 5] = std::array::from_fn(|i| tensor(SHAPES[i], 140 + i as u64, dtype, &dev).require_grad());
    let g = tensor::<B, 3>(SHAPES[0], 150, dtype, &dev);
    let host = [&p[0], &p[1], &p[2], &p[3], &p[4], &g].map(|t| values(t.clone()));
    let grads = (block(&p) * g).sum().backward();
    (p.map(|t| values(t.grad(&grads).expect("a gradient"))), host)
}

/// `a[m, k] · b[k, n]`, row-major, float64.
fn mm(a: &[f64], (m, k): (usize, usize), b: &[f64], n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            let x = a[i * k + l];
            for j in 0..n {
                c[i * n + j] += x * b[l * n + j];
            }
        }
    }
    c
}

/// The transpose of row-major `a[m, n]`.
fn tr(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n * m).map(|e| a[(e % m) * n + e / m]).collect()
}

/// `[2·37, n·16]` (rows `[b, s]`) as `[2, n, 37, 16]` (BHSD), and back with `back`.
fn heads(t: &[f64], n: usize, back: bool) -> Vec<f64> {
    let mut out = vec![0.0; t.len()];
    for (b, h, s, e) in
        (0..2).flat_map(|b| (0..n).flat_map(move |h| (0..37).flat_map(move |s| (0..16).map(move |e| (b, h, s, e)))))
    {
        let (rows, bhsd) = (((b * 37 + s) * n + h) * 16 + e, ((b * n + h) * 37 + s) * 16 + e);
        if back {
            out[rows] = t[bhsd];
        } else {
            out[bhsd] = t[rows];
        }
    }
    out
}

/// The gradients `[dx, dw_q, dw_k, dw_v, dw_o]` of `sum(block ⊙ g)` by the chain rule in float64,
/// the attention's forward and backward from gemmbridge's reference.
fn reference_block([x, wq, wk, wv, wo, g]: &[Vec<f64>; 6]) -> [Vec<f64>; 5] {
    let rows = 2 * 37;
    let c = Case { b: 2, h: (4, 2), s: (37, 37), d: 16, mask: AttnMask::Causal };
    let proj = |w: &[f64], n| mm(x, (rows, 64), w, n);
    let (q, k, v) = (heads(&proj(wq, 64), 4, false), heads(&proj(wk, 32), 2, false), heads(&proj(wv, 32), 2, false));
    let o = heads(&c.forward(&q, &k, &v).0, 4, true);
    let dwo = mm(&tr(&o, rows, 64), (64, rows), g, 64);
    let d_o = heads(&mm(g, (rows, 64), &tr(wo, 64, 64), 64), 4, false);
    let [dq, dk, dv] = c.grads(&q, &k, &v, &d_o);
    let (dq, dk, dv) = (heads(&dq, 4, true), heads(&dk, 2, true), heads(&dv, 2, true));
    let xt = tr(x, rows, 64);
    let dw = |d: &[f64], n| mm(&xt, (64, rows), d, n);
    let mut dx = g.clone();
    for (d, w, n) in [(&dq, wq, 64), (&dk, wk, 32), (&dv, wv, 32)] {
        for (a, b) in dx.iter_mut().zip(mm(d, (rows, n), &tr(w, 64, n), 64)) {
            *a += b;
        }
    }
    [dx, dw(&dq, 64), dw(&dk, 32), dw(&dv, 32), dwo]
}
