//! Grouped GEMM for mixture-of-experts layers as data: [`GroupedProblem`], the three products
//! of an expert layer over tokens sorted by expert ([`GroupedOp`]), group sizes from host counts
//! or from PyTorch-style offsets, every rule checked on the CPU before anything is launched,
//! and each group as an ordinary [`GemmProblem`] on its slice of the buffers
//! ([`GroupedProblem::group`]), which is how a backend runs it. The module
//! [`self::reference`] holds the float64 definitions tests check against; [`self::fp8`] the
//! CPU emulation of an FP8 grouped product (operands quantised per group, each group in the
//! TN form of [`GroupedProblem::tn_operand`]); [`self::streams`] the ways to run one
//! ([`streams::candidates`]) and the pool-of-streams schedule as data.
//!
//! E experts (groups), `m_e` tokens routed to expert `e` (any of them 0), `M = Σ m_e` rows,
//! the layer maps K input features to N output features; every matrix row-major and
//! contiguous:
//! - [`GroupedOp::Forward`]: `y[M, N] = x[M, K] · w[e][N, K]ᵀ` (+ `bias[e][N]`), rows of x
//!   and y sorted by group (group e's rows start at `Σ_{f<e} m_f`); w is `[E, N, K]`
//!   (`nn.Linear`'s layout per expert), bias `[E, N]`.
//! - [`GroupedOp::BackwardData`]: `dx[M, K] = dy[M, N] · w[e][N, K]`.
//! - [`GroupedOp::BackwardWeight`]: `dw[e][N, K] = dy[e]ᵀ · x[e]` over group e's rows (the
//!   product's inner dimension is `m_e`: an empty group gives a zero `dw[e]`).
//!
//! Rows past the last group (offsets that end before the buffers' rows) belong to no group:
//! nothing reads or writes them.
//!
//! f32, tf32, f16 and bf16 (f32 accumulation); a bias per group for the forward
//! ([`GroupedProblem::with_bias`], `bias[E, N]`). Group sizes are host counts; PyTorch's `offs`
//! on the device come over with a copy to the host (`gpu.stream().clone_dtoh(&offs)`, a wait on
//! the engine's stream, not capturable) and [`GroupedProblem::from_offsets`]. Without a GPU,
//! [`crate::cpu::grouped_gemm`] runs the same problem on host slices.
//!
//! ```no_run
//! use gemmbridge::cuda::{Fp8Options, Gpu};
//! use gemmbridge::fp8::{Fp8Format, Scaling};
//! use gemmbridge::grouped::{GroupedOp, GroupedOperand, GroupedProblem};
//! use gemmbridge::half::bf16;
//! use gemmbridge::Precision;
//!
//! let gpu = Gpu::new(0)?;
//! // 4 experts mapping 2048 features to 768; the router sent 300, 0, 17 and 707 tokens
//! let (sizes, n, k) = ([300, 0, 17, 707], 768, 2048);
//! let fwd = GroupedProblem::new(GroupedOp::Forward, &sizes, n, k, Precision::BF16)?;
//! let [lx, lw, ly] = fwd.lens(); // x[M, K], w[E, N, K] (nn.Linear's layout per expert), y[M, N]
//! let s = gpu.stream();
//! let (x, w) = (s.alloc_zeros::<bf16>(lx)?, s.alloc_zeros::<bf16>(lw)?);
//! let mut y = s.alloc_zeros::<bf16>(ly)?;
//! gpu.grouped_gemm(&fwd, &x, &w, &mut y, None)?; // y = x · w[e]ᵀ per expert
//! // the backward: dx = dy · w[e] and dw[e] = dy[e]ᵀ · x[e] (an empty group's dw[e] is zeros)
//! let dy = s.alloc_zeros::<bf16>(ly)?;
//! let (mut dx, mut dw) = (s.alloc_zeros::<bf16>(lx)?, s.alloc_zeros::<bf16>(lw)?);
//! let dgrad = GroupedProblem::new(GroupedOp::BackwardData, &sizes, n, k, Precision::BF16)?;
//! gpu.grouped_gemm(&dgrad, &dy, &w, &mut dx, None)?;
//! let wgrad = GroupedProblem::new(GroupedOp::BackwardWeight, &sizes, n, k, Precision::BF16)?;
//! gpu.grouped_gemm(&wgrad, &dy, &x, &mut dw, None)?;
//! // FP8 (Hopper): each group quantised on its own, in the TN form FP8 kernels read; A and B
//! // are grouped_gemm's first and second buffers, for any of the three products
//! let qx = gpu.fp8().grouped_quantize(&fwd, GroupedOperand::A, &x, Fp8Format::E4M3, Scaling::Row)?;
//! let qw = gpu.fp8().grouped_quantize(&fwd, GroupedOperand::B, &w, Fp8Format::E4M3, Scaling::Row)?;
//! gpu.fp8().grouped_gemm(&fwd, &qx, &qw, &mut y, None, Fp8Options::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How it runs
//! `gpu.plans().grouped_backend(&p)` says which way ([`streams::GroupedBackend`]; a setting of the
//! engine forces one), by a rule measured on the H100 and the H200: equal groups without a bias
//! as one strided-batched GEMM (`StridedBatch`); small unequal groups (at most 1024³
//! multiply-adds each on average) of a forward or backward data as one
//! `cublasGemmGroupedBatchedEx` (`GroupedBatched`); otherwise — every backward weight among them
//! — each group's GEMM (cuBLASLt, a plan per shape, kept) on a
//! pool of the engine's own streams (`StreamPool`, 4 by default), forked from and joined back to
//! the engine's stream with events, so that experts run side by side (in order on the engine's
//! stream where one group has rows). A pooled call repeated on the same buffers and sizes is
//! captured once into one CUDA graph and then replayed with a single launch. Capturing a grouped
//! call yourself works for every way but cuBLAS's grouped call (its pointer arrays are copied
//! from the host: [`crate::Error::NotCapturable`]); force `StreamPool` before capturing small
//! unequal groups. cuDNN's MoE grouped matmul (`Cudnn`, cuDNN 9.18 and later: one operation
//! over every group, the group starts written by a kernel launch) is a candidate that
//! `GpuTuning::grouped` measures and a setting can force; on Hopper with cuDNN 9.19 it was several
//! times slower on skewed groups and has no backward data. Every buffer and every group is
//! checked before anything is launched. [`crate::moe`] has a MoE layer's routing on the device.
//!
//! Measured instead of the rule: `GpuTuning::grouped(&p, (&a, &b), &mut c, None, 10)` times
//! every way on your buffers and keeps the fastest for every problem of that layer alike in
//! total rows and skew ([`GroupedProblem::signature`]); the tactic it returns goes into a tactic
//! database (kind `grouped_gemm`). `gemmbridge tune --ops grouped,grouped_dx,grouped_dw` does it
//! for the benchmark's shapes and stores only what beats the rule.
//!
//! # Other forms
//! - By address (other frameworks' buffers): `unsafe { gpu.grouped_gemm_raw(&p, [a, b, c], bias,
//!   stream) }` with `RawBuffer`s, as `gemm_raw` for one GEMM.
//! - FP8, every recipe of the FP8 GEMM: `GpuFp8::grouped_quantize` makes one operand per group in
//!   the TN form ([`GroupedProblem::tn_operand`] says which: the forward's `x_e[m_e, K]` and
//!   `w_e[N, K]`, the backward data's `dy_e[m_e, N]` and `w_eᵀ[K, N]`, the backward weight's
//!   `dy_eᵀ[N, m_e]` and `x_eᵀ[K, m_e]`), each with its own scales; `GpuFp8::grouped_gemm` runs
//!   one FP8 GEMM per group on the pool of streams, output bf16, f16 or f32. A backward weight's
//!   empty group gets zeros (β = 0) or keeps its `dw[e]` (β = 1, accumulating); another β with an
//!   empty group is refused.

