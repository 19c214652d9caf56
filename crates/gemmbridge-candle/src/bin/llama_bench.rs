//! `gemmbridge-candle-llama`: a LLaMA-family model at LLaMA-3-8B's configuration (random bf16
//! weights, or fewer layers with `--layers`) on one GPU, timed as the adapter's model
//! (`gemmbridge_candle::llama`: prefill of a batch, batched decode on a paged cache) or as
//! candle-transformers' `Llama` on candle's own operations (`--impl candle`), on the same
//! weights. One side per process: run the two alternately for the project's protocol. An
//! `"op": "env"` line (the device, the side, the sampling), then one JSON line per row (the
//! fields of `gemmbridge bench`'s rows, so `gemmbridge compare` pairs them), on stdout and in
//! `--out`.
//!
//! Rows (layout `llama3-8b`, dtype bf16, k = 4096):
//! - `llama_prefill`: `b` prompts of `s` random tokens, one forward on an empty cache and the
//!   argmax of each prompt's last logits read to the host; m = b·s tokens, n = s;
//!   `tflops` from 2·(parameters past the embedding)·tokens.
//! - `llama_decode`: every sequence holding `context − 1` positions (filled by untimed
//!   prefills: the adapter's in groups of [`PREFILL_TOKENS`], candle-transformers' in chunks
//!   whose f32 scores stay under 4 GB — its cache grows by concatenation, so filling a long
//!   context for a large batch copies the cache once per chunk: minutes at 64 × 4096), then
//!   greedy steps of one token per sequence, each step's
//!   argmax read to the host (as a generation loop does); m = b, n = context; `tbps` from the
//!   bytes a step must read (the weights past the embedding and every sequence's keys and
//!   values).
//!
//! `median_ms` is the median over `--reps` samples of `--steps` back-to-back calls (a call: one
//! prefill, or one decode step), `min_ms` the fastest sample; `tokens_per_s` = m / median.
//! `--gap-ms` leaves the GPU idle before each row's warm-up.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::llama as theirs;
use clap::Parser;
use gemmbridge_candle::llama::{Llama, LlamaConfig, PREFILL_TOKENS};

/// LLaMA-3-8B's `config.json` (Meta-Llama-3-8B).
const LLAMA3_8B: &str = r#"{
  "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001
}"#;

