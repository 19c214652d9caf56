//! `fp8_linear`'s float64 references, shared by the CPU (`cpu_fp8_linear.rs`) and GPU
//! (`gpu/fp8_linear.rs`) tests (included by `#[path]` from both): the recipe's emulation (both
//! operands quantised by `gemmbridge::fp8::quantize`, the product in float64), the exact
//! product, and the check of an output against both.

use candle_core::{DType, Result, Tensor};
use gemmbridge::fp8::{self, Fp8Format, Source};
use gemmbridge_candle::Fp8Scaling;

use crate::common::{f64s, rel_err};

/// The tensor's values in logical order as f32 (exact for f16, bf16 and f32).
pub fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// `x[.., k]·w[n, k]ᵀ + b` in float64 on the given values.
pub fn product(x: &[f64], w: &[f64], b: Option<&[f64]>, (n, k): (usize, usize)) -> Vec<f64> {
    let rows = x.len() / k;
    let mut y = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for j in 0..n {
            let dot: f64 = (0..k).map(|t| x[r * k + t] * w[j * k + t]).sum();
            y.push(dot + b.map_or(0.0, |b| b[j]));
        }
    }
    y
}

/// The recipe's emulation: x and w quantised by gemmbridge's CPU quantisation (the GPU
/// kernels' bits), dequantised, multiplied in float64, the bias added.
pub fn emulated(x: &Tensor, w: &Tensor, b: Option<&Tensor>, scaling: Fp8Scaling) -> Result<Vec<f64>> {
    let (n, k) = w.dims2()?;
    let m = x.elem_count() / k;
    let q = |v: &[f32], rows, s| -> Vec<f64> {
        let q = fp8::quantize(v, rows, k, Source::RowMajor, Fp8Format::E4M3, s).unwrap();
        fp8::dequantize(&q).unwrap()
    };
    let (xd, wd) = (q(&f32s(x)?, m, scaling.x_scaling()), q(&f32s(w)?, n, scaling.w_scaling()));
    let bv = b.map(f64s).transpose()?;
    Ok(product(&xd, &wd, bv.as_deref(), (n, k)))
}

/// `x·wᵀ + b` in float64 on the unquantised values.
pub fn exact(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Vec<f64>> {
    let bv = b.map(f64s).transpose()?;
    Ok(product(&f64s(x)?, &f64s(w)?, bv.as_deref(), w.dims2()?))
}

/// Asserts `got` within `band` of the recipe's emulation and within 1.5× the emulation's error
/// against float64, the quantisation visible in that error; returns the emulation's error.
pub fn check_recipe(what: &str, got: &Tensor, [emu, ex]: [&[f64]; 2], band: f64) -> Result<f64> {
    let got = f64s(got)?;
    let (vs_emu, vs_exact, recipe) = (rel_err(&got, emu), rel_err(&got, ex), rel_err(emu, ex));
    println!("{what}: {vs_emu:.2e} from the emulation, {vs_exact:.3e} from float64 (recipe {recipe:.3e})");
    assert!(vs_emu <= band, "{what}: {vs_emu:e} from the emulation");
    assert!(vs_exact <= 1.5 * recipe, "{what}: {vs_exact:e} > 1.5 × the recipe's {recipe:e}");
    // FP8's rounding shows: a path that skipped the quantisation would sit near 0 here
    assert!(recipe > 1e-3, "{what}: the recipe's error {recipe:e} is not FP8's");
    Ok(recipe)
}
