//! The operands of the GEMM entry points — raw buffers by address, and the epilogue's extra
//! operands (by address or as cudarc buffers) — and the checks of a raw call's buffers.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::error::Result;
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, check_epilogue, BufferDesc};

/// A device buffer given by address, for memory gemmbridge does not own (another framework's
/// tensor storage). Zero-copy: only the address is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBuffer {
    /// Device address of the first element (a `CUdeviceptr`).
    pub address: u64,
    /// Bytes valid from `address` on; checked against what the layout addresses.
    pub len_bytes: usize,
}

/// The operands of a raw call ([`Gpu::gemm_raw`](crate::cuda::Gpu::gemm_raw),
/// [`Gpu::autotune_raw`](crate::cuda::Gpu::autotune_raw)) by address: stored row-major A, B
/// and C (inputs of the precision's input dtype, C of its output dtype), and the epilogue's
/// extra operands (see [`crate::epilogue`]; of the output dtype), named so that they cannot
/// be passed in the wrong order.
///
/// ```
/// use gemmbridge::cuda::{RawBuffer, RawOperands};
/// let buf = |address| RawBuffer { address, len_bytes: 4096 };
/// let ops = RawOperands::new(buf(0x1000), buf(0x2000), buf(0x3000)).with_bias(buf(0x4000));
/// assert_eq!(ops.bias, Some(buf(0x4000)));
/// assert_eq!(ops.aux, None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawOperands {
    /// Stored A.
    pub a: RawBuffer,
    /// Stored B.
    pub b: RawBuffer,
    /// Stored C (written).
    pub c: RawBuffer,
    /// The bias `[n]` an epilogue reads, or the bias gradient (`[m]` or `[n]`) it writes.
    pub bias: Option<RawBuffer>,
    /// The aux `[m, n]` matrix (layout [`GemmProblem::aux`](crate::GemmProblem::aux)) an
    /// epilogue writes or reads.
    pub aux: Option<RawBuffer>,
}

impl RawOperands {
    /// A, B and C, no epilogue operands.
    pub const fn new(a: RawBuffer, b: RawBuffer, c: RawBuffer) -> RawOperands {
        RawOperands { a, b, c, bias: None, aux: None }
    }

    /// The same with the epilogue's bias (or bias gradient).
    #[must_use]
    pub const fn with_bias(self, bias: RawBuffer) -> RawOperands {
        RawOperands { bias: Some(bias), ..self }
    }

    /// The same with the epilogue's aux matrix.
    #[must_use]
    pub const fn with_aux(self, aux: RawBuffer) -> RawOperands {
        RawOperands { aux: Some(aux), ..self }
    }

    /// Buffer descriptions of A, B, C for `p` (inputs of the input dtype, C of the output's).
    pub(crate) fn descs(&self, p: &GemmProblem) -> [BufferDesc; 3] {
        let prec = p.precision();
        let desc = |r: RawBuffer, dtype| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype };
        [desc(self.a, prec.input()), desc(self.b, prec.input()), desc(self.c, prec.output())]
    }

    /// The epilogue's operands alone.
    pub(crate) fn extras(&self) -> RawExtras {
        RawExtras { bias: self.bias, aux: self.aux }
    }
}

/// The epilogue's extra operands by address, as the entry points pass them on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawExtras {
    pub bias: Option<RawBuffer>,
    pub aux: Option<RawBuffer>,
}

/// The epilogue's extra operands as cudarc buffers, for [`Gpu::gemm_fused`](crate::cuda::Gpu::gemm_fused). Give exactly the
/// ones the epilogue uses (see [`crate::epilogue`]).
pub struct Extras<'a, T> {
    /// A bias `[n]` the epilogue reads.
    pub bias: Option<&'a dyn DevicePtr<T>>,
    /// A bias gradient the epilogue writes (`[m]` for `BiasGradA`, `[n]` for `BiasGradB`).
    pub bias_grad: Option<&'a mut dyn DevicePtrMut<T>>,
    /// An aux matrix the epilogue reads (`DGelu`).
    pub aux_in: Option<&'a dyn DevicePtr<T>>,
    /// An aux matrix the epilogue writes (`GeluAux`, `GeluAuxBias`).
    pub aux_out: Option<&'a mut dyn DevicePtrMut<T>>,
}

impl<T> Default for Extras<'_, T> {
    fn default() -> Self {
        Extras { bias: None, bias_grad: None, aux_in: None, aux_out: None }
    }
}

/// Every buffer check for a call: A, B, C, then the epilogue's operands.
pub(crate) fn check_all(p: &GemmProblem, [a, b, c]: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
    check_buffers(p, a, b, c)?;
    let out = p.precision().output();
    let d = |r: RawBuffer| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype: out };
    check_epilogue(p, [a, b, c], extras.bias.map(d), extras.aux.map(d))
}
