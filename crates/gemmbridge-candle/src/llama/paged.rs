//! The model on a [`PagedKvCache`]: a batch of prompts of different lengths prefilled
//! together, then batched decode steps, one token per sequence.

use candle_core::{DType, Result, Tensor};

use super::model::Llama;
use super::LayerWeights;
use crate::{linear, rms_norm, sdpa, swiglu, Activation, PagedKvCache};

/// Positions per page of the caches [`Llama::paged_cache`] makes.
pub const PAGE_SIZE: usize = 16;

impl Llama {
    /// A [`PagedKvCache`] for this model (its layers, key/value heads, head dimension and
    /// dtype) with pages for `positions` positions in all, [`PAGE_SIZE`] per page, on the
    /// model's device.
    ///
    /// # Errors
    /// As [`PagedKvCache::new`]: a model that is not f16 or bf16, a head dimension that is not
    /// a multiple of 8 up to 256; `positions` 0.
    pub fn paged_cache(&self, positions: usize) -> Result<PagedKvCache> {
        let c = &self.cfg;
        let pages = positions.div_ceil(PAGE_SIZE);
        let dims = (c.kv_heads(), c.head_dim());
        PagedKvCache::new(c.num_hidden_layers, dims, self.dtype(), (pages, PAGE_SIZE), self.embed.device())
    }

    /// Prefills `prompts` (token ids, of any lengths ≥ 1) into the empty sequences `ids` of
    /// `cache`, one batch: the prompts right-padded to the longest (padding rows are computed
    /// and never written to the cache nor read: attention is causal), each one's keys and
    /// values appended to its pages. Returns each prompt's last-token logits `[b, vocab]`, f32.
    ///
    /// # Errors
    /// Before anything runs: an empty batch or prompt, `ids` not one per prompt, a sequence
    /// that already holds positions, a token id past the vocabulary, a prompt past
    /// `max_position_embeddings`; [`PagedKvCache::begin`]'s errors (too few free pages); then
    /// the operations' errors (the step is then dropped, the cache usable).
    pub fn prefill(&self, prompts: &[&[u32]], ids: &[usize], cache: &mut PagedKvCache) -> Result<Tensor> {
        let s = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if prompts.is_empty() || ids.len() != prompts.len() || prompts.iter().any(|p| p.is_empty()) {
            candle_core::bail!("llama prefill: {} prompts (none empty) for {} sequences", prompts.len(), ids.len());
        }
        for (&id, p) in ids.iter().zip(prompts) {
            if cache.len(id)? != 0 {
                candle_core::bail!("llama prefill: sequence {id} already holds {} positions", cache.len(id)?);
            }
            self.check_id(p.iter().copied().max().unwrap_or(0))?;
        }
        self.check_positions(s)?;
        let mut padded = vec![0u32; prompts.len() * s];
        for (row, p) in padded.chunks_mut(s).zip(prompts) {
            row[..p.len()].copy_from_slice(p);
        }
        let rows: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        let tokens = Tensor::from_vec(padded, (prompts.len(), s), self.embed.device())?;
        self.paged_step(&tokens, ids, &rows, cache)
    }

    /// One decode step: `tokens[n]` is the next token of sequence `ids[n]` (each holding at
    /// least one position); each one's keys and values are appended and it attends to its whole
    /// sequence through the page table. Returns the logits `[b, vocab]`, f32.
    ///
    /// # Errors
    /// Before anything runs: no token, `ids` not one per token, a token id past the vocabulary,
    /// an empty sequence, a sequence at `max_position_embeddings`; [`PagedKvCache::begin`]'s
    /// errors; then the operations' errors (the step is then dropped, the cache usable).
    pub fn decode(&self, tokens: &[u32], ids: &[usize], cache: &mut PagedKvCache) -> Result<Tensor> {
        if tokens.is_empty() || ids.len() != tokens.len() {
            candle_core::bail!("llama decode: {} tokens for {} sequences", tokens.len(), ids.len());
        }
        self.check_id(tokens.iter().copied().max().unwrap_or(0))?;
        for &id in ids {
            let held = cache.len(id)?;
            if held == 0 {
                candle_core::bail!("llama decode: sequence {id} is empty (prefill it first)");
            }
            self.check_positions(held + 1)?;
        }
        let t = Tensor::from_slice(tokens, (tokens.len(), 1), self.embed.device())?;
        self.paged_step(&t, ids, &vec![1; tokens.len()], cache)
    }

