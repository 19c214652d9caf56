//! Scaled-dot-product attention: [`attention`] on burn's `[b, h, s, d]` tensors through
//! cuDNN's fused flash-attention engines (gemmbridge's `GpuAttention::forward` and
//! `GpuAttention::backward`), with the [`AttentionOps`] trait that backends implement and the
//! [`GemmAttention`] module.
//!
//! Which path serves a call, and the autodiff node: [`AttentionOps`].

mod autodiff;
mod composed;
mod cube;
mod fusion;
mod module;
#[cfg(feature = "ndarray")]
mod ndarray;

pub use module::{GemmAttention, GemmAttentionConfig, GemmAttentionRecord, MhaConversionError};

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

/// Which keys each query row sees. Row `i` of sequence `n` (of `s_q` query rows) against key
/// `j` (of `s_kv`):
///
/// | mask | visible |
/// |---|---|
/// | `None` | every key |
/// | `Causal` | `j ≤ i` (the diagonal from the top left: PyTorch's `is_causal`) |
/// | `CausalBottomRight` | `j ≤ i + s_kv − s_q` (burn's `AttentionModuleOptions::is_causal`; the same as `Causal` when `s_q = s_kv`) |
/// | `Lengths(len)` | `j < len[n]` (key padding: burn's `mask_pad` of a right-padded batch) |
/// | `CausalLengths(len)` | `j ≤ i` and `j < len[n]` |
///
/// With lengths, every query row is computed (a padded query row attends to its sequence's
/// keys, as under burn's `mask_pad`); `len` has one entry per sequence, each in `1..=s_kv`.
/// On cuDNN the lengths become gemmbridge's per-sequence lengths (`SeqLens::host`, checked,
/// then copied in stream order; no mask tensor is made), the query lengths all `s_q`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnMask {
    /// Every key is visible.
    #[default]
    None,
    /// Query row `i` sees keys `j ≤ i`.
    Causal,
    /// Query row `i` sees keys `j ≤ i + s_kv − s_q` (needs `s_kv ≥ s_q`: no row without keys).
    CausalBottomRight,
    /// Sequence `n` sees its first `len[n]` keys.
    Lengths(Vec<usize>),
    /// `Causal` and `Lengths` together.
    CausalLengths(Vec<usize>),
}

impl AttnMask {
    /// The per-sequence key lengths, if the mask has them.
    pub fn lengths(&self) -> Option<&[usize]> {
        match self {
            AttnMask::Lengths(l) | AttnMask::CausalLengths(l) => Some(l),
            _ => None,
        }
    }

    /// Whether query row `i` of sequence `n` sees key `j`, for `s_q` query rows and `s_kv` keys.
    pub fn visible(&self, n: usize, i: usize, j: usize, s_q: usize, s_kv: usize) -> bool {
        let within = self.lengths().is_none_or(|l| j < l[n]);
        within
            && match self {
                AttnMask::None | AttnMask::Lengths(_) => true,
                AttnMask::Causal | AttnMask::CausalLengths(_) => j <= i,
                AttnMask::CausalBottomRight => j + s_q <= i + s_kv,
            }
    }
}

static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

/// `(served, fell back)`: attention calls (forwards and backwards) that reached the adapter on
/// burn's CUDA backend (plain, under fusion or autodiff) and ran on cuDNN, or ran burn's ops
/// instead (adapter off, a dtype or head dimension cuDNN does not take, no cuDNN, a non-CUDA
/// cubecl runtime), since the start of the process. Counted apart from [`crate::counts`]'
/// GEMMs; backends on burn's ops alone (NdArray) are not counted. The `tracing` debug log says
/// why, per call.
pub fn attention_counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

pub(crate) fn count(served: bool) {
    (if served { &SERVED } else { &FELL_BACK }).fetch_add(1, Ordering::Relaxed);
}

/// What the attention backward reads: the forward's inputs, its output and its softmax
/// statistics `lse[b, h_q, s_q]` (natural log of each row's sum of `exp(scale·q·kᵀ)` over the
/// visible keys; f32 for f16, bf16 and f32 inputs, f64 for f64).
#[derive(Clone, Debug)]
pub struct AttnResiduals<B: Backend> {
    /// `q[b, h_q, s_q, d]`.
    pub q: FloatTensor<B>,
    /// `k[b, h_kv, s_kv, d]`.
    pub k: FloatTensor<B>,
    /// `v[b, h_kv, s_kv, d]`.
    pub v: FloatTensor<B>,
    /// The forward's output `o[b, h_q, s_q, d]`.
    pub o: FloatTensor<B>,
    /// The forward's statistics `lse[b, h_q, s_q]`.
    pub lse: FloatTensor<B>,
}

