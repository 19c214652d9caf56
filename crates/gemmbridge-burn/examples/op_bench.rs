//! Times gemmbridge-burn's layer operations on burn's CUDA backend under `Autodiff`, forward
//! and forward with backward, at a LLaMA-3-8B layer's and ResNet-50's sizes: with the adapter
//! on (`--impl ours`) or off (`--impl burn`: `set_enabled(false)`, every call runs burn's own
//! operations, the same path as on a backend the adapter does not serve). One side per
//! process: run the two alternately, then `gemmbridge compare --ours OURS --peer BURN`.
//!
//! Operations (`--ops`, bf16 or f16):
//! - `attention`: causal, 2 × 2048 tokens, 32 query heads over 8 key/value heads of 128;
//! - `rms_norm`: 4096 rows of 4096; `swiglu`: 4096 rows of 2 × 14 336;
//! - `rope`: rotate-half over `[2, 32, 2048, 128]`;
//! - `conv2d`: 3×3, padding 1, bias and ReLU, 32 images of 64 channels at 56² (ResNet-50's
//!   first stage) and of 256 at 14² (its third);
//! - `grouped_matmul`: 8192 rows over 8 experts (1024 each), `[8, 2048, 2048]` weights.
//!
//! Output: an `"op": "env"` line, then per operation two rows in `gemmbridge bench`'s fields
//! (stdout, and `--out`): `op` `<name>_fwd` and `<name>_fwd_bwd` (the backward of
//! `Σ y∘dy` through burn's autodiff), `layout` the sizes, `median_ms` per call (the median
//! over `--reps` samples of `--steps` calls, the device synchronised at the end of each),
//! `min_ms`, `tflops` where the operation's multiply-adds are counted (attention, conv2d,
//! grouped_matmul; 0 for the memory-bound ones). `--cpu`: burn's NdArray backend at small sizes
//! in f32, a check of the harness.
//!
//! ```text
//! cargo run --release -p gemmbridge-burn --example op_bench -- --impl ours --out ours.jsonl
//! cargo run --release -p gemmbridge-burn --example op_bench -- --impl burn --out burn.jsonl
//! ```

mod common;

use std::any::Any;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, FloatDType, Tensor};
use clap::Parser;
use common::bench::{median_min, Lines, Sampling, SamplingArgs};
use gemmbridge_burn::{AttentionOps, AttnMask, ConvActivation, ConvOps, GroupedOps, LayerOps, RopeStyle};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Times gemmbridge-burn's layer operations against burn's own", allow_negative_numbers = true)]
struct Args {
    /// ours (the adapter on) or burn (the adapter off: burn's own operations).
    #[arg(long = "impl", value_parser = ["ours", "burn"])]
    side: String,
    /// Operations, comma-separated: attention, rms_norm, swiglu, rope, conv2d, grouped_matmul.
    #[arg(long, value_delimiter = ',', default_value = "attention,rms_norm,swiglu,rope,conv2d,grouped_matmul")]
    ops: Vec<String>,
    /// bf16 or f16 [default: bf16; f32, the only one, with --cpu].
    #[arg(long, value_parser = ["bf16", "f16", "f32"])]
    dtype: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// The operations `--ops` may name.
const OPS: [&str; 6] = ["attention", "rms_norm", "swiglu", "rope", "conv2d", "grouped_matmul"];

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let s = a.sampling.sampling()?;
    let cpu = a.sampling.cpu;
    if let Some(bad) = a.ops.iter().find(|o| !OPS.contains(&o.as_str())) {
        anyhow::bail!("--ops: unknown operation {bad:?} (known: {})", OPS.join(", "));
    }
    let dtype = match (a.dtype.as_deref(), cpu) {
        (Some("f32") | None, true) => FloatDType::F32,
        (Some(d), true) => anyhow::bail!("--cpu runs f32 only (NdArray has no {d}): drop --dtype"),
        (Some("f32"), false) => {
            anyhow::bail!("--dtype f32: the adapter's attention serves bf16 and f16; use --cpu for f32")
        }
        (Some("f16"), false) => FloatDType::F16,
        _ => FloatDType::BF16,
    };
    let device = a.sampling.device()?;
    gemmbridge_burn::set_enabled(a.side == "ours");
    let mut lines = Lines::create(a.sampling.out.as_deref())?;
    let backend = if a.side == "ours" { "gemmbridge-burn" } else { "burn" };
    lines.emit(a.sampling.env_line(backend, &device, json!({})))?;
    let rows = if cpu {
        rows::<Autodiff<NdArray<f32>>>(&a.ops, dtype, true, &s, &Default::default())?
    } else {
        rows::<Autodiff<burn::backend::Cuda>>(&a.ops, dtype, false, &s, &Default::default())?
    };
    rows.into_iter().try_for_each(|r| lines.emit(r))
}