    /// A position count past `max_position_embeddings`, named.
    fn check_positions(&self, end: usize) -> Result<()> {
        if end > self.cfg.max_position_embeddings {
            candle_core::bail!(
                "llama: {end} positions pass max_position_embeddings {}",
                self.cfg.max_position_embeddings
            );
        }
        Ok(())
    }

    /// The step over `tokens[b, s]`: sequence `ids[n]` appends `rows[n]` of its row's tokens.
    /// The last-token logits of each sequence.
    fn paged_step(&self, tokens: &Tensor, ids: &[usize], rows: &[usize], cache: &mut PagedKvCache) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        cache.begin(ids, rows, s)?;
        let out = self.paged_layers(tokens, rows, cache);
        match out {
            Ok(t) => {
                cache.commit()?;
                Ok(t)
            }
            Err(e) => {
                cache.cancel();
                Err(e.context(format!("llama: a step of {b}×{s} tokens")))
            }
        }
    }

    fn paged_layers(&self, tokens: &Tensor, rows: &[usize], cache: &PagedKvCache) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let h = self.cfg.hidden_size;
        let mut x = self.embed.index_select(&tokens.flatten_all()?, 0)?.reshape((b, s, h))?;
        for (i, l) in self.layers.iter().enumerate() {
            x = self.paged_layer(i, l, &x, cache)?;
        }
        let last: Vec<u32> = rows.iter().enumerate().map(|(n, &r)| (n * s + r - 1) as u32).collect();
        let last = Tensor::new(last, x.device())?;
        let x = x.reshape((b * s, h))?.index_select(&last, 0)?;
        let x = rms_norm(&x, &self.norm, self.cfg.rms_norm_eps as f32)?;
        linear(&x, &self.lm_head, None, Activation::None)?.to_dtype(DType::F32)
    }

    /// One decoder layer on `x[b, s, H]` over the cache's step.
    fn paged_layer(&self, i: usize, l: &LayerWeights, x: &Tensor, cache: &PagedKvCache) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (hq, hkv, d) = (self.cfg.num_attention_heads, self.cfg.kv_heads(), self.cfg.head_dim());
        let eps = self.cfg.rms_norm_eps as f32;
        let n = rms_norm(x, &l.norm_in, eps)?;
        let qkv = linear(&n, &l.qkv, None, Activation::None)?;
        cache.rope_qkv(&qkv, hq, (&self.cos32, &self.sin32))?;
        let qkv = qkv.reshape((b, s, hq + 2 * hkv, d))?;
        let (q, k, v) = (qkv.narrow(2, 0, hq)?, qkv.narrow(2, hq, hkv)?, qkv.narrow(2, hq + hkv, hkv)?);
        cache.append(i, &k, &v)?;
        let o = if s == 1 {
            cache.attend(i, &q.squeeze(1)?, None)?
        } else {
            let t = |t: &Tensor| t.transpose(1, 2);
            sdpa(&t(&q)?, &t(&k)?, &t(&v)?, true, None)?.transpose(1, 2)?
        };
        let x = (linear(&o.reshape((b, s, hq * d))?, &l.o, None, Activation::None)? + x)?;
        let n = rms_norm(&x, &l.norm_post, eps)?;
        let a = swiglu(&linear(&n, &l.gate_up, None, Activation::None)?)?;
        linear(&a, &l.down, None, Activation::None)? + x
    }
}