#[derive(Parser)]
#[command(
    name = "gemmbridge-candle-llama",
    about = "A LLaMA-3-8B-sized model's prefill and decode under candle, timed"
)]
struct Args {
    /// which model runs: ours (the adapter's) or candle (candle-transformers' on candle's ops)
    #[arg(long = "impl", default_value = "ours", value_parser = ["ours", "candle"])]
    side: String,
    /// rows: decode, prefill
    #[arg(long, value_delimiter = ',', default_value = "prefill,decode")]
    ops: Vec<String>,
    /// prefill shapes, BxS
    #[arg(long, value_delimiter = ',', default_value = "1x2048,8x512")]
    prefill: Vec<String>,
    /// decode batch sizes
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    batch_sizes: Vec<usize>,
    /// decode contexts (positions each sequence holds after the step)
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    contexts: Vec<usize>,
    /// decoder layers (LLaMA-3-8B has 32)
    #[arg(long, default_value_t = 32)]
    layers: usize,
    /// calls per sample
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// timed samples per row
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// idle GPU time before each row's warm-up, ms
    #[arg(long, default_value_t = 0.0)]
    gap_ms: f64,
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// also write the rows here (JSONL)
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One model, either side.
enum Model {
    Ours(Llama),
    Theirs(theirs::Llama, theirs::Config),
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.steps == 0 || a.reps == 0 || a.layers == 0 || !(0.0..=60_000.0).contains(&a.gap_ms) {
        candle_core::bail!("--steps, --reps and --layers must be at least 1, --gap-ms within 0..=60000");
    }
    let prefill = a.prefill.iter().map(|s| parse_bxs(s)).collect::<Result<Vec<_>>>()?;
    let dev = Device::new_cuda(a.device)?;
    let config = LLAMA3_8B.replace("\"num_hidden_layers\": 32", &format!("\"num_hidden_layers\": {}", a.layers));
    let cfg: LlamaConfig = serde_json::from_str(&config).map_err(candle_core::Error::wrap)?;
    let model = load(&a.side, &config, &cfg, &dev)?;
    let mut out = match &a.out {
        Some(p) => {
            Some(std::fs::File::create(p).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", p.display())))?)
        }
        None => None,
    };
    let mut emit = |row: serde_json::Value| -> Result<()> {
        println!("{row}");
        if let Some(f) = out.as_mut() {
            writeln!(f, "{row}").map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    };
    // the run's first line, as `gemmbridge compare` reads it (it refuses runs of other devices
    // or other gaps)
    let device = dev.as_cuda_device()?.cuda_stream().context().name().map_err(candle_core::Error::wrap)?;
    let backend = if a.side == "ours" { "gemmbridge-candle" } else { "candle-transformers" };
    emit(serde_json::json!({"op": "env", "backend": backend, "device": device, "candle": "0.11",
        "cudnn": gemmbridge::cuda::cudnn_version(), "layers": a.layers, "steps": a.steps, "reps": a.reps,
        "heat_ms": 0.0, "gap_ms": a.gap_ms}))?;
    let params = layer_params(&cfg) * cfg.num_hidden_layers as f64 + (cfg.vocab_size * cfg.hidden_size) as f64;
    if a.ops.iter().any(|o| o == "prefill") {
        for &(b, s) in &prefill {
            gap(&dev, a.gap_ms)?;
            let (med, min) = time_prefill(&model, (b, s), (a.steps, a.reps), &dev)?;
            let tokens = (b * s) as f64;
            let tflops = 2.0 * params * tokens / (med * 1e-3) / 1e12;
            emit(row("llama_prefill", (b * s, s, b), (med, min), serde_json::json!({"tflops": tflops})))?;
        }
    }
    if a.ops.iter().any(|o| o == "decode") {
        for &c in &a.contexts {
            for &b in &a.batch_sizes {
                gap(&dev, a.gap_ms)?;
                let (med, min) = time_decode(&model, &cfg, (b, c), (a.steps, a.reps), &dev)?;
                let kv = 2.0 * (cfg.num_hidden_layers * b * c * cfg.kv_heads() * cfg.head_dim()) as f64;
                let tbps = (params + kv) * 2.0 / (med * 1e-3) / 1e12;
                emit(row("llama_decode", (b, c, b), (med, min), serde_json::json!({"tflops": 0.0, "tbps": tbps})))?;
            }
        }
    }
    Ok(())
}

/// A row in `gemmbridge bench`'s fields plus `impl` and `tokens_per_s`.
fn row(
    op: &str,
    (m, n, b): (usize, usize, usize),
    (med, min): (f64, f64),
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut r = serde_json::json!({
        "op": op, "dtype": "bf16", "m": m, "n": n, "k": 4096, "batch": b,
        "median_ms": med, "min_ms": min, "layout": "llama3-8b",
        "tokens_per_s": m as f64 / (med * 1e-3),
    });
    if let (Some(r), Some(e)) = (r.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    r
}

/// "BxS" as (b, s).
fn parse_bxs(s: &str) -> Result<(usize, usize)> {
    let bad = || candle_core::Error::Msg(format!("--prefill {s:?}: expected BxS, e.g. 8x512"));
    let (b, t) = s.split_once('x').ok_or_else(bad)?;
    let (b, t) = (b.parse::<usize>().map_err(|_| bad())?, t.parse::<usize>().map_err(|_| bad())?);
    if b == 0 || t == 0 {
        return Err(bad());
    }
    Ok((b, t))
}

/// Parameters of one decoder layer (projections and norms).
fn layer_params(c: &LlamaConfig) -> f64 {
    let (h, i, q, kv) = (c.hidden_size, c.intermediate_size, c.hidden_size, c.kv_heads() * c.head_dim());
    (h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h) as f64
}

/// The GPU drained and left idle for `ms`.
fn gap(dev: &Device, ms: f64) -> Result<()> {
    dev.synchronize()?;
    std::thread::sleep(Duration::from_secs_f64(ms / 1e3));
    Ok(())
}

/// Random bf16 weights of the checkpoint's names (uniform, scale √(3/fan-in); norms 1), made on
/// the GPU, and the model of `side` loaded from them.
fn load(side: &str, config: &str, cfg: &LlamaConfig, dev: &Device) -> Result<Model> {
    let (h, i, v, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim());
    let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
    let rand = |dims: (usize, usize)| -> Result<Tensor> {
        let s = (3.0 / dims.1 as f64).sqrt();
        Tensor::rand(-s as f32, s as f32, dims, dev)?.to_dtype(DType::BF16)
    };
    let mut m: HashMap<String, Tensor> = HashMap::new();
    m.insert("model.embed_tokens.weight".into(), rand((v, h))?);
    m.insert("lm_head.weight".into(), rand((v, h))?);
    m.insert("model.norm.weight".into(), Tensor::ones(h, DType::BF16, dev)?);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        for (name, dims) in [
            ("self_attn.q_proj.weight", (q, h)),
            ("self_attn.k_proj.weight", (kv, h)),
            ("self_attn.v_proj.weight", (kv, h)),
            ("self_attn.o_proj.weight", (h, q)),
            ("mlp.gate_proj.weight", (i, h)),
            ("mlp.up_proj.weight", (i, h)),
            ("mlp.down_proj.weight", (h, i)),
        ] {
            m.insert(p.clone() + name, rand(dims)?);
        }
        m.insert(p.clone() + "input_layernorm.weight", Tensor::ones(h, DType::BF16, dev)?);
        m.insert(p + "post_attention_layernorm.weight", Tensor::ones(h, DType::BF16, dev)?);
    }
    let vb = VarBuilder::from_tensors(m, DType::BF16, dev);
    if side == "ours" {
        return Ok(Model::Ours(Llama::load(vb, cfg)?));
    }
    let tc: theirs::LlamaConfig = serde_json::from_str(config).map_err(candle_core::Error::wrap)?;
    let tc = tc.into_config(false);
    Ok(Model::Theirs(theirs::Llama::load(vb, &tc)?, tc))
}

/// Random token ids `[b, s]` (below 32 000).
fn random_tokens(b: usize, s: usize, seed: usize) -> Vec<Vec<u32>> {
    (0..b).map(|n| (0..s).map(|t| ((n * 7919 + t * 104_729 + seed * 31) % 32_000) as u32 + 1).collect()).collect()
}

/// The median and the minimum, ms per call, of `reps` samples of `steps` calls of `f` (each
/// sample's calls back to back, the device synchronised around it).
fn samples(dev: &Device, (steps, reps): (usize, usize), mut f: impl FnMut(usize) -> Result<()>) -> Result<(f64, f64)> {
    f(0)?;
    dev.synchronize()?;
    let mut t = Vec::with_capacity(reps);
    for r in 0..reps {
        dev.synchronize()?;
        let start = Instant::now();
        for i in 0..steps {
            f(1 + r * steps + i)?;
        }
        dev.synchronize()?;
        t.push(start.elapsed().as_secs_f64() * 1e3 / steps as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok((t[t.len() / 2], t[0]))
}

/// One prefill of `b` prompts of `s` tokens on a fresh cache per call.
fn time_prefill(model: &Model, (b, s): (usize, usize), sr: (usize, usize), dev: &Device) -> Result<(f64, f64)> {
    let prompts = random_tokens(b, s, 1);
    match model {
        Model::Ours(m) => samples(dev, sr, |_| {
            let mut cache = m.paged_cache(b * s.next_multiple_of(gemmbridge_candle::llama::PAGE_SIZE))?;
            let ids: Vec<usize> = (0..b).map(|_| cache.add_sequence()).collect();
            let p: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            m.prefill(&p, &ids, &mut cache)?.argmax(D::Minus1)?.to_vec1::<u32>().map(|_| ())
        }),
        Model::Theirs(m, tc) => {
            let flat: Vec<u32> = prompts.concat();
            let tokens = Tensor::from_vec(flat, (b, s), dev)?;
            samples(dev, sr, |_| {
                let mut cache = theirs::Cache::new(true, DType::BF16, tc, dev)?;
                m.forward(&tokens, 0, &mut cache)?.argmax(D::Minus1)?.to_vec1::<u32>().map(|_| ())
            })
        }
    }
}

/// Greedy decode steps of `b` sequences from `context − 1` held positions.
fn time_decode(
    model: &Model,
    cfg: &LlamaConfig,
    (b, context): (usize, usize),
    sr: (usize, usize),
    dev: &Device,
) -> Result<(f64, f64)> {
    let held = context - 1;
    let extra = 1 + sr.0 * sr.1 + 1;
    let prompts = random_tokens(b, held, 2);
    match model {
        Model::Ours(m) => {
            let mut cache = m.paged_cache(b * (held + extra).next_multiple_of(gemmbridge_candle::llama::PAGE_SIZE))?;
            let ids: Vec<usize> = (0..b).map(|_| cache.add_sequence()).collect();
            let per = (PREFILL_TOKENS / held).max(1);
            for (g, chunk) in prompts.chunks(per).enumerate() {
                let p: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
                m.prefill(&p, &ids[g * per..g * per + chunk.len()], &mut cache)?;
            }
            let mut next = vec![1u32; b];
            samples(dev, sr, |_| {
                next = m.decode(&next, &ids, &mut cache)?.argmax(D::Minus1)?.to_vec1::<u32>()?;
                Ok(())
            })
        }
        Model::Theirs(m, tc) => {
            let mut cache = theirs::Cache::new(true, DType::BF16, tc, dev)?;
            // chunks whose f32 scores [b, h_q, chunk, context] stay under 4 GB
            let chunk = (4e9 / (4.0 * (b * cfg.num_attention_heads * context) as f64)) as usize;
            let chunk = chunk.clamp(1, 2048);
            let mut pos = 0;
            while pos < held {
                let n = chunk.min(held - pos);
                let part: Vec<u32> = prompts.iter().flat_map(|p| p[pos..pos + n].iter().copied()).collect();
                m.forward(&Tensor::from_vec(part, (b, n), dev)?, pos, &mut cache)?;
                pos += n;
            }
            let mut next = Tensor::ones((b, 1), DType::U32, dev)?;
            samples(dev, sr, |_| {
                let ids = m.forward(&next, pos, &mut cache)?.argmax(D::Minus1)?.to_vec1::<u32>()?;
                pos += 1;
                next = Tensor::from_vec(ids, (b, 1), dev)?;
                Ok(())
            })
        }
    }
}