pub mod align;
pub mod fp8;
pub mod reference;
pub mod streams;
pub mod tn;

pub use tn::TnOperand;

use crate::error::{Error, Result, Which};
use crate::layout::{MatrixLayout, Operand};
use crate::precision::Precision;
use crate::problem::{GemmProblem, MAX_DIM};
use crate::Epilogue;

/// Which product of an expert layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupedOp {
    /// `y = x · w[e]ᵀ (+ bias[e])` per group.
    Forward,
    /// `dx = dy · w[e]` per group.
    BackwardData,
    /// `dw[e] = dy[e]ᵀ · x[e]` per group.
    BackwardWeight,
}

impl GroupedOp {
    /// The buffers' names in argument order `[a, b, c]`: forward `(x, w, y)`, backward data
    /// `(dy, w, dx)`, backward weight `(dy, x, dw)`.
    pub const fn names(self) -> [&'static str; 3] {
        match self {
            GroupedOp::Forward => ["x", "w", "y"],
            GroupedOp::BackwardData => ["dy", "w", "dx"],
            GroupedOp::BackwardWeight => ["dy", "x", "dw"],
        }
    }

    /// The three buffers as errors name them ([`Which::Grouped`], by [`GroupedOp::names`]).
    pub const fn operands(self) -> [Which; 3] {
        let [a, b, c] = self.names();
        [Which::Grouped(a), Which::Grouped(b), Which::Grouped(c)]
    }
}

