//! The decoder-layer rows of `gemmbridge bench` (`--ops layer_fwd,layer_fwd_bwd`; the
//! layer's single ops are `layer.rs`'s): one LLaMA-3-8B layer ([`DecoderLayer::llama3_8b`],
//! bf16) on `b` sequences of `s` tokens (`--layer-shapes`, default 2×4096 and 8×1024, the
//! shapes of `bench/layer_peer.py`), timed as the GEMM rows are: `layer_fwd` the forward
//! without what the backward reads (the peer's `torch.no_grad()`), `layer_fwd_bwd` the
//! training forward and the backward (dx and every weight gradient); with `--dtypes
//! fp8_e4m3`, also with FP8 forward projections per `--scalings` recipe the layer takes. A
//! row's m is s, n is d, k is ffn, batch is b, layout `llama3-8b`; its TFLOP/s counts
//! [`DecoderLayer::flops`]. A step the GPU layer cannot run (its
//! [`gemmbridge::Error::Unsupported`], or an FP8 recipe the GPU does not offer) is reported
//! and its row skipped, as attention rows a cuDNN does not offer are.

use anyhow::bail;
use cudarc::driver::CudaSlice;
use gemmbridge::cuda::layer::GpuDecoderLayer;
use gemmbridge::cuda::Gpu;
use gemmbridge::fp8::Scaling;
use gemmbridge::half::bf16;
use gemmbridge::layer::reference::Weights;
use gemmbridge::layer::{DecoderLayer, LayerOptions, LayerWeight, Tokens};
use gemmbridge::Precision;

use super::attn::unsupported;
use super::fp8;
use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The layer ops.
pub const OPS: [&str; 2] = ["layer_fwd", "layer_fwd_bwd"];

/// The rows' layout label (the peer's).
pub const LAYOUT: &str = "llama3-8b";

/// `--layer-shapes` parsed: `BxS` comma-separated.
pub fn parse_shapes(list: &str) -> anyhow::Result<Vec<Tokens>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let parsed =
            item.to_ascii_lowercase().split_once('x').and_then(|(b, s)| Some((b.parse().ok()?, s.parse().ok()?)));
        match parsed {
            Some((b, s)) if b > 0 && s > 0 => out.push(Tokens { b, s }),
            _ => bail!("--layer-shapes: {item:?} is not BxS with both positive (e.g. 2x4096)"),
        }
    }
    if out.is_empty() {
        bail!("--layer-shapes names no shape (give BxS, e.g. 2x4096,8x1024)");
    }
    Ok(out)
}

/// Weights of a trained layer's scale without a host random source per element: norms 1,
/// each projection's entries a hash of their place in ±√(3/in) (uniform, variance 1/in).
///
/// # Errors
/// As [`Weights::from_fn`].
pub fn synthetic_weights(l: &DecoderLayer) -> gemmbridge::Result<Weights> {
    Weights::from_fn(l, |w, i| {
        let [_, cols] = l.weight_shape(w);
        if matches!(w, LayerWeight::Norm1 | LayerWeight::Norm2) {
            return 1.0;
        }
        let mut z = (i as u64 ^ ((w as u64) << 56)).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let u = (z ^ (z >> 31)) as f64 / u64::MAX as f64;
        (2.0 * u - 1.0) * (3.0 / cols as f64).sqrt()
    })
}

/// The layer's FP8 forward recipe of a `--scalings` name: `tensorwise` and `rowwise` (the same
/// scaling for both operands); `None` for the others, which the layer does not take.
fn layer_recipe(name: &str) -> Option<Scaling> {
    match fp8::recipe(name).ok()? {
        (Scaling::Tensor, Scaling::Tensor) => Some(Scaling::Tensor),
        (Scaling::Row, Scaling::Row) => Some(Scaling::Row),
        _ => None,
    }
}

