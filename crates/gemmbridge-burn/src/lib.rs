//! # gemmbridge-burn
//!
//! burn 0.21's `matmul` through gemmbridge (cuBLASLt / cuBLAS) on burn's own CUDA buffers:
//! zero-copy, the output allocated by burn's allocator and returned as an ordinary burn tensor.
//!
//! ```no_run
//! use burn::backend::Cuda;
//! use burn::tensor::Tensor;
//! use gemmbridge_burn::matmul;
//!
//! let device = Default::default();
//! let (x, w) = (Tensor::<Cuda, 2>::ones([4, 8], &device), Tensor::<Cuda, 2>::ones([8, 2], &device));
//! let y = matmul(x, w); // Tensor<B, D> · Tensor<B, D> for any B: GemmOps, burn's broadcasting
//! ```
//!
//! - [`GemmOps`] is implemented for the plain CUDA backend
//!   (`CubeBackend<CudaRuntime, F, I, BT>`), for it under burn's fusion layer (`Fusion<…>`,
//!   what `burn::backend::Cuda` is with burn's default features) as a custom operation, and for
//!   either under `Autodiff` (backward: `dA = dC·Bᵀ`, `dB = Aᵀ·dC`, transposes as views).
//! - Where a call cannot be served — a dtype other than f32/f16/bf16, a layout a GEMM cannot
//!   read ([`layout::Fallback`]), no GPU library — it falls back to burn's own matmul, and a
//!   `tracing` debug line says which path each shape took. [`set_enabled`] switches the
//!   adapter off and on at run time (A/B tests).
//! - [`linear`] and the [`GemmLinear`] module (`nn::Linear`'s API and record) fuse the bias and
//!   an [`Activation`] into the GEMM's epilogue (GELU-erf, which cuBLASLt has no epilogue for:
//!   the bias, then burn's `gelu` op).
//! - Ordering with cubecl's streams (which cubecl 0.10 does not expose), chosen by
//!   [`set_ordering`]: by default on the device, with no host wait ([`GemmOrdering::Device`]: a
//!   one-thread cubecl kernel on the caller's stream releases gemmbridge's stream through a
//!   flag in device memory, and gemmbridge's stream releases the caller's through another);
//!   or with host waits before and after the GEMM ([`GemmOrdering::HostWait`]). See README.md for
//!   the cost of each and the upstream hook that would make both unnecessary.
//! - [`rms_norm`], [`swiglu`] and [`rope`] ([`LayerOps`]; modules [`GemmRmsNorm`],
//!   [`GemmSwiGluMlp`]): cuDNN's norm graph and gemmbridge's layer kernels, forward and
//!   backward, ordered as the GEMMs are; burn's own ops elsewhere.
//! - [`attention`] ([`AttentionOps`], [`AttnMask`]; module [`GemmAttention`]): cuDNN's fused flash
//!   attention (f16/bf16; causal, padding, grouped heads), forward and backward; burn's elsewhere.
//! - [`grouped_matmul`] ([`GroupedOps`]): a mixture-of-experts layer's product over rows sorted
//!   by expert through gemmbridge's grouped GEMM, forward and both backward products; burn's
//!   own ops elsewhere ([`grouped_matmul_burn`]).
//! - [`conv2d`] ([`ConvOps`]; module [`GemmConv2d`]): cuDNN's convolutions with a fused bias and
//!   ReLU, forward and backward (data, filter; bias by burn's sum); burn's own `conv2d` elsewhere.

mod attention;
mod autodiff;
mod conv;
mod cube;
mod fusion;
mod grouped;
mod layer_ops;
pub mod layout;
mod linear;
#[cfg(feature = "ndarray")]
mod ndarray;
mod order;

pub use attention::{
    attention, attention_counts, attention_with_scale, AttentionOps, AttnMask, AttnResiduals, GemmAttention,
    GemmAttentionConfig, GemmAttentionRecord, MhaConversionError,
};
pub use conv::{conv2d, conv_counts, ConvActivation, ConvOps, GemmConv2d, GemmConv2dConfig, GemmConv2dRecord};
pub use grouped::{grouped_counts, grouped_matmul, grouped_matmul_burn, GroupedOps};
pub use layer_ops::{
    layer_counts, rms_norm, rope, swiglu, GemmRmsNorm, GemmRmsNormConfig, GemmRmsNormRecord, GemmSwiGluMlp,
    GemmSwiGluMlpConfig, GemmSwiGluMlpRecord, LayerOps, RopeDirection, RopeStyle,
};
pub use linear::{GemmLinear, GemmLinearConfig, GemmLinearRecord};
pub use order::GemmOrdering;
#[doc(hidden)]
pub use order::{with_device_edges, Spinner};

