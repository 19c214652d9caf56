//! The layer's decode step as data ([`DecodeStep`]: `b` sequences, one new token each, over a
//! paged KV cache), its rules, its byte count, and its float64 definition
//! ([`decode_reference`]), for tests.

use super::f64ops::{self, product};
use super::reference::{tail, Weights};
use super::{DecoderLayer, LayerWeight, Proj, Tokens};
use crate::error::{Error, Result};
use crate::layer_ops::{Positions, RopeDirection, MAX_POSITION};
use crate::paged::{HostIndex, PagedAppend, PagedCache, PagedDecode};

/// One decode step of `layer` over `cache`: `cache.batch` sequences, one token each.
///
/// Token `n` of `x[b, d]` is sequence `n`'s next token; the sequence holds `held[n]` positions
/// in the cache before the step. The step is the layer of [`crate::layer`] on one token per
/// sequence, its attention reading the cache:
/// ```text
/// h1  = rms_norm(x) ∘ w_norm1;  qkv = h1 · w_qkvᵀ
/// q, k ← rope(q), rope(k)       at position p = held[n] (the token's place in its sequence)
/// k, v → the cache              at position held[n] through sequence n's page table
/// o   = paged decode(q)         over held[n] + 1 keys and values (GQA, scale 1/√hd, no mask)
/// y   = the layer's tail on (x, o): x2 = x + o·w_oᵀ, norm 2, gate/up, SwiGLU, y = x2 + a·w_downᵀ
/// ```
/// The held lengths are not changed: the caller advances each by one after the step. A
/// prefill of `s` tokens followed by decode steps gives, token for token, the layer's causal
/// forward over the whole sequence (a CPU test checks this).
///
/// The cache's key/value heads, head dimension and element type are the layer's. The page
/// table's width is fixed by `cache` (bucketed: [`PagedCache::for_max_len`]), so one plan serves
/// every step until a sequence outgrows [`PagedCache::max_len`]. Fields public to be read;
/// checked by [`DecodeStep::validate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeStep {
    /// The layer.
    pub layer: DecoderLayer,
    /// The paged cache and the batch's table shape.
    pub cache: PagedCache,
}

impl DecodeStep {
    /// A step of `layer` over `cache`.
    pub fn new(layer: DecoderLayer, cache: PagedCache) -> DecodeStep {
        DecodeStep { layer, cache }
    }

    /// The step's tokens: `b` sequences of one token.
    pub const fn tokens(&self) -> Tokens {
        Tokens { b: self.cache.batch, s: 1 }
    }

    /// The append of the step's k and v rows, read in place from the fused projection's output
    /// (rows [`DecoderLayer::qkv_width`] apart; k at [`DecoderLayer::qkv_offsets`]`[1]`, v at
    /// `[2]`).
    pub fn append(&self) -> PagedAppend {
        PagedAppend::decode(self.cache).with_ld(self.layer.qkv_width())
    }

    /// The step's attention: `h_q` query heads over the cache, scale `1/√hd` (the layer's).
    pub fn attention(&self) -> PagedDecode {
        PagedDecode::new(self.cache, self.layer.heads_q)
    }

    /// Every rule: the layer's on `b` tokens ([`DecoderLayer::check_tokens`]), the cache's
    /// ([`PagedCache::validate`]), the cache's heads, head dimension and element type the
    /// layer's, and those of the append and the attention.
    ///
    /// # Errors
    /// [`Error::DecoderShape`] for a cache unlike the layer; as the checks named.
    pub fn validate(&self) -> Result<()> {
        self.layer.check_tokens(self.tokens())?;
        self.cache.validate()?;
        let (l, c) = (&self.layer, &self.cache);
        if (c.heads_kv, c.head_dim, c.dtype) != (l.heads_kv, l.head_dim, l.dtype) {
            return Err(Error::DecoderShape {
                what: "the cache's key/value heads, head dimension or element type are not the layer's",
                detail: format!("cache {} for layer {}", c.describe(), l.describe()),
            });
        }
        self.append().validate()?;
        self.attention().validate()
    }

    /// Checks a step's host tables and held lengths: as [`PagedAppend::check_index`] (entries
    /// within the container, `held[n] + 1` within the table's capacity, no page written that
    /// another sequence holds, no page twice among one sequence's live entries), and every position below RoPE's [`MAX_POSITION`].
    ///
    /// # Errors
    /// [`Error::PagedCache`] naming the rule, the sequence and the values.
    pub fn check_index(&self, tables: &[i32], held: &[i32]) -> Result<()> {
        self.append().check_index(&HostIndex { tables, lens: held, new_lens: None })?;
        if let Some((n, &p)) = held.iter().enumerate().find(|&(_, &p)| p as usize >= MAX_POSITION) {
            return Err(Error::PagedCache {
                what: "a position is past RoPE's limit",
                detail: format!("held[{n}] = {p} ≥ {MAX_POSITION} ({})", self.describe()),
            });
        }
        Ok(())
    }

