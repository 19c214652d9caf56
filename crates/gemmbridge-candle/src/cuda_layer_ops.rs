//! The CUDA path of RoPE and SwiGLU: the plans of [`crate::rope`] and [`crate::swiglu`] run by
//! gemmbridge's layer kernels on candle's buffers, on the stream of the storage given (as
//! [`crate::cuda`]); RoPE's copies into and out of its scratch are candle's own `copy2d`
//! kernels on the same stream. No host synchronisation.

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use candle_core::cuda::{CudaDevice, CudaStorageSlice};
use candle_core::{CudaStorage, DType, Result};
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer_ops::{Positions, RopeTables};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::cuda::{engine, output};
use crate::layer_plan::{GluPlan, RopePlan};

/// `n` elements of `dtype` (f32, f16 or bf16) on `dev`'s stream as candle storage
/// ([`output`]: NaN first where poisoning is on).
fn storage(dev: &CudaDevice, dtype: DType, n: usize) -> Result<CudaStorage> {
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(output::<f32>(dev, n)?, dev.clone()),
        DType::F16 => CudaStorage::wrap_cuda_slice(output::<f16>(dev, n)?, dev.clone()),
        DType::BF16 => CudaStorage::wrap_cuda_slice(output::<bf16>(dev, n)?, dev.clone()),
        other => candle_core::bail!("rope: f32, f16 or bf16 expected, not {other:?}"),
    })
}

/// RoPE: x copied into the scratch fused QKV buffer (every query and key head of every row is
/// written by [`RopePlan::blocks`]' copies; the value heads are neither written nor read, and
/// the scratch never reaches candle), rotated in place by `Gpu::rope`, its query and key heads
/// copied out into the dense `[b, h, t, d]` output (every element written).
pub(crate) fn rope(plan: &RopePlan, x: &CudaStorage, tables: [&CudaStorage; 2]) -> Result<CudaStorage> {
    let (dev, p) = (&x.device, &plan.problem);
    let (d, dtype, blocks) = (p.head_dim, x.dtype(), plan.blocks());
    let mut scratch = storage(dev, dtype, p.qkv_elems())?;
    for b in &blocks {
        x.copy2d(&mut scratch, b.rows, d, plan.x_rs, p.ld, plan.x_start + b.row * plan.x_rs, b.slot)?;
    }
    rotate(plan, &mut scratch, tables)?;
    let mut out = storage(dev, dtype, plan.out_elems())?;
    for b in blocks.iter().filter(|b| b.copy_out) {
        scratch.copy2d(&mut out, b.rows, d, p.ld, d, b.slot, b.row * d)?;
    }
    Ok(out)
}

/// The plan's rotation of the scratch, tables `[t, d/2]` f32 at the plan's offsets.
fn rotate(plan: &RopePlan, scratch: &mut CudaStorage, [cos, sin]: [&CudaStorage; 2]) -> Result<()> {
    let gpu = engine(&scratch.device)?;
    let [cs, ss] = plan.table_starts;
    let (cos, sin) = (cos.as_cuda_slice::<f32>()?.slice(cs..), sin.as_cuda_slice::<f32>()?.slice(ss..));
    let tables = Some(RopeTables { cos: &cos as &dyn DevicePtr<f32>, sin: &sin as &dyn DevicePtr<f32> });
    let start: Positions<&dyn DevicePtr<i32>> = Positions::Contiguous { start: 0 };
    let (p, dir) = (&plan.problem, plan.direction);
    let r = match &mut scratch.slice {
        CudaStorageSlice::F32(s) => gpu.rope::<f32>(p, dir, s, start, tables),
        CudaStorageSlice::F16(s) => gpu.rope::<f16>(p, dir, s, start, tables),
        CudaStorageSlice::BF16(s) => gpu.rope::<bf16>(p, dir, s, start, tables),
        _ => candle_core::bail!("rope: f32, f16 or bf16 expected"),
    };
    r.map_err(wrap)
}

/// SwiGLU's forward: `y` dense `[rows, f]` (every element written).
pub(crate) fn swiglu<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &GluPlan,
    gu: &CudaSlice<T>,
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let gu = gu.slice(plan.start..);
    let mut y = output::<T>(dev, p.rows * p.f)?;
    gpu.swiglu(p, &gu, &mut y).map_err(wrap)?;
    Ok(y)
}

/// SwiGLU's backward from a dense `dy[rows, f]` starting at `dy_start`: `dgu` `[rows, ld_in]`
/// (gu's row stride). Every element of the `[.., 2·f]` view candle is handed is written; the
/// row padding past `2·f` is not, and lies outside that view.
pub(crate) fn swiglu_backward<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    plan: &GluPlan,
    gu: &CudaSlice<T>,
    (dy, dy_start): (&CudaSlice<T>, usize),
) -> Result<CudaSlice<T>> {
    let p = &plan.problem;
    let gpu = engine(dev)?;
    let (gu, dy) = (gu.slice(plan.start..), dy.slice(dy_start..));
    let mut dgu = output::<T>(dev, p.rows * p.ld_in)?;
    gpu.swiglu_backward(p, &dy, &gu, &mut dgu).map_err(wrap)?;
    Ok(dgu)
}