/// What one call made (its output, or every gradient), held until the device is synchronised
/// so that nothing it launched is left unexecuted (burn's fusion skips what nothing reads).
type Made = Box<dyn Any>;

/// One operation at one size: its row's key, its forward's multiply-adds ×2 (0: not
/// counted), and one call (forward only, or forward and backward).
struct Case {
    name: &'static str,
    layout: String,
    mnkb: [usize; 4],
    flops: f64,
    call: Box<dyn Fn(bool) -> Made>,
}

/// Every row of `ops`, timed.
fn rows<B>(
    ops: &[String],
    dtype: FloatDType,
    small: bool,
    s: &Sampling,
    dev: &B::Device,
) -> anyhow::Result<Vec<serde_json::Value>>
where
    B: AutodiffBackend + LayerOps + AttentionOps + ConvOps + GroupedOps,
{
    let dt = match dtype {
        FloatDType::BF16 => "bf16",
        FloatDType::F16 => "f16",
        _ => "f32",
    };
    let mut rows = Vec::new();
    for op in ops {
        for case in cases::<B>(op, dtype, small, dev) {
            for backward in [false, true] {
                let (med, min) = time::<B>(&case, backward, s, dev)?;
                // a backward costs about twice a forward (attention's 2.5 times: it recomputes P)
                let factor = match (backward, case.name) {
                    (false, _) => 1.0,
                    (true, "attention") => 3.5,
                    (true, _) => 3.0,
                };
                let flops = factor * case.flops;
                let [m, n, k, batch] = case.mnkb;
                let op = format!("{}_{}", case.name, if backward { "fwd_bwd" } else { "fwd" });
                rows.push(json!({"op": op, "dtype": dt, "m": m, "n": n, "k": k, "batch": batch, "median_ms": med,
                    "min_ms": min, "tflops": flops / (med * 1e-3) / 1e12, "layout": case.layout}));
            }
        }
    }
    Ok(rows)
}

/// `shape` values `mean + scale·N(0, 1)`, in `dtype`, tracked for gradients.
fn input<B: AutodiffBackend, const D: usize>(
    shape: [usize; D],
    (mean, scale): (f64, f64),
    dtype: FloatDType,
    dev: &B::Device,
) -> Tensor<B, D> {
    (Tensor::<B, D>::random(shape, Distribution::Normal(0.0, 1.0), dev) * scale + mean).cast(dtype).require_grad()
}

/// `y` (the forward only), or every gradient of `Σ y∘dy` (with the backward).
fn finish<B: AutodiffBackend, const D: usize>(y: Tensor<B, D>, dy: &Tensor<B, D>, backward: bool) -> Made {
    if backward {
        Box::new((y * dy.clone()).sum().backward())
    } else {
        Box::new(y)
    }
}