/// One of the two operands of a grouped product, in [`crate::cuda::Gpu::grouped_gemm`]'s
/// argument order ([`GroupedOp::names`]): what [`crate::cuda::GpuFp8::grouped_quantize`] splits
/// into one FP8 operand per group ([`GroupedProblem::tn_operand`] says where each lies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupedOperand {
    /// The first: the forward's `x[rows, K]`, a backward's `dy[rows, N]` (rows sorted by
    /// group: group e is its `m_e` rows from [`GroupedProblem::row_start`]).
    A,
    /// The second: `w[E, N, K]` for the forward and the backward data (group e is expert e's
    /// `[N, K]`), the backward weight's `x[rows, K]` (group e is its rows).
    B,
}

/// A validated grouped product (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupedProblem {
    op: GroupedOp,
    sizes: Vec<usize>,
    /// Rows of the row-indexed buffers (at least `Σ m_e`).
    rows: usize,
    n: usize,
    k: usize,
    precision: Precision,
    bias: bool,
}

impl GroupedProblem {
    /// A grouped product with `sizes[e] = m_e` rows per group (host counts), N = `n`,
    /// K = `k`, the buffers' rows exactly `Σ m_e`.
    ///
    /// # Errors
    /// [`Error::GroupedShape`]: no group, N or K zero, a group size, E, N, K or the total
    /// above [`MAX_DIM`], a buffer too large to address.
    pub fn new(op: GroupedOp, sizes: &[usize], n: usize, k: usize, precision: Precision) -> Result<GroupedProblem> {
        let rows = sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m)).unwrap_or(usize::MAX);
        let p = GroupedProblem { op, sizes: sizes.to_vec(), rows, n, k, precision, bias: false };
        p.validate()?;
        Ok(p)
    }

    /// A grouped product from PyTorch's `offs` (`torch._grouped_mm`): `offsets[e]` is where
    /// group e's rows end (so `m_e = offsets[e] − offsets[e−1]`, `offsets[−1] = 0`), over
    /// buffers of `rows` rows; rows from the last offset on belong to no group.
    ///
    /// # Errors
    /// [`Error::GroupedShape`]: an offset negative, below the one before it or past `rows`,
    /// and as [`GroupedProblem::new`].
    pub fn from_offsets(
        op: GroupedOp,
        offsets: &[i32],
        rows: usize,
        n: usize,
        k: usize,
        precision: Precision,
    ) -> Result<GroupedProblem> {
        let mut sizes = Vec::with_capacity(offsets.len());
        let mut end = 0usize;
        for (e, &o) in offsets.iter().enumerate() {
            let bad = |what| Err(Error::GroupedShape { what, detail: format!("offsets[{e}] = {o} ({rows} rows)") });
            if o < 0 {
                return bad("an offset is negative");
            }
            let o = o as usize;
            if o < end {
                let what = "the offsets are not monotone";
                return Err(Error::GroupedShape {
                    what,
                    detail: format!("offsets[{e}] = {o} < offsets[{}] = {end}", e - 1),
                });
            }
            if o > rows {
                return bad("an offset is past the rows");
            }
            sizes.push(o - end);
            end = o;
        }
        let p = GroupedProblem { op, sizes, rows, n, k, precision, bias: false };
        p.validate()?;
        Ok(p)
    }

    /// The same forward with a bias per group, `bias[E, N]` (added to every row of the group).
    ///
    /// # Errors
    /// [`Error::GroupedShape`] for a backward product (a bias gradient is a sum over rows,
    /// not a product's epilogue here).
    pub fn with_bias(self) -> Result<GroupedProblem> {
        if self.op != GroupedOp::Forward {
            return Err(Error::GroupedShape {
                what: "a bias belongs to the forward only",
                detail: format!("{:?}", self.op),
            });
        }
        Ok(GroupedProblem { bias: true, ..self })
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::GroupedShape { what, detail });
        if self.sizes.is_empty() {
            return bad("there is no group", "E = 0".into());
        }
        if self.n == 0 || self.k == 0 {
            return bad("N or K is zero", format!("N = {}, K = {}", self.n, self.k));
        }
        if let Some((e, m)) = self.sizes.iter().enumerate().find(|(_, &m)| m > MAX_DIM) {
            return bad("a group is too large", format!("m[{e}] = {m} > {MAX_DIM}"));
        }
        let total = self.sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m)).filter(|&t| t <= MAX_DIM);
        let Some(total) = total else {
            let sum: u128 = self.sizes.iter().map(|&m| m as u128).sum();
            return bad(
                "the groups' rows add up to more than 2³¹ − 1",
                format!("Σ m_e = {sum} over {} groups", self.sizes.len()),
            );
        };
        for (name, v) in [("N", self.n), ("K", self.k), ("E", self.sizes.len()), ("rows", self.rows)] {
            if v > MAX_DIM {
                return bad("a size is too large", format!("{name} = {v} > {MAX_DIM}"));
            }
        }
        if total > self.rows {
            return bad("the groups' rows exceed the buffers'", format!("Σ m_e = {total}, rows = {}", self.rows));
        }
        // every buffer addressable in bytes of the widest element (f32)
        let max = isize::MAX as usize / 4;
        let (m, e, n, k) = (self.rows, self.sizes.len(), self.n, self.k);
        let elems = [m.checked_mul(n.max(k)), e.checked_mul(n).and_then(|x| x.checked_mul(k))];
        if elems.iter().any(|x| x.is_none_or(|x| x > max)) {
            return bad(
                "a buffer is too large to address",
                format!("rows·max(N, K) = {m}·{}, E·N·K = {e}·{n}·{k}", n.max(k)),
            );
        }
        Ok(())
    }

    /// The product.
    pub fn op(&self) -> GroupedOp {
        self.op
    }

    /// `m_e` per group.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Groups E.
    pub fn groups(&self) -> usize {
        self.sizes.len()
    }

    /// Rows of the row-indexed buffers (x, y, dy, dx).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// N (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// K (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Storage and arithmetic.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether the forward adds a bias per group.
    pub fn has_bias(&self) -> bool {
        self.bias
    }

    /// Whether the problem's precision has one element type for every buffer, as every
    /// grouped way takes it (its own [`check_one_type`]).
    ///
    /// # Errors
    /// As [`check_one_type`].
    pub(crate) fn check_one_type(&self) -> Result<()> {
        check_one_type(self.precision, &self.describe())
    }

    /// Whether a bias is given (`given`) exactly when the problem has one.
    ///
    /// # Errors
    /// [`Error::EpilogueOperand`] (operand "bias": "is required but missing" or "was given but
    /// is not used").
    pub fn check_bias(&self, given: bool) -> Result<()> {
        match (self.bias, given) {
            (true, false) => Err(Error::EpilogueOperand {
                epilogue: Epilogue::Bias,
                operand: "bias",
                problem: "is required but missing",
            }),
            (false, true) => Err(Error::EpilogueOperand {
                epilogue: Epilogue::Bias,
                operand: "bias",
                problem: "was given but is not used",
            }),
            _ => Ok(()),
        }
    }

    /// Where group `e`'s rows start (`e` up to the number of groups: `row_start(E)` is where
    /// the groups end).
    ///
    /// # Panics
    /// For `e` past the number of groups.
    pub fn row_start(&self, e: usize) -> usize {
        self.sizes[..e].iter().sum()
    }

    /// Elements of the buffers `[a, b, c]` (argument order, [`GroupedOp::names`]); the bias,
    /// when there is one, has `E·N`.
    /// Saturates at `usize::MAX` for sizes no buffer can have.
    pub fn lens(&self) -> [usize; 3] {
        let (m, e, n, k) = (self.rows, self.groups(), self.n, self.k);
        let (mk, mn, enk) = (m.saturating_mul(k), m.saturating_mul(n), e.saturating_mul(n).saturating_mul(k));
        match self.op {
            GroupedOp::Forward => [mk, enk, mn],
            GroupedOp::BackwardData => [mn, enk, mk],
            GroupedOp::BackwardWeight => [mn, mk, enk],
        }
    }

    /// Group `e` as an ordinary row-major GEMM and where its operands start in the buffers
    /// (elements, `[a, b, c]`): forward `y_e = x_e·w_eᵀ` ([`GemmProblem::linear`], with
    /// [`Epilogue::Bias`] when there is a bias, whose start is `e·N`); backward data
    /// `dx_e = dy_e·w_e` ([`GemmProblem::matmul`]); backward weight `dw_e = dy_eᵀ·x_e`
    /// (`op(A)` the transpose of `dy_e[m_e, N]`, inner dimension `m_e`: 0 for an empty group,
    /// where β = 0 gives zeros).
    ///
    /// # Errors
    /// [`Error::GroupedShape`] for a group past the last; as [`GemmProblem::new`] (the sizes
    /// were checked, so only for sizes cuBLAS cannot take).
    pub fn group(&self, e: usize) -> Result<(GemmProblem, [usize; 3])> {
        if e >= self.groups() {
            return Err(Error::GroupedShape {
                what: "there is no such group",
                detail: format!("group {e} of {}", self.groups()),
            });
        }
        let (m, r0, n, k) = (self.sizes[e], self.row_start(e), self.n, self.k);
        let w0 = e * n * k;
        Ok(match self.op {
            GroupedOp::Forward => {
                let p = GemmProblem::linear(m, n, k, self.precision)?;
                let p = if self.bias { p.with_epilogue(Epilogue::Bias)? } else { p };
                (p, [r0 * k, w0, r0 * n])
            }
            GroupedOp::BackwardData => (GemmProblem::matmul(m, k, n, self.precision)?, [r0 * n, w0, r0 * k]),
            GroupedOp::BackwardWeight => {
                let p = GemmProblem::new(
                    Operand::t(MatrixLayout::row_major(m, n)),
                    Operand::n(MatrixLayout::row_major(m, k)),
                    MatrixLayout::row_major(n, k),
                    1,
                    self.precision,
                )?;
                (p, [r0 * n, r0 * k, w0])
            }
        })
    }

    /// How many groups have rows (`m_e > 0`).
    pub fn busy_groups(&self) -> usize {
        self.sizes.iter().filter(|&&m| m > 0).count()
    }

    /// Multiply-adds of all groups: `Σ m_e · N · K`.
    pub fn macs(&self) -> f64 {
        self.sizes.iter().map(|&m| m as f64).sum::<f64>() * self.n as f64 * self.k as f64
    }

    /// The key of this problem's measured backend in a tactic database (kind "grouped_gemm"):
    /// `grouped_gemm <op> e<E> n<N> k<K> m<bucket> <spread> <precision>[ bias]`, where the
    /// bucket is the next power of two ≥ Σ m_e (as a GEMM key buckets M) and the spread is
    /// `equal` (every group of one non-zero size) or `skew<s>`, `s` = log₂(largest group / mean
    /// group with rows) rounded: group sizes change every step, so problems of one layer whose
    /// totals and skew are alike share a choice. Example:
    /// `grouped_gemm forward e128 n768 k2048 m32768 skew5 bf16`.
    pub fn signature(&self) -> String {
        let busy = self.busy_groups().max(1);
        let total: usize = self.sizes.iter().sum();
        let max = self.sizes.iter().copied().max().unwrap_or(0);
        let first = self.sizes[0];
        let spread = if first > 0 && self.sizes.iter().all(|&m| m == first) {
            "equal".to_string()
        } else {
            let ratio = max as f64 * busy as f64 / total.max(1) as f64;
            format!("skew{}", ratio.max(1.0).log2().round() as u32)
        };
        let op = match self.op {
            GroupedOp::Forward => "forward",
            GroupedOp::BackwardData => "backward_data",
            GroupedOp::BackwardWeight => "backward_weight",
        };
        format!(
            "grouped_gemm {op} e{} n{} k{} m{} {spread} {}{}",
            self.groups(),
            self.n,
            self.k,
            total.max(1).next_power_of_two(),
            self.precision,
            if self.bias { " bias" } else { "" }
        )
    }

    /// A short description: `forward E8 M4096 (0..1024 rows per group) N14336 K4096 bf16`.
    pub fn describe(&self) -> String {
        let (lo, hi) = (self.sizes.iter().min().unwrap_or(&0), self.sizes.iter().max().unwrap_or(&0));
        format!(
            "{:?} E{} M{} ({lo}..{hi} rows per group) N{} K{} {}{}",
            self.op,
            self.groups(),
            self.rows,
            self.n,
            self.k,
            self.precision,
            if self.bias { " +bias" } else { "" }
        )
    }
}

/// Whether `precision` has one element type for every buffer (its input and output types
/// agree), as every grouped way takes it: the grouped entries hand each GEMM one typed buffer
/// list. `what` names the call in the error.
///
/// # Errors
/// [`Error::Unsupported`] naming `what` and the precision.
pub(crate) fn check_one_type(precision: Precision, what: &str) -> Result<()> {
    if precision.input() != precision.output() {
        let what = format!("{what}: one element type for every buffer, so the output's must be the inputs'");
        return Err(Error::Unsupported { backend: "grouped GEMM", what });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