/// Backends whose attention gemmbridge can serve; the methods default to burn's ops, so a
/// backend gemmbridge cannot serve implements the trait with an empty body.
///
/// Which path serves a call:
/// - **cuDNN** (through gemmbridge, on burn's buffers, zero-copy): burn's CUDA backend
///   (`CubeBackend<CudaRuntime, …>`, also under `Fusion` and `Autodiff`), f16 or bf16 inputs, a
///   head dimension that is a multiple of 8 up to 256, the adapter on ([`crate::set_enabled`]).
///   f32 softmax and accumulation, one rounding of the output. Ordered with cubecl's stream as
///   the GEMMs are ([`crate::set_ordering`]).
/// - **burn**, everywhere else (f32 and f64 inputs, other head dimensions, other backends, the
///   adapter off, a cuDNN that refuses the problem): without gradients burn's own
///   `ModuleOps::attention` (`burn::tensor::module::attention`; key/value heads repeated for
///   grouped queries, the mask given as a bool tensor or burn's `is_causal`); under `Autodiff`
///   a composition of burn's matmul, max, exp and sum in f32 (f64 for f64 inputs) that also
///   yields the softmax statistics, and the flash-attention backward written in burn's ops
///   (`composed.rs`).
///
/// Under `Autodiff` a tracked call is one node: the forward keeps its softmax statistics
/// `lse[b, h_q, s_q]` (f32) beside `q`, `k`, `v` and `o`, and the backward is one call of
/// cuDNN's fused backward (or the composed one), so nothing is recomputed but the scores inside
/// the backward kernel. Under `Fusion`, f16/bf16 calls are custom operations of the fusion
/// stream; other dtypes run burn's ops on the fusion backend, where burn can fuse them.
/// [`attention_counts`] counts the calls cuDNN served and those it did not.
///
/// Implemented for every `CubeBackend<R, …>` (served when `R` is `CudaRuntime`),
/// `Fusion<B>`, `Autodiff<B, C>` and, with the `ndarray` feature, `NdArray`.
///
/// Every method takes checked inputs ([`attention`] checks them): `q[b, h_q, s_q, d]`,
/// `k`, `v[b, h_kv, s_kv, d]`, `h_q` a multiple of `h_kv`, one dtype, any strides, a mask that
/// leaves every query row a key, `scale` finite and positive.
pub trait AttentionOps: Backend {
    /// `o[b, h_q, s_q, d] = softmax(scale·q·kᵀ + mask)·v` with query head `hq` reading
    /// key/value head `hq / (h_q / h_kv)`.
    fn gemm_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> FloatTensor<Self> {
        composed::burn_attention::<Self>(q, k, v, mask, scale)
    }

    /// [`AttentionOps::gemm_attention`] and the softmax statistics `lse[b, h_q, s_q]` (see
    /// [`AttnResiduals`]) that [`AttentionOps::gemm_attention_backward`] reads.
    fn gemm_attention_stats(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::forward_stats::<Self>(q, k, v, mask, scale)
    }

