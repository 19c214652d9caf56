//! The CUDA path of the grouped matmul: gemmbridge's `Gpu::grouped_gemm` on candle's buffers,
//! on the stream of the storage given (as [`crate::cuda`]), with no host synchronisation.

use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::CudaDevice;
use candle_core::Result;
use gemmbridge::grouped::GroupedProblem;
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::cuda::{engine, output};

/// The grouped product `p` (forward, backward data or backward weight) on two contiguous
/// operands `a` and `b` in `GroupedOp::names`' order, each read from its start offset: the
/// output dense, of `p.lens()[2]` elements. Every element is written: the rows of the forward
/// and the backward data belong to the groups (`Σ m_e` is the rows), and the backward weight
/// writes zeros into an empty group's `dw[e]`.
pub(crate) fn grouped<T: Element + DeviceRepr>(
    dev: &CudaDevice,
    p: &GroupedProblem,
    (a, a_start): (&CudaSlice<T>, usize),
    (b, b_start): (&CudaSlice<T>, usize),
) -> Result<CudaSlice<T>> {
    let gpu = engine(dev)?;
    let (a, b) = (a.slice(a_start..), b.slice(b_start..));
    let mut c = output::<T>(dev, p.lens()[2])?;
    gpu.grouped_gemm(p, &a, &b, &mut c, None).map_err(wrap)?;
    Ok(c)
}
