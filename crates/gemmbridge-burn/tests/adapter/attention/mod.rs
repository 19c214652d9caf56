//! `gemmbridge_burn::attention` and `GemmAttention`: `cpu` on burn's NdArray backend (runs in
//! CI: burn's attention op, the composed forward with statistics and the composed backward,
//! the masks, grouped heads, the module and its record, the refusals); `gpu` on burn's CUDA
//! backend (ignored elsewhere: cuDNN's forward and backward against float64 and burn's own
//! attention, plain and fused, f16 and bf16, inside a residual block).
//!
//! The float64 reference is gemmbridge's (`gemmbridge::attention::reference`), on the values
//! the tensors hold (after any rounding to f16/bf16), so the bands measure the computation.

mod cpu;
mod gpu;

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use gemmbridge::attention::{reference, Attention, AttnMask as EngineMask};
use gemmbridge_burn::AttnMask;

/// `n` deterministic values in `[-1, 1)` (a linear congruential generator from `seed`), the
/// same on every backend.
pub fn host_values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `shape` holding [`host_values`], in `dtype`.
pub fn tensor<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    dtype: FloatDType,
    dev: &B::Device,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::<B, D>::from_data(TensorData::new(host_values(n, seed), shape), dev).cast(dtype)
}

/// The tensor's values in float64, in logical (row-major) order.
pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(FloatDType::F64).into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

/// ‖got − want‖ / ‖want‖; infinite where `got` has a non-finite value.
pub fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    d / want.iter().map(|w| w * w).sum::<f64>().sqrt()
}

/// One attention case: shapes `q[b, h_q, s_q, d]`, `k`, `v[b, h_kv, s_kv, d]` and a mask.
#[derive(Clone, Debug)]
pub struct Case {
    pub b: usize,
    pub h: (usize, usize),
    pub s: (usize, usize),
    pub d: usize,
    pub mask: AttnMask,
}

impl Case {
    pub fn q_shape(&self) -> [usize; 4] {
        [self.b, self.h.0, self.s.0, self.d]
    }

    pub fn kv_shape(&self) -> [usize; 4] {
        [self.b, self.h.1, self.s.1, self.d]
    }

    /// The reference's problem (BHSD, the values' order) and its lengths.
    fn problem(&self) -> (Attention, Option<[Vec<i32>; 2]>) {
        let engine = match self.mask {
            AttnMask::None | AttnMask::Lengths(_) => EngineMask::None,
            AttnMask::Causal | AttnMask::CausalLengths(_) => EngineMask::Causal,
            AttnMask::CausalBottomRight => EngineMask::CausalBottomRight,
        };
        let lens = self.mask.lengths().map(|l| [vec![self.s.0 as i32; self.b], l.iter().map(|&n| n as i32).collect()]);
        let p = Attention::new(self.b, self.h, self.s, self.d, gemmbridge::DType::BF16)
            .bhsd()
            .with_mask(engine)
            .with_var_len(lens.is_some());
        (p, lens)
    }

    /// The float64 forward: `(o, lse)`.
    pub fn forward(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (p, lens) = self.problem();
        let f = reference::forward(&p, q, k, v, lens.as_ref().map(|[a, b]| (a.as_slice(), b.as_slice())));
        (f.o, f.lse)
    }

    /// The float64 gradients `[dq, dk, dv]` for the output gradient `d_o`.
    pub fn grads(&self, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> [Vec<f64>; 3] {
        let (p, lens) = self.problem();
        let lens = lens.as_ref().map(|[a, b]| (a.as_slice(), b.as_slice()));
        let f = reference::forward(&p, q, k, v, lens);
        let g = reference::backward(&p, (q, k, v), &f.o, d_o, &f.lse, lens);
        [g.dq, g.dk, g.dv]
    }
}

/// The cases every test runs: sequence 37 (41 keys for cross-attention), 5 query heads over 1
/// key/value head and 6 over 2, d = 64, every mask.
pub fn cases() -> Vec<Case> {
    let c = |h, s, mask| Case { b: 2, h, s, d: 64, mask };
    vec![
        c((5, 1), (37, 37), AttnMask::None),
        c((5, 1), (37, 37), AttnMask::Causal),
        c((6, 2), (37, 41), AttnMask::Causal),
        c((6, 2), (37, 41), AttnMask::CausalBottomRight),
        c((5, 1), (37, 41), AttnMask::Lengths(vec![41, 9])),
        c((5, 5), (37, 37), AttnMask::CausalLengths(vec![30, 37])),
    ]
}