/// The cases of operation `op` (small sizes with `small`).
fn cases<B>(op: &str, dtype: FloatDType, small: bool, dev: &B::Device) -> Vec<Case>
where
    B: AutodiffBackend + LayerOps + AttentionOps + ConvOps + GroupedOps,
{
    let pick = |big: usize, little: usize| if small { little } else { big };
    let d = dev.clone();
    match op {
        "attention" => {
            let (b, hq, hkv, s, hd) = (pick(2, 1), pick(32, 4), pick(8, 2), pick(2048, 64), pick(128, 32));
            let (q, k, v) = (
                input::<B, 4>([b, hq, s, hd], (0.0, 1.0), dtype, &d),
                input([b, hkv, s, hd], (0.0, 1.0), dtype, &d),
                input([b, hkv, s, hd], (0.0, 1.0), dtype, &d),
            );
            let dy = input::<B, 4>([b, hq, s, hd], (0.0, 1.0), dtype, &d).detach();
            let call = Box::new(move |bw: bool| {
                let y = gemmbridge_burn::attention(q.clone(), k.clone(), v.clone(), AttnMask::Causal);
                finish(y, &dy, bw)
            });
            let flops = 2.0 * (b * hq * s * s * hd) as f64; // causal: half of 4·b·h·s²·d
            vec![Case {
                name: "attention",
                layout: format!("b{b}-h{hq}/{hkv}-s{s}-d{hd}-causal"),
                mnkb: [s, s, hd, b * hq],
                flops,
                call,
            }]
        }
        "rms_norm" | "swiglu" => {
            let (rows, f) = (pick(4096, 64), if op == "rms_norm" { pick(4096, 96) } else { pick(14336, 96) });
            let width = if op == "rms_norm" { f } else { 2 * f };
            let x = input::<B, 2>([rows, width], (0.0, 1.0), dtype, &d);
            let w = input::<B, 1>([f], (1.0, 0.1), dtype, &d);
            let dy = input::<B, 2>([rows, f], (0.0, 1.0), dtype, &d).detach();
            let name = if op == "rms_norm" { "rms_norm" } else { "swiglu" };
            let call: Box<dyn Fn(bool) -> Made> = if op == "rms_norm" {
                Box::new(move |bw| finish(gemmbridge_burn::rms_norm(x.clone(), w.clone(), 1e-5), &dy, bw))
            } else {
                Box::new(move |bw| finish(gemmbridge_burn::swiglu(x.clone()), &dy, bw))
            };
            vec![Case { name, layout: format!("rows{rows}-f{f}"), mnkb: [rows, f, 0, 1], flops: 0.0, call }]
        }
        "rope" => {
            let (b, h, t, hd) = (pick(2, 1), pick(32, 4), pick(2048, 64), pick(128, 32));
            let x = input::<B, 4>([b, h, t, hd], (0.0, 1.0), dtype, &d);
            let angles = Tensor::<B, 2>::random([t, hd / 2], Distribution::Uniform(0.0, std::f64::consts::TAU), &d);
            let (cos, sin) = (angles.clone().cos().cast(dtype), angles.sin().cast(dtype));
            let dy = input::<B, 4>([b, h, t, hd], (0.0, 1.0), dtype, &d).detach();
            let call = Box::new(move |bw: bool| {
                let y = gemmbridge_burn::rope(x.clone(), cos.clone(), sin.clone(), RopeStyle::RotateHalf);
                finish(y, &dy, bw)
            });
            vec![Case {
                name: "rope",
                layout: format!("b{b}-h{h}-t{t}-d{hd}"),
                mnkb: [t, hd, 0, b * h],
                flops: 0.0,
                call,
            }]
        }
        "conv2d" => [(64usize, 56usize), (256, 14)]
            .into_iter()
            .map(|(c, side)| {
                let (n, c, side) = (pick(32, 2), pick(c, c / 32), pick(side, 8));
                let x = input::<B, 4>([n, c, side, side], (0.0, 1.0), dtype, &d);
                let w = input::<B, 4>([c, c, 3, 3], (0.0, 1.0 / (9.0 * c as f64).sqrt()), dtype, &d);
                let bias = input::<B, 1>([c], (0.0, 0.1), dtype, &d);
                let dy = input::<B, 4>([n, c, side, side], (0.0, 1.0), dtype, &d).detach();
                let call = Box::new(move |bw: bool| {
                    let opts = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
                    let y =
                        gemmbridge_burn::conv2d(x.clone(), w.clone(), Some(bias.clone()), opts, ConvActivation::Relu);
                    finish(y, &dy, bw)
                });
                let flops = 2.0 * 9.0 * (n * c * c * side * side) as f64;
                Case {
                    name: "conv2d",
                    layout: format!("n{n}-c{c}-{side}x{side}-3x3"),
                    mnkb: [n * side * side, c, 9 * c, 1],
                    flops,
                    call,
                }
            })
            .collect(),
        _ => {
            let (e, n, k, per) = (8, pick(2048, 48), pick(2048, 40), pick(1024, 8));
            let x = input::<B, 2>([e * per, k], (0.0, 1.0), dtype, &d);
            let w = input::<B, 3>([e, n, k], (0.0, 1.0 / (k as f64).sqrt()), dtype, &d);
            let dy = input::<B, 2>([e * per, n], (0.0, 1.0), dtype, &d).detach();
            let sizes = vec![per; e];
            let call = Box::new(move |bw: bool| {
                finish(gemmbridge_burn::grouped_matmul(x.clone(), w.clone(), &sizes), &dy, bw)
            });
            let flops = 2.0 * (e * per * n * k) as f64;
            vec![Case {
                name: "grouped_matmul",
                layout: format!("e{e}x{per}-n{n}-k{k}"),
                mnkb: [e * per, n, k, e],
                flops,
                call,
            }]
        }
    }
}

/// `s.warmup` calls after `s.gap` idle, then `s.reps` samples of `s.steps` calls, each sample
/// ended by a device sync with every call's results still held: (median, fastest) ms per call.
fn time<B: AutodiffBackend>(case: &Case, backward: bool, s: &Sampling, dev: &B::Device) -> anyhow::Result<(f64, f64)> {
    let sync = || B::sync(dev).map_err(|e| anyhow::anyhow!("device sync: {e:?}"));
    std::thread::sleep(s.gap);
    for _ in 0..s.warmup {
        drop((case.call)(backward));
    }
    sync()?;
    let mut samples = Vec::with_capacity(s.reps);
    for _ in 0..s.reps {
        let t0 = Instant::now();
        let held: Vec<_> = (0..s.steps).map(|_| (case.call)(backward)).collect();
        sync()?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3 / s.steps as f64);
        drop(held);
    }
    Ok(median_min(samples))
}
