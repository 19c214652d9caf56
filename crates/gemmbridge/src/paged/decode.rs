//! [`PagedDecode`]: decode attention over a paged cache, one query row per sequence, as data.

use super::PagedCache;
use crate::attention::{Attention, AttnMask};
use crate::error::Result;

/// Decode attention over a paged cache: for each sequence `n`, the queries `q[n, h_q, d]` (one
/// row per query head, `[b, h_q, d]` contiguous) attend to the `lens[n]` keys and values the
/// tables point to, `o[n, h_q, d]` (contiguous) = softmax(`scale`·q·kᵀ)·v with query head `hq`
/// reading key/value head `hq / (h_q / h_kv)` (GQA). The only mask is the lengths' (for the last
/// query row the bottom-right causal mask adds nothing; cuDNN 9.18.1's known issues also say to run
/// decoding without a causal mask when `h_q ≠ h_kv`). Equal, on the keys it sees, to
/// [`Attention`] over the keys gathered into contiguous tensors ([`PagedDecode::attention`],
/// [`super::reference::decode`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedDecode {
    /// The cache read and the batch's table shape.
    pub cache: PagedCache,
    /// Query heads, a multiple of `cache.heads_kv`.
    pub heads_q: usize,
    /// The factor on `q·kᵀ`; default `1/√d`.
    pub scale: f32,
}

impl PagedDecode {
    /// `heads_q` query heads over `cache`, scale `1/√d`.
    pub fn new(cache: PagedCache, heads_q: usize) -> PagedDecode {
        let d = cache.head_dim;
        let scale = if d == 0 { 1.0 } else { (1.0 / (d as f64).sqrt()) as f32 };
        PagedDecode { cache, heads_q, scale }
    }

    /// The same with `scale`.
    #[must_use]
    pub fn with_scale(self, scale: f32) -> PagedDecode {
        PagedDecode { scale, ..self }
    }

    /// A short description: `decode hq32 scale0.088388346 over pages4096×16 h8 d128 bf16
    /// tables[64×256]`.
    pub fn describe(&self) -> String {
        format!("decode hq{} scale{:?} over {}", self.heads_q, self.scale, self.cache.describe())
    }

    /// Elements of `q` and of `o`: `batch·h_q·d` (saturating).
    pub fn query_elems(&self) -> usize {
        self.cache.batch.saturating_mul(self.heads_q).saturating_mul(self.cache.head_dim)
    }

    /// The same attention on contiguous tensors: `b` sequences, `(h_q, h_kv)` heads, one query
    /// row and [`PagedCache::max_len`] keys each, BHSD, per-sequence lengths, no mask; the keys
    /// and values gathered as [`super::reference::gather`] lays them out.
    pub fn attention(&self) -> Attention {
        let c = &self.cache;
        Attention::new(c.batch, (self.heads_q, c.heads_kv), (1, c.max_len()), c.head_dim, c.dtype)
            .bhsd()
            .with_mask(AttnMask::None)
            .with_scale(self.scale)
            .with_var_len(true)
    }

    /// Checks every rule: the cache's ([`PagedCache::validate`]), and those of the equivalent
    /// [`Attention`] ([`Attention::validate`]: `h_q` a multiple of `h_kv`, the scale finite and
    /// positive, every size at most 2³¹ − 1).
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] for the cache's rules; [`crate::Error::AttentionShape`]
    /// for the attention's.
    pub fn validate(&self) -> Result<()> {
        self.cache.validate()?;
        self.attention().validate()
    }

    /// Checks a call's host tables and lengths: the table ([`PagedCache::check_tables`]) and one
    /// length per sequence from 1 (a sequence without keys has no defined output) to the
    /// table's capacity.
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] naming the rule, the sequence and the values.
    pub fn check_index(&self, tables: &[i32], lens: &[i32]) -> Result<()> {
        self.cache.check_tables(tables)?;
        self.cache.check_lens("lens", lens, 1)
    }
}
