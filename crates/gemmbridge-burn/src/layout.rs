//! From burn's tensor metadata (shape and strides, in elements) to a gemmbridge problem:
//! pure, no GPU.
//!
//! burn's `matmul` multiplies the last two dimensions and broadcasts the leading (batch) ones.
//! A GEMM reads an operand directly when its last two dimensions are a row-major matrix with a
//! leading dimension (`strides = [ld, 1]`, which also covers burn's pitched allocations) or a
//! transposed one (`strides = [1, ld]`, e.g. after `swap_dims`), and when its batch dimensions,
//! broadcast to the output's, advance by one stride per output matrix (a size-1 dimension
//! broadcasts with stride 0). Anything else is not a layout a GEMM can read, and the caller falls
//! back to burn's own matmul.

use gemmbridge::{Epilogue, GemmProblem, MatrixLayout, Operand, Precision};

use crate::Activation;

/// Why a matmul is left to burn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Ranks or stride counts that do not fit, inner dimensions that differ, batch dims that do
    /// not broadcast, a bias length other than d_out, sizes that overflow (burn's op reports
    /// what is an error).
    Shape(String),
    /// A matrix whose last two strides are neither `[ld, 1]` nor `[1, ld]`.
    Layout(String),
    /// Batch dimensions that do not collapse into one stride.
    Batch(String),
    /// gemmbridge rejected the problem (named error text).
    Problem(String),
}

/// A matmul gemmbridge can run: the problem and the output's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulPlan {
    /// The strided-batched GEMM; the output is a contiguous row-major `[.., m, n]` tensor.
    pub problem: GemmProblem,
    /// Shape of the output tensor.
    pub out_shape: Vec<usize>,
}

/// One operand's last two dimensions as a stored row-major matrix and its op.
fn matrix(rows: usize, cols: usize, sr: usize, sc: usize, what: &str) -> Result<Operand, Fallback> {
    if sc == 1 && (sr >= cols || rows <= 1) {
        Ok(Operand::n(MatrixLayout::row_major(rows, cols).with_ld(sr.max(cols))))
    } else if sr == 1 && (sc >= rows || cols <= 1) {
        Ok(Operand::t(MatrixLayout::row_major(cols, rows).with_ld(sc.max(rows))))
    } else {
        Err(Fallback::Layout(format!("{what}: [{rows}, {cols}] with strides [{sr}, {sc}]")))
    }
}

/// The single batch stride of an operand whose batch dims are broadcast to `out_batch`, if any.
fn batch_stride(shape: &[usize], strides: &[usize], out_batch: &[usize], what: &str) -> Result<usize, Fallback> {
    let fail = || {
        Fallback::Batch(format!("{what}: batch shape {shape:?} strides {strides:?} do not collapse over {out_batch:?}"))
    };
    // effective stride of each output batch dim: 0 where this operand broadcasts
    let eff: Vec<usize> = shape.iter().zip(strides).map(|(&d, &s)| if d == 1 { 0 } else { s }).collect();
    let mut stride: Option<usize> = None;
    let mut expected: Option<usize> = None;
    for i in (0..out_batch.len()).rev() {
        if out_batch[i] == 1 {
            continue;
        }
        match expected {
            None => stride = Some(eff[i]),
            Some(e) if eff[i] == e => {}
            Some(_) => return Err(fail()),
        }
        expected = Some(eff[i].checked_mul(out_batch[i]).ok_or_else(fail)?);
    }
    Ok(stride.unwrap_or(0))
}

/// The shape of `lhs[.., m, k] · rhs[.., k, n]` (rank ≥ 2, same ranks) under burn's
/// broadcasting: each batch dim of size 1 takes the other's size (0 included), then `[m, n]`.
/// Whether the batch dims broadcast at all is not checked here.
pub(crate) fn matmul_out_shape(lhs_shape: &[usize], rhs_shape: &[usize]) -> Vec<usize> {
    let d = lhs_shape.len();
    let batch = lhs_shape[..d - 2].iter().zip(rhs_shape).map(|(&a, &b)| if a == 1 { b } else { a });
    batch.chain([lhs_shape[d - 2], rhs_shape[d - 1]]).collect()
}

