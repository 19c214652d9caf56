//! The plain CUDA backend: burn's buffers handed to gemmbridge by address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use cubecl::cuda::CudaRuntime;
use gemmbridge::cuda::{Gpu, RawBuffer};
use gemmbridge::Precision;

use crate::layout::{plan, Fallback};
use crate::GemmOps;

/// One gemmbridge `Gpu` per device index, opened on first use (None when it cannot be).
fn gpu(index: usize) -> Option<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Option<Arc<Gpu>>>>> = OnceLock::new();
    let mut map = GPUS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.entry(index)
        .or_insert_with(|| match Gpu::new(index) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!("gemmbridge-burn: no gemmbridge GPU {index} ({e}); using burn's matmul");
                None
            }
        })
        .clone()
}

fn precision(dtype: DType) -> Option<Precision> {
    match dtype {
        DType::F32 if crate::tf32() => Some(Precision::TF32),
        DType::F32 => Some(Precision::F32),
        DType::F16 => Some(Precision::F16),
        DType::BF16 => Some(Precision::BF16),
        _ => None,
    }
}

/// Runs the matmul through gemmbridge, or says why not.
fn try_gemm(lhs: &CubeTensor<CudaRuntime>, rhs: &CubeTensor<CudaRuntime>) -> Result<CubeTensor<CudaRuntime>, Fallback> {
    let prec = precision(lhs.dtype)
        .filter(|_| lhs.dtype == rhs.dtype)
        .ok_or_else(|| Fallback::Problem(format!("dtypes {:?} · {:?}", lhs.dtype, rhs.dtype)))?;
    let p = plan(lhs.meta.shape(), lhs.meta.strides(), rhs.meta.shape(), rhs.meta.strides(), prec)?;
    let gpu = gpu(lhs.device.index).ok_or_else(|| Fallback::Problem("no gemmbridge GPU".into()))?;
    let client = lhs.client.clone();
    // the output, from burn's allocator on the calling thread's cubecl stream
    let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        client.clone(),
        lhs.device.clone(),
        Shape::from(p.out_shape.clone()),
        lhs.dtype,
    );
    let resource = |t: &CubeTensor<CudaRuntime>| {
        client.get_resource(t.handle.clone()).map_err(|e| Fallback::Problem(format!("get_resource: {e:?}")))
    };
    // the bindings keep the memory from being handed out again until they drop
    let (ra, rb, rc) = (resource(lhs)?, resource(rhs)?, resource(&out)?);
    // (cubecl's GpuResource type is not nameable outside cubecl-cuda; its fields are public)
    let a = RawBuffer { address: ra.resource().ptr, len_bytes: ra.resource().size as usize };
    let b = RawBuffer { address: rb.resource().ptr, len_bytes: rb.resource().size as usize };
    let c = RawBuffer { address: rc.resource().ptr, len_bytes: rc.resource().size as usize };
    // Forward edge: everything queued on this thread's cubecl stream (the producers of A and
    // B, C's allocation) is done. cubecl 0.10 exposes no CUstream to wait on instead.
    cubecl::future::block_on(client.sync()).map_err(|e| Fallback::Problem(format!("cubecl sync: {e:?}")))?;
    let s = gpu.stream();
    // SAFETY: the three addresses are live cubecl allocations of the primary context (which
    // gemmbridge's Gpu shares), held by the bindings above until after the synchronize below;
    // no cubecl work touches them meanwhile (the sync above drained this thread's stream, and
    // C is fresh); gemmbridge checks their lengths against the layouts.
    let r = unsafe { gpu.gemm_raw(&p.problem, 1.0, a, b, 0.0, c, s.cu_stream()) };
    // Back edge: C is written before cubecl reads it or reuses A and B.
    s.synchronize().map_err(|e| Fallback::Problem(format!("stream synchronize: {e:?}")))?;
    drop((ra, rb, rc));
    match r {
        Ok(()) => Ok(out),
        Err(e) => Err(Fallback::Problem(e.to_string())),
    }
}

/// The shared entry: gemmbridge when it can serve, burn's matmul (`fallback`) otherwise.
pub(crate) fn matmul_or(
    lhs: CubeTensor<CudaRuntime>,
    rhs: CubeTensor<CudaRuntime>,
    fallback: impl FnOnce(CubeTensor<CudaRuntime>, CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime>,
) -> CubeTensor<CudaRuntime> {
    if !crate::enabled() {
        crate::count(false);
        return fallback(lhs, rhs);
    }
    match try_gemm(&lhs, &rhs) {
        Ok(out) => {
            crate::count(true);
            tracing::debug!(lhs = ?lhs.meta.shape(), rhs = ?rhs.meta.shape(), dtype = ?lhs.dtype, "matmul: gemmbridge");
            out
        }
        Err(why) => {
            crate::count(false);
            tracing::debug!(lhs = ?lhs.meta.shape(), rhs = ?rhs.meta.shape(), ?why, "matmul: burn (fallback)");
            fallback(lhs, rhs)
        }
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> GemmOps for CubeBackend<CudaRuntime, F, I, BT> {
    fn gemm_matmul(lhs: CubeTensor<CudaRuntime>, rhs: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
        matmul_or(lhs, rhs, <Self as FloatTensorOps<Self>>::float_matmul)
    }
}
