//! The LLaMA model ([`gemmbridge_candle::llama`]) against candle-transformers' `llama` on the
//! same checkpoint: a tiny random one (hidden 256, 4 layers, 8 query heads over 2 key/value
//! heads, vocabulary 1000) written as `config.json` and `model.safetensors`, read by both
//! through candle's `VarBuilder`. The prefill's logits and 16 greedy decode steps (both fed the
//! reference's token) within ‖Δ‖/‖ref‖ ≤ 2e-2 in bf16 and 1e-4 in f32 at every step, and the
//! same token wherever the reference's top-2 margin exceeds that band; checkpoints and
//! configurations that do not fit are named errors before anything runs.

mod common;
#[path = "common/llama.rs"]
mod llama_check;

use candle_core::{DType, Device, Result, Tensor};
use gemmbridge_candle::llama::{generate, Cache, Llama, LlamaConfig};
use llama_check::{folder, run, run_batched, tensors, write, CONFIG};

#[test]
fn f32_on_the_cpu_equals_candle_transformers() -> Result<()> {
    run(&Device::Cpu, DType::F32, 1e-4)
}

#[test]
fn bf16_on_the_cpu_equals_candle_transformers() -> Result<()> {
    run(&Device::Cpu, DType::BF16, 2e-2)
}

#[test]
fn bf16_batched_on_a_paged_cache_equals_candle_transformers() -> Result<()> {
    run_batched(&Device::Cpu, DType::BF16, 2e-2)
}

/// A missing tensor, a mis-shaped one, heads that do not divide, a prompt past the positions
/// and a token past the vocabulary: each a named error before anything runs.
#[test]
fn bad_checkpoints_and_prompts_are_named_errors() -> Result<()> {
    let mut rng = common::rng("llama bad input");
    let dev = Device::Cpu;
    let cfg: LlamaConfig = serde_json::from_str(CONFIG).unwrap();
    let good = tensors(&mut rng, &cfg)?;
    let expect = |r: Result<Llama>, needle: &str| {
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    };
    let dir = folder("missing");
    let mut t = good.clone();
    t.remove("model.layers.2.mlp.up_proj.weight");
    write(&dir, CONFIG, &t)?;
    expect(Llama::from_folder(&dir, &cfg, DType::F32, &dev), "model.layers.2.mlp.up_proj.weight");
    let mut t = good.clone();
    t.insert("model.layers.1.self_attn.k_proj.weight".into(), Tensor::zeros((63, 256), DType::F32, &dev)?);
    write(&dir, CONFIG, &t)?;
    expect(Llama::from_folder(&dir, &cfg, DType::F32, &dev), "k_proj");
    std::fs::remove_dir_all(&dir).ok();
    let bad = CONFIG.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
    let e = serde_json::from_str::<LlamaConfig>(&bad).unwrap().validate().unwrap_err().to_string();
    assert!(e.contains("8 query heads are not a multiple of 3"), "{e}");
    let e = serde_json::from_str::<LlamaConfig>(&CONFIG.replace("\"hidden_size\": 256", "\"hidden_size\": 250"))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("hidden_size 250"), "{e}");
    let dir = folder("prompts");
    write(&dir, CONFIG, &good)?;
    let model = Llama::from_folder(&dir, &cfg, DType::F32, &dev)?;
    let e = generate(&model, &[vec![5; 60]], 8, |_| {}).unwrap_err().to_string();
    assert!(e.contains("64 positions"), "{e}");
    let e = generate(&model, &[vec![5, 2], vec![7, 1000]], 2, |_| {}).unwrap_err().to_string();
    assert!(e.contains("token id 1000"), "{e}");
    let mut cache = Cache::new(&model);
    let e = model.forward(&Tensor::new(&[[5u32, 1000]], &dev)?, &mut cache).unwrap_err().to_string();
    assert!(e.contains("token id 1000"), "{e}");
    assert!(cache.is_empty(), "nothing ran");
    model.forward(&Tensor::new(&[[5u32, 6]], &dev)?, &mut cache)?;
    let e = model.forward(&Tensor::new(&[[5u32, 6]], &dev)?, &mut cache).unwrap_err().to_string();
    assert!(e.contains("2-token step after 2 cached positions"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
