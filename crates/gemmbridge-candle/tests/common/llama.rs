//! The LLaMA model against candle-transformers' `llama` on one tiny random checkpoint: what
//! the CPU tests (`llama_oracle.rs`) and the GPU tests (`gpu.rs`) share.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Result, Tensor, D};
use candle_transformers::models::llama as oracle;
use gemmbridge_candle::llama::{Cache, Llama, LlamaConfig};
use rand::rngs::StdRng;
use rand::Rng;

use crate::common;

pub const CONFIG: &str = r#"{
  "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": 2
}"#;

/// A fresh folder under the target directory's temporary space.
pub fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gemmbridge-llama-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The checkpoint's tensors, f32: weights of scale 1/√fan-in (activations stay of order 1),
/// norms near 1.
pub fn tensors(rng: &mut StdRng, cfg: &LlamaConfig) -> Result<HashMap<String, Tensor>> {
    let dev = Device::Cpu;
    let mut rand = |dims: (usize, usize), scale: f32| -> Result<Tensor> {
        let v: Vec<f32> = (0..dims.0 * dims.1).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect();
        Tensor::from_vec(v, dims, &dev)
    };
    let (h, i, v, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim());
    let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
    let s = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
    let mut m = HashMap::new();
    m.insert("model.embed_tokens.weight".into(), rand((v, h), 1.7)?);
    m.insert("lm_head.weight".into(), rand((v, h), s(h))?);
    m.insert("model.norm.weight".into(), (rand((1, h), 0.2)?.squeeze(0)? + 1.0)?);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        for (name, dims, fan) in [
            ("self_attn.q_proj.weight", (q, h), h),
            ("self_attn.k_proj.weight", (kv, h), h),
            ("self_attn.v_proj.weight", (kv, h), h),
            ("self_attn.o_proj.weight", (h, q), q),
            ("mlp.gate_proj.weight", (i, h), h),
            ("mlp.up_proj.weight", (i, h), h),
            ("mlp.down_proj.weight", (h, i), i),
        ] {
            m.insert(p.clone() + name, rand(dims, s(fan))?);
        }
        m.insert(p.clone() + "input_layernorm.weight", (rand((1, h), 0.2)?.squeeze(0)? + 1.0)?);
        m.insert(p + "post_attention_layernorm.weight", (rand((1, h), 0.2)?.squeeze(0)? + 1.0)?);
    }
    Ok(m)
}

/// Writes `config.json` (`config`) and `model.safetensors` (`t`) into `dir`.
pub fn write(dir: &Path, config: &str, t: &HashMap<String, Tensor>) -> Result<()> {
    std::fs::write(dir.join("config.json"), config).unwrap();
    candle_core::safetensors::save(t, dir.join("model.safetensors"))
}

/// candle-transformers' model and cache on the same folder.
fn reference(dir: &Path, dtype: DType, dev: &Device) -> Result<(oracle::Llama, oracle::Cache)> {
    let cfg: oracle::LlamaConfig = serde_json::from_str(CONFIG).unwrap();
    let cfg = cfg.into_config(false);
    // SAFETY: the file is not changed while the model lives
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], dtype, dev)? };
    Ok((oracle::Llama::load(vb, &cfg)?, oracle::Cache::new(true, dtype, &cfg, dev)?))
}

/// The relative error of `got` against `want` (both `[1, vocab]` f32).
fn rel(got: &Tensor, want: &Tensor) -> Result<f64> {
    Ok(common::rel_err(&common::f64s(got)?, &common::f64s(want)?))
}

/// The reference's top-2 margin over its largest magnitude, and its top token.
fn margin(want: &Tensor) -> Result<(f64, u32)> {
    let mut v = common::f64s(want)?;
    let top = want.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
    v.sort_by(|a, b| b.total_cmp(a));
    Ok(((v[0] - v[1]) / v[0].abs().max(1.0), top))
}