/// Every row: per shape, per op, in bf16 (the peer's only dtype; with bf16 in `dtypes`) and,
/// with FP8 forward projections, per `--scalings` recipe the layer takes (`tensorwise`, `rowwise`;
/// dtype `fp8_e4m3`, layout `llama3-8b/<recipe>`; the backward stays bf16); `each` is called
/// with every row as it is made.
pub fn bench(
    gpu: &Gpu,
    (ops, shapes, scalings): (&[String], &[Tokens], &[String]),
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let mut ways: Vec<(&str, String, LayerOptions)> = Vec::new();
    if dtypes.iter().any(|(n, _)| n == "bf16") {
        ways.push(("bf16", LAYOUT.to_string(), LayerOptions::default()));
    }
    for name in scalings {
        match layer_recipe(name) {
            Some(s) => ways.push(("fp8_e4m3", format!("{LAYOUT}/{name}"), LayerOptions { fp8_forward: Some(s) })),
            None => eprintln!("layer rows: FP8 recipe {name} skipped (the layer takes tensorwise and rowwise)"),
        }
    }
    if ways.is_empty() {
        eprintln!("layer rows: skipped (they run in bf16 or FP8, and --dtypes names neither)");
        return Ok(Vec::new());
    }
    let l = DecoderLayer::llama3_8b();
    let mut rows = Vec::new();
    for &t in shapes {
        for (dtype, layout, options) in &ways {
            let mut layer = match GpuDecoderLayer::<bf16>::with_options(gpu, (l, t), &synthetic_weights(&l)?, *options)
            {
                Err(e) if fp8::not_offered(&e) || matches!(e, gemmbridge::Error::Unsupported { .. }) => {
                    eprintln!("layer rows {layout} b{} s{}: skipped: {e}", t.b, t.s);
                    continue;
                }
                other => other?,
            };
            let s = gpu.stream();
            let n = t.count() * l.d_model;
            let (x, dy): (CudaSlice<bf16>, CudaSlice<bf16>) = (s.clone_htod(&normal(n))?, s.clone_htod(&normal(n))?);
            for op in ops {
                let timed = match op.as_str() {
                    "layer_fwd" => timing::time_gpu(gpu, sampling, &mut || layer.forward(gpu, &x, false)),
                    "layer_fwd_bwd" => timing::time_gpu(gpu, sampling, &mut || {
                        layer.forward(gpu, &x, true)?;
                        layer.backward(gpu, &x, &dy)
                    }),
                    other => bail!("unknown layer op {other:?}"),
                };
                let t_ = match timed {
                    Err(e) if unsupported(&e) => {
                        eprintln!("{op} {layout} b{} s{}: skipped: {e}", t.b, t.s);
                        continue;
                    }
                    other => other?,
                };
                let flops = l.flops(t, op == "layer_fwd_bwd");
                let row = Row::timed(op, dtype, [t.s, l.d_model, l.ffn, t.b], &t_, flops, layout.clone());
                each(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_weights_have_the_scale_of_a_layer() {
        assert_eq!(parse_shapes(" 2x4096, 8X1024").unwrap(), [Tokens { b: 2, s: 4096 }, Tokens { b: 8, s: 1024 }]);
        assert!(parse_shapes("2x0").is_err());
        assert!(parse_shapes("4096").is_err());
        assert!(parse_shapes(",").is_err());
        let l = DecoderLayer::new(64, (2, 1), 16, 96, gemmbridge::DType::BF16);
        let w = synthetic_weights(&l).unwrap();
        w.check(&l).unwrap();
        let down = &w.w_down;
        let var = down.iter().map(|v| v * v).sum::<f64>() / down.len() as f64;
        assert!((var * 96.0 - 1.0).abs() < 0.1, "variance·in = {}", var * 96.0);
        assert!(w.w_norm1.iter().all(|&v| v == 1.0));
        assert_ne!(w.w_qkv[..8], w.w_o[..8], "each weight draws its own values");
        assert_eq!(layer_recipe("tensorwise"), Some(Scaling::Tensor));
        assert_eq!(layer_recipe("rowwise"), Some(Scaling::Row));
        assert_eq!(layer_recipe("block"), None);
    }
}
