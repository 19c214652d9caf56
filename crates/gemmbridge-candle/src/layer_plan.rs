//! The plans of RoPE ([`crate::rope`]) and SwiGLU ([`crate::swiglu`]): candle layouts as
//! gemmbridge's layer problems, the one description the CPU path
//! ([`crate::cpu_layer_ops`]) and the CUDA path both execute.
//!
//! RoPE rotates `x[b, h, t, d]` through a scratch fused QKV buffer: gemmbridge's RoPE
//! ([`gemmbridge::layer_ops::Rope`]) rotates the query and key heads of a fused buffer and has
//! no query-only form, so the `b·h` sequences of x are copied, two by two, into one query and
//! one key head per token (`[m, t, 3·d]`, `m = ⌈b·h/2⌉`), rotated in place and copied out (the
//! module `rope` says why in full).

use candle_core::{DType, Layout};
use gemmbridge::layer_ops::{GluLayout, Rope, RopeDirection, RopeStyle, SwiGlu};

use crate::plan;

/// `x[b, h, t, d]` rotated through a scratch fused QKV buffer (the module documentation): the
/// one description the CPU and the CUDA path execute.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopePlan {
    /// The scratch's problem: `m = ⌈b·h/2⌉` groups of `t` tokens, one query and one key head of
    /// `d` (rows `3·d` apart), angles from `[t, d/2]` tables, token `p` at position `p`.
    pub problem: Rope,
    /// Forward, or the backward's opposite angles.
    pub direction: RopeDirection,
    /// Sequences of x, `b·h`.
    pub seqs: usize,
    /// Storage offset of x's first element.
    pub x_start: usize,
    /// Elements from one of x's rows of `d` to the next (its `b`, `h`, `t` merged).
    pub x_rs: usize,
    /// Storage offsets of the cosine and sine tables.
    pub table_starts: [usize; 2],
}

/// A run of consecutive rows of x (and of the output) copied into one head of consecutive
/// scratch rows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    /// Rows of `d` elements.
    pub rows: usize,
    /// The first row's index among x's rows (= the output's dense rows).
    pub row: usize,
    /// The scratch element of the first row's head; rows `3·d` apart.
    pub slot: usize,
    /// Whether the rows are copied back out (not for the duplicated key head of an odd `b·h`).
    pub copy_out: bool,
}

impl RopePlan {
    /// The plan for x and the f32 tables `[t, d/2]` (contiguous), or `None` (x's rows do not
    /// merge into one stride over contiguous rows; a size gemmbridge's rules or candle's 32-bit
    /// CUDA copy kernels refuse; an empty x).
    pub(crate) fn new(
        x: &Layout,
        tables: [&Layout; 2],
        style: RopeStyle,
        direction: RopeDirection,
    ) -> Option<RopePlan> {
        let &[b, h, t, d] = x.dims() else { return None };
        let (st, seqs) = (x.stride(), b * h);
        let rows = seqs * t;
        if rows == 0 || d == 0 || st[3] != 1 {
            return None;
        }
        let x_rs = match plan::merged_stride(&x.dims()[..3], &st[..3])? {
            0 if rows > 1 => return None,
            0 => d,
            s => s,
        };
        if x_rs < d || tables.iter().any(|l| l.dims() != [t, d / 2] || !l.is_contiguous()) {
            return None;
        }
        let problem = Rope::new(seqs.div_ceil(2), t, (1, 1), d).with_style(style).with_tables(t);
        problem.validate().ok()?;
        let x_extent = (rows - 1).checked_mul(x_rs)?.checked_add(d)?;
        if x_extent > u32::MAX as usize || problem.qkv_elems() > u32::MAX as usize {
            return None;
        }
        let table_starts = [tables[0].start_offset(), tables[1].start_offset()];
        Some(RopePlan { problem, direction, seqs, x_start: x.start_offset(), x_rs, table_starts })
    }

    /// Elements of the output, `b·h·t·d`.
    pub(crate) fn out_elems(&self) -> usize {
        self.seqs * self.problem.seq * self.problem.head_dim
    }

    /// The copies between x (or the output) and the scratch: sequences `0..m` into the query
    /// heads, `m..b·h` into the key heads, and for an odd `b·h` the last group's query rows
    /// again into its key head (not copied out).
    pub(crate) fn blocks(&self) -> Vec<Block> {
        let p = &self.problem;
        let (m, t, d) = (p.batch, p.seq, p.head_dim);
        let mut blocks = vec![Block { rows: m * t, row: 0, slot: 0, copy_out: true }];
        if self.seqs > m {
            blocks.push(Block { rows: (self.seqs - m) * t, row: m * t, slot: d, copy_out: true });
        }
        if self.seqs < 2 * m {
            blocks.push(Block { rows: t, row: (m - 1) * t, slot: (m - 1) * t * p.ld + d, copy_out: false });
        }
        blocks
    }
}

/// SwiGLU over the rows of `gu[.., 2·f]` (its leading dimensions merged into one row stride),
/// `y` dense `[rows, f]`: the one description the CPU and the CUDA path execute.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GluPlan {
    /// The problem (gu's rows `ld_in` apart, `y` and `dy` dense; `dgu` as gu).
    pub problem: SwiGlu,
    /// Storage offset of gu.
    pub start: usize,
}

impl GluPlan {
    /// gu's rows as the problem's rows, or `None` (a dtype gemmbridge does not take, an empty
    /// gu, a strided last dimension, leading dimensions that do not merge into one stride).
    pub(crate) fn new(gu: &Layout, dtype: DType) -> Option<GluPlan> {
        plan::element(dtype)?;
        let (dims, st) = (gu.dims(), gu.stride());
        let r = dims.len();
        let n = *dims.last()?;
        let rows: usize = dims[..r - 1].iter().product();
        if n < 2 || rows == 0 || st[r - 1] != 1 {
            return None;
        }
        let ld = match plan::merged_stride(&dims[..r - 1], &st[..r - 1])? {
            0 if rows > 1 => return None,
            0 => n,
            s => s,
        };
        if ld < n {
            return None;
        }
        let problem = SwiGlu::new(rows, n / 2, GluLayout::Halves).with_ld(ld, n / 2);
        problem.validate().ok()?;
        Some(GluPlan { problem, start: gu.start_offset() })
    }
}
