//! The router's top-k with the sort of the routed rows ([`MoeRouter`]) and the weighted
//! combine of each token's expert outputs ([`MoeCombine`]), as data.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::MAX_DIM;

/// The most experts a token is routed to.
pub const MAX_TOP_K: usize = 16;

/// The most experts a router chooses among (its per-expert counts sit in a CTA's shared memory).
pub const MAX_EXPERTS: usize = 4096;

/// Routed rows one CTA of the sort counts and places (the per-CTA counts are
/// `ceil(R / SORT_CHUNK)·E` int32).
pub const SORT_CHUNK: usize = 2048;

/// The router of a MoE layer: `tokens` rows of logits `[S, E]` (f32, f16 or bf16), each
/// token routed to its `top_k` largest logits' experts (ties to the lower expert), with the
/// softmax over those k logits as weights (f32). Its outputs (`GpuMoe::route`), for the
/// R = S·k routed rows:
/// - `ids[R]`, `weights[R]`: token s's j-th choice at `s·k + j` (largest first);
/// - `starts[E]`, `index[R]`, `ks[R]`, `slots[R]`: the routed rows sorted by expert, stably
///   (by expert, then token, then slot): sorted row r is slot `slots[r] = index[r]·k + ks[r]`;
///   expert e's rows start at `starts[e]`; `pos[R]`: the sorted row of each slot (`slots`'
///   inverse).
///
/// A logit that is NaN ranks as −∞ (below every number, ties to the lower expert); a NaN among
/// a token's chosen logits, or a largest chosen logit of +∞ or −∞, makes all its weights NaN;
/// a −∞ below a finite largest one gets weight 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeRouter {
    /// Tokens S.
    pub tokens: usize,
    /// Experts E.
    pub experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// The logits' element type.
    pub dtype: DType,
}

impl MoeRouter {
    /// Checks the sizes.
    ///
    /// # Errors
    /// [`Error::GroupedShape`]: no token or expert; `top_k` 0, above E or above
    /// [`MAX_TOP_K`]; E above [`MAX_EXPERTS`]; S·k above [`MAX_DIM`].
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str| {
            Err(Error::GroupedShape {
                what,
                detail: format!(
                    "S = {}, E = {}, top_k = {} (at most {MAX_TOP_K} and E; E at most {MAX_EXPERTS})",
                    self.tokens, self.experts, self.top_k
                ),
            })
        };
        if self.tokens == 0 || self.experts == 0 {
            return bad("a router needs tokens and experts");
        }
        if self.top_k == 0 || self.top_k > self.experts.min(MAX_TOP_K) {
            return bad("a router's top_k is out of range");
        }
        if self.experts > MAX_EXPERTS {
            return bad("a router has too many experts");
        }
        if self.tokens.checked_mul(self.top_k).is_none_or(|r| r > MAX_DIM) {
            return bad("a router's routed rows pass 2³¹ − 1");
        }
        Ok(())
    }

    /// Routed rows R = S·k (saturating: [`MoeRouter::validate`] bounds it).
    pub fn rows(&self) -> usize {
        self.tokens.saturating_mul(self.top_k)
    }

    /// CTAs of the sort, and the int32 counts they keep (`[CTAs, E]`; saturating).
    pub fn sort_blocks(&self) -> (usize, usize) {
        let blocks = self.rows().div_ceil(SORT_CHUNK);
        (blocks, blocks.saturating_mul(self.experts))
    }
}

/// The weighted combine `y[s, c] = Σ_j w[q] · o[row(q), c]` for the slots q = s·k + j (f32
/// accumulation, in order j = 0, 1, …, one fused multiply-add each, then rounded to the output
/// type), `o` `[S·k, N]` with slot q's row at `row(q)`: q itself (token order) or `pos[q]`
/// (expert order, what the expert products write: the unpermute is fused into the combine),
/// `y[S, N]`, `w[S·k]` f32; without weights
/// every w is 1 (the sum of each token's rows: a backward's input gradient). Its backward
/// (`GpuMoe::combine_backward`) writes `do[row(q), c] = w[q] · dy[s, c]`, the weights'
/// gradient `dw[q] = Σ_c dy[s, c] · o[row(q), c]` and, for the router's weights (a softmax over
/// the chosen logits), the logits' gradient `dlogits[s, e]` `[S, E]`: `w_j (dw_j − Σ_i w_i
/// dw_i)` at the chosen experts, 0 elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeCombine {
    /// Tokens S.
    pub tokens: usize,
    /// Slots per token k.
    pub top_k: usize,
    /// Features N.
    pub n: usize,
    /// The element type of o, y, dy and do.
    pub dtype: DType,
}

impl MoeCombine {
    /// Checks the sizes.
    ///
    /// # Errors
    /// [`Error::GroupedShape`]: a size zero, `top_k` above [`MAX_TOP_K`], S·k above
    /// [`MAX_DIM`] (its rows are int32), S·k·N past what a buffer can address.
    pub fn validate(&self) -> Result<()> {
        let detail = || format!("S = {}, top_k = {}, N = {}", self.tokens, self.top_k, self.n);
        if self.tokens == 0 || self.top_k == 0 || self.n == 0 || self.top_k > MAX_TOP_K {
            return Err(Error::GroupedShape { what: "a combine's sizes are out of range", detail: detail() });
        }
        if self.rows() > MAX_DIM {
            return Err(Error::GroupedShape { what: "a combine's routed rows pass 2³¹ − 1", detail: detail() });
        }
        if self.rows().checked_mul(self.n).is_none_or(|e| e > isize::MAX as usize / 4) {
            return Err(Error::GroupedShape { what: "a combine's buffers are too large", detail: detail() });
        }
        Ok(())
    }

    /// Routed rows S·k (saturating: [`MoeCombine::validate`] bounds it).
    pub fn rows(&self) -> usize {
        self.tokens.saturating_mul(self.top_k)
    }
}