    /// `[dq, dk, dv]` (shaped as q, k, v; `dk`, `dv` summed over the query heads that share a
    /// key/value head) from the forward's residuals and the output's gradient `d_o[b, h_q, s_q,
    /// d]`, with the forward's mask and scale.
    fn gemm_attention_backward(
        saved: AttnResiduals<Self>,
        d_o: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> [FloatTensor<Self>; 3] {
        composed::backward::<Self>(saved, d_o, mask, scale)
    }
}

/// `1/√d`, as gemmbridge's `Attention::new` computes it.
pub(crate) fn default_scale(d: usize) -> f32 {
    (1.0 / (d as f64).sqrt()) as f32
}

/// Whether cuDNN's engines take the dtype (f16, bf16).
pub(crate) fn half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `o = softmax(q·kᵀ/√d + mask)·v`: scaled-dot-product attention (PyTorch's
/// `F.scaled_dot_product_attention` without dropout) for `q[b, h_q, s_q, d]`, `k[b, h_kv, s_kv,
/// d]`, `v[b, h_kv, s_kv, d]` in burn's `[b, h, s, d]` order with any strides (a `[b, s, h,
/// d]` projection after `swap_dims(1, 2)` is read in place on cuDNN; strides cuDNN cannot
/// read — a head dimension that is not contiguous, strides not multiples of 8 elements,
/// overlapping views — are copied contiguous first). Returns `o[b, h_q, s_q, d]`, contiguous.
///
/// Grouped-query attention: `h_q` a multiple of `h_kv`; query head `hq` reads key/value head
/// `hq / (h_q / h_kv)` (`h_kv = 1`: multi-query). Masks: [`AttnMask`]. Paths and dtypes:
/// [`AttentionOps`] (f16/bf16 on cuDNN; f32 and everything else burn's ops).
///
/// # Backward
/// Under `Autodiff`, `dq`, `dk`, `dv` of q's, k's and v's shapes (`dk`, `dv` summed over the
/// query heads of a group) from one fused backward; the forward keeps the softmax statistics
/// (`4·b·h_q·s_q` bytes) for it. On cuDNN, q, k, v that are not contiguous are copied
/// contiguous for the backward (the gradients are written contiguous).
///
/// # Panics
/// Before anything runs, naming the shapes: tensors on different devices or of different
/// dtypes; a zero dimension; `k` and `v` of different shapes; batch or head dimension of `k`
/// differing from `q`'s; `h_q` not a multiple of `h_kv`; lengths not one per sequence or
/// outside `1..=s_kv`; [`AttnMask::CausalBottomRight`] with `s_kv < s_q` (rows without keys).
pub fn attention<B: AttentionOps>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: AttnMask) -> Tensor<B, 4> {
    let scale = default_scale(q.dims()[3]);
    attention_with_scale(q, k, v, mask, scale)
}

/// [`attention`] with the factor on `q·kᵀ` given (instead of `1/√d`).
///
/// # Panics
/// As [`attention`], and for a `scale` that is not finite and positive.
pub fn attention_with_scale<B: AttentionOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: AttnMask,
    scale: f32,
) -> Tensor<B, 4> {
    check(&q, &k, &v, &mask, scale);
    let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let o = B::gemm_attention(prim(q), prim(k), prim(v), &mask, scale);
    Tensor::from_primitive(TensorPrimitive::Float(o))
}

/// The rules of [`attention_with_scale`], checked at the call site (never inside a backend or a
/// deferred fusion stream).
fn check<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>, mask: &AttnMask, scale: f32) {
    const F: &str = "gemmbridge_burn::attention";
    let (qs, ks, vs) = (q.dims(), k.dims(), v.dims());
    let shapes = format!("q {qs:?}, k {ks:?}, v {vs:?} ([b, h, s, d])");
    let device = q.device();
    assert!(k.device() == device && v.device() == device, "{F}: q, k and v are on different devices");
    assert!(
        q.dtype() == k.dtype() && q.dtype() == v.dtype(),
        "{F}: dtypes differ: q {:?}, k {:?}, v {:?}",
        q.dtype(),
        k.dtype(),
        v.dtype()
    );
    assert!(qs.iter().chain(&ks).all(|&n| n > 0), "{F}: a dimension is zero: {shapes}");
    assert!(ks == vs, "{F}: k and v differ in shape: {shapes}");
    assert!(ks[0] == qs[0] && ks[3] == qs[3], "{F}: k's batch or head dimension differs from q's: {shapes}");
    assert!(
        qs[1].is_multiple_of(ks[1]),
        "{F}: {} query heads are not a multiple of {} key/value heads: {shapes}",
        qs[1],
        ks[1]
    );
    assert!(scale.is_finite() && scale > 0.0, "{F}: scale = {scale} is not finite and positive");
    let (b, s_q, s_kv) = (qs[0], qs[2], ks[2]);
    if let Some(len) = mask.lengths() {
        assert!(len.len() == b, "{F}: {} key length(s) for a batch of {b}: {shapes}", len.len());
        if let Some((n, l)) = len.iter().enumerate().find(|&(_, &l)| l == 0 || l > s_kv) {
            panic!("{F}: key length {l} of sequence {n} is outside 1..={s_kv}: {shapes}");
        }
    }
    assert!(
        !(*mask == AttnMask::CausalBottomRight && s_kv < s_q),
        "{F}: the bottom-right causal mask leaves query rows without keys (s_kv = {s_kv} < s_q = {s_q}): {shapes}"
    );
}
