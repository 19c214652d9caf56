//! A mixture-of-experts layer's routing and its expert products with the routing on the
//! device, as data: the router's top-k and the sort of the routed rows by expert
//! ([`MoeRouter`]), an expert product whose group starts are a device tensor ([`MoeGemm`]),
//! and the weighted combine of each token's expert outputs ([`MoeCombine`]); every rule
//! checked on the CPU, and the definitions tests check against ([`mod@reference`]).
//!
//! One step of a MoE layer over S tokens, E experts, top-k routing (R = S·k routed rows):
//! 1. logits `[S, E]` (the router's GEMM), then [`MoeRouter`]: per token the k largest logits'
//!    experts and weights (softmax over those k, which equals a softmax over all E
//!    renormalised over the k), and the routed rows sorted by expert — `starts[E]` (where each
//!    expert's rows begin), `index[R]` (the token of each sorted row), `ks[R]`, `slots[R]` and
//!    `pos[R]` (each slot's sorted row);
//! 2. x's rows gathered into expert order by `index` (`GpuMoe::gather`) — sorted, or in the
//!    capacity layout (`MoeRouting::pad`: every expert given [`capacity`]'s rows, pad rows
//!    zero, so that the products are equal groups of one strided batch);
//! 3. the expert products over the sorted rows: with the group starts on the device
//!    ([`MoeGemm`], `GpuMoe::gemm`: cuDNN's MoE grouped matmul, 9.18 and later) or over host
//!    group sizes ([`crate::grouped`], every library version, the backward weight too);
//! 4. [`MoeCombine`]: `y[s] = Σ_j w[s, j] · out[pos[s·k + j]]` — the unpermute fused into the
//!    weighted combine.
//!
//! The router, the gather and the combine run on gemmbridge's own kernels with no host
//! synchronisation.

pub mod reference;
mod router;

pub use router::{MoeCombine, MoeRouter, MAX_EXPERTS, MAX_TOP_K, SORT_CHUNK};

use crate::error::{Error, Result};
use crate::grouped::GroupedOp;
use crate::precision::Precision;
use crate::problem::MAX_DIM;

/// An expert product over device group starts: `out[r] = in[r] · B_e` for the rows r of
/// expert e, rows in expert order, with, per [`GroupedOp`] (w `[E, N, K]`, `nn.Linear`'s
/// layout per expert, as [`crate::grouped`]):
/// - `Forward`: `y[r, N] = x[r, K] · w[e]ᵀ`;
/// - `BackwardData`: `dx[r, K] = dy[r, N] · w[e]`.
///
/// Expert e's sorted rows are `starts[e] .. starts[e + 1]` (the last expert's run to R):
/// `starts` `[E]` int32 on the device, non-decreasing, `starts[0] = 0`, at most R. Rows
/// are row-major and contiguous; f16 and bf16 with f32 accumulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeGemm {
    op: GroupedOp,
    experts: usize,
    rows: usize,
    n: usize,
    k: usize,
    precision: Precision,
}

impl MoeGemm {
    /// The product `op` of `experts` experts over `rows` sorted rows (R), N = `n`, K = `k`.
    ///
    /// # Errors
    /// [`Error::GroupedShape`]: the backward weight (its rows are its inner dimension: it
    /// runs with host sizes, [`crate::grouped`]); no expert, no row, N or K zero; a size
    /// above [`MAX_DIM`] (group starts are int32); a buffer too large to address.
    /// [`Error::Unsupported`]: a precision other than [`Precision::F16`] and
    /// [`Precision::BF16`].
    pub fn new(
        op: GroupedOp,
        experts: usize,
        rows: usize,
        (n, k): (usize, usize),
        precision: Precision,
    ) -> Result<MoeGemm> {
        let p = MoeGemm { op, experts, rows, n, k, precision };
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
        if self.op == GroupedOp::BackwardWeight {
            let detail = "dw[e] = dy[e]ᵀ·x[e] runs with host group sizes (Gpu::grouped_gemm)".into();
            return bad("a MoE product with device routing is a forward or a backward data", detail);
        }
        if !matches!(self.precision, Precision::F16 | Precision::BF16) {
            let what = format!("{}: a MoE product with device routing takes f16 or bf16", self.describe());
            return Err(Error::Unsupported { backend: "cuDNN MoE grouped matmul", what });
        }
        let sizes = [("E", self.experts), ("R", self.rows), ("N", self.n), ("K", self.k)];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad("a size is zero", format!("{name} = 0 in {}", self.describe()));
        }
        if let Some((name, v)) = sizes.iter().find(|(_, v)| *v > MAX_DIM) {
            return bad("a size is too large", format!("{name} = {v} > {MAX_DIM}"));
        }
        let max = isize::MAX as usize / 2;
        let elems = [
            self.rows.checked_mul(self.width().0),
            self.rows.checked_mul(self.width().1),
            self.experts.checked_mul(self.n).and_then(|x| x.checked_mul(self.k)),
        ];
        if elems.iter().any(|x| x.is_none_or(|x| x > max)) {
            return bad("a buffer is too large to address", self.describe());
        }
        Ok(())
    }

    /// The product.
    pub fn op(&self) -> GroupedOp {
        self.op
    }

    /// Experts E.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Sorted rows R.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// N (output features of the forward).
    pub fn n(&self) -> usize {
        self.n
    }

    /// K (input features of the forward).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Storage and arithmetic.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// (input row width, output row width): forward `(K, N)`, backward data `(N, K)`.
    pub fn width(&self) -> (usize, usize) {
        match self.op {
            GroupedOp::BackwardData => (self.n, self.k),
            _ => (self.k, self.n),
        }
    }

    /// Elements of the input `[R, in]`, the weight `[E, N, K]` and the output `[R, out]`.
    pub fn lens(&self) -> [usize; 3] {
        let (win, wout) = self.width();
        [self.rows * win, self.experts * self.n * self.k, self.rows * wout]
    }

    /// The same product over host group sizes ([`crate::grouped::GroupedProblem`]), for the
    /// float64 reference and comparisons.
    ///
    /// # Errors
    /// As [`crate::grouped::GroupedProblem::new`]; [`Error::GroupedShape`] when `sizes` has
    /// not E entries or they do not add up to R.
    pub fn grouped(&self, sizes: &[usize]) -> Result<crate::grouped::GroupedProblem> {
        let total = sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m)).unwrap_or(usize::MAX);
        if sizes.len() != self.experts || total != self.rows {
            let detail = format!("{} sizes adding up to {total}; E = {}, R = {}", sizes.len(), self.experts, self.rows);
            return Err(Error::GroupedShape { what: "the group sizes do not match the MoE product", detail });
        }
        crate::grouped::GroupedProblem::new(self.op, sizes, self.n, self.k, self.precision)
    }

    /// `Forward E128 R32768 N768 K2048 bf16`.
    pub fn describe(&self) -> String {
        format!("{:?} E{} R{} N{} K{} {}", self.op, self.experts, self.rows, self.n, self.k, self.precision)
    }
}