/// Prefill and 16 decode steps of both models on `dev`, every step's logits within `band`.
pub fn run(dev: &Device, dtype: DType, band: f64) -> Result<()> {
    let mut rng = common::rng(&format!("llama {dtype:?}"));
    let dir = folder(&format!("{dtype:?}-{}", dev.is_cuda()));
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let cfg = LlamaConfig::from_file(&dir.join("config.json"))?;
    write(&dir, CONFIG, &tensors(&mut rng, &cfg)?)?;
    let ours = Llama::from_folder(&dir, &cfg, dtype, dev)?;
    let (theirs, mut their_cache) = reference(&dir, dtype, dev)?;
    let mut cache = Cache::new(&ours);
    let prompt: Vec<u32> = (0..11).map(|_| rng.random_range(3..1000)).collect();
    let mut tokens = Tensor::new(prompt.as_slice(), dev)?.unsqueeze(0)?;
    let (mut pos, mut agreed) = (0, 0);
    for step in 0..17 {
        let got = ours.forward(&tokens, &mut cache)?;
        let want = theirs.forward(&tokens, pos, &mut their_cache)?;
        pos += tokens.dim(1)?;
        let e = rel(&got, &want)?;
        let (m, top) = margin(&want)?;
        let mine = got.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
        println!("step {step}: logits {e:.2e}, reference top {top} (margin {m:.2e}), ours {mine}");
        assert!(e <= band, "step {step} ({dtype:?}): logits {e:e} above {band:e}");
        if m > band {
            assert_eq!(mine, top, "step {step} ({dtype:?}): margin {m:e} above the band, tokens differ");
            agreed += 1;
        }
        tokens = Tensor::new(&[top], dev)?.unsqueeze(0)?;
    }
    assert!(agreed >= 8, "only {agreed} of 17 steps had a margin above the band");
    assert_eq!(cache.len(), 11 + 16);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A batch of prompts of different lengths prefilled together on a paged cache and
/// decoded together for 16 steps, each sequence against candle-transformers run on that prompt
/// alone (batch 1, its own cache): every sequence's logits within `band` at every step, the
/// reference's token wherever its top-2 margin exceeds the band; each sequence fed the
/// reference's token.
pub fn run_batched(dev: &Device, dtype: DType, band: f64) -> Result<()> {
    let mut rng = common::rng(&format!("llama batched {dtype:?}"));
    let dir = folder(&format!("batched-{dtype:?}-{}", dev.is_cuda()));
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let cfg = LlamaConfig::from_file(&dir.join("config.json"))?;
    write(&dir, CONFIG, &tensors(&mut rng, &cfg)?)?;
    let ours = Llama::from_folder(&dir, &cfg, dtype, dev)?;
    let prompts: Vec<Vec<u32>> =
        [11usize, 3, 17].iter().map(|&n| (0..n).map(|_| rng.random_range(3..1000)).collect()).collect();
    // room for the prompts, 16 steps, and a page each to spare
    let mut cache = ours.paged_cache(3 * 64)?;
    let ids: Vec<usize> = prompts.iter().map(|_| cache.add_sequence()).collect();
    let mut refs = Vec::new();
    for _ in &prompts {
        refs.push(reference(&dir, dtype, dev)?);
    }
    let slices: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut got = ours.prefill(&slices, &ids, &mut cache)?;
    let mut inputs: Vec<Tensor> =
        prompts.iter().map(|p| Tensor::new(p.as_slice(), dev)?.unsqueeze(0)).collect::<Result<_>>()?;
    let mut pos = vec![0usize; prompts.len()];
    let (mut agreed, mut checked) = (0, 0);
    for step in 0..17 {
        let mut next = Vec::new();
        for (n, (theirs, their_cache)) in refs.iter_mut().enumerate() {
            let want = theirs.forward(&inputs[n], pos[n], their_cache)?;
            pos[n] += inputs[n].dim(1)?;
            let mine = got.narrow(0, n, 1)?;
            let e = rel(&mine, &want)?;
            let (m, top) = margin(&want)?;
            let arg = mine.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
            println!("step {step} seq {n}: logits {e:.2e}, reference top {top} (margin {m:.2e}), ours {arg}");
            assert!(e <= band, "step {step} seq {n} ({dtype:?}): logits {e:e} above {band:e}");
            if m > band {
                assert_eq!(arg, top, "step {step} seq {n} ({dtype:?}): margin {m:e} above the band, tokens differ");
                agreed += 1;
            }
            checked += 1;
            next.push(top);
            inputs[n] = Tensor::new(&[top], dev)?.unsqueeze(0)?;
        }
        if step < 16 {
            got = ours.decode(&next, &ids, &mut cache)?;
        }
    }
    assert!(agreed >= checked / 2, "only {agreed} of {checked} steps had a margin above the band");
    for (n, &id) in ids.iter().enumerate() {
        assert_eq!(cache.len(id)?, prompts[n].len() + 16);
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
