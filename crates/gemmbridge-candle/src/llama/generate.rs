//! Greedy decoding of a batch of prompts.

use candle_core::{DType, Result, Tensor, D};

use super::model::{Cache, Llama};
use super::paged::PAGE_SIZE;

/// Padded prompt tokens a prefill batch holds at most: prompts are prefilled in consecutive
/// groups under it, so that a prefill's activations stay within a few GB at LLaMA-3-8B's
/// sizes (its gate/up projection is `tokens × 2 × 14336` elements).
pub const PREFILL_TOKENS: usize = 16_384;

/// Greedy decoding of each prompt (token ids, of any lengths) for `steps` new tokens;
/// `progress` is called with the number of tokens made so far after each step. Returns the new
/// tokens of each prompt.
///
/// f16 and bf16 models decode the whole batch together on one [`crate::PagedKvCache`]
/// ([`Llama::prefill`] of consecutive groups of prompts of at most [`PREFILL_TOKENS`] padded
/// tokens, then [`Llama::decode`] steps of every sequence at once): each step reads its tokens
/// back to the host once (the argmax of every row). Other dtypes (f32) run each prompt alone on
/// its own contiguous [`Cache`] ([`Llama::forward`]).
///
/// # Errors
/// An empty prompt, a prompt and `steps` past `max_position_embeddings` or a token id past the
/// vocabulary (named before anything runs); as [`Llama::prefill`], [`Llama::decode`],
/// [`Llama::forward`].
pub fn generate(
    model: &Llama,
    prompts: &[Vec<u32>],
    steps: usize,
    progress: impl FnMut(usize),
) -> Result<Vec<Vec<u32>>> {
    let limit = model.cfg.max_position_embeddings;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() || p.len().checked_add(steps).is_none_or(|end| end > limit + 1) {
            candle_core::bail!(
                "llama: prompt {i} has {} tokens; with {steps} more it must fit {limit} positions",
                p.len()
            );
        }
        model.check_id(p.iter().copied().max().unwrap_or(0))?;
    }
    if steps == 0 || prompts.is_empty() {
        return Ok(vec![Vec::new(); prompts.len()]);
    }
    match model.dtype() {
        DType::F16 | DType::BF16 => batched(model, prompts, steps, progress),
        _ => one_by_one(model, prompts, steps, progress),
    }
}

/// The batch on one paged cache.
fn batched(
    model: &Llama,
    prompts: &[Vec<u32>],
    steps: usize,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Vec<u32>>> {
    let positions: usize = prompts.iter().map(|p| (p.len() + steps).next_multiple_of(PAGE_SIZE)).sum();
    let mut cache = model.paged_cache(positions)?;
    let ids: Vec<usize> = prompts.iter().map(|_| cache.add_sequence()).collect();
    let mut next = Vec::with_capacity(prompts.len());
    let mut start = 0;
    while start < prompts.len() {
        let (mut end, mut longest) = (start, 0);
        while end < prompts.len()
            && (end == start || (end + 1 - start) * longest.max(prompts[end].len()) <= PREFILL_TOKENS)
        {
            longest = longest.max(prompts[end].len());
            end += 1;
        }
        let group: Vec<&[u32]> = prompts[start..end].iter().map(Vec::as_slice).collect();
        let logits = model.prefill(&group, &ids[start..end], &mut cache)?;
        next.extend(logits.argmax(D::Minus1)?.to_vec1::<u32>()?);
        start = end;
    }
    let mut outs: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    progress(prompts.len());
    for step in 1..steps {
        let logits = model.decode(&next, &ids, &mut cache)?;
        next = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
        for (o, &t) in outs.iter_mut().zip(&next) {
            o.push(t);
        }
        progress((step + 1) * prompts.len());
    }
    Ok(outs)
}

/// Each prompt alone on its own contiguous cache.
fn one_by_one(
    model: &Llama,
    prompts: &[Vec<u32>],
    steps: usize,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Vec<u32>>> {
    let dev = model.embed.device();
    let (mut outs, mut made) = (Vec::with_capacity(prompts.len()), 0);
    for p in prompts {
        let mut cache = Cache::new(model);
        let mut out = Vec::with_capacity(steps);
        let mut tokens = Tensor::new(p.as_slice(), dev)?.unsqueeze(0)?;
        for _ in 0..steps {
            // the prompt's ids were checked above and each next one is an argmax over the vocabulary
            model.check_step(&tokens, &cache)?;
            let next = model.step(&tokens, &mut cache)?.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
            out.push(next);
            made += 1;
            progress(made);
            tokens = Tensor::new(&[next], dev)?.unsqueeze(0)?;
        }
        outs.push(out);
    }
    Ok(outs)
}
