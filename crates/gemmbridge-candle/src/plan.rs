//! candle layouts as gemmbridge problems: what decides whether a call is served, and the one
//! description both the CPU and the CUDA path execute.
//!
//! A candle tensor is `dims`, `stride` (in elements, 0 for a broadcast dimension; any value for
//! a dimension of size 1) and a start offset into its storage. Every plan here reads the
//! storage in place, at those strides; where a tensor's strides cannot be described (a row
//! stride below the row's length, leading dimensions that do not merge into one stride), the
//! plan is `None` and the caller copies the tensor contiguous and plans again, or falls back to
//! candle's own operation.

use candle_core::{DType, Layout};
use gemmbridge::attention::{Attention, AttnMask, AttnTensor, HeadLayout};
use gemmbridge::norm::{NormTensor, RmsNorm};
use gemmbridge::{Epilogue, GemmProblem, MatrixLayout, Operand, Precision};

/// gemmbridge's element type for a candle dtype it serves (f32, f16, bf16).
pub(crate) fn element(dtype: DType) -> Option<gemmbridge::DType> {
    match dtype {
        DType::F32 => Some(gemmbridge::DType::F32),
        DType::F16 => Some(gemmbridge::DType::F16),
        DType::BF16 => Some(gemmbridge::DType::BF16),
        _ => None,
    }
}

/// The GEMM precision for `dtype`: strict f32, or f16/bf16 with f32 accumulation; with
/// `f32_out` the f16/bf16 forms that write f32 (the CPU path's epilogue input).
pub(crate) fn precision(dtype: DType, f32_out: bool) -> Option<Precision> {
    Some(match (dtype, f32_out) {
        (DType::F32, _) => Precision::F32,
        (DType::F16, false) => Precision::F16,
        (DType::F16, true) => Precision::F16_F32OUT,
        (DType::BF16, false) => Precision::BF16,
        (DType::BF16, true) => Precision::BF16_F32OUT,
        _ => return None,
    })
}

/// The stride `s` that walks `dims` in row-major order (`stride[i] = s·Π dims[i+1..]` for every
/// dimension of size above 1), or `None`; `Some(0)` where every dimension above 1 has stride
/// 0 (a broadcast) or there is none.
pub(crate) fn merged_stride(dims: &[usize], stride: &[usize]) -> Option<usize> {
    let inner = (0..dims.len()).rev().find(|&i| dims[i] > 1);
    let Some(inner) = inner else { return Some(0) };
    let s = stride[inner];
    let mut below = 1usize;
    for i in (0..dims.len()).rev() {
        if dims[i] > 1 && stride[i] != s.checked_mul(below)? {
            return None;
        }
        below = below.checked_mul(dims[i])?;
    }
    Some(s)
}

/// The matrix `[rows, cols]` with row stride `rs` and column stride `cs` as a stored row-major
/// matrix and its op (batch stride 0, set by the caller): `N` where the columns are
/// contiguous, `T` (the row-major `[cols, rows]` view) where the rows are; `None` otherwise.
fn matrix(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<Operand> {
    let n_ld = if rows == 1 { cols } else { rs };
    if (cs == 1 || cols == 1) && n_ld >= cols {
        let l = MatrixLayout { rows, cols, ld: n_ld, batch_stride: 0 };
        return Some(Operand::n(l));
    }
    let t_ld = if cols == 1 { rows } else { cs };
    if (rs == 1 || rows == 1) && t_ld >= rows {
        let l = MatrixLayout { rows: cols, cols: rows, ld: t_ld, batch_stride: 0 };
        return Some(Operand::t(l));
    }
    None
}

/// Whether `l` (`[..., rows, cols]`) can be read in place as an operand of a batched matmul
/// over the output batch dimensions `batch`.
pub(crate) fn operand_in_place(l: &Layout, batch: &[usize]) -> bool {
    batched_operand(l, batch).is_some()
}

/// An operand `[..batch, rows, cols]` (its batch dimensions right-aligned to the output's
/// `batch`, absent or of size 1 where it is broadcast) with its batch stride over the
/// flattened output batch.
fn batched_operand(l: &Layout, batch: &[usize]) -> Option<Operand> {
    let (dims, stride) = (l.dims(), l.stride());
    let r = dims.len();
    let mut op = matrix(dims[r - 2], dims[r - 1], stride[r - 2], stride[r - 1])?;
    // the operand's stride for each output batch dimension: 0 where it broadcasts
    let lead = batch.len() - (r - 2);
    let eff: Vec<usize> =
        (0..batch.len()).map(|i| if i < lead || dims[i - lead] == 1 { 0 } else { stride[i - lead] }).collect();
    op.layout.batch_stride = merged_stride(batch, &eff)?;
    Some(op)
}

/// A broadcast batched matmul `a[..., m, k]·b[..., k, n]` as one strided batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatmulPlan {
    /// The problem (C dense `[batch, m, n]`).
    pub problem: GemmProblem,
    /// Storage offsets of A and B.
    pub starts: [usize; 2],
}

