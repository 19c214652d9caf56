//! A LLaMA-family decoder (LLaMA 2 and 3, Mistral-style grouped-query attention) built from
//! the adapter's operations: [`Llama`] reads a Hugging Face checkpoint (`config.json` and
//! `*.safetensors`, the weight names candle-transformers' `llama` uses) through candle's
//! `VarBuilder`.
//!
//! Two ways to run it:
//! - **Batched, on a paged cache** (f16 and bf16): [`Llama::prefill`] runs a batch of prompts of
//!   different lengths at once into a [`crate::PagedKvCache`] ([`Llama::paged_cache`]), and
//!   [`Llama::decode`] one new token of every sequence per step, attention reading each
//!   sequence's keys and values through its pages (cuDNN's paged attention on CUDA).
//!   [`generate`] decodes a batch greedily this way.
//! - **One sequence, contiguous cache** (any dtype, f32 included): [`Llama::forward`] on a
//!   [`Cache`] that grows by concatenation; [`generate`] uses it for f32 models.
//!
//! Each layer: RMSNorm ([`crate::rms_norm`]), one fused QKV projection ([`crate::linear`] on
//! q, k and v's weights concatenated at load), RoPE on q and k (the tables computed as
//! candle-transformers computes them; [`crate::PagedKvCache::rope_qkv`] at each sequence's
//! position on the paged path, [`crate::rope`] on the other), attention (causal
//! [`crate::sdpa`] over a prompt, decode attention over the cache), the output projection and
//! the residual, RMSNorm, one fused gate/up projection, SwiGLU ([`crate::swiglu`]) and the down
//! projection with its residual; the final RMSNorm and the LM head on each sequence's last
//! token. The logits are f32.
//!
//! ```
//! use candle_core::{DType, Device};
//! use gemmbridge_candle::llama::{Llama, LlamaConfig};
//! let cfg: LlamaConfig = serde_json::from_str(
//!     r#"{"hidden_size": 64, "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 2,
//!        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
//!        "max_position_embeddings": 64}"#,
//! ).unwrap();
//! let dev = Device::Cpu; // or Device::new_cuda(0)? with the `cuda` feature
//! // zeros stand in for a checkpoint here: `Llama::from_folder(dir, &cfg, dtype, &dev)` reads one
//! let model = Llama::load(candle_nn::VarBuilder::zeros(DType::BF16, &dev), &cfg)?;
//! let mut cache = model.paged_cache(2 * 64)?; // room for 128 positions
//! let (a, b) = (cache.add_sequence(), cache.add_sequence());
//! let logits = model.prefill(&[&[1, 5, 7], &[2, 9]], &[a, b], &mut cache)?; // [2, 100]
//! let next: Vec<u32> = logits.argmax(candle_core::D::Minus1)?.to_vec1()?;
//! let logits = model.decode(&next, &[a, b], &mut cache)?; // one more token each
//! assert_eq!((logits.dims(), cache.len(a)?, cache.len(b)?), (&[2, 100][..], 4, 3));
//! # Ok::<(), candle_core::Error>(())
//! ```

mod generate;
mod model;
mod paged;

use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;

pub use generate::{generate, PREFILL_TOKENS};
pub use model::{Cache, Llama};
pub use paged::PAGE_SIZE;

/// The fields of a Hugging Face LLaMA `config.json` the model reads (as candle-transformers'
/// `LlamaConfig`); others are ignored.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct LlamaConfig {
    /// Model width H.
    pub hidden_size: usize,
    /// The MLP's width.
    pub intermediate_size: usize,
    /// Tokens of the vocabulary.
    pub vocab_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads; the head dimension is `hidden_size / num_attention_heads`.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); the query heads when absent.
    pub num_key_value_heads: Option<usize>,
    /// RMSNorm's epsilon.
    pub rms_norm_eps: f64,
    /// RoPE's base θ (10 000 when absent).
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    /// LLaMA 3's frequency scaling, when the checkpoint has one.
    pub rope_scaling: Option<RopeScaling>,
    /// The longest sequence: the RoPE tables' length, and a sequence's limit.
    pub max_position_embeddings: usize,
    /// The LM head is the embedding matrix (no `lm_head.weight`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f32 {
    10_000.0
}

/// `rope_scaling` of a LLaMA 3 `config.json` (`rope_type` "llama3"; "default" means none).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct RopeScaling {
    /// The divisor of the low frequencies.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are divided by
    /// `factor`.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The pretraining context length.
    pub original_max_position_embeddings: usize,
    /// "llama3" or "default".
    #[serde(default = "default_rope_type")]
    pub rope_type: String,
}

fn default_rope_type() -> String {
    "default".into()
}

