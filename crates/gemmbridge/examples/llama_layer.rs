//! One LLaMA-style decoder layer (RMSNorm, fused QKV, RoPE, causal GQA attention, O projection
//! and residual, RMSNorm, SwiGLU MLP and residual), forward and backward, at a small size: on
//! the CPU backend, and with `--gpu` on the GPU too, each printed as the relative error of its
//! output and of every gradient against the float64 layer on the same (rounded) inputs.
//!
//! ```text
//! cargo run --release -p gemmbridge --example llama_layer [-- --gpu] [--fp8 tensor|row] [--seed N]
//! ```
//!
//! The layer: d 256, 4 query heads over 2 key/value heads of 64, ffn 688, bf16, 2 sequences of
//! 33 tokens; weights of a trained layer's scale (norms near 1, projections ~1/√in). `--fp8`
//! runs the four forward projections with FP8 E4M3 operands (the recipe named, for both);
//! their error against the unquantised float64 layer is then FP8's, a few percent.

use clap::Parser;
use gemmbridge::fp8::Scaling;
use gemmbridge::half::bf16;
use gemmbridge::layer::cpu::CpuDecoderLayer;
use gemmbridge::layer::reference::{backward, forward, Grads, Weights};
use gemmbridge::layer::{DecoderLayer, LayerOptions, LayerWeight, Tokens};
use gemmbridge::reference::rel_error;
use gemmbridge::DType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

#[derive(Parser)]
#[command(about = "A LLaMA-style decoder layer on the CPU (and the GPU) against its float64 definition")]
struct Args {
    /// Also run the layer on GPU 0.
    #[arg(long)]
    gpu: bool,
    /// FP8 forward projections with this recipe: tensor or row.
    #[arg(long, value_parser = ["tensor", "row"])]
    fp8: Option<String>,
    /// The inputs' seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// y, dx and every weight gradient against the float64 layer's.
fn report(side: &str, y: &[f64], got: &Grads, (want_y, want): (&[f64], &Grads)) {
    println!("{side}:");
    println!("  y           {:.2e}", rel_error(y, want_y));
    println!("  dx          {:.2e}", rel_error(&got.dx, &want.dx));
    for w in LayerWeight::ALL {
        println!("  d_{:<10}{:.2e}", w.name(), rel_error(got.dw.get(w), want.dw.get(w)));
    }
}

/// The layer on the GPU: its output and gradients.
fn on_gpu(
    (l, t): (DecoderLayer, Tokens),
    w: &Weights,
    (x, dy): (&[bf16], &[bf16]),
    options: LayerOptions,
) -> Result<(Vec<f64>, Grads), Box<dyn std::error::Error>> {
    use gemmbridge::cuda::layer::{to_host, GpuDecoderLayer};
    let gpu = gemmbridge::cuda::Gpu::new(0)?;
    let mut layer = GpuDecoderLayer::<bf16>::with_options(&gpu, (l, t), w, options)?;
    println!("GPU: {} (the norms' weight gradients in {:?})", gpu.info()?.name, layer.norm_grad_type());
    let s = gpu.stream();
    let (dx_in, ddy) = (s.clone_htod(x)?, s.clone_htod(dy)?);
    layer.forward(&gpu, &dx_in, true)?;
    layer.backward(&gpu, &dx_in, &ddy)?;
    let y = to_host(&gpu, layer.output())?;
    Ok((y, Grads { dx: to_host(&gpu, layer.input_grad())?, dw: layer.grads_to_host(&gpu)? }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (l, t) = (DecoderLayer::new(256, (4, 2), 64, 688, DType::BF16), Tokens { b: 2, s: 33 });
    let fp8_forward = args.fp8.as_deref().map(|r| if r == "row" { Scaling::Row } else { Scaling::Tensor });
    let options = LayerOptions { fp8_forward };
    println!("layer: {}, b {} s {}, FP8 forward {:?}, seed {}", l.describe(), t.b, t.s, fp8_forward, args.seed);
    let mut r = StdRng::seed_from_u64(args.seed);
    let w = Weights::from_fn(&l, |which, _| {
        let [_, cols] = l.weight_shape(which);
        let v: f64 = r.sample(StandardNormal);
        let v = match which {
            LayerWeight::Norm1 | LayerWeight::Norm2 => 1.0 + 0.1 * v,
            _ => v / (cols as f64).sqrt(),
        };
        bf16::from_f64(v).to_f64() // the float64 layer starts from the stored values
    })?;
    let n = t.count() * l.d_model;
    let mut normal = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f64(r.sample(StandardNormal))).collect() };
    let (x, dy) = (normal(n), normal(n));
    let wide = |v: &[bf16]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
    let saved = forward(&l, t, &w, &wide(&x))?;
    let want = backward(&l, t, &w, &wide(&x), &saved, &wide(&dy))?;
    let mut cpu = CpuDecoderLayer::<bf16>::with_options((l, t), &w, options)?;
    cpu.forward(&x, true)?;
    cpu.backward(&x, &dy)?;
    let got = Grads { dx: wide(cpu.input_grad()), dw: cpu.grads() };
    report("CPU backend", &wide(cpu.output()), &got, (&saved.y, &want));
    if args.gpu {
        match on_gpu((l, t), &w, (&x, &dy), options) {
            Ok((y, g)) => report("GPU", &y, &g, (&saved.y, &want)),
            Err(e) => {
                eprintln!("GPU: {e}");
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
