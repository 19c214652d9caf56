//! The training layers' launches that are not GEMMs: gemmbridge's elementwise kernels
//! (`device/kernels/act.cu`) and cuBLAS's `axpy`, all on [`Gpu::stream`].

use crate::cuda::api::engine::Gpu;
use crate::cuda::blas::Axpy;
use crate::cuda::device::{arg, suffix, KernelSet};
use crate::dtype::DType;
use crate::error::Result;
use crate::train::Activation;

/// Threads per CTA of the elementwise kernels.
const THREADS: u32 = 256;
/// Most CTAs of their grid-stride loops (8 per SM of a 132-SM H200).
const MAX_CTAS: usize = 1056;

/// The grid of a grid-stride loop over `items`.
fn grid(items: usize) -> (u32, u32, u32) {
    (items.div_ceil(THREADS as usize).clamp(1, MAX_CTAS) as u32, 1, 1)
}

/// The 8-wide instances' counts `(n8, cols8, ld8)` for a `[rows, cols]` operation whose saved
/// operand has row stride `ld`, when they serve: `cols` and `ld` multiples of 8, every address
/// 16-byte aligned (so every row of 8-element chunks is), and the chunk counts and the saved
/// operand's last chunk index below 2³¹ (the kernels index in 32 bits). `None`: the scalar
/// instances run (the same arithmetic per element, so the same bits).
fn wide((rows, cols, ld): (usize, usize, usize), addrs: &[u64]) -> Option<(u32, u32, u32)> {
    let aligned =
        cols.is_multiple_of(8) && ld.is_multiple_of(8) && cols > 0 && addrs.iter().all(|a| a.is_multiple_of(16));
    let small = (rows.checked_mul(ld.max(cols))? / 8) < (1 << 31);
    (aligned && small).then(|| ((rows * cols / 8) as u32, (cols / 8) as u32, (ld / 8) as u32))
}

/// One activation-backward launch ([`Gpu::enqueue_dact`]):
/// `out[rows, cols] = dy[rows, cols] ⊙ act′(saved)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DactLaunch {
    /// The activation whose derivative is applied.
    pub act: Activation,
    /// The element type of all three operands.
    pub dtype: DType,
    /// The incoming gradient, `[rows, cols]` contiguous.
    pub dy: u64,
    /// The layer's output (ReLU) or pre-activation (GELU), `[rows, cols]` with row stride `ld`.
    pub saved: u64,
    /// The result, `[rows, cols]` contiguous; may be `dy`.
    pub out: u64,
    /// `(rows, cols, ld)`.
    pub shape: (usize, usize, usize),
}

/// Compiles the training layers' kernels on `gpu` now (NVRTC, tens of ms) rather than on the
/// first step of an [`Mlp`](super::Mlp) that needs one, which a CUDA graph capture then may
/// contain.
///
/// # Errors
/// [`crate::Error::LibraryNotFound`] without NVRTC; [`crate::Error::Driver`].
pub fn prepare_kernels(gpu: &Gpu) -> Result<()> {
    gpu.with_kernels(|_| Ok(()))
}

