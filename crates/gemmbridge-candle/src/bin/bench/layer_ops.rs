//! The bandwidth-bound rows of a Llama-3-8B layer, at every `--tokens` count m, each against
//! candle-nn's own fused operation: `rms_norm` (x[m, 4096], label `d4096`), `rope` (the query
//! heads `[1, 32, m, 128]`, label `h32-d128`, n the 4096 features of a token) and `swiglu`
//! (the fused gate/up projection's output `[m, 2·14336]`, label `f14336`). Their k and batch
//! are 1; their rate is TB/s of the bytes a call must read and write (`tflops` 0). Inputs
//! rotate through as many sets as fit 512 MiB (1 to 8), on both sides.

use candle_core::{Result, Tensor};
use gemmbridge_candle::RopeStyle;

use crate::rows::{randn, rotation_count, Bench, Case, Work};
use crate::BenchArgs;

/// Llama-3-8B's hidden size, query heads, head dimension and MLP width.
const HIDDEN: usize = 4096;
const HEADS: usize = 32;
const HEAD_DIM: usize = 128;
const MLP: usize = 14336;

/// `count` bf16 tensors of `dims`, standard normal.
fn sets(b: &Bench, dims: &[usize], count: usize) -> Result<Vec<Tensor>> {
    (0..count).map(|_| randn(dims, 1.0, &b.dev)).collect()
}

/// `rms_norm`: candle-nn's `ops::rms_norm` (one fused kernel) against
/// [`gemmbridge_candle::rms_norm`]; eps 1e-5. Bytes: x read, y written, w read.
pub fn rms_norm(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    let w = (randn(&[HIDDEN], 0.1, &b.dev)? + 1.0)?;
    for &m in &a.tokens {
        let count = rotation_count(m * HIDDEN * 2);
        let xs = sets(b, &[m, HIDDEN], count)?;
        let bytes = ((2 * m * HIDDEN + HIDDEN) * 2) as f64;
        let case = Case {
            op: "rms_norm",
            dtype: "bf16",
            dims: [m, HIDDEN, 1, 1],
            layout: format!("d{HIDDEN}"),
            work: Work::Bytes(bytes),
        };
        let (mut i, mut j) = (0, 0);
        let mut ours = || {
            i = (i + 1) % count;
            let (y, served) = gemmbridge_candle::rms_norm_served(&xs[i], &w, 1e-5)?;
            Ok((vec![y], served))
        };
        let mut candle = || {
            j = (j + 1) % count;
            Ok(vec![candle_nn::ops::rms_norm(&xs[j], &w, 1e-5)?])
        };
        b.row(&case, &mut ours, &mut [("", &mut candle)])?;
    }
    Ok(())
}

/// `rope`: candle-nn's `rotary_emb::rope` (one fused kernel, bf16 tables) against
/// [`gemmbridge_candle::rope`] on the same tables (LLaMA's rotate-half pairs, θ = 500 000).
/// Bytes: x read, y written, both tables read.
pub fn rope(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    for &m in &a.tokens {
        let half = HEAD_DIM / 2;
        let angles: Vec<f32> = (0..m * half)
            .map(|e| (e / half) as f32 * 500_000f32.powf(-2.0 * (e % half) as f32 / HEAD_DIM as f32))
            .collect();
        let angles = Tensor::from_vec(angles, (m, half), &b.dev)?;
        let (cos, sin) =
            (angles.cos()?.to_dtype(candle_core::DType::BF16)?, angles.sin()?.to_dtype(candle_core::DType::BF16)?);
        let count = rotation_count(m * HIDDEN * 2);
        let xs = sets(b, &[1, HEADS, m, HEAD_DIM], count)?;
        let bytes = ((2 * m * HIDDEN + 2 * m * half) * 2) as f64;
        let case = Case {
            op: "rope",
            dtype: "bf16",
            dims: [m, HIDDEN, 1, 1],
            layout: format!("h{HEADS}-d{HEAD_DIM}"),
            work: Work::Bytes(bytes),
        };
        let (mut i, mut j) = (0, 0);
        let mut ours = || {
            i = (i + 1) % count;
            let (y, served) = gemmbridge_candle::rope_served(&xs[i], &cos, &sin, RopeStyle::RotateHalf)?;
            Ok((vec![y], served))
        };
        let mut candle = || {
            j = (j + 1) % count;
            Ok(vec![candle_nn::rotary_emb::rope(&xs[j], &cos, &sin)?])
        };
        b.row(&case, &mut ours, &mut [("", &mut candle)])?;
    }
    Ok(())
}

/// `swiglu`: candle-nn's `ops::swiglu` (`chunk`, `silu`, a product: two kernels) against
/// [`gemmbridge_candle::swiglu`] (one). Bytes: gu read, y written.
pub fn swiglu(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    for &m in &a.tokens {
        let count = rotation_count(m * 2 * MLP * 2);
        let gus = sets(b, &[m, 2 * MLP], count)?;
        let bytes = (3 * m * MLP * 2) as f64;
        let case = Case {
            op: "swiglu",
            dtype: "bf16",
            dims: [m, MLP, 1, 1],
            layout: format!("f{MLP}"),
            work: Work::Bytes(bytes),
        };
        let (mut i, mut j) = (0, 0);
        let mut ours = || {
            i = (i + 1) % count;
            let (y, served) = gemmbridge_candle::swiglu_served(&gus[i])?;
            Ok((vec![y], served))
        };
        let mut candle = || {
            j = (j + 1) % count;
            Ok(vec![candle_nn::ops::swiglu(&gus[j])?])
        };
        b.row(&case, &mut ours, &mut [("", &mut candle)])?;
    }
    Ok(())
}
