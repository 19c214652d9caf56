//! What the CPU tests (`conv_cpu`, `layer_cpu`, `grouped_cpu`) share: f32 values widened to
//! f64, the relative error and its band, seeded uniform inputs.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};

/// f32 arithmetic against float64: ‖got − want‖ / ‖want‖ at most this.
pub(crate) const F32_BAND: f64 = 1e-5;

pub(crate) fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

/// ‖got − want‖ / ‖want‖ (infinite for a non-finite `got`).
pub(crate) fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    d / want.iter().map(|w| w * w).sum::<f64>().sqrt()
}

pub(crate) fn assert_band(what: &str, got: &[f64], want: &[f64], band: f64) {
    let e = rel(got, want);
    assert!(e <= band, "{what}: ‖err‖/‖ref‖ = {e:e} > {band:e}");
}

/// A tensor of `shape` with values uniform in `[-1, 1)` from `rng`, and the values.
pub(crate) fn uniform<B: Backend, const D: usize>(
    rng: &mut rand::rngs::StdRng,
    shape: [usize; D],
) -> (Tensor<B, D>, Vec<f64>) {
    let v: Vec<f32> = (0..shape.iter().product()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let wide = v.iter().map(|&e| f64::from(e)).collect();
    (Tensor::from_data(TensorData::new(v, shape), &Default::default()), wide)
}

pub(crate) fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}
