//! The training layers' launches that are not GEMMs: gemmbridge's elementwise kernels
//! (`device/kernels/act.cu`) and cuBLAS's `axpy`, all on [`Gpu::stream`].

use super::super::device::{arg, suffix, KernelSet};
use super::super::gpu::Gpu;
use crate::dtype::DType;
use crate::error::Result;
use crate::train::Activation;

/// Threads per CTA of the elementwise kernels.
const THREADS: u32 = 256;
/// Most CTAs of their grid-stride loops (8 per SM of a 132-SM H200).
const MAX_CTAS: usize = 1056;

impl Gpu {
    /// Compiles the training layers' kernels now (NVRTC, tens of ms) rather than on the first
    /// step that needs one, which a CUDA graph capture then may contain.
    ///
    /// # Errors
    /// [`crate::Error::LibraryNotFound`] without NVRTC; [`crate::Error::Driver`].
    pub fn prepare_training(&self) -> Result<()> {
        self.with_kernels(|_| Ok(()))
    }

    /// Runs `f` with the training kernels (compiled on first use) under the lock.
    fn with_kernels(&self, f: impl FnOnce(&super::super::device::Kernels) -> Result<()>) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let k = st.dev.kernels(self.stream().cu_stream(), KernelSet::Train)?;
        f(k)
    }

    /// `out[rows, cols] = dy[rows, cols] ⊙ act′(saved)` on [`Gpu::stream`], where `saved` is
    /// the layer's output (ReLU) or pre-activation (GELU), `[rows, cols]` with row stride `ld`;
    /// `dy` and `out` contiguous (`out` may be `dy`).
    ///
    /// # Safety
    /// The addresses are device memory of this context holding those elements of `dtype`;
    /// `saved` does not overlap `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn enqueue_dact(
        &self,
        act: Activation,
        dtype: DType,
        dy: u64,
        saved: u64,
        out: u64,
        (rows, cols, ld): (usize, usize, usize),
    ) -> Result<()> {
        let kernel = match act {
            Activation::None => return Ok(()),
            Activation::Relu => "dact_relu",
            Activation::GeluTanh => "dact_gelu_tanh",
            Activation::GeluErf => "dact_gelu_erf",
        };
        let name = format!("{kernel}_{}", suffix(dtype));
        let (mut dy, mut saved, mut out) = (dy, saved, out);
        let grid = ((rows * cols).div_ceil(THREADS as usize).clamp(1, MAX_CTAS) as u32, 1, 1);
        let (mut n, mut cols, mut ld) = ((rows * cols) as i64, cols as i64, ld as i64);
        let stream = self.stream().cu_stream();
        self.with_kernels(|k| {
            // SAFETY: dact_*_T(const T* dy, const T* saved, T* out, long n, long cols, long ld);
            // the buffers are the caller's contract; grid-stride over n elements.
            unsafe {
                k.launch(
                    &name,
                    grid,
                    THREADS,
                    stream,
                    &mut [arg(&mut dy), arg(&mut saved), arg(&mut out), arg(&mut n), arg(&mut cols), arg(&mut ld)],
                )
            }
        })
    }

    /// `y[i] = act(pre[i])` for `n` contiguous elements, on [`Gpu::stream`]: the GELUs
    /// (erf or tanh form) and ReLU where no epilogue applies them (ReLU in place, `y = pre`,
    /// for FP8 layers). The identity: nothing to do.
    ///
    /// # Safety
    /// `pre` and `y` are device memory of this context holding `n` elements of `dtype`, the
    /// same memory or not overlapping.
    pub(crate) unsafe fn enqueue_act(&self, act: Activation, dtype: DType, pre: u64, y: u64, n: usize) -> Result<()> {
        let kernel = match act {
            Activation::GeluErf => "gelu_erf",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Relu => "relu",
            Activation::None => return Ok(()),
        };
        let name = format!("{kernel}_{}", suffix(dtype));
        let (mut pre, mut y, mut n64) = (pre, y, n as i64);
        let grid = (n.div_ceil(THREADS as usize).clamp(1, MAX_CTAS) as u32, 1, 1);
        let stream = self.stream().cu_stream();
        self.with_kernels(|k| {
            // SAFETY: gelu_*_T(const T* pre, T* y, long n); the caller's contract.
            unsafe { k.launch(&name, grid, THREADS, stream, &mut [arg(&mut pre), arg(&mut y), arg(&mut n64)]) }
        })
    }

    /// `y[i] += alpha·x[i]` for `n` contiguous elements (cuBLAS `axpy`, f32 arithmetic), on
    /// [`Gpu::stream`].
    ///
    /// # Safety
    /// `x` and `y` are device memory of this context holding `n` elements of `dtype`, not
    /// overlapping.
    pub(crate) unsafe fn enqueue_axpy(&self, dtype: DType, n: usize, alpha: f32, x: u64, y: u64) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        // SAFETY: forwarded; the stream is this Gpu's own.
        unsafe { st.libs.blas.axpy(&mut st.dev, dtype, n, alpha, x, y, self.stream().cu_stream()) }
    }
}
