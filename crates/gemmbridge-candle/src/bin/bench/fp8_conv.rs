//! The FP8 linear and convolution rows.
//!
//! - `fp8_linear`: `x[m, k]·w[n, k]ᵀ` at the projections of a Llama-3-8B layer, bf16 in and out
//!   — candle's bf16 `x.matmul(&w.t())` against [`gemmbridge_candle::fp8_linear`] on an
//!   [`Fp8Weight`] quantised once (the activations quantised each call, inside the timed call),
//!   row-wise scales (label `proj/rowwise`) and 1×128·128×128 blocks (`proj/block`). TFLOP/s
//!   2·m·n·k; `rel_diff` is FP8's own error against candle's bf16 product, not a defect.
//! - `conv2d`: ResNet-50's 3×3 convolutions (stride 1, padding 1) at batch 32, NCHW bf16, with a
//!   bias and ReLU — candle's `conv2d`, `broadcast_add` and `relu` against one fused cuDNN graph
//!   ([`gemmbridge_candle::conv2d`]). As `gemmbridge bench`'s convolution rows: m = P·Q, n = K,
//!   k = C·R·S, batch = N, layout `nchw-cC-hH` (2·m·n·k·batch flops).

use candle_core::Result;
use gemmbridge_candle::{Conv2dParams, ConvAct, Fp8Scaling, Fp8Weight};

use crate::linear::PROJECTIONS;
use crate::rows::{randn, Bench, Case, Work};
use crate::BenchArgs;

/// `fp8_linear`: both recipes at every projection and `--tokens` count.
pub fn fp8_linear(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    for (scaling, tag) in [(Fp8Scaling::RowWise, "rowwise"), (Fp8Scaling::Block, "block")] {
        for &(name, n, k) in &PROJECTIONS {
            let w = randn(&[n, k], 1.0 / (k as f64).sqrt(), &b.dev)?;
            let w8 = Fp8Weight::quantize(&w, scaling)?;
            for &m in &a.tokens {
                let x = randn(&[m, k], 1.0, &b.dev)?;
                let case = Case {
                    op: "fp8_linear",
                    dtype: "bf16",
                    dims: [m, n, k, 1],
                    layout: format!("{name}/{tag}"),
                    work: Work::Flops(2.0 * (m * n * k) as f64),
                };
                let mut ours = || {
                    let (y, served) = gemmbridge_candle::fp8_linear_served(&x, &w8, None)?;
                    Ok((vec![y], served))
                };
                let mut candle = || Ok(vec![x.matmul(&w.t()?)?]);
                b.row(&case, &mut ours, &mut [("", &mut candle)])?;
            }
        }
    }
    Ok(())
}

/// ResNet-50's 3×3 convolutions: `(C = K, H = W)`.
const RESNET50_3X3: [(usize, usize); 4] = [(64, 56), (128, 28), (256, 14), (512, 7)];

/// `conv2d`: bias and ReLU, batch 32.
pub fn conv2d(b: &mut Bench, _a: &BenchArgs) -> Result<()> {
    let n = 32;
    for &(c, hw) in &RESNET50_3X3 {
        let x = randn(&[n, c, hw, hw], 1.0, &b.dev)?;
        let w = randn(&[c, c, 3, 3], 1.0 / ((c * 9) as f64).sqrt(), &b.dev)?;
        let bias = randn(&[c], 1.0, &b.dev)?;
        let p = Conv2dParams::new(1, 1, 1, 1);
        let case = Case {
            op: "conv2d",
            dtype: "bf16",
            dims: [hw * hw, c, c * 9, n],
            layout: format!("nchw-c{c}-h{hw}"),
            work: Work::Flops(2.0 * (hw * hw * c * c * 9 * n) as f64),
        };
        let mut ours = || {
            let (y, served) = gemmbridge_candle::conv2d_served(&x, &w, Some(&bias), ConvAct::Relu, p)?;
            Ok((vec![y], served))
        };
        let mut candle = || Ok(vec![gemmbridge_candle::conv2d_candle(&x, &w, Some(&bias), ConvAct::Relu, p)?]);
        b.row(&case, &mut ours, &mut [("", &mut candle)])?;
    }
    Ok(())
}