/// Group starts from host group sizes: `starts[e] = Σ_{f<e} sizes[f]` (what
/// `first_token_offset` holds), as int32.
///
/// # Errors
/// [`Error::GroupedShape`] when a start passes `i32::MAX`.
pub fn starts_of(sizes: &[usize]) -> Result<Vec<i32>> {
    let mut at = 0usize;
    let mut out = Vec::with_capacity(sizes.len());
    for (e, &m) in sizes.iter().enumerate() {
        out.push(i32::try_from(at).map_err(|_| Error::GroupedShape {
            what: "a group start passes 2³¹ − 1",
            detail: format!("group {e} starts at row {at}"),
        })?);
        at = at.saturating_add(m);
    }
    Ok(out)
}

/// Group sizes from group starts over `rows` rows (what [`starts_of`] inverts): expert e has
/// the rows from `starts[e]` to the next start (the last to `rows`), the starts first clamped
/// as the device clamps them (each between the one before it, 0 for the first, and `rows`):
/// a start that steps back gives 0, a negative first start counts from 0, a start past
/// `rows` ends there.
pub fn sizes_of(starts: &[i32], rows: usize) -> Vec<usize> {
    let mut prev = 0usize;
    let clamped: Vec<usize> = starts
        .iter()
        .map(|&s| {
            prev = usize::try_from(s).unwrap_or(0).clamp(prev, rows);
            prev
        })
        .collect();
    let ends = clamped.iter().skip(1).copied().chain([rows]);
    clamped.iter().zip(ends).map(|(&s, e)| e - s).collect()
}

/// The most rows a capacity layout may add, as a multiple of the routed rows, for
/// [`capacity`] to choose it. Measured on an H100 (bf16, cuBLAS 13.1): equal groups of
/// Qwen3-30B-A3B's up-projection (128 experts of 256 rows, 2048 → 768) run as a strided batch
/// in 0.164 ms (forward), 0.165 (backward data), 0.199 (backward weight), where cuBLAS's
/// grouped call on the same rows in unequal groups takes 0.32, 0.36 and 0.53: padding pays
/// while it adds less than about twice the rows; 1.5 keeps a margin.
pub const PAD_LIMIT: f64 = 1.5;

/// Rows per expert of a capacity layout ([`crate::cuda::MoeRouting::pad`]), a multiple of 8:
/// the largest group of `sizes`, rounded up, when the E·cap rows stay within [`PAD_LIMIT`]
/// times the routed rows (a near-balanced routing, as a router trained with a balancing loss
/// gives) and within [`MAX_DIM`] (what `pad` takes); `None` when they do not (a skewed
/// routing: its ragged groups are cheaper), when nothing is routed, or when the sums overflow.
/// No row is dropped at this capacity.
pub fn capacity(sizes: &[usize]) -> Option<usize> {
    let rows = sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m))?;
    let cap = sizes.iter().max()?.checked_next_multiple_of(8)?;
    let padded = cap.checked_mul(sizes.len()).filter(|&p| p <= MAX_DIM)?;
    (rows > 0 && padded as f64 <= PAD_LIMIT * rows as f64).then_some(cap)
}

/// Checks host group starts against `p` (what the device values must be for the product to
/// mean what they say; on the device, values out of range are clamped into range instead, so
/// that nothing outside the buffers is read or written): `E` of them, non-decreasing from 0,
/// at most R.
///
/// # Errors
/// [`Error::GroupedShape`] naming the first value that breaks a rule.
pub fn check_starts(p: &MoeGemm, starts: &[i32]) -> Result<()> {
    let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
    if starts.len() != p.experts {
        return bad("the group starts have the wrong length", format!("{} starts, E = {}", starts.len(), p.experts));
    }
    let mut prev = 0i32;
    for (e, &s) in starts.iter().enumerate() {
        if (e == 0 && s != 0) || s < prev || s as i64 > p.rows as i64 {
            return bad(
                "a group start is out of order",
                format!("starts[{e}] = {s} (previous {prev}, R = {})", p.rows),
            );
        }
        prev = s;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