    /// Bytes of the layer's weights (the four projections and the two norms), read once per
    /// step.
    pub fn weight_bytes(&self) -> f64 {
        // summed in f64: each length saturates at usize::MAX on a layer `validate` refuses, and
        // their sum in usize would overflow
        let elems: f64 = LayerWeight::ALL.iter().map(|&w| self.layer.weight_len(w) as f64).sum();
        elems * self.layer.dtype.size_bytes() as f64
    }

    /// Bytes of the keys and values attention reads when the sequences hold `lens` positions
    /// after the append: `2·Σlens·h_kv·hd` elements.
    pub fn kv_bytes(&self, lens: &[i32]) -> f64 {
        let held: f64 = lens.iter().map(|&l| l as f64).sum();
        2.0 * held * self.layer.kv_width() as f64 * self.layer.dtype.size_bytes() as f64
    }

    /// The bytes a step must move, the count of the bench's TB/s: [`DecodeStep::weight_bytes`]
    /// and [`DecodeStep::kv_bytes`] (activations, tables and lengths not counted).
    pub fn bytes(&self, lens: &[i32]) -> f64 {
        self.weight_bytes() + self.kv_bytes(lens)
    }

    /// `decode step b64 over pages4096×16 h8 d128 bf16 tables[64×256] of d 4096 …`.
    pub fn describe(&self) -> String {
        format!("decode step b{} over {} of {}", self.cache.batch, self.cache.describe(), self.layer.describe())
    }
}

/// The decode step in float64, [`DecodeStep`]'s definition: from `x[b, d]`, the caches
/// (`k`, `v`: [`PagedCache::container_elems`] values each, written at each sequence's position
/// `held[n]`), `tables` and `held`, returns `y[b, d]`.
///
/// # Errors
/// As [`DecodeStep::validate`] and [`DecodeStep::check_index`]; [`Error::DecoderShape`] for
/// `x`, a weight or a container of the wrong length.
pub fn decode_reference(
    step: &DecodeStep,
    w: &Weights,
    x: &[f64],
    (k, v): (&mut [f64], &mut [f64]),
    (tables, held): (&[i32], &[i32]),
) -> Result<Vec<f64>> {
    step.validate()?;
    step.check_index(tables, held)?;
    w.check(&step.layer)?;
    let (l, c, b) = (&step.layer, &step.cache, step.cache.batch);
    let (d, width, hd) = (l.d_model, l.qkv_width(), l.head_dim);
    let lengths = [("x", x.len(), b * d), ("k", k.len(), c.container_elems()), ("v", v.len(), c.container_elems())];
    if let Some((name, got, want)) = lengths.iter().find(|(_, g, w)| g != w) {
        return Err(Error::DecoderShape {
            what: "an input of the decode step has the wrong length",
            detail: format!("{name} has {got} elements, expected {want}"),
        });
    }
    let t = Tokens { b, s: 1 };
    let g = l.gemms(t, l.precision())?;
    let (h1, _) = f64ops::rms_norm(l, x, &w.w_norm1);
    let qkv = product(&g.fwd[Proj::Qkv as usize], &h1, &w.w_qkv);
    // each sequence's token at its own position, held[n]
    let qkv = f64ops::rope(l, t, &qkv, &Positions::Given(held), RopeDirection::Forward);
    let [_, ok, ov] = l.qkv_offsets();
    let mut q = Vec::with_capacity(b * l.q_width());
    for n in 0..b {
        let pos = held[n] as usize;
        let row = &qkv[n * width..(n + 1) * width];
        q.extend_from_slice(&row[..l.q_width()]);
        let (page, slot) = c.locate(tables, n, pos);
        for h in 0..l.heads_kv {
            let at = c.index(page, h, slot, 0);
            k[at..at + hd].copy_from_slice(&row[ok + h * hd..ok + (h + 1) * hd]);
            v[at..at + hd].copy_from_slice(&row[ov + h * hd..ov + (h + 1) * hd]);
        }
    }
    let after: Vec<i32> = held.iter().map(|&p| p + 1).collect();
    let o = crate::paged::reference::decode(&step.attention(), &q, (k, v), tables, &after);
    Ok(tail(l, w, (x, &o), &|p, a, b, _| product(&g.fwd[p as usize], a, b)).y)
}
