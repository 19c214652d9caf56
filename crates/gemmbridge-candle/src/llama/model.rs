//! The model's forward and greedy decoding.

use candle_core::{DType, Result, Tensor};

use super::{LayerWeights, LlamaConfig};
use crate::{linear, rms_norm, rope, sdpa, swiglu, Activation};

/// A LLaMA-family model on one candle device (see the [module documentation](super)).
pub struct Llama {
    pub(super) cfg: LlamaConfig,
    /// `[vocab, H]`.
    pub(super) embed: Tensor,
    pub(super) layers: Vec<LayerWeights>,
    /// The final RMSNorm's weight `[H]`.
    pub(super) norm: Tensor,
    /// `[vocab, H]` (the embedding when tied).
    pub(super) lm_head: Tensor,
    /// RoPE's tables `[max_position_embeddings, d/2]`, in the model's dtype.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    /// The same tables widened to f32 (exactly), as gemmbridge's RoPE reads them.
    pub(super) cos32: Tensor,
    pub(super) sin32: Tensor,
}

/// One batch of sequences' keys and values, per layer `[b, h_kv, len, d]` (contiguous, grown
/// by each step), and how many positions they hold.
pub struct Cache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl Cache {
    /// An empty cache for `model`.
    pub fn new(model: &Llama) -> Cache {
        Cache { kv: vec![None; model.cfg.num_hidden_layers], len: 0 }
    }

    /// Positions held: the next token's position.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Llama {
    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The model's dtype.
    pub fn dtype(&self) -> DType {
        self.embed.dtype()
    }

    /// One step for `tokens` `[b, s]` (u32) at positions `cache.len() ..`: a prefill of `s`
    /// tokens on an empty cache (causal attention over them), or any number of one-token
    /// decode steps after it (the new token attends to the whole cache). Returns the last
    /// token's logits `[b, vocab]` in f32 and grows the cache by `s`.
    ///
    /// # Errors
    /// Before anything runs: tokens not 2-D u32 or empty, a token id past the vocabulary, a
    /// multi-token step on a cache that already holds positions, positions past
    /// `max_position_embeddings`, a batch other than the cache's; then the operations' errors.
    pub fn forward(&self, tokens: &Tensor, cache: &mut Cache) -> Result<Tensor> {
        self.check_step(tokens, cache)?;
        // the ids' largest, read back to the host (one wait); generate checks its ids on the host
        let ids = tokens.flatten_all()?.max(0)?.to_scalar::<u32>()?;
        self.check_id(ids)?;
        self.step(tokens, cache)
    }

    /// [`Llama::forward`] once its checks passed (the ids by the caller).
    pub(super) fn step(&self, tokens: &Tensor, cache: &mut Cache) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let pos = cache.len;
        let h = self.cfg.hidden_size;
        let mut x = self.embed.index_select(&tokens.flatten_all()?, 0)?.reshape((b, s, h))?;
        let (cos, sin) = (self.cos.narrow(0, pos, s)?, self.sin.narrow(0, pos, s)?);
        for (l, kv) in self.layers.iter().zip(cache.kv.iter_mut()) {
            x = self.layer(l, &x, (&cos, &sin), kv)?;
        }
        cache.len += s;
        let x = rms_norm(&x, &self.norm, self.cfg.rms_norm_eps as f32)?;
        let last = x.narrow(1, s - 1, 1)?.squeeze(1)?;
        linear(&last, &self.lm_head, None, Activation::None)?.to_dtype(DType::F32)
    }

    /// A token id past the vocabulary, named.
    pub(super) fn check_id(&self, top: u32) -> Result<()> {
        if top as usize >= self.cfg.vocab_size {
            candle_core::bail!("llama: token id {top} is past the vocabulary ({} tokens)", self.cfg.vocab_size);
        }
        Ok(())
    }

    /// Every rule of a step but the ids' range (host values only, no wait on the device).
    pub(super) fn check_step(&self, tokens: &Tensor, cache: &Cache) -> Result<()> {
        let (b, s) = tokens.dims2()?;
        if tokens.dtype() != DType::U32 || b == 0 || s == 0 {
            candle_core::bail!(
                "llama: tokens must be a non-empty [b, s] u32 tensor, got {:?} {:?}",
                tokens.dims(),
                tokens.dtype()
            );
        }
        if s > 1 && cache.len > 0 {
            candle_core::bail!(
                "llama: a {s}-token step after {} cached positions (prefill on an empty cache, then one token a step)",
                cache.len
            );
        }
        let end = cache.len + s;
        if end > self.cfg.max_position_embeddings {
            candle_core::bail!(
                "llama: positions {}..{end} pass max_position_embeddings {}",
                cache.len,
                self.cfg.max_position_embeddings
            );
        }
        if let Some((k, _)) = cache.kv.iter().flatten().next() {
            if k.dim(0)? != b {
                candle_core::bail!("llama: a batch of {b} on a cache of {} sequences", k.dim(0)?);
            }
        }
        Ok(())
    }

    /// One decoder layer on `x` `[b, s, H]`, its keys and values appended to `kv`.
    fn layer(
        &self,
        l: &LayerWeights,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        kv: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (hq, hkv, d) = (self.cfg.num_attention_heads, self.cfg.kv_heads(), self.cfg.head_dim());
        let eps = self.cfg.rms_norm_eps as f32;
        let n = rms_norm(x, &l.norm_in, eps)?;
        // [b, s, hq + 2·hkv, d]: q, k and v are views of it, transposed to [b, heads, s, d]
        let qkv = linear(&n, &l.qkv, None, Activation::None)?.reshape((b, s, hq + 2 * hkv, d))?;
        let part = |from: usize, heads: usize| qkv.narrow(2, from, heads)?.transpose(1, 2);
        let q = rope(&part(0, hq)?, cos, sin)?;
        let k = rope(&part(hq, hkv)?, cos, sin)?;
        let v = part(hq + hkv, hkv)?;
        let (k, v) = match kv.take() {
            Some((ck, cv)) => (Tensor::cat(&[&ck, &k], 2)?, Tensor::cat(&[&cv, &v], 2)?),
            None => (k.contiguous()?, v.contiguous()?),
        };
        *kv = Some((k.clone(), v.clone()));
        let o = sdpa(&q, &k, &v, s > 1, None)?.transpose(1, 2)?.reshape((b, s, hq * d))?;
        let x = (linear(&o, &l.o, None, Activation::None)? + x)?;
        let n = rms_norm(&x, &l.norm_post, eps)?;
        let a = swiglu(&linear(&n, &l.gate_up, None, Activation::None)?)?;
        linear(&a, &l.down, None, Activation::None)? + x
    }
}
