//! The grouped matmul of a mixture-of-experts layer: [`grouped_matmul`] on burn tensors, rows
//! sorted by expert, through gemmbridge's grouped GEMM (`Gpu::grouped_gemm_raw`: the forward,
//! the backward data and the backward weight products of `gemmbridge::grouped`) on burn's
//! CUDA backend, and a per-expert loop of burn's own ops ([`grouped_matmul_burn`]) elsewhere.
//!
//! The structure is the layer operations': the trait [`GroupedOps`] has one method per
//! product, each defaulting to burn's ops (`burn_ops.rs`), so NdArray implements it with an
//! empty body; `cube.rs` serves the CUDA `CubeBackend` (the layer operations' `run` orders the call with the
//! caller's cubecl stream, as the adapter's GEMMs are), `fusion.rs` records the calls as
//! custom operations of burn's fusion stream, and `autodiff.rs` makes a call one autodiff node
//! whose backward is the other two products.

mod autodiff;
mod burn_ops;
mod cube;
mod fusion;
#[cfg(feature = "ndarray")]
mod ndarray;

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::layout::Fallback;

/// Backends whose grouped matmul gemmbridge can serve.
///
/// Every method takes checked operands ([`grouped_matmul`] checks them) and group sizes
/// `sizes[e] = m_e` (host counts, any of them 0, `Σ m_e = R`), rows sorted by expert: expert
/// `e` owns the `m_e` consecutive rows from `Σ_{f<e} m_f` of every `[R, ·]` operand. Every
/// method defaults to burn's own ops (a loop over the experts with rows: `narrow`, `matmul`,
/// `cat`; f16 and bf16 widened to f32 and rounded once at the end), so a backend gemmbridge
/// cannot serve implements the trait with an empty body.
///
/// Which path serves a call:
/// - **gemmbridge** (`Gpu::grouped_gemm_raw` on burn's own buffers, zero-copy for contiguous
///   operands; others are copied contiguous first): burn's CUDA backend
///   (`CubeBackend<CudaRuntime, …>`, also under `Fusion` and `Autodiff`), f32 (strict, or tf32
///   under [`crate::set_tf32`]), f16 and bf16 with f32 accumulation, the adapter on
///   ([`crate::set_enabled`]), `R`, `N`, `K` and `E` non-zero. gemmbridge picks the way per
///   call (one strided batch for equal groups, cuBLAS's grouped call for small unequal ones,
///   else one cuBLASLt GEMM per expert on a pool of streams); ordered with cubecl's stream as
///   the GEMMs are ([`crate::set_ordering`]).
/// - **burn**, everywhere else (other backends and dtypes, empty products, the adapter off, a
///   gemmbridge refusal): [`GroupedOps`]' defaults, what [`grouped_matmul_burn`] runs.
///
/// Implemented for every `CubeBackend<R, …>` (served when `R` is `CudaRuntime`), `Fusion<B>`,
/// `Autodiff<B, C>` and, with the `ndarray` feature, `NdArray`.
pub trait GroupedOps: Backend {
    /// The forward: `x[R, K]`, `w[E, N, K]` → `y[R, N]`, `y[r] = x[r]·w[e]ᵀ` for every row `r`
    /// of expert `e`; x's dtype.
    fn gemm_grouped_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        burn_ops::forward::<Self>(x, w, sizes)
    }

    /// The backward data: `dy[R, N]`, `w[E, N, K]` → `dx[R, K]`, `dx[r] = dy[r]·w[e]` for every
    /// row `r` of expert `e`; dy's dtype.
    fn gemm_grouped_backward_data(dy: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        burn_ops::backward_data::<Self>(dy, w, sizes)
    }

    /// The backward weight: `dy[R, N]`, `x[R, K]` → `dw[E, N, K]`, `dw[e] = dy[e]ᵀ·x[e]` over
    /// expert e's rows, zeros for an expert without rows; dy's dtype.
    fn gemm_grouped_backward_weight(dy: FloatTensor<Self>, x: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        burn_ops::backward_weight::<Self>(dy, x, sizes)
    }
}

static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

/// `(served, fell back)`: grouped products (forwards, backward data and backward weight
/// products each count once) that reached a backend gemmbridge can serve (burn's
/// `CubeBackend`, also under fusion and autodiff) and were run by gemmbridge's grouped GEMM, or
/// were handed to burn's ops (adapter off, a dtype or size gemmbridge does not take, a
/// non-CUDA cubecl runtime, a refusal of the engine), since the start of the process; apart
/// from [`crate::counts`]' GEMMs. NdArray's calls are not counted. The `tracing` debug log
/// says which path each call took, and why.
pub fn grouped_counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

/// The result of `attempt` when the adapter is on and gemmbridge can serve, `None` when the
/// caller should run burn's ops; counts and logs which path the call took.
pub(crate) fn served<T>(what: &str, shapes: &[&[usize]], attempt: impl FnOnce() -> Result<T, Fallback>) -> Option<T> {
    let r = if crate::enabled() { attempt() } else { Err(Fallback::Problem("adapter disabled".into())) };
    match r {
        Ok(out) => {
            SERVED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, "{what}: gemmbridge");
            Some(out)
        }
        Err(why) => {
            FELL_BACK.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, ?why, "{what}: burn");
            None
        }
    }
}