/// Plans `lhs[.., m, k] · rhs[.., k, n]` with burn's broadcasting of the batch dimensions.
///
/// ```
/// use gemmbridge::{Op, Precision};
/// use gemmbridge_burn::layout::plan;
/// // x[4, 16, 24] · wᵀ where w is [8, 24] broadcast over the batch: w.transpose() has
/// // shape [1, 24, 8] and strides [192, 1, 24]
/// let p = plan(&[4, 16, 24], &[384, 24, 1], &[1, 24, 8], &[192, 1, 24], Precision::BF16).unwrap();
/// assert_eq!(p.out_shape, vec![4, 16, 8]);
/// assert_eq!((p.problem.batch(), p.problem.b().op, p.problem.b().layout.batch_stride), (4, Op::T, 0));
/// ```
///
/// # Errors
/// A [`Fallback`] saying why the call should go to burn's own matmul.
pub fn plan(
    lhs_shape: &[usize],
    lhs_strides: &[usize],
    rhs_shape: &[usize],
    rhs_strides: &[usize],
    precision: Precision,
) -> Result<MatmulPlan, Fallback> {
    let d = lhs_shape.len();
    if d < 2 || rhs_shape.len() != d || lhs_strides.len() != d || rhs_strides.len() != d {
        return Err(Fallback::Shape(format!("ranks {lhs_shape:?} and {rhs_shape:?}")));
    }
    let (m, k, k2, n) = (lhs_shape[d - 2], lhs_shape[d - 1], rhs_shape[d - 2], rhs_shape[d - 1]);
    if k != k2 {
        return Err(Fallback::Shape(format!("inner dimensions {lhs_shape:?} · {rhs_shape:?}")));
    }
    if (0..d - 2).any(|i| lhs_shape[i] != rhs_shape[i] && lhs_shape[i] != 1 && rhs_shape[i] != 1) {
        return Err(Fallback::Shape(format!("batch dims {lhs_shape:?} and {rhs_shape:?} do not broadcast")));
    }
    let out_shape = matmul_out_shape(lhs_shape, rhs_shape);
    let out_batch = &out_shape[..d - 2];
    let batch = checked_product(out_batch)
        .ok_or_else(|| Fallback::Shape(format!("batch dims of {lhs_shape:?} · {rhs_shape:?} overflow")))?;
    let mut a = matrix(m, k, lhs_strides[d - 2], lhs_strides[d - 1], "lhs")?;
    let mut b = matrix(k, n, rhs_strides[d - 2], rhs_strides[d - 1], "rhs")?;
    a.layout = a.layout.with_batch_stride(batch_stride(&lhs_shape[..d - 2], &lhs_strides[..d - 2], out_batch, "lhs")?);
    b.layout = b.layout.with_batch_stride(batch_stride(&rhs_shape[..d - 2], &rhs_strides[..d - 2], out_batch, "rhs")?);
    let c = MatrixLayout::row_major(m, n);
    let problem = GemmProblem::new(a, b, c, batch, precision).map_err(|e| Fallback::Problem(e.to_string()))?;
    Ok(MatmulPlan { problem, out_shape })
}

/// The epilogue for a linear layer with or without a bias and with an activation: the bias and
/// the activation where cuBLASLt has it (GELU-erf's GEMM fuses the bias only; the activation
/// follows, [`after_epilogue`]).
pub fn linear_epilogue(bias: bool, act: Activation) -> Epilogue {
    match (bias, act) {
        (false, Activation::None | Activation::GeluErf) => Epilogue::None,
        (true, Activation::None | Activation::GeluErf) => Epilogue::Bias,
        (false, Activation::Relu) => Epilogue::Relu,
        (true, Activation::Relu) => Epilogue::ReluBias,
        (false, Activation::GeluTanh) => Epilogue::Gelu,
        (true, Activation::GeluTanh) => Epilogue::GeluBias,
    }
}

/// What of `act` is left to apply, as burn's op, after the GEMM of [`linear_epilogue`]:
/// GELU-erf (cuBLASLt's GELU epilogue is the tanh form), nothing for the others.
pub fn after_epilogue(act: Activation) -> Activation {
    match act {
        Activation::GeluErf => Activation::GeluErf,
        Activation::None | Activation::Relu | Activation::GeluTanh => Activation::None,
    }
}

/// The product of `dims`, or `None` on overflow.
fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d))
}