/// `a`'s and `b`'s layouts as one strided batch over the broadcast `batch`, or `None`.
pub(crate) fn matmul(a: &Layout, b: &Layout, batch: &[usize], dtype: DType) -> Option<MatmulPlan> {
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let count: usize = batch.iter().product();
    if m == 0 || n == 0 || k == 0 || count == 0 {
        return None;
    }
    let (oa, ob) = (batched_operand(a, batch)?, batched_operand(b, batch)?);
    let problem = GemmProblem::new(oa, ob, MatrixLayout::row_major(m, n), count, precision(dtype, false)?).ok()?;
    Some(MatmulPlan { problem, starts: [a.start_offset(), b.start_offset()] })
}

/// A linear layer `y[.., n] = act(x[.., k]·w[n, k]ᵀ + bias)` as one GEMM over the rows of x.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinearPlan {
    /// The problem with its epilogue (C dense `[rows, n]`).
    pub problem: GemmProblem,
    /// Storage offsets of x, w and the bias.
    pub starts: [usize; 3],
}

/// x's rows (its leading dimensions merged) as A and w as op(B) = wᵀ, or `None`.
pub(crate) fn linear(
    x: &Layout,
    w: &Layout,
    bias: Option<&Layout>,
    epilogue: Epilogue,
    dtype: DType,
) -> Option<LinearPlan> {
    let (xd, xs) = (x.dims(), x.stride());
    let r = xd.len();
    let (k, rows) = (xd[r - 1], xd[..r - 1].iter().product::<usize>());
    let n = w.dims()[0];
    if k == 0 || n == 0 || rows == 0 {
        return None;
    }
    // rows that all share one row (a broadcast x) read as ld 0: not a GEMM operand
    let rs = match merged_stride(&xd[..r - 1], &xs[..r - 1])? {
        0 if rows > 1 => return None,
        0 => k,
        s => s,
    };
    let a = matrix(rows, k, rs, xs[r - 1])?;
    let ws = w.stride();
    let b = matrix(k, n, ws[1], ws[0])?;
    if let Some(bl) = bias {
        if !(bl.dims() == [n] && (n == 1 || bl.stride()[0] == 1)) {
            return None;
        }
    }
    let problem = GemmProblem::new(a, b, MatrixLayout::row_major(rows, n), 1, precision(dtype, false)?).ok()?;
    let problem = problem.with_epilogue(epilogue).ok()?;
    Some(LinearPlan { problem, starts: [x.start_offset(), w.start_offset(), bias.map_or(0, |b| b.start_offset())] })
}

/// The same problem with its output in f32 and no epilogue: the CPU path's GEMM, whose f32
/// result the bias and activation are applied to before the one rounding.
pub(crate) fn f32_out(p: &GemmProblem, dtype: DType) -> Option<GemmProblem> {
    GemmProblem::new(p.a(), p.b(), p.c(), p.batch(), precision(dtype, true)?).ok()
}

/// RMSNorm over the last dimension of `x[.., c]` with weight `w[c]`: the rows of x read in
/// place (leading dimensions merged into one row stride), `y` dense.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormPlan {
    /// The problem (x strided, y, dy and dx dense).
    pub problem: RmsNorm,
    /// Storage offsets of x and w.
    pub starts: [usize; 2],
}

/// x's rows as the norm's rows, or `None` (strides that do not merge, a weight that is not
/// `[c]` and contiguous, a dtype gemmbridge's norm does not take, an empty tensor; with
/// `dense_rows`, a row stride other than `c`).
///
/// `dense_rows` is for the CUDA path: cuDNN's norm graph refuses strided rows (cuDNN 9.14 on an
/// H100, `gemmbridge probe --only norm`; docs/DESIGN.md), so there padded rows are copied
/// contiguous first, where the CPU backend reads them in place.
pub(crate) fn rms_norm(x: &Layout, w: &Layout, eps: f32, dtype: DType, dense_rows: bool) -> Option<NormPlan> {
    let (xd, xs) = (x.dims(), x.stride());
    let r = xd.len();
    let (c, rows) = (xd[r - 1], xd[..r - 1].iter().product::<usize>());
    if c == 0 || rows == 0 || (c > 1 && xs[r - 1] != 1) || w.dims() != [c] || (c > 1 && w.stride()[0] != 1) {
        return None;
    }
    let ld = match merged_stride(&xd[..r - 1], &xs[..r - 1])? {
        0 if rows > 1 => return None,
        0 => c,
        s => s,
    };
    if ld < c || (dense_rows && rows > 1 && ld != c) {
        return None;
    }
    let problem = RmsNorm::new(rows, c, eps, element(dtype)?).with_ld(NormTensor::X, ld);
    problem.validate().ok()?;
    Some(NormPlan { problem, starts: [x.start_offset(), w.start_offset()] })
}

