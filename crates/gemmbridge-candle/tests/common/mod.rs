//! Shared by the adapter's tests: seeded random tensors, float64 values and the error measure.
#![allow(dead_code)] // each test file uses its own subset

pub mod reference;

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh generator; the seed is printed so that a failure can be replayed.
pub fn rng(test: &str) -> StdRng {
    let seed: u64 = match std::env::var("GEMMBRIDGE_TEST_SEED") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("GEMMBRIDGE_TEST_SEED={v}: not a u64")),
        Err(_) => rand::rng().random(),
    };
    println!("{test}: seed {seed} (GEMMBRIDGE_TEST_SEED={seed} draws it again)");
    StdRng::seed_from_u64(seed)
}

/// A tensor of `dims` with values uniform in [-1, 1), of `dtype`, on `dev`.
pub fn random(rng: &mut StdRng, dims: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    Tensor::from_vec(v, dims, dev)?.to_dtype(dtype)
}

/// The tensor's values in logical (row-major) order, widened to f64.
pub fn f64s(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// ‖got − want‖ / ‖want‖; infinite where `got` holds a NaN or the lengths differ.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// The band of `dtype`: f32 1e-5, f16/bf16 1e-2.
pub fn band(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// Asserts `got` (a tensor) within `dtype`'s band of the float64 `want`.
pub fn assert_close(what: &str, got: &Tensor, want: &[f64], dtype: DType) -> Result<()> {
    let e = rel_err(&f64s(got)?, want);
    assert!(e <= band(dtype), "{what} ({dtype:?}): relative error {e:e} above {:e}", band(dtype));
    Ok(())
}

/// Row-major index of `idx` in `dims`, with the dimensions `idx` lacks at the front broadcast
/// (and dimensions of size 1 broadcast).
pub fn bcast_index(dims: &[usize], idx: &[usize]) -> usize {
    let lead = idx.len() - dims.len();
    dims.iter().enumerate().fold(0, |acc, (i, &d)| acc * d + if d == 1 { 0 } else { idx[lead + i] })
}