impl LlamaConfig {
    /// Reads and checks a `config.json`.
    ///
    /// # Errors
    /// The file's I/O or JSON error, wrapped; as [`LlamaConfig::validate`].
    pub fn from_file(path: &Path) -> Result<LlamaConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let cfg: LlamaConfig =
            serde_json::from_str(&text).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Checks the sizes agree, before any weight is read.
    ///
    /// # Errors
    /// candle's `Error::Msg` naming the values: a size of 0; `hidden_size` not a multiple of
    /// the query heads, or an odd head dimension (RoPE rotates pairs); query heads not a
    /// multiple of the key/value heads; `rms_norm_eps` or `rope_theta` not finite and
    /// positive; a `rope_type` other than "llama3" and "default".
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            candle_core::bail!("llama config: {name} is 0");
        }
        let (h, hq, hkv) = (self.hidden_size, self.num_attention_heads, self.kv_heads());
        if h % hq != 0 || (h / hq) % 2 != 0 {
            candle_core::bail!("llama config: hidden_size {h} is not {hq} heads of an even head dimension");
        }
        if hq % hkv != 0 {
            candle_core::bail!("llama config: {hq} query heads are not a multiple of {hkv} key/value heads");
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            candle_core::bail!("llama config: rms_norm_eps = {} is not finite and positive", self.rms_norm_eps);
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            candle_core::bail!("llama config: rope_theta = {} is not finite and positive", self.rope_theta);
        }
        if let Some(s) = &self.rope_scaling {
            if s.rope_type != "llama3" && s.rope_type != "default" {
                candle_core::bail!("llama config: rope_scaling.rope_type {:?} (llama3 or default)", s.rope_type);
            }
        }
        Ok(())
    }

    /// RoPE's inverse frequencies, `[d/2]`, as candle-transformers' `llama` computes them
    /// (f32; LLaMA 3's scaling where `rope_type` is "llama3").
    fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim();
        let base: Vec<f32> = (0..d).step_by(2).map(|i| 1f32 / self.rope_theta.powf(i as f32 / d as f32)).collect();
        let Some(s) = self.rope_scaling.as_ref().filter(|s| s.rope_type == "llama3") else { return base };
        let l = s.original_max_position_embeddings as f32;
        let (low, high) = (l / s.low_freq_factor, l / s.high_freq_factor);
        base.into_iter()
            .map(|f| {
                let wavelen = 2. * std::f32::consts::PI / f;
                if wavelen < high {
                    f
                } else if wavelen > low {
                    f / s.factor
                } else {
                    let smooth = (l / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                    (1. - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }

    /// The cosine and sine tables `[max_position_embeddings, d/2]` in `dtype`: the angles
    /// `p·inv_freq_i` in f32 (a product of candle's f32 matmul, as candle-transformers makes
    /// them), then rounded to `dtype`.
    fn rope_tables(&self, dtype: DType, dev: &Device) -> Result<(Tensor, Tensor)> {
        let inv = self.inv_freq();
        let n = inv.len();
        let theta = Tensor::new(inv, dev)?.reshape((1, n))?;
        let p = self.max_position_embeddings;
        let idx = Tensor::arange(0, p as u32, dev)?.to_dtype(DType::F32)?.reshape((p, 1))?.matmul(&theta)?;
        Ok((idx.cos()?.to_dtype(dtype)?, idx.sin()?.to_dtype(dtype)?))
    }
}

/// The weights of one layer, as the model uses them: QKV `[(hq + 2·hkv)·d, H]` and gate/up
/// `[2·I, H]` concatenated at load.
struct LayerWeights {
    norm_in: Tensor,
    qkv: Tensor,
    o: Tensor,
    norm_post: Tensor,
    gate_up: Tensor,
    down: Tensor,
}

impl LayerWeights {
    fn load(vb: VarBuilder, cfg: &LlamaConfig) -> Result<LayerWeights> {
        let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let a = vb.pp("self_attn");
        let m = vb.pp("mlp");
        let qkv = Tensor::cat(
            &[a.get((q, h), "q_proj.weight")?, a.get((kv, h), "k_proj.weight")?, a.get((kv, h), "v_proj.weight")?],
            0,
        )?;
        let gate_up = Tensor::cat(&[m.get((i, h), "gate_proj.weight")?, m.get((i, h), "up_proj.weight")?], 0)?;
        Ok(LayerWeights {
            norm_in: vb.get(h, "input_layernorm.weight")?,
            qkv,
            o: a.get((h, q), "o_proj.weight")?,
            norm_post: vb.get(h, "post_attention_layernorm.weight")?,
            gate_up,
            down: m.get((h, i), "down_proj.weight")?,
        })
    }
}

impl Llama {
    /// Loads the model from `vb` (Hugging Face names: `model.embed_tokens.weight`,
    /// `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `….mlp.{gate,up,down}_proj.weight`,
    /// `….input_layernorm.weight`, `….post_attention_layernorm.weight`, `model.norm.weight`,
    /// `lm_head.weight` unless the embeddings are tied), in `vb`'s dtype and device.
    ///
    /// # Errors
    /// As [`LlamaConfig::validate`]; a missing tensor or one of another shape (candle's error
    /// naming it), before the model exists.
    pub fn load(vb: VarBuilder, cfg: &LlamaConfig) -> Result<Llama> {
        cfg.validate()?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = vb.get((v, h), "model.embed_tokens.weight")?;
        let lm_head = if cfg.tie_word_embeddings { embed.clone() } else { vb.get((v, h), "lm_head.weight")? };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| LayerWeights::load(vb.pp(format!("model.layers.{i}")), cfg))
            .collect::<Result<Vec<_>>>()?;
        let (cos, sin) = cfg.rope_tables(vb.dtype(), vb.device())?;
        let (cos32, sin32) = (cos.to_dtype(DType::F32)?, sin.to_dtype(DType::F32)?);
        let norm = vb.get(h, "model.norm.weight")?;
        Ok(Llama { cfg: cfg.clone(), embed, layers, norm, lm_head, cos, sin, cos32, sin32 })
    }

    /// Loads every `*.safetensors` file of `dir` (memory-mapped) in `dtype` on `dev`.
    ///
    /// # Errors
    /// A folder with no `*.safetensors`; as [`Llama::load`]; the files' errors.
    pub fn from_folder(dir: &Path, cfg: &LlamaConfig, dtype: DType, dev: &Device) -> Result<Llama> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            candle_core::bail!("{}: no *.safetensors file", dir.display());
        }
        // SAFETY: the files are mapped read-only and must not change while the model lives
        // (candle's `from_mmaped_safetensors` contract).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, dev)? };
        Llama::load(vb, cfg)
    }
}