/// The README's example, compiled as a doctest so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

static TF32: AtomicBool = AtomicBool::new(false);
static FUSED_BIAS_GRAD: AtomicBool = AtomicBool::new(true);
static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);
static DEVICE_ORDERED: AtomicUsize = AtomicUsize::new(0);
static HOST_WAITED: AtomicUsize = AtomicUsize::new(0);

/// `(served, fell back)`: GEMM calls (matmul and linear, forward and backward) that reached the
/// adapter on a backend it can serve (burn's CUDA `CubeBackend`, also under fusion and
/// autodiff) and were run by gemmbridge, or were handed back to burn's op (adapter disabled,
/// a dtype or layout gemmbridge does not take, a non-CUDA cubecl runtime), since the start of
/// the process. Backends that use `GemmOps`' defaults (NdArray) are not counted. The per-shape
/// detail is in the `tracing` debug log.
pub fn counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

pub(crate) fn count(served: bool) {
    (if served { &SERVED } else { &FELL_BACK }).fetch_add(1, Ordering::Relaxed);
}

/// `(device, host wait)`: served GEMM calls (of [`counts`]' first number, on burn's CUDA
/// backend) ordered on the device and ordered by host waits, since the start of the process.
/// With [`GemmOrdering::Device`] set, the second counts the calls that had to wait on the host
/// (an operand made on another thread's cubecl stream, no spin kernel); the debug
/// log says why, per call.
pub fn ordering_counts() -> (usize, usize) {
    (DEVICE_ORDERED.load(Ordering::Relaxed), HOST_WAITED.load(Ordering::Relaxed))
}

pub(crate) fn count_ordering(device: bool) {
    (if device { &DEVICE_ORDERED } else { &HOST_WAITED }).fetch_add(1, Ordering::Relaxed);
}

/// Turns the adapter on or off. Off is `set_ordering(GemmOrdering::Burn)` (every call runs
/// burn's own matmul); on leaves an ordering that is already on as it is, and after off returns
/// to the ordering last set (device ordering unless [`set_ordering`] chose another), so
/// `set_enabled(false)` … `set_enabled(true)` is an A/B toggle that keeps the ordering.
pub fn set_enabled(on: bool) {
    order::enable(on);
}

/// Whether the adapter is on (its ordering is not [`GemmOrdering::Burn`]).
pub fn enabled() -> bool {
    ordering() != GemmOrdering::Burn
}

/// Chooses how calls run (process-wide, takes effect at the next call): burn's own op
/// ([`GemmOrdering::Burn`]), gemmbridge ordered by host waits ([`GemmOrdering::HostWait`]), or
/// gemmbridge ordered on the device ([`GemmOrdering::Device`], the default; calls it cannot
/// order correctly — an operand made on another thread's cubecl stream, or where the spin
/// kernel cannot be compiled — wait on the host instead). The debug log names the ordering of
/// every call.
pub fn set_ordering(o: GemmOrdering) {
    order::set(o);
}

/// The ordering [`set_ordering`] chose.
pub fn ordering() -> GemmOrdering {
    order::get()
}

static SM_RESERVE: AtomicU32 = AtomicU32::new(1);

/// SMs that device-ordered GEMMs leave free (default 1; 0 uses them all), taking effect at the
/// next call. Device ordering's wait kernel spins on the caller's stream while the GEMM runs;
/// on a GEMM that fills every SM it holds one CTA back until the others finish (measured on
/// the H200, bf16 4096³: 1.46× the GEMM's time; leaving one SM free: 1.14×). The GEMMs are
/// planned for the remaining SMs (gemmbridge's `GpuOptions::sm_count_target`) on a gemmbridge
/// `Gpu` of their own (its own plans, handles and workspace per stream, 32 MiB on Hopper);
/// host-wait calls use every SM. A reserve of the GPU's SM count or more leaves none: every SM
/// is used (a warning is logged once).
pub fn set_sm_reserve(sms: u32) {
    SM_RESERVE.store(sms, Ordering::Relaxed);
}

/// Gives the adapter's gemmbridge `Gpu`s (those open and those opened later) the tuned
/// algorithms of `db` (`gemmbridge tune`; `TacticDb::load`). Device-ordered GEMMs run under an
/// SM count target ([`set_sm_reserve`]): only entries tuned under the same target apply to
/// them (`gemmbridge tune --sm-count-target`, the GPU's SM count less the reserve); host-wait
/// calls use entries tuned on the whole GPU. A later call replaces the database for `Gpu`s
/// opened from then on and adds its entries to those open.
pub fn load_tactics(db: &gemmbridge::cuda::tactics::TacticDb) {
    cube::load_tactics(db);
}