/// Plans burn's `linear`: `act(x[.., d_in] · weight[d_in, d_out] + bias[d_out])` as one GEMM
/// with `m` = the product of `x`'s leading dimensions and the bias/activation as its epilogue.
///
/// `x`'s leading dimensions must collapse into one run of rows with a single row stride (every
/// contiguous or row-pitched tensor does; size-1 dims are ignored); `weight` is row-major
/// (`LinearLayout::Row`, `op(B) = N`) or a transposed view (`LinearLayout::Col`, `op(B) = T`);
/// `bias`, given as `(length, stride)` in elements, must have `d_out` contiguous elements. The
/// output is a contiguous `[.., d_out]` tensor.
///
/// ```
/// use gemmbridge::{Epilogue, Op, Precision};
/// use gemmbridge_burn::{layout::plan_linear, Activation};
/// // x[4, 16, 24] · w, w stored as [8, 24] (LinearLayout::Col: shape [24, 8], strides [1, 24])
/// let p = plan_linear(&[4, 16, 24], &[384, 24, 1], &[24, 8], &[1, 24], Some((8, 1)), Activation::Relu, Precision::F16)
///     .unwrap();
/// assert_eq!(p.out_shape, vec![4, 16, 8]);
/// assert_eq!((p.problem.m(), p.problem.n(), p.problem.k()), (64, 8, 24));
/// assert_eq!((p.problem.b().op, p.problem.epilogue()), (Op::T, Epilogue::ReluBias));
/// ```
///
/// # Errors
/// A [`Fallback`] saying why the call should go to burn's own `linear`: `Shape` (ranks, d_in,
/// a bias length other than d_out, sizes that overflow), `Layout` (a strided bias, a weight
/// neither row-major nor transposed), `Batch` (leading dims of x that do not collapse).
pub fn plan_linear(
    x_shape: &[usize],
    x_strides: &[usize],
    w_shape: &[usize],
    w_strides: &[usize],
    bias: Option<(usize, usize)>,
    act: Activation,
    precision: Precision,
) -> Result<MatmulPlan, Fallback> {
    let d = x_shape.len();
    if d == 0 || x_strides.len() != d || w_shape.len() != 2 || w_strides.len() != 2 {
        return Err(Fallback::Shape(format!("linear: x {x_shape:?}, weight {w_shape:?}")));
    }
    let (d_in, d_out) = (w_shape[0], w_shape[1]);
    if x_shape[d - 1] != d_in {
        return Err(Fallback::Shape(format!("linear: x {x_shape:?} · weight {w_shape:?}")));
    }
    match bias {
        Some((len, _)) if len != d_out => {
            return Err(Fallback::Shape(format!("linear: bias of {len} elements for d_out = {d_out}")))
        }
        Some((_, stride)) if stride != 1 && d_out > 1 => {
            return Err(Fallback::Layout(format!("linear: bias with stride {stride}")))
        }
        _ => {}
    }
    let lead = &x_shape[..d - 1];
    let m = checked_product(lead).ok_or_else(|| Fallback::Shape(format!("linear: x {x_shape:?} overflows")))?;
    // the leading dims collapse into rows exactly as batch dims collapse into one batch stride
    // (size-1 dims ignored, each other dim advancing by the rows inside it); one row needs none
    let row_stride = if m <= 1 { d_in } else { batch_stride(lead, &x_strides[..d - 1], lead, "linear: x")? };
    let mut p = plan(&[m, d_in], &[row_stride, x_strides[d - 1]], w_shape, w_strides, precision)?;
    p.problem =
        p.problem.with_epilogue(linear_epilogue(bias.is_some(), act)).map_err(|e| Fallback::Problem(e.to_string()))?;
    p.out_shape = lead.iter().copied().chain([d_out]).collect();
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemmbridge::Op;

    fn contiguous(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
        s
    }

    #[test]
    fn rank2_contiguous_and_pitched() {
        let p = plan(&[5, 7], &[7, 1], &[7, 3], &[3, 1], Precision::F32).unwrap();
        assert_eq!(p.out_shape, vec![5, 3]);
        assert_eq!((p.problem.m(), p.problem.n(), p.problem.k(), p.problem.batch()), (5, 3, 7, 1));
        // burn pads rows: a [5, 1000] f32 tensor may have row stride 1024
        let p = plan(&[5, 1000], &[1024, 1], &[1000, 3], &[3, 1], Precision::F32).unwrap();
        assert_eq!(p.problem.a().layout.ld, 1024);
    }

    #[test]
    fn transposed_views_become_op_t() {
        // rhs = w.swap_dims(0, 1) of a contiguous w[3, 7]: shape [7, 3], strides [1, 7]
        let p = plan(&[5, 7], &[7, 1], &[7, 3], &[1, 7], Precision::BF16).unwrap();
        assert_eq!(p.problem.b().op, Op::T);
        assert_eq!((p.problem.b().layout.rows, p.problem.b().layout.cols, p.problem.b().layout.ld), (3, 7, 7));
    }

    #[test]
    fn batches_and_broadcasting() {
        let (l, r) = ([2, 3, 4, 5], [2, 3, 5, 6]);
        let p = plan(&l, &contiguous(&l), &r, &contiguous(&r), Precision::F16).unwrap();
        assert_eq!(p.problem.batch(), 6);
        assert_eq!(p.problem.a().layout.batch_stride, 20);
        assert_eq!(p.problem.b().layout.batch_stride, 30);
        assert_eq!(p.out_shape, vec![2, 3, 4, 6]);
        // rhs broadcast over both batch dims
        let r1 = [1, 1, 5, 6];
        let p = plan(&l, &contiguous(&l), &r1, &contiguous(&r1), Precision::F16).unwrap();
        assert_eq!(p.problem.b().layout.batch_stride, 0);
        assert_eq!(p.out_shape, vec![2, 3, 4, 6]);
        // lhs broadcast over the first batch dim only: strides (0, 20) do not collapse
        let l1 = [1, 3, 4, 5];
        let e = plan(&l1, &contiguous(&l1), &r, &contiguous(&r), Precision::F16).unwrap_err();
        assert!(matches!(e, Fallback::Batch(_)), "{e:?}");
    }

    #[test]
    fn unreadable_layouts_and_shapes_fall_back() {
        // a column slice with strides [7, 2]
        assert!(matches!(plan(&[5, 3], &[7, 2], &[3, 3], &[3, 1], Precision::F32), Err(Fallback::Layout(_))));
        assert!(matches!(plan(&[5, 7], &[7, 1], &[6, 3], &[3, 1], Precision::F32), Err(Fallback::Shape(_))));
        assert!(matches!(
            plan(&[2, 5, 7], &[35, 7, 1], &[3, 7, 3], &[21, 3, 1], Precision::F32),
            Err(Fallback::Shape(_))
        ));
        assert!(matches!(plan(&[5], &[1], &[5], &[1], Precision::F32), Err(Fallback::Shape(_))));
    }

    #[test]
    fn linear_rows_collapse_and_epilogues() {
        // x[2, 3, 5] contiguous, w[5, 4] row-major, bias
        let p = plan_linear(&[2, 3, 5], &[15, 5, 1], &[5, 4], &[4, 1], Some((4, 1)), Activation::None, Precision::F32)
            .unwrap();
        assert_eq!((p.problem.m(), p.problem.n(), p.problem.k(), p.problem.batch()), (6, 4, 5, 1));
        assert_eq!((p.problem.b().op, p.problem.epilogue()), (Op::N, Epilogue::Bias));
        assert_eq!(p.out_shape, vec![2, 3, 4]);
        // rank 2 with a pitched row stride, no bias, GELU
        let p = plan_linear(&[3, 5], &[8, 1], &[5, 4], &[4, 1], None, Activation::GeluTanh, Precision::BF16).unwrap();
        assert_eq!((p.problem.a().layout.ld, p.problem.epilogue()), (8, Epilogue::Gelu));
        // rank 1 x: one row
        let p = plan_linear(&[5], &[1], &[5, 4], &[4, 1], None, Activation::None, Precision::F32).unwrap();
        assert_eq!((p.problem.m(), p.out_shape.clone()), (1, vec![4]));
        for (bias, act, e) in [
            (false, Activation::None, Epilogue::None),
            (true, Activation::Relu, Epilogue::ReluBias),
            (false, Activation::Relu, Epilogue::Relu),
            (true, Activation::GeluTanh, Epilogue::GeluBias),
            (false, Activation::GeluErf, Epilogue::None),
            (true, Activation::GeluErf, Epilogue::Bias),
        ] {
            assert_eq!(linear_epilogue(bias, act), e);
        }
        // only GELU-erf has a part left after the GEMM
        for act in Activation::ALL {
            let left = if act == Activation::GeluErf { Activation::GeluErf } else { Activation::None };
            assert_eq!(after_epilogue(act), left, "{act:?}");
        }
    }

    #[test]
    fn linear_layouts_that_fall_back() {
        // pitched rows inside a rank-3 x: [2, 3, 5] with strides [24, 8, 1] (24 = 3·8: collapses)
        assert!(plan_linear(&[2, 3, 5], &[24, 8, 1], &[5, 4], &[4, 1], None, Activation::None, Precision::F32).is_ok());
        // x[2, 3, 5] with batch stride 32 (not 3·8): rows do not collapse
        let e = plan_linear(&[2, 3, 5], &[32, 8, 1], &[5, 4], &[4, 1], None, Activation::None, Precision::F32);
        assert!(matches!(e, Err(Fallback::Batch(_))), "{e:?}");
        // a strided bias view
        let e = plan_linear(&[3, 5], &[5, 1], &[5, 4], &[4, 1], Some((4, 2)), Activation::None, Precision::F32);
        assert!(matches!(e, Err(Fallback::Layout(_))), "{e:?}");
        // a bias burn would broadcast ([1]) or reject ([3]): burn's linear decides
        for len in [1, 3] {
            let e = plan_linear(&[3, 5], &[5, 1], &[5, 4], &[4, 1], Some((len, 1)), Activation::None, Precision::F32);
            assert!(matches!(e, Err(Fallback::Shape(_))), "bias of {len}: {e:?}");
        }
        // mismatched d_in
        let e = plan_linear(&[3, 5], &[5, 1], &[6, 4], &[4, 1], None, Activation::None, Precision::F32);
        assert!(matches!(e, Err(Fallback::Shape(_))), "{e:?}");
    }

    /// Views whose size-1 or broadcast dims would make a naive collapse read the wrong rows
    /// (found by a random search against the CPU GEMM).
    #[test]
    fn linear_collapse_ignores_size_one_dims_and_rejects_broadcasts() {
        let lin = |shape: &[usize], strides: &[usize]| {
            plan_linear(shape, strides, &[5, 4], &[4, 1], None, Activation::None, Precision::F32)
        };
        // base[2, 131, 5].slice(.., 0..3).unsqueeze(1): [2, 1, 3, 5] with strides [655, 655, 5, 1]
        // — rows of the two batches are 655 elements apart, not 15
        assert!(matches!(lin(&[2, 1, 3, 5], &[655, 655, 5, 1]), Err(Fallback::Batch(_))));
        // the same rows with a size-1 dim whose stride is arbitrary: they do collapse
        let p = lin(&[2, 1, 3, 5], &[15, 999, 5, 1]).unwrap();
        assert_eq!((p.problem.m(), p.problem.a().layout.ld), (6, 5));
        // x[3, 1, 1, 5] with junk strides on the size-1 dims: rows 4 apart... of a 5-wide row: no
        assert!(lin(&[3, 1, 1, 5], &[4, 4, 36, 1]).is_err());
        // x[3, 1, 1, 5] rows 8 apart (pitched): ld 8
        assert_eq!(lin(&[3, 1, 1, 5], &[8, 4, 36, 1]).unwrap().problem.a().layout.ld, 8);
        // t[2, 5].expand([3, 1, 2, 5]): strides [0, 0, 5, 1] read 6 rows from a 2-row tensor
        assert!(matches!(lin(&[3, 1, 2, 5], &[0, 0, 5, 1]), Err(Fallback::Batch(_))));
        // one row, any strides
        assert_eq!(lin(&[1, 1, 5], &[7, 3, 1]).unwrap().problem.m(), 1);
    }

    #[test]
    fn sizes_that_overflow_are_fallbacks_not_panics() {
        let big = 1usize << 33;
        let e = plan(&[big, big, 2, 2], &[0, 0, 2, 1], &[1, 1, 2, 2], &[4, 4, 2, 1], Precision::F32);
        assert!(matches!(e, Err(Fallback::Shape(_))), "{e:?}");
        let e = plan(&[2, 3, 2, 2], &[4, usize::MAX, 2, 1], &[2, 3, 2, 2], &[12, 4, 2, 1], Precision::F32);
        assert!(e.is_err(), "{e:?}");
        let e = plan_linear(&[big, big, 4], &[0, 4, 1], &[4, 2], &[2, 1], None, Activation::None, Precision::F32);
        assert!(matches!(e, Err(Fallback::Shape(_))), "{e:?}");
        let e = plan_linear(&[2, 2, 4], &[1, usize::MAX, 1], &[4, 2], &[2, 1], None, Activation::None, Precision::F32);
        assert!(e.is_err(), "{e:?}");
    }

    #[test]
    fn a_zero_batch_broadcast_against_one_stays_zero() {
        let p = plan(&[0, 3, 4], &[12, 4, 1], &[1, 4, 5], &[20, 5, 1], Precision::F32).unwrap();
        assert_eq!((p.out_shape.clone(), p.problem.batch()), (vec![0, 3, 5], 0));
    }
}
