//! Greedy generation with a LLaMA-family checkpoint through gemmbridge's candle operations.
//!
//! ```text
//! cargo run --release -p gemmbridge-candle --example llama -- MODEL_DIR --tokens 1,450,4996 --steps 32
//! cargo run --release -p gemmbridge-candle --features cuda,tokenizers --example llama -- \
//!     MODEL_DIR --gpu --dtype bf16 --prompt "The capital of France is" --prompt "Rust is"
//! ```
//!
//! MODEL_DIR holds a Hugging Face checkpoint: `config.json` and `*.safetensors` (LLaMA 2/3,
//! TinyLlama, Mistral-style grouped-query attention), and `tokenizer.json` for `--prompt`
//! (with the `tokenizers` feature). Each prompt is prefilled, then decoded greedily; the new
//! tokens (and their text, with a tokenizer) are printed with the tokens per second.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use clap::Parser;
use gemmbridge_candle::llama::{generate, Llama, LlamaConfig};

#[derive(Parser)]
#[command(about = "Greedy generation with a LLaMA-family checkpoint through gemmbridge's candle operations")]
struct Args {
    /// The checkpoint's folder: config.json, *.safetensors (and tokenizer.json for --prompt).
    model: PathBuf,
    /// A prompt as text (needs the `tokenizers` feature and the folder's tokenizer.json);
    /// repeat for a batch.
    #[arg(long)]
    prompt: Vec<String>,
    /// A prompt as comma-separated token ids; repeat for a batch.
    #[arg(long)]
    tokens: Vec<String>,
    /// New tokens per prompt.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Run on CUDA device 0 (needs the `cuda` feature).
    #[arg(long)]
    gpu: bool,
}

/// The prompts as token ids: `--tokens` as given, `--prompt` through the tokenizer.
fn prompts(args: &Args) -> anyhow::Result<Vec<Vec<u32>>> {
    let mut out = Vec::new();
    for t in &args.tokens {
        out.push(t.split(',').map(|v| v.trim().parse::<u32>()).collect::<Result<Vec<_>, _>>()?);
    }
    if !args.prompt.is_empty() {
        out.extend(tokenize(args)?);
    }
    anyhow::ensure!(!out.is_empty(), "give at least one --prompt or --tokens");
    Ok(out)
}

#[cfg(feature = "tokenizers")]
fn tokenize(args: &Args) -> anyhow::Result<Vec<Vec<u32>>> {
    let tok = tokenizers::Tokenizer::from_file(args.model.join("tokenizer.json")).map_err(anyhow::Error::msg)?;
    args.prompt
        .iter()
        .map(|p| Ok(tok.encode(p.as_str(), true).map_err(anyhow::Error::msg)?.get_ids().to_vec()))
        .collect()
}

#[cfg(not(feature = "tokenizers"))]
fn tokenize(_: &Args) -> anyhow::Result<Vec<Vec<u32>>> {
    anyhow::bail!("--prompt needs the `tokenizers` feature; give --tokens instead")
}

#[cfg(feature = "tokenizers")]
fn text(args: &Args, ids: &[u32]) -> Option<String> {
    let tok = tokenizers::Tokenizer::from_file(args.model.join("tokenizer.json")).ok()?;
    tok.decode(ids, true).ok()
}

#[cfg(not(feature = "tokenizers"))]
fn text(_: &Args, _: &[u32]) -> Option<String> {
    None
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dtype = match args.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => anyhow::bail!("unknown dtype {other:?}; choose f32, f16 or bf16"),
    };
    let dev = if args.gpu { Device::new_cuda(0)? } else { Device::Cpu };
    let prompts = prompts(&args)?;
    let cfg = LlamaConfig::from_file(&args.model.join("config.json"))?;
    let t0 = Instant::now();
    let model = Llama::from_folder(&args.model, &cfg, dtype, &dev)?;
    eprintln!("loaded {} layers in {:.1} s", cfg.num_hidden_layers, t0.elapsed().as_secs_f64());
    let bar = indicatif::ProgressBar::new((prompts.len() * args.steps) as u64);
    bar.set_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} tokens, {per_sec}")?);
    let t1 = Instant::now();
    let outs = generate(&model, &prompts, args.steps, |n| bar.set_position(n as u64))?;
    bar.finish_and_clear();
    let secs = t1.elapsed().as_secs_f64();
    for (p, out) in prompts.iter().zip(&outs) {
        println!("prompt {p:?}\n  → {out:?}");
        if let Some(t) = text(&args, out) {
            println!("  → {t:?}");
        }
    }
    let made = outs.iter().map(Vec::len).sum::<usize>();
    println!("{made} tokens in {secs:.2} s: {:.1} tokens/s (prefill included)", made as f64 / secs);
    Ok(())
}