/// The SMs device-ordered GEMMs leave free ([`set_sm_reserve`]).
pub fn sm_reserve() -> u32 {
    SM_RESERVE.load(Ordering::Relaxed)
}

/// Lets f32 matmuls use tf32 tensor cores (gemmbridge's `Precision::TF32`, ‖err‖/‖ref‖ ≤ 1e-3);
/// off by default: strict f32 (`Precision::F32`, `CUBLAS_COMPUTE_32F`). burn's own f32 matmul
/// (cubek-matmul 0.2 on tensor cores) rounds f32 operands to tf32 on GPUs that have it (sm_80
/// and later), so on those it matches this switch on rather than off.
pub fn set_tf32(on: bool) {
    TF32.store(on, Ordering::Relaxed);
}

pub(crate) fn tf32() -> bool {
    TF32.load(Ordering::Relaxed)
}

/// Under `Autodiff`, computes a linear layer's bias gradient inside its weight-gradient GEMM
/// (cuBLASLt's bias-gradient epilogue; on by default), or (off) as burn's own reduction after
/// a plain GEMM, as earlier versions of this crate did. For A/B measurements.
pub fn set_fused_bias_grad(on: bool) {
    FUSED_BIAS_GRAD.store(on, Ordering::Relaxed);
}

pub(crate) fn fused_bias_grad() -> bool {
    FUSED_BIAS_GRAD.load(Ordering::Relaxed)
}

/// The activation of [`linear`] and [`GemmLinear::forward_activation`]: gemmbridge's own
/// (`gemmbridge::train::Activation`), re-exported.
///
/// - `None`, `Relu` and `GeluTanh` are fused into the GEMM's epilogue. `GeluTanh` is the tanh
///   approximation cuBLASLt computes (`CUBLASLT_EPILOGUE_GELU`, cuBLASLt docs
///   §cublasLtEpilogue_t), which is burn's `activation::gelu_approximate`, not burn's erf
///   `gelu`; the two differ by up to about 5e-4 absolute.
/// - `GeluErf` is burn's `activation::gelu` (the exact erf form). cuBLASLt has no epilogue for
///   it, so the GEMM fuses the bias only and burn's `gelu` op follows on its output; under
///   `Autodiff` the gradient is burn's.
pub use gemmbridge::train::Activation;

/// Backends whose matmul and linear gemmbridge can serve.
///
/// Both methods default to burn's own ops, so a backend gemmbridge cannot serve implements the
/// trait with an empty body and keeps working untouched. This crate implements it for every
/// `CubeBackend<R, …>` (served when `R` is `CudaRuntime`, burn's own op for wgpu, cpu, rocm),
/// for `Fusion<B>`, for `Autodiff<B, C>`, and, with the `ndarray` feature, for `NdArray`
/// (burn's op). The trait cannot be implemented outside this crate for burn's types (Rust's
/// orphan rule), so other backends need a one-line impl added here.
pub trait GemmOps: Backend {
    /// `lhs[.., m, k] · rhs[.., k, n]` with burn's broadcasting of the batch dimensions: the
    /// result of burn's `float_matmul`, through gemmbridge where it can serve.
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// `act(x[.., d_in] · weight[d_in, d_out] + bias[d_out])`, burn's `linear` (then `act`),
    /// with the bias and the activation fused into the GEMM's epilogue where gemmbridge serves.
    /// As burn's backend-level `ModuleOps::linear`, `x` has rank ≥ 2 here; the tensor-level
    /// [`linear`] also takes rank 1, and checks the shapes.
    fn gemm_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        act: Activation,
    ) -> FloatTensor<Self> {
        burn_linear::<Self>(x, weight, bias, act)
    }

    /// A linear layer's weight and bias gradients from 2-D `x[m, d_in]` and `dy[m, d_out]`:
    /// `(xᵀ·dy [d_in, d_out], Σ_rows dy [d_out])`, with the sum fused into the GEMM's epilogue
    /// (cuBLASLt's bias-gradient epilogue) where gemmbridge serves; burn's matmul and
    /// `linear_bias_backward` otherwise.
    fn gemm_linear_param_grads(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dw = Self::gemm_matmul(Self::float_transpose(x), dy.clone());
        (dw, <Self as burn::tensor::ops::ModuleOps<Self>>::linear_bias_backward(dy))
    }
}

/// burn's own `linear` followed by the activation, in burn's ops (the fallback path).
pub(crate) fn burn_linear<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    act: Activation,
) -> FloatTensor<B> {
    activate::<B>(B::linear(x, weight, bias), act)
}

