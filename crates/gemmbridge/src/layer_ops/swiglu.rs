//! SwiGLU as data: [`SwiGlu`] (the gate/up buffer's shape and layout, the output's) and its
//! rules (the module documentation of [`crate::layer_ops`] gives the definition).

use super::{bad, MAX_ELEM_BYTES, MAX_SIZE};
use crate::error::Result;

/// How the gate `g` and the up projection `u` lie in a row of the `[rows, 2·f]` input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GluLayout {
    /// `[g₀ … g_{f−1} | u₀ … u_{f−1}]`: the gate's and the up projection's weights stacked
    /// one after the other (`torch.chunk(x, 2, dim=-1)`, Megatron's and vLLM's
    /// `gate_up_proj`).
    #[default]
    Halves,
    /// `g₀, u₀, g₁, u₁, …`: the two weights' rows interleaved.
    Interleaved,
}

/// One SwiGLU problem: `y[rows, f] = silu(g)·u` over the `[rows, 2·f]` gate/up output (see the
/// module documentation). Made with [`SwiGlu::new`] and [`SwiGlu::with_ld`]; fields public to
/// be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwiGlu {
    /// Rows (tokens).
    pub rows: usize,
    /// Output columns `f` (the MLP's intermediate size); the input has `2·f`.
    pub f: usize,
    /// Where `g` and `u` lie in an input row.
    pub layout: GluLayout,
    /// Elements from one input row (and one input-gradient row) to the next, at least `2·f`.
    pub ld_in: usize,
    /// Elements from one output row (and one output-gradient row) to the next, at least `f`.
    pub ld_out: usize,
}

impl SwiGlu {
    /// `rows × 2·f` in, `rows × f` out, rows contiguous. Not checked here (problems are data):
    /// [`SwiGlu::validate`] and every call check it.
    pub fn new(rows: usize, f: usize, layout: GluLayout) -> SwiGlu {
        SwiGlu { rows, f, layout, ld_in: f.saturating_mul(2), ld_out: f }
    }

    /// The same with input rows `ld_in` and output rows `ld_out` elements apart.
    #[must_use]
    pub fn with_ld(self, ld_in: usize, ld_out: usize) -> SwiGlu {
        SwiGlu { ld_in, ld_out, ..self }
    }

    /// Elements the input (and the input gradient) must hold: `(rows − 1)·ld_in + 2·f` (0
    /// without rows or columns; saturating).
    pub fn in_elems(&self) -> usize {
        extent(self.rows, self.ld_in, self.f.saturating_mul(2))
    }

    /// Elements the output (and the output gradient) must hold: `(rows − 1)·ld_out + f`.
    pub fn out_elems(&self) -> usize {
        extent(self.rows, self.ld_out, self.f)
    }

    /// Where `g[r, j]` and `u[r, j]` lie in the input. Arithmetic only, no bounds check:
    /// meaningful for `r < rows`, `j < f` of a problem that passes [`SwiGlu::validate`].
    pub fn gate_up_index(&self, r: usize, j: usize) -> (usize, usize) {
        let row = r * self.ld_in;
        match self.layout {
            GluLayout::Halves => (row + j, row + self.f + j),
            GluLayout::Interleaved => (row + 2 * j, row + 2 * j + 1),
        }
    }

    /// Bytes the forward (`backward = false`) or the backward moves with `elem`-byte elements:
    /// `3·rows·f·elem` (read `g`, `u`, write `y`) or `5·rows·f·elem` (read `dy`, `g`, `u`,
    /// write `dg`, `du`).
    pub fn bytes_moved(&self, elem: usize, backward: bool) -> f64 {
        (if backward { 5.0 } else { 3.0 }) * self.rows as f64 * self.f as f64 * elem as f64
    }

    /// A short description: `rows8192 f14336 halves ld28672/14336`.
    pub fn describe(&self) -> String {
        let layout = match self.layout {
            GluLayout::Halves => "halves",
            GluLayout::Interleaved => "interleaved",
        };
        format!("rows{} f{} {layout} ld{}/{}", self.rows, self.f, self.ld_in, self.ld_out)
    }

    /// Checks every rule: `ld_in ≥ 2·f`, `ld_out ≥ f`, every size at most [`MAX_SIZE`] and the
    /// buffers' extents `(rows − 1)·ld + width` addressable: at most `isize::MAX` bytes of the
    /// widest element SwiGLU takes (f32, 4 bytes), so [`SwiGlu::in_elems`] and
    /// [`SwiGlu::out_elems`] and their bytes are exact.
    ///
    /// Zero sizes are allowed: with `rows = 0` or `f = 0` a call reads and writes nothing
    /// (its buffers may be empty, [`SwiGlu::in_elems`]) and returns `Ok` (as RoPE with zero
    /// tokens; RMSNorm instead refuses zero rows, [`crate::norm::RmsNorm::validate`]).
    ///
    /// # Errors
    /// [`crate::Error::LayerOp`] naming the rule and the values.
    pub fn validate(&self) -> Result<()> {
        let (op, d) = ("SwiGLU", || self.describe());
        for (name, v) in
            [("rows", self.rows), ("2·f", self.f.saturating_mul(2)), ("ld_in", self.ld_in), ("ld_out", self.ld_out)]
        {
            if v > MAX_SIZE {
                return bad(op, "a size is too large", format!("{name} = {v} > {MAX_SIZE} ({})", d()));
            }
        }
        if self.ld_in < 2 * self.f || self.ld_out < self.f {
            return bad(
                op,
                "a leading dimension is less than its row",
                format!("need ld_in ≥ 2·f, ld_out ≥ f ({})", d()),
            );
        }
        for (name, ld, width) in [("gate/up", self.ld_in, 2 * self.f), ("y", self.ld_out, self.f)] {
            let elems = (self.rows.max(1) - 1).checked_mul(ld).and_then(|x| x.checked_add(width));
            if elems.is_none_or(|e| e.checked_mul(MAX_ELEM_BYTES).is_none_or(|b| b > isize::MAX as usize)) {
                return bad(
                    op,
                    "a buffer's extent is not addressable (more than isize::MAX bytes of 4-byte elements)",
                    format!("{name}: ({} − 1)·{ld} + {width} elements ({})", self.rows, d()),
                );
            }
        }
        Ok(())
    }
}

/// `(rows − 1)·ld + cols`, 0 when empty, `usize::MAX` when it overflows.
fn extent(rows: usize, ld: usize, cols: usize) -> usize {
    if rows == 0 || cols == 0 {
        return 0;
    }
    (rows - 1).checked_mul(ld).and_then(|x| x.checked_add(cols)).unwrap_or(usize::MAX)
}