impl Gpu {
    /// Runs `f` with the training kernels (compiled on first use) under the lock.
    fn with_kernels(&self, f: impl FnOnce(&crate::cuda::device::Kernels) -> Result<()>) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let k = st.dev.kernels(self.stream().cu_stream(), KernelSet::Train)?;
        f(k)
    }

    /// `out[rows, cols] = dy[rows, cols] ⊙ act′(saved)` per `launch` ([`DactLaunch`]) on
    /// [`Gpu::stream`].
    ///
    /// # Safety
    /// `launch`'s addresses are device memory of this context holding the elements its shape
    /// names, of its `dtype`; `saved` does not overlap `out`.
    pub(crate) unsafe fn enqueue_dact(&self, launch: DactLaunch) -> Result<()> {
        let DactLaunch { act, dtype, dy, saved, out, shape: (rows, cols, ld) } = launch;
        if act == Activation::GeluTanh {
            if let Some((n8, cols8, ld8)) = wide((rows, cols, ld), &[dy, saved, out]) {
                let name = format!("dact_gelu_tanh_v8_{}", suffix(dtype));
                let (mut dy, mut saved, mut out) = (dy, saved, out);
                let (mut n8, mut cols8, mut ld8) = (n8, cols8, ld8);
                let stream = self.stream().cu_stream();
                return self.with_kernels(|k| {
                    // SAFETY: dact_gelu_tanh_v8_T(const T* dy, const T* pre, T* out, unsigned n8,
                    // unsigned cols8, unsigned ld8); `wide` checked the alignment and counts, the
                    // buffers are the caller's contract.
                    unsafe {
                        k.launch(
                            &name,
                            grid(n8 as usize),
                            THREADS,
                            stream,
                            &mut [
                                arg(&mut dy),
                                arg(&mut saved),
                                arg(&mut out),
                                arg(&mut n8),
                                arg(&mut cols8),
                                arg(&mut ld8),
                            ],
                        )
                    }
                });
            }
        }
        let kernel = match act {
            Activation::None => return Ok(()),
            Activation::Relu => "dact_relu",
            Activation::GeluTanh => "dact_gelu_tanh",
            Activation::GeluErf => "dact_gelu_erf",
        };
        let name = format!("{kernel}_{}", suffix(dtype));
        let (mut dy, mut saved, mut out) = (dy, saved, out);
        let grid = grid(rows * cols);
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
        if act == Activation::GeluTanh {
            if let Some((n8, _, _)) = wide((1, n, n), &[pre, y]) {
                let name = format!("gelu_tanh_v8_{}", suffix(dtype));
                let (mut pre, mut y, mut n8) = (pre, y, n8);
                let stream = self.stream().cu_stream();
                return self.with_kernels(|k| {
                    // SAFETY: gelu_tanh_v8_T(const T* pre, T* y, unsigned n8); `wide` checked
                    // the alignment and count, the buffers are the caller's contract.
                    unsafe {
                        k.launch(
                            &name,
                            grid(n8 as usize),
                            THREADS,
                            stream,
                            &mut [arg(&mut pre), arg(&mut y), arg(&mut n8)],
                        )
                    }
                });
            }
        }
        let kernel = match act {
            Activation::GeluErf => "gelu_erf",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Relu => "relu",
            Activation::None => return Ok(()),
        };
        let name = format!("{kernel}_{}", suffix(dtype));
        let (mut pre, mut y, mut n64) = (pre, y, n as i64);
        let grid = grid(n);
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
        let a = Axpy { dtype, n, alpha, x, y };
        unsafe { st.libs.blas.axpy(&mut st.dev, &a, self.stream().cu_stream()) }
    }
}

#[cfg(test)]
mod tests {
    use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::dtype::Element;

    #[test]
    fn the_8_wide_instances_take_aligned_rows_only() {
        assert_eq!(wide((37, 264, 272), &[0x1000, 0x2000, 0x3000]), Some((37 * 33, 33, 34)));
        assert_eq!(wide((1, 4096, 4096), &[0]), Some((512, 512, 512)));
        // a width or stride not a multiple of 8, an address off 16 bytes, no columns
        assert_eq!(wide((37, 260, 264), &[0]), None);
        assert_eq!(wide((37, 264, 270), &[0]), None);
        assert_eq!(wide((37, 264, 264), &[0x1000, 0x1002]), None);
        assert_eq!(wide((0, 0, 0), &[0]), None);
        // counts past 32-bit indexing in units of 8, and an overflowing product
        assert_eq!(wide((1 << 20, 1 << 14, 1 << 14), &[0]), None);
        assert!(wide((1 << 16, 1 << 14, 1 << 14), &[0]).is_some());
        assert_eq!(wide((usize::MAX, 8, 8), &[0]), None);
    }

    /// Device copies of `v`, once at a 16-byte-aligned address and once one element past it.
    fn both<T: Element + DeviceRepr>(gpu: &Gpu, v: &[T]) -> (CudaSlice<T>, CudaSlice<T>) {
        let mut shifted = vec![T::default()];
        shifted.extend_from_slice(v);
        (gpu.stream().clone_htod(v).unwrap(), gpu.stream().clone_htod(&shifted).unwrap())
    }

    fn addr<T>(gpu: &Gpu, v: &CudaSlice<T>) -> u64 {
        v.device_ptr(gpu.stream()).0
    }