/// `act(y)` in burn's ops.
pub(crate) fn activate<B: Backend>(y: FloatTensor<B>, act: Activation) -> FloatTensor<B> {
    match act {
        Activation::None => y,
        Activation::Relu => B::relu(y),
        Activation::GeluErf => B::gelu(y),
        Activation::GeluTanh => {
            // 0.5·y·(1 + tanh(√(2/π)·(y + 0.044715·y³))), as burn's gelu_approximate
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            let cube = B::float_mul_scalar(B::float_powi_scalar(y.clone(), 3.into()), 0.044715.into());
            let inner = B::float_mul_scalar(B::float_add(y.clone(), cube), SQRT_2_OVER_PI.into());
            let t = B::float_add_scalar(B::float_tanh(inner), 1.0.into());
            B::float_mul_scalar(B::float_mul(y, t), 0.5.into())
        }
    }
}

/// `lhs[.., m, k] · rhs[.., k, n]` through gemmbridge, as burn's `Tensor::matmul` (same
/// broadcasting, same result type), falling back to burn's matmul where gemmbridge cannot serve.
///
/// # Panics
/// As burn's `Tensor::matmul`, before anything runs: tensors on different devices, inner
/// dimensions that differ, batch dimensions that do not broadcast (each message names the
/// shapes).
pub fn matmul<B: GemmOps, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    check_matmul(&lhs, &rhs);
    let out = B::gemm_matmul(lhs.into_primitive().tensor(), rhs.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// burn's checks for matmul (burn's own `TensorCheck` is crate-private), so that a bad call
/// fails at the call site with the shapes, never inside a backend or a deferred fusion stream.
fn check_matmul<B: Backend, const D: usize>(lhs: &Tensor<B, D>, rhs: &Tensor<B, D>) {
    let (l, r) = (lhs.dims(), rhs.dims());
    assert!(lhs.device() == rhs.device(), "gemmbridge_burn::matmul: lhs and rhs are on different devices");
    assert!(D >= 2, "gemmbridge_burn::matmul: rank {D}; matmul needs rank ≥ 2");
    assert!(
        l[D - 1] == r[D - 2],
        "gemmbridge_burn::matmul: the inner dimensions differ ({} and {}): lhs shape {l:?}, rhs shape {r:?}",
        l[D - 1],
        r[D - 2]
    );
    for i in 0..D - 2 {
        assert!(
            l[i] == r[i] || l[i] == 1 || r[i] == 1,
            "gemmbridge_burn::matmul: batch dimension {i} does not broadcast ({} and {}): lhs shape {l:?}, rhs shape {r:?}",
            l[i],
            r[i]
        );
    }
}

/// `act(x[.., d_in] · weight[d_in, d_out] + bias[d_out])` — burn's `module::linear` followed by
/// `act` — with the bias and activation fused into one gemmbridge GEMM where it can serve.
///
/// `x` of any rank ≥ 1 (rank 1 is one row, as in burn). `weight` may be a transposed view
/// (burn's `LinearLayout::Col`); it becomes `op(B) = T`, no copy. `x`'s leading dimensions must
/// collapse into one row stride (any contiguous tensor does), otherwise the call falls back to
/// burn.
///
/// # Panics
/// Before anything runs: tensors on different devices, `x`'s last dimension ≠ `d_in`, a bias
/// whose length is neither `d_out` nor 1 (each message names the shapes). A one-element bias
/// goes to burn's `linear`, which broadcasts it.
pub fn linear<B: GemmOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    act: Activation,
) -> Tensor<B, D> {
    check_linear(&x, &weight, bias.as_ref());
    if D == 1 {
        // as burn's module::linear: one row through the rank-2 path
        return linear(x.unsqueeze::<2>(), weight, bias, act).squeeze_dim(0);
    }
    let out = B::gemm_linear(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
        act,
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn check_linear<B: Backend, const D: usize>(x: &Tensor<B, D>, w: &Tensor<B, 2>, bias: Option<&Tensor<B, 1>>) {
    let (xs, ws) = (x.dims(), w.dims());
    let device = x.device();
    assert!(
        w.device() == device && bias.is_none_or(|b| b.device() == device),
        "gemmbridge_burn::linear: x, weight and bias are on different devices"
    );
    assert!(
        xs[D - 1] == ws[0],
        "gemmbridge_burn::linear: x's last dimension is {} but weight is [d_input, d_output] = {ws:?}: x shape {xs:?}",
        xs[D - 1]
    );
    if let Some(b) = bias {
        let len = b.dims()[0];
        assert!(
            len == ws[1] || len == 1,
            "gemmbridge_burn::linear: bias has {len} elements but weight is [d_input, d_output] = {ws:?} (d_output or 1, which broadcasts)"
        );
    }
}
