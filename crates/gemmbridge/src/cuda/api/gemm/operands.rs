//! The operands of the GEMM entry points — raw buffers by address, and the epilogue's extra
//! operands (by address or as cudarc buffers) — and the checks of a raw call's buffers.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::error::Result;
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, check_c_in, check_epilogue, BufferDesc};

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
/// [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)) by address: stored row-major A, B
/// and C (inputs of the precision's input dtype, C of its output dtype), and the epilogue's
/// extra operands (see [`crate::epilogue`]; of the output dtype), named so that they cannot
/// be passed in the wrong order. With [`RawOperands::with_c_in`], C is read from a buffer of
/// its own and `c` is only written (cuBLASLt's D).
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
    /// Stored C (written: cuBLASLt's D; read too where β ≠ 0 and `c_in` is absent).
    pub c: RawBuffer,
    /// A read-only C (`D = α·op(A)·op(B) + β·C_in`), laid out as `c` (the problem's C layout,
    /// the output dtype); `None`, or `c`'s own address: C is read from `c` in place.
    pub c_in: Option<RawBuffer>,
    /// The bias `[n]` an epilogue reads, or the bias gradient (`[m]` or `[n]`) it writes.
    pub bias: Option<RawBuffer>,
    /// The aux `[m, n]` matrix (layout [`GemmProblem::aux`](crate::GemmProblem::aux)) an
    /// epilogue writes or reads.
    pub aux: Option<RawBuffer>,
}

impl RawOperands {
    /// A, B and C, no epilogue operands.
    pub const fn new(a: RawBuffer, b: RawBuffer, c: RawBuffer) -> RawOperands {
        RawOperands { a, b, c, c_in: None, bias: None, aux: None }
    }

    /// The same with C read from `c_in` instead of from the output `c`
    /// ([`Extras::c_in`] says what is checked and how each library serves it).
    #[must_use]
    pub const fn with_c_in(self, c_in: RawBuffer) -> RawOperands {
        RawOperands { c_in: Some(c_in), ..self }
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
        RawExtras { c_in: self.c_in, bias: self.bias, aux: self.aux }
    }
}

/// The operands beyond A, B and C by address, as the entry points pass them on: a separate
/// read-only C and the epilogue's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawExtras {
    pub c_in: Option<RawBuffer>,
    pub bias: Option<RawBuffer>,
    pub aux: Option<RawBuffer>,
}

/// The operands beyond A, B and C as cudarc buffers, for
/// [`Gpu::gemm_fused`](crate::cuda::Gpu::gemm_fused): a separate read-only C, and the
/// epilogue's. Give exactly the epilogue operands the epilogue uses (see [`crate::epilogue`]).
pub struct Extras<'a, T> {
    /// A read-only C: `D = epilogue(α·op(A)·op(B) + β·C_in)` with D the call's `c`, which is
    /// then only written — a residual added in the epilogue while the residual stream itself
    /// is kept. Laid out as the problem's C (same shape, leading dimension, batch stride and
    /// dtype: D's); checked like C, and no written operand may share a byte with it (D at
    /// C_in's own address is the in-place call). β = 0 does not read it. cuBLASLt takes C and
    /// D apart (`cublasLtMatmul`'s C and D); cuBLAS has no separate C, so a call cuBLAS serves
    /// ([`Backend::Blas`](crate::cuda::Backend::Blas), α = 0, k = 0, Auto's fallback) first
    /// copies C_in into D on the stream (`cuMemcpy3DAsync`, capturable), then computes
    /// `β·D` in place. On padded calls C_in is what is staged in.
    pub c_in: Option<&'a dyn DevicePtr<T>>,
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
        Extras { c_in: None, bias: None, bias_grad: None, aux_in: None, aux_out: None }
    }
}

/// Every buffer check for a call: A, B, C, then the epilogue's operands, then a separate C.
pub(crate) fn check_all(p: &GemmProblem, [a, b, c]: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
    check_buffers(p, a, b, c)?;
    let out = p.precision().output();
    let d = |r: RawBuffer| BufferDesc { address: r.address, len_bytes: r.len_bytes, dtype: out };
    let (bias, aux) = (extras.bias.map(d), extras.aux.map(d));
    check_epilogue(p, [a, b, c], bias, aux)?;
    match extras.c_in {
        Some(ci) => check_c_in(p, [a, b, c], d(ci), bias, aux),
        None => Ok(()),
    }
}
