//! What the cuBLASLt engine's GPU tests share: the capture lock, the f64 reference of a GEMM's
//! result, raw buffers of safe ones.

#![allow(dead_code)] // each test file uses its own part

use cudarc::driver::{CudaSlice, DevicePtr};
use gemmbridge::cuda::RawBuffer;
use gemmbridge::reference::{gemm_epilogue_rowmajor, rel_error};
use gemmbridge::{Element, GemmProblem};

/// The epilogue operands of a raw call, as these tests build them.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawExtras {
    pub bias: Option<RawBuffer>,
    pub aux: Option<RawBuffer>,
}

/// Tests that capture CUDA graphs (explicitly, in the tuner's graph timing, or through graph
/// replay) and assert that the capture happened take this lock exclusively; the others share
/// it. Another thread's first launch of a kernel (CUDA's lazy module loading synchronises the
/// device) invalidates a capture in flight; gemmbridge then falls back (direct call, eager
/// timing), which is right but would fail those assertions (seen on the H200 with the tests
/// on parallel threads).
pub static CAPTURE: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

pub fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    CAPTURE.write().unwrap_or_else(|p| p.into_inner())
}

pub fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// ‖got − ref‖ / ‖ref‖ for a dense row-major C (`m·n` elements, β = 0) read back from the GPU,
/// against the f64 reference of `p` (with `bias` if its epilogue reads one) on the stored
/// inputs.
pub fn error_vs_reference<TI: Element, TO: Element>(
    p: &GemmProblem,
    alpha: f64,
    got: &[TO],
    (a, b): (&[TI], &[TI]),
    bias: Option<&[TO]>,
) -> f64 {
    let mut want = vec![0.0; p.m() * p.n()];
    let mut bias = bias.map(wide);
    gemm_epilogue_rowmajor(p, (alpha, 0.0), [&wide(a), &wide(b)], &mut want, bias.as_deref_mut(), None);
    rel_error(&wide(got), &want)
}

/// The raw buffer of a device slice on `stream`.
pub fn raw<T>(s: &CudaSlice<T>, stream: &cudarc::driver::CudaStream) -> RawBuffer {
    RawBuffer { address: s.device_ptr(stream).0, len_bytes: s.len() * std::mem::size_of::<T>() }
}