/// Scaled-dot-product attention on `q[b, h_q, s_q, d]`, `k`, `v[b, h_kv, s_kv, d]` read in
/// their strides (any strides with a contiguous head dimension), `o` dense `[b, h_q, s_q, d]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnPlan {
    /// The problem.
    pub problem: Attention,
    /// Storage offsets of q, k and v.
    pub starts: [usize; 3],
}

/// The attention problem, or `None` where gemmbridge's rules refuse it (f32, a head dimension
/// that is not a multiple of 8, mismatched shapes, strides it cannot take).
pub(crate) fn attention([q, k, v]: [&Layout; 3], causal: bool, scale: Option<f32>, dtype: DType) -> Option<AttnPlan> {
    let (qd, kd) = (q.dims(), k.dims());
    if qd.len() != 4 || kd.len() != 4 || v.dims() != kd || qd[0] != kd[0] || qd[3] != kd[3] {
        return None;
    }
    let elem = dtype.size_in_bytes();
    // cuDNN's engines take 16-byte aligned addresses; candle's buffers start aligned
    let heads = |l: &Layout| {
        let s = l.stride();
        (s[3] == 1 && (l.start_offset() * elem).is_multiple_of(16)).then_some(HeadLayout {
            batch: s[0],
            head: s[1],
            seq: s[2],
        })
    };
    let (b, d) = (qd[0], qd[3]);
    let mut p = Attention::new(b, (qd[1], kd[1]), (qd[2], kd[2]), d, element(dtype)?)
        .with_layout(AttnTensor::Q, heads(q)?)
        .with_layout(AttnTensor::K, heads(k)?)
        .with_layout(AttnTensor::V, heads(v)?)
        .with_layout(AttnTensor::O, HeadLayout::bhsd(qd[2], qd[1], d));
    if causal {
        p = p.with_mask(AttnMask::Causal);
    }
    if let Some(s) = scale {
        p = p.with_scale(s);
    }
    p.validate().ok()?;
    Some(AttnPlan { problem: p, starts: [q.start_offset(), k.start_offset(), v.start_offset()] })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Shape;

    #[test]
    fn merged_strides() {
        assert_eq!(merged_stride(&[2, 3], &[3, 1]), Some(1));
        assert_eq!(merged_stride(&[2, 3], &[30, 10]), Some(10));
        assert_eq!(merged_stride(&[2, 1, 3], &[3, 99, 1]), Some(1)); // size-1 strides are free
        assert_eq!(merged_stride(&[2, 3], &[0, 0]), Some(0));
        assert_eq!(merged_stride(&[2, 3], &[4, 1]), None); // padding between the rows of dim 0
        assert_eq!(merged_stride(&[], &[]), Some(0));
    }

    #[test]
    fn a_transposed_operand_enters_as_t_and_a_broadcast_one_with_stride_0() {
        // a[4, 2, 5, 3] contiguous; b[3, 7] seen as the transpose of a contiguous [7, 3]
        let a = Layout::contiguous(Shape::from((4, 2, 5, 3)));
        let b = Layout::contiguous(Shape::from((7, 3))).transpose(0, 1).unwrap();
        let p = matmul(&a, &b, &[4, 2], DType::F32).unwrap().problem;
        assert_eq!((p.m(), p.n(), p.k(), p.batch()), (5, 7, 3, 8));
        assert_eq!(p.a().layout.batch_stride, 15);
        assert_eq!(p.b().op, gemmbridge::Op::T);
        assert_eq!(p.b().layout.batch_stride, 0);
    }

    #[test]
    fn padded_norm_rows_are_read_in_place_on_the_cpu_only() {
        let x = Layout::contiguous(Shape::from((3, 5, 40))).narrow(2, 3, 37).unwrap();
        let w = Layout::contiguous(Shape::from(37));
        let p = rms_norm(&x, &w, 1e-5, DType::F32, false).unwrap();
        assert_eq!((p.problem.rows, p.problem.features, p.starts[0]), (15, 37, 3));
        assert!(rms_norm(&x, &w, 1e-5, DType::F32, true).is_none());
        let dense = Layout::contiguous(Shape::from((3, 5, 37)));
        assert!(rms_norm(&dense, &w, 1e-5, DType::F32, true).is_some());
    }

    #[test]
    fn a_mixed_broadcast_has_no_single_batch_stride() {
        let a = Layout::contiguous(Shape::from((2, 1, 5, 3))); // broadcast over the second batch dim
        let b = Layout::contiguous(Shape::from((1, 4, 3, 7))); // and over the first
        assert!(matmul(&a, &b, &[2, 4], DType::F32).is_none());
        assert!(matmul(&a, &b, &[2, 1], DType::F64).is_none()); // f64: not served
    }
}
