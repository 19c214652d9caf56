//! The linear rows: `x[m, k]·w[n, k]ᵀ` in bf16 at the projections of a Llama-3-8B layer, plain
//! (`linear`) and with a bias and GELU (`linear_bias_gelu`), at every `--tokens` count m.
//! A row's label is the projection's name (`linear/up_proj`), its batch 1, its TFLOP/s
//! 2·m·n·k per call. Inputs rotate through as many sets as fit 512 MiB (1 to 8), as
//! bench/peer.py's do, on both sides.

use candle_core::Result;
use gemmbridge_candle::Activation;

use crate::rows::{randn, rotation_count, Bench, Case, Work};
use crate::BenchArgs;

/// `(name, n, k)`: the projections of a Llama-3-8B layer (hidden 4096, 8 key/value heads of
/// 128, MLP 14336).
pub const PROJECTIONS: [(&str, usize, usize); 4] =
    [("qo_proj", 4096, 4096), ("kv_proj", 1024, 4096), ("up_proj", 14336, 4096), ("down_proj", 4096, 14336)];

/// `linear`: candle's `x.matmul(&w.t())` (cuBLAS) against [`gemmbridge_candle::linear`]
/// (cuBLASLt).
pub fn plain(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    rows(b, a, "linear", Activation::None)
}

/// `linear_bias_gelu`: candle's matmul, `broadcast_add` and `gelu` (three launches) against
/// one GEMM with the bias and GELU in its epilogue.
pub fn bias_gelu(b: &mut Bench, a: &BenchArgs) -> Result<()> {
    rows(b, a, "linear_bias_gelu", Activation::Gelu)
}

fn rows(b: &mut Bench, a: &BenchArgs, op: &'static str, act: Activation) -> Result<()> {
    let with_bias = act != Activation::None;
    for &(name, n, k) in &PROJECTIONS {
        for &m in &a.tokens {
            let sets = rotation_count((m * k + n * k) * 2);
            let (mut xs, mut ws, mut bs) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..sets {
                xs.push(randn(&[m, k], 1.0, &b.dev)?);
                ws.push(randn(&[n, k], 1.0 / (k as f64).sqrt(), &b.dev)?);
                bs.push(randn(&[n], 1.0, &b.dev)?);
            }
            let bias = |i: usize| with_bias.then(|| &bs[i]);
            let case = Case {
                op,
                dtype: "bf16",
                dims: [m, n, k, 1],
                layout: name.to_string(),
                work: Work::Flops(2.0 * (m * n * k) as f64),
            };
            let (mut i, mut j) = (0, 0);
            let mut ours = || {
                i = (i + 1) % sets;
                let (y, served) = gemmbridge_candle::linear_served(&xs[i], &ws[i], bias(i), act)?;
                Ok((vec![y], served))
            };
            let mut candle = || {
                j = (j + 1) % sets;
                let y = if with_bias {
                    gemmbridge_candle::linear_candle(&xs[j], &ws[j], bias(j), act)?
                } else {
                    xs[j].matmul(&ws[j].t()?)?
                };
                Ok(vec![y])
            };
            b.row(&case, &mut ours, &mut [("", &mut candle)])?;
        }
    }
    Ok(())
}
