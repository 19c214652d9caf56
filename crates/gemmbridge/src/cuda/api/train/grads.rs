//! The layers' gradients and parameters outside the GEMMs: where a fused bias gradient is
//! written, its accumulation, and copies to the host.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};

use crate::cuda::api::engine::Gpu;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::Result;
use crate::train::{GradMode, LayerParams, Params};

/// Where a fused bias gradient goes: the layer's `db` (overwrite) or its temporary
/// (accumulate, then [`accumulate_bias_grad`]); cuBLASLt's BGRAD epilogues overwrite.
pub(super) fn bias_grad_out<'a, T>(
    mode: GradMode,
    db: &'a mut Option<CudaSlice<T>>,
    tmp: &'a mut Option<CudaSlice<T>>,
) -> Option<&'a mut dyn DevicePtrMut<T>> {
    let v = match mode {
        GradMode::Overwrite => db.as_mut(),
        GradMode::Accumulate => tmp.as_mut(),
    };
    v.map(|v| v as &mut dyn DevicePtrMut<T>)
}

/// Under [`GradMode::Accumulate`]: `db += tmp` (cuBLAS `axpy`), after the GEMM wrote `tmp`.
pub(super) fn accumulate_bias_grad<T: Element>(
    gpu: &Gpu,
    mode: GradMode,
    tmp: &Option<CudaSlice<T>>,
    db: &mut Option<CudaSlice<T>>,
) -> Result<()> {
    if let (GradMode::Accumulate, Some(tmp), Some(db)) = (mode, tmp, db.as_mut()) {
        let (s, n) = (gpu.stream(), tmp.len().min(db.len()));
        let (pt, _gt) = tmp.device_ptr(s);
        let (pb, _gb) = db.device_ptr_mut(s);
        // SAFETY: both hold the layer's out_features elements of T (n), distinct allocations.
        unsafe { gpu.enqueue_axpy(T::DTYPE, n, 1.0, pt, pb) }?;
    }
    Ok(())
}

/// Parameters or gradients (`w` and `b` per layer) copied to the host as f32 (waits for the stream).
pub(super) fn to_host<T: Element + DeviceRepr>(
    gpu: &Gpu,
    w: &[CudaSlice<T>],
    b: &[Option<CudaSlice<T>>],
) -> Result<Params> {
    let s = gpu.stream();
    let down = |v: &CudaSlice<T>| -> Result<Vec<f32>> {
        let h: Vec<T> = s.clone_dtoh(v).map_err(status::driver("cuMemcpyDtoH"))?;
        Ok(h.iter().map(|v| v.to_f32()).collect())
    };
    w.iter()
        .zip(b)
        .map(|(w, b)| Ok(LayerParams { w: down(w)?, b: b.as_ref().map(down).transpose()?.unwrap_or_default() }))
        .collect()
}
