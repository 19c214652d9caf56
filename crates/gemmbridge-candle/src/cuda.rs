//! The CUDA path: the plans of [`crate::plan`] run by gemmbridge (cuBLASLt, cuDNN) on candle's
//! own device buffers and stream. Zero-copy: the inputs are candle's `CudaSlice`s viewed at
//! their start offsets, the output is allocated by candle's device on its stream and handed
//! back as candle storage. Every call is enqueued on the stream of the storage it is given
//! (`CudaDevice::cuda_stream`: for `CudaDevice::new`, the calling thread's per-thread stream;
//! for `CudaDevice::new_with_stream`, the device's own), in order with candle's own work, with
//! no host synchronisation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda::cudarc::driver::result::memset_d8_async;
use candle_core::cuda::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::cuda::{CudaDevice, DeviceId};
use candle_core::Result;
use gemmbridge::cuda::{Extras, Gpu, GpuOptions, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, Scale};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::plan::{LinearPlan, MatmulPlan, NormPlan};

/// The gemmbridge engine on `dev`'s stream: made on first use (`Gpu::with_stream`, default
/// options) and kept for the process, one per candle device (`CudaDevice::id`).
pub(crate) fn engine(dev: &CudaDevice) -> Result<Arc<Gpu>> {
    static ENGINES: OnceLock<Mutex<HashMap<DeviceId, Arc<Gpu>>>> = OnceLock::new();
    let mut map = ENGINES
        .get_or_init(Mutex::default)
        .lock()
        .map_err(|_| candle_core::Error::Msg("gemmbridge engines: a thread panicked while holding the lock".into()))?;
    if let Some(gpu) = map.get(&dev.id()) {
        return Ok(gpu.clone());
    }
    let gpu = Arc::new(Gpu::with_stream(dev.cuda_stream(), GpuOptions::default()).map_err(wrap)?);
    map.insert(dev.id(), gpu.clone());
    Ok(gpu)
}

/// Runs `$body` with `$t` the element type of the CUDA storages given (one dtype: f32, f16 or
/// bf16), each bound to its `CudaSlice`; the result (a `CudaSlice<$t>`) wrapped as candle
/// storage on `$dev`.
macro_rules! by_dtype {
    ($op:expr, $dev:expr, [$($s:ident),+], |$t:ident| $body:expr) => {
        match ($(&$s.slice,)+) {
            ($(candle_core::cuda::CudaStorageSlice::F32($s),)+) => { type $t = f32; candle_core::CudaStorage::wrap_cuda_slice($body?, $dev.clone()) }
            ($(candle_core::cuda::CudaStorageSlice::F16($s),)+) => { type $t = gemmbridge::half::f16; candle_core::CudaStorage::wrap_cuda_slice($body?, $dev.clone()) }
            ($(candle_core::cuda::CudaStorageSlice::BF16($s),)+) => { type $t = gemmbridge::half::bf16; candle_core::CudaStorage::wrap_cuda_slice($body?, $dev.clone()) }
            _ => candle_core::bail!("{}: f32, f16 or bf16 operands of one dtype expected", $op),
        }
    };
}
pub(crate) use by_dtype;

/// An output of `n` elements on `dev`'s stream, every element written by the call it is made
/// for before candle reads it; filled with NaN first where [`crate::set_poison_outputs`] is on.
pub(crate) fn output<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: the memory is uninitialised; each caller's GEMM (β = 0 never reads C), norm or
    // attention writes all `n` elements on the same stream before the storage is returned.
    let mut out = unsafe { dev.alloc::<T>(n) }?;
    if crate::poison_outputs() {
        let stream = dev.cuda_stream();
        let bytes = n * std::mem::size_of::<T>();
        let (ptr, _record) = out.device_ptr_mut(&stream);
        // SAFETY: `ptr` is the start of the `bytes` bytes just allocated on `stream`, filled on
        // the same stream; all-ones bytes are a NaN of f32, f16 and bf16 alike.
        unsafe { memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }.map_err(candle_core::Error::wrap)?;
    }
    Ok(out)
}

/// `C = A·B` for the plan, C dense `[batch, m, n]`.
pub(crate) fn matmul<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &MatmulPlan,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (a, b) = (a.slice(plan.starts[0]..), b.slice(plan.starts[1]..));
    let mut c = output::<T>(dev, p.batch() * p.m() * p.n())?;
    gpu.gemm_fused(p, Scale::PRODUCT, &a, &b, &mut c, Extras::default()).map_err(wrap)?;
    Ok(c)
}

/// `y = act(x·wᵀ + bias)` with the bias and activation in cuBLASLt's epilogue.
pub(crate) fn linear<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &LinearPlan,
    [x, w]: [&CudaSlice<T>; 2],
    bias: Option<&CudaSlice<T>>,
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (x, w) = (x.slice(plan.starts[0]..), w.slice(plan.starts[1]..));
    let bias = bias.map(|b| b.slice(plan.starts[2]..));
    let mut y = output::<T>(dev, p.m() * p.n())?;
    let extras = Extras { bias: bias.as_ref().map(|b| b as &dyn DevicePtr<T>), ..Extras::default() };
    gpu.gemm_fused(p, Scale::PRODUCT, &x, &w, &mut y, extras).map_err(wrap)?;
    Ok(y)
}

/// RMSNorm's forward on cuDNN's norm graph (inference phase): `y` dense `[rows, c]`.
pub(crate) fn rms_norm<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &NormPlan,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (x, w) = (x.slice(plan.starts[0]..), w.slice(plan.starts[1]..));
    let mut y = output::<T>(dev, p.rows * p.features)?;
    gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut::new(&mut y)).map_err(wrap)?;
    Ok(y)
}

/// RMSNorm's backward from a dense `dy[rows, c]` starting at `dy_start`: `[dx (rows·c) | dw
/// (c)]` in one buffer; the training forward is run again first for the inverse RMS of every
/// row.
pub(crate) fn rms_norm_backward<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &NormPlan,
    [x, w]: [&CudaSlice<T>; 2],
    (dy, dy_start): (&CudaSlice<T>, usize),
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (x, w, dy) = (x.slice(plan.starts[0]..), w.slice(plan.starts[1]..), dy.slice(dy_start..));
    let (rows, c) = (p.rows, p.features);
    let mut inv_rms = output::<f32>(dev, rows)?;
    let mut y = output::<T>(dev, rows * c)?;
    gpu.rms_norm_forward(p, RmsNormIn::new(&x, &w), RmsNormOut::new(&mut y).training(&mut inv_rms)).map_err(wrap)?;
    let mut out = output::<T>(dev, rows * c + c)?;
    {
        let (mut dx, mut dw) = out.split_at_mut(rows * c);
        let saved = RmsNormSaved { x: &x, w: &w, inv_rms: &inv_rms, dy: &dy };
        gpu.rms_norm_backward(p, saved, &mut dx, RmsNormDw::Io(&mut dw)).map_err(wrap)?;
    }
    Ok(out)
}
