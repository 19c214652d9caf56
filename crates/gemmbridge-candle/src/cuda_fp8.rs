//! `fp8_linear`'s CUDA path: gemmbridge's quantisation kernels (`GpuFp8::quantize`) and FP8 GEMM
//! (`GpuFp8::gemm`, cuBLASLt) on candle's buffers and stream, through the engine of
//! [`crate::cuda::engine`]. The quantised operands come from the stream-ordered pool and are
//! freed in stream order after the GEMM; nothing waits for the host.

use candle_core::cuda::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use candle_core::cuda::{CudaDevice, CudaStorageSlice};
use candle_core::{Device, Result, Storage, Tensor};
use gemmbridge::cuda::{Fp8Options, Fp8Tensor};
use gemmbridge::fp8::{Fp8Format, Scaling, Source};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::cuda::{engine, output};

/// `w[n, k]` (a CUDA tensor of f32, f16 or bf16) quantised to E4M3 with `scaling` by the
/// engine on candle's stream, or `None` where `w` is not on a CUDA device or the GPU and the
/// loaded cuBLASLt do not offer `scaling` (`DeviceInfo::check_fp8`: row-wise and block scales
/// need compute capability 9.0 and cuBLASLt ≥ 12.9).
pub(crate) fn quantize_weight(w: &Tensor, scaling: Scaling) -> Result<Option<Fp8Tensor>> {
    let Device::Cuda(dev) = w.device() else { return Ok(None) };
    let gpu = engine(dev)?;
    if gpu.info().map_err(wrap)?.check_fp8(scaling).is_err() {
        return Ok(None);
    }
    let (n, k) = w.dims2()?;
    let w = w.contiguous()?;
    let (storage, layout) = w.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        candle_core::bail!("Fp8Weight::quantize: a CUDA tensor without CUDA storage")
    };
    let range = layout.start_offset()..layout.start_offset() + n * k;
    let (src, fmt) = (Source::RowMajor, Fp8Format::E4M3);
    let q = match &cs.slice {
        CudaStorageSlice::F32(s) => gpu.fp8().quantize(&s.slice(range), n, k, src, fmt, scaling),
        CudaStorageSlice::F16(s) => gpu.fp8().quantize(&s.slice(range), n, k, src, fmt, scaling),
        CudaStorageSlice::BF16(s) => gpu.fp8().quantize(&s.slice(range), n, k, src, fmt, scaling),
        _ => candle_core::bail!("Fp8Weight::quantize: the weight must be f32, f16 or bf16, not {:?}", w.dtype()),
    };
    q.map(Some).map_err(wrap)
}

/// `y[m, n] = x[m, k]·wᵀ (+ bias[n])` in FP8: `x` (dense from `x_start`) quantised to E4M3 with
/// `x_scaling` on the stream, then the FP8 GEMM with f32 accumulation into a new `y` of `T`
/// (the bias in cuBLASLt's epilogue, f16/bf16 only).
pub(crate) fn forward<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    w: &Fp8Tensor,
    (x, x_start, m): (&CudaSlice<T>, usize, usize),
    bias: Option<(&CudaSlice<T>, usize)>,
    x_scaling: Scaling,
) -> Result<CudaSlice<T>> {
    let (n, k) = (w.layout().rows, w.layout().cols);
    let gpu = engine(dev)?;
    let xv = x.slice(x_start..x_start + m * k);
    let xq = gpu.fp8().quantize(&xv, m, k, Source::RowMajor, Fp8Format::E4M3, x_scaling).map_err(wrap)?;
    let bias = bias.map(|(b, start)| b.slice(start..start + n));
    let mut y = output::<T>(dev, m * n)?;
    let bias_ptr = bias.as_ref().map(|b| b as &dyn DevicePtr<T>);
    gpu.fp8().gemm(&xq, w, &mut y, bias_ptr, Fp8Options::default()).map_err(wrap)?;
    Ok(y)
}