/// A mixture-of-experts layer's product over rows sorted by expert: `y[r] = x[r]·w[e]ᵀ` for
/// every row `r` routed to expert `e`, with the backward under `Autodiff`.
///
/// - `x[R, K]`: the routed rows, sorted by expert: expert `e` owns the `sizes[e]` consecutive
///   rows from `Σ_{f<e} sizes[f]`. Any strides (contiguous operands are read in place on CUDA,
///   others copied contiguous first).
/// - `w[E, N, K]`: one weight per expert in `nn.Linear`'s `[out, in]` layout (burn's
///   `Linear` stores `[in, out]`: `swap_dims(1, 2)` of a stacked `[E, K, N]` is such a `w`, a
///   view that the CUDA path copies).
/// - `sizes`: `E` host counts, any of them 0, adding up to `R`. Host counts because
///   gemmbridge's grouped GEMM plans from them: it picks the way to run the call from the sizes
///   and launches one GEMM per expert at offsets it computes on the host (counts on the device
///   would cost a copy and a wait before every call). A router's counts made on the device
///   (after `sort_with_indices` of the chosen experts, say) come over with `into_data`, one
///   wait per layer.
/// - Output `y[R, N]`, contiguous, x's dtype. f32, f16 and bf16 (f32 accumulation, one
///   rounding) through gemmbridge on burn's CUDA backend; which path serves a call and the
///   dtypes of each: [`GroupedOps`]; [`grouped_counts`] counts them.
/// - Backward (`Autodiff`; one node): `dx[R, K]` with `dx[r] = dy[r]·w[e]` (gemmbridge's
///   grouped backward data) and `dw[E, N, K]` with `dw[e] = dy[e]ᵀ·x[e]` over expert e's
///   rows, zeros for an expert without rows (the grouped backward weight); only the gradients
///   asked for are computed.
///
/// # Panics
/// Before anything runs, each message naming the values: x and w on different devices or of
/// different dtypes, `sizes.len()` not w's `E`, `sizes` not adding up to x's `R`, x's `K` not
/// w's `K`.
pub fn grouped_matmul<B: GroupedOps>(x: Tensor<B, 2>, w: Tensor<B, 3>, sizes: &[usize]) -> Tensor<B, 2> {
    check(&x, &w, sizes);
    let y = B::gemm_grouped_matmul(x.into_primitive().tensor(), w.into_primitive().tensor(), sizes);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`grouped_matmul`] in burn's own ops on any backend: for every expert with rows, x's rows
/// (`narrow`) times `w[e]ᵀ` (burn's `matmul`), the experts' outputs concatenated (`cat`); f16
/// and bf16 computed in f32 and rounded once to x's dtype. What [`GroupedOps`]' defaults and
/// the CUDA backend's fallback run, and what tests compare with. Under `Autodiff` its gradients
/// are burn's, through those ops. Shapes, layouts and panics as [`grouped_matmul`].
pub fn grouped_matmul_burn<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 3>, sizes: &[usize]) -> Tensor<B, 2> {
    check(&x, &w, sizes);
    burn_ops::forward_tensors(x, w, sizes)
}

/// The rules of [`grouped_matmul`], checked at the call site (never inside a backend or a
/// deferred fusion stream).
fn check<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 3>, sizes: &[usize]) {
    const F: &str = "gemmbridge_burn::grouped_matmul";
    let ([r, k], [e, n, kw]) = (x.dims(), w.dims());
    let shapes = format!("x [R, K] = [{r}, {k}], w [E, N, K] = [{e}, {n}, {kw}]");
    assert!(x.device() == w.device(), "{F}: x is on {:?} but w is on {:?}", x.device(), w.device());
    assert!(x.dtype() == w.dtype(), "{F}: x is {:?} but w is {:?}", x.dtype(), w.dtype());
    assert!(sizes.len() == e, "{F}: {} group sizes for the E = {e} experts of w: {shapes}", sizes.len());
    let total = sizes.iter().try_fold(0usize, |a, &m| a.checked_add(m));
    assert!(
        total == Some(r),
        "{F}: the group sizes {sizes:?} add up to {} but x has R = {r} rows: {shapes}",
        total.map_or("more than usize::MAX".into(), |t| t.to_string())
    );
    assert!(k == kw, "{F}: x's K = {k} is not w's K = {kw}: {shapes}");
}

/// Each expert with rows: `(e, first row, rows)`.
pub(crate) fn busy(sizes: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    sizes
        .iter()
        .enumerate()
        .scan(0, |r0, (e, &m)| {
            let at = *r0;
            *r0 += m;
            Some((e, at, m))
        })
        .filter(|&(_, _, m)| m > 0)
}