    fn host<T: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<T>, skip: usize) -> Vec<f64> {
        gpu.stream().clone_dtoh(v).unwrap()[skip..].iter().map(|x| x.to_f64()).collect()
    }

    /// The GELU-tanh forward and backward, 8-wide (aligned) and scalar (the same data one
    /// element off alignment), on `[37, 264]` with the saved operand's rows 272 apart: the
    /// same bits, NaN and infinities included, and both near the float64 definition.
    fn wide_equals_scalar<T: Element + DeviceRepr>(gpu: &Gpu, rng: &mut rand::rngs::StdRng, tol: f64) {
        let (rows, cols, ld) = (37usize, 264usize, 272usize);
        let mut value = |_| T::from_f64(rng.random_range(-6.0..6.0));
        let mut pre: Vec<T> = (0..rows * ld).map(&mut value).collect();
        let dy: Vec<T> = (0..rows * cols).map(&mut value).collect();
        for (i, special) in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 30.0, -30.0].iter().enumerate() {
            pre[i * 13] = T::from_f64(*special);
        }
        let (pre_a, pre_s) = both(gpu, &pre);
        let (dy_a, dy_s) = both(gpu, &dy);
        let (out_a, out_s) = both(gpu, &vec![T::from_f64(f64::NAN); rows * cols]);
        let (pa, da, oa) = (addr(gpu, &pre_a), addr(gpu, &dy_a), addr(gpu, &out_a));
        let e = std::mem::size_of::<T>() as u64;
        let (ps, ds, os) = (addr(gpu, &pre_s) + e, addr(gpu, &dy_s) + e, addr(gpu, &out_s) + e);
        assert!(wide((rows, cols, ld), &[da, pa, oa]).is_some() && wide((rows, cols, ld), &[ds, ps, os]).is_none());
        let (act, dt) = (Activation::GeluTanh, T::DTYPE);
        let launch = |dy, saved, out| DactLaunch { act, dtype: dt, dy, saved, out, shape: (rows, cols, ld) };
        // SAFETY: every buffer holds the elements named (the shifted ones one more), on this
        // context; saved and out do not overlap.
        unsafe {
            gpu.enqueue_dact(launch(da, pa, oa)).unwrap();
            gpu.enqueue_dact(launch(ds, ps, os)).unwrap();
        }
        let (got_a, got_s) = (host(gpu, &out_a, 0), host(gpu, &out_s, 1));
        let same =
            |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
        assert!(same(&got_a, &got_s), "{dt}: dact_gelu_tanh 8-wide and scalar differ");
        let want: Vec<f64> =
            (0..rows * cols).map(|i| dy[i].to_f64() * act.grad(pre[i / cols * ld + i % cols].to_f64())).collect();
        let finite = |v: &[f64]| v.iter().map(|x| if x.is_finite() { *x } else { 0.0 }).collect::<Vec<_>>();
        let err = crate::reference::rel_error(&finite(&got_a), &finite(&want));
        assert!(err <= tol, "{dt}: dact_gelu_tanh rel error {err:e} > {tol:e}");
        // the forward over pre's rows as one contiguous run
        let n = rows * ld;
        let (y_a, y_s) = both(gpu, &vec![T::from_f64(f64::NAN); n]);
        let (ya, ys) = (addr(gpu, &y_a), addr(gpu, &y_s) + e);
        // SAFETY: as above, n elements each.
        unsafe {
            gpu.enqueue_act(act, dt, pa, ya, n).unwrap();
            gpu.enqueue_act(act, dt, ps, ys, n).unwrap();
        }
        let (fa, fs) = (host(gpu, &y_a, 0), host(gpu, &y_s, 1));
        assert!(same(&fa, &fs), "{dt}: gelu_tanh 8-wide and scalar differ");
        let want: Vec<f64> = pre.iter().map(|p| act.apply(p.to_f64())).collect();
        let err = crate::reference::rel_error(&finite(&fa), &finite(&want));
        assert!(err <= tol, "{dt}: gelu_tanh rel error {err:e} > {tol:e}");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_8_wide_gelu_tanh_instances_give_the_scalar_bits() {
        let gpu = Gpu::new(0).expect("a CUDA GPU");
        let seed = std::env::var("GEMMBRIDGE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::rng().random::<u64>());
        eprintln!("test seed {seed} (replay with GEMMBRIDGE_TEST_SEED={seed})");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        wide_equals_scalar::<f32>(&gpu, &mut rng, 1e-5);
        wide_equals_scalar::<half::f16>(&gpu, &mut rng, 1e-2);
        wide_equals_scalar::<half::bf16>(&gpu, &mut rng, 1e-2);
    }
}
