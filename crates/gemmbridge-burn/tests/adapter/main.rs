//! gemmbridge-burn's tests, in one executable (each test executable links all of burn, so one
//! builds much faster than several):
//!
//! - `linear`: `GemmLinear` and the autodiff rules on burn's NdArray backend (CPU, runs in CI);
//! - `gpu`: forward, fused linear and gradients against float64 and burn's own ops (CUDA);
//! - `gpu_ordering`: device ordering under stress, both orderings, the cross-thread fallback (CUDA);
//! - `gpu_switch`: the A/B switch (CUDA);
//! - `layer_cpu`: `rms_norm`, `swiglu`, `rope` and their modules on NdArray (CPU, runs in CI);
//! - `gpu_layer`: the same through gemmbridge against float64 and burn's own ops (CUDA);
//! - `conv_cpu` / `gpu_conv`: `conv2d` and `GemmConv2d` on NdArray (CPU, runs in CI) / through
//!   gemmbridge's cuDNN convolutions against float64 and burn's own conv2d (CUDA);
//! - `grouped_cpu` / `gpu_grouped`: `grouped_matmul` on NdArray (CPU, runs in CI) / through
//!   gemmbridge's grouped GEMM against float64 and the fallback (CUDA);
//! - `composition`: autodiff through a decoder block built of the adapter's operations, by
//!   finite differences on NdArray (CPU, runs in CI) and against float64 through gemmbridge (CUDA);
//! - `train_check`: the `train_llama` example's model trained with burn's modules and with
//!   gemmbridge-burn's, loss curves compared (NdArray, runs in CI; bf16 on CUDA).
//!
//! The CUDA tests are `#[ignore]`d; `cargo test -p gemmbridge-burn --test adapter --
//! --include-ignored` runs them all, and a module path filters, e.g. `-- --include-ignored
//! gpu_ordering::`.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use gemmbridge_burn::{set_ordering, GemmOrdering};

mod attention;
mod composition;
mod conv_cpu;
mod cpu_common;
mod gpu;
mod gpu_conv;
mod gpu_grouped;
mod gpu_layer;
mod gpu_ordering;
mod gpu_switch;
mod grouped_cpu;
mod layer_cpu;
mod linear;
mod train_check;

/// The adapter's switch, its ordering and its call counts are process-wide. A GPU test that
/// changes them, or counts calls exactly, holds this lock for writing and so runs alone; every
/// other GPU test holds it for reading.
static ADAPTER_STATE: RwLock<()> = RwLock::new(());

/// For a test that runs with the adapter as it is by default, beside other such tests.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    ADAPTER_STATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// For a test that changes the adapter's process-wide state or counts its calls exactly: it
/// runs alone, and the default ordering (device, adapter on) is back when it ends, also when
/// it fails.
pub fn exclusive() -> Exclusive {
    Exclusive { _alone: ADAPTER_STATE.write().unwrap_or_else(PoisonError::into_inner) }
}

/// The write side of the adapter-state lock ([`exclusive`]).
pub struct Exclusive {
    _alone: RwLockWriteGuard<'static, ()>,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        set_ordering(GemmOrdering::Device);
    }
}
