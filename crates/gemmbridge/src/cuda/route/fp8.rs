//! FP8 GEMM on the routing floor: the FP8 operand type ([`Fp8Tensor`]), the call value
//! ([`Fp8Call`]: every FP8 rule checked by `validate`), and the plan of the staging the
//! hardware's alignment rules need before the launch in cuBLASLt's FP8 mode (`lt/fp8.rs`).
//!
//! Staging: cuBLASLt's FP8 kernels need the output's rows 16-byte aligned and, with 1×128 or
//! 128×128 scales, the row counts they scale a multiple of 4 (`crate::fp8` lists the measured
//! rules). Where `y` does not meet them (N · element size not a multiple of 16, an output
//! address off 16 bytes, or M / N not a multiple of 16 with block scales) the GEMM runs on an
//! aligned copy of `y` from the stream-ordered pool, sized by the operands' padded rows (whose
//! padding is zeros), and `y`'s `[M, N]` part is copied back (copied in first when β ≠ 0). A
//! bias is staged with it (zero-extended). Cost per call: one `cuMemAllocAsync`, one or two
//! pitched copies of `y`; none on the aligned path.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::cuda::device::{copy_pitched, Locked, Pitched, RelaxedDrop, Scratch};
use crate::cuda::library;
use crate::cuda::lt::fp8::{Fp8Key, Fp8Operands};
use crate::cuda::route::Libraries;
use crate::cuda::status;
use crate::dtype::DType;
use crate::error::{Error, Result, Which};
use crate::fp8::{check_pair, check_support, Fp8Format, Fp8Layout, Fp8Rule, OutputKind, Quantized, Scaling};

/// An FP8 operand on the GPU: data row-major `[rows_alloc, ld]` bytes and f32 scales, in the
/// layouts [`Fp8Layout`] documents (zeros in the padding). Made by [`GpuFp8::quantize`](crate::cuda::GpuFp8::quantize); used by
/// [`GpuFp8::gemm`](crate::cuda::GpuFp8::gemm) as `x[M, K]` (rows = M) or `w[N, K]` (rows = N). Owns its memory, in the
/// context of the `Gpu` that made it.
pub struct Fp8Tensor {
    pub(crate) data: RelaxedDrop<CudaSlice<u8>>,
    pub(crate) scales: RelaxedDrop<CudaSlice<f32>>,
    pub(crate) layout: Fp8Layout,
    pub(crate) format: Fp8Format,
}

impl std::fmt::Debug for Fp8Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp8Tensor").field("layout", &self.layout).field("format", &self.format).finish()
    }
}

impl Fp8Tensor {
    /// The layout: rows, columns (K), leading dimension, scaling.
    pub fn layout(&self) -> Fp8Layout {
        self.layout
    }

    /// The FP8 format of the data.
    pub fn format(&self) -> Fp8Format {
        self.format
    }

    /// The data, `layout().data_len()` bytes.
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.data
    }

    /// The dequantisation scales, `layout().scale_len()` f32s.
    pub fn scales(&self) -> &CudaSlice<f32> {
        &self.scales
    }

    /// Copies data and scales to the host (waits for the tensor's stream).
    ///
    /// # Errors
    /// [`Error::Driver`] from the copies.
    pub fn to_host(&self) -> Result<Quantized> {
        let s = self.data.stream();
        let data = s.clone_dtoh(&*self.data).map_err(status::driver("cuMemcpyDtoHAsync"))?;
        let scales = s.clone_dtoh(&*self.scales).map_err(status::driver("cuMemcpyDtoHAsync"))?;
        s.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        Ok(Quantized { layout: self.layout, format: self.format, data, scales })
    }
}

/// Options of an FP8 GEMM: `y = α·(x·wᵀ) + β·y (+ bias)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Options {
    /// α (default 1), applied after the scales.
    pub alpha: f32,
    /// β (default 0: `y` is never read). Not offered with an FP8 output.
    pub beta: f32,
    /// cuBLASLt's fast accumulation (`CUBLASLT_MATMUL_DESC_FAST_ACCUM`): partial sums are not
    /// promoted to full f32 precision as often; faster, less accurate (docs/PERFORMANCE.md
    /// gives the measured cost). Not offered with block scales. Default off.
    pub fast_accum: bool,
}

impl Default for Fp8Options {
    fn default() -> Self {
        Fp8Options { alpha: 1.0, beta: 0.0, fast_accum: false }
    }
}

/// The FP8 output's D scale and amax: `y_fp8 = saturate(d_scale · result)`, and the largest
/// |result| (before `d_scale`) is written to `amax` (cuBLASLt's D_SCALE and AMAX_D).
pub struct Fp8Out<'a> {
    /// One f32: the quantisation multiplier of the output (cuBLASLt's convention: the result
    /// is multiplied by it; the stored values dequantise as `y_fp8 / d_scale`).
    pub d_scale: &'a dyn DevicePtr<f32>,
    /// One f32, written.
    pub amax: &'a mut dyn DevicePtrMut<f32>,
}

/// How one call runs: the sizes cuBLASLt is given and whether `y` is staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fp8Shape {
    pub m: usize,
    pub n: usize,
    pub m_used: usize,
    pub n_used: usize,
    pub staged: bool,
}

/// The sizes cuBLASLt runs and whether the output is staged (see the module documentation).
pub(crate) fn fp8_shape(
    x: &Fp8Layout,
    w: &Fp8Layout,
    out_bytes: usize,
    y_addr: u64,
    bias_addr: Option<u64>,
) -> Fp8Shape {
    let block = |s: Scaling| matches!(s, Scaling::Block1x128 | Scaling::Block128x128);
    let (m, n) = (x.rows, w.rows);
    let m_used = if block(x.scaling) && !m.is_multiple_of(16) { x.rows_alloc } else { m };
    let n_ok = (n * out_bytes).is_multiple_of(16) && (!block(w.scaling) || n.is_multiple_of(16));
    let n_used = if n_ok { n } else { w.rows_alloc };
    let staged =
        m_used != m || n_used != n || !y_addr.is_multiple_of(16) || bias_addr.is_some_and(|b| !b.is_multiple_of(16));
    Fp8Shape { m, n, m_used, n_used, staged }
}

pub(crate) fn broken(rule: Fp8Rule, detail: String) -> Error {
    Error::Fp8 { rule, detail }
}

/// Length and alignment of a `len`-element vector or matrix of `dtype` at `addr`.
fn check_extent(which: Which, addr: u64, len_bytes: usize, elems: usize, dtype: DType) -> Result<()> {
    let elem_bytes = dtype.size_bytes();
    Error::check_bytes(which, len_bytes, elems, elem_bytes)?;
    if !addr.is_multiple_of(elem_bytes as u64) {
        return Err(Error::Misaligned { operand: which, address: addr, align: elem_bytes });
    }
    Ok(())
}

/// One validated-to-be FP8 call by address (lengths in bytes).
pub(crate) struct Fp8Call<'a> {
    pub x: &'a Fp8Tensor,
    pub w: &'a Fp8Tensor,
    pub y: (u64, usize),
    /// A read-only C apart from `y` (dense outputs; `β·C` is read from it, `y` only written),
    /// laid out as `y`; `None`: C is `y`.
    pub c_in: Option<(u64, usize)>,
    pub out: OutputKind,
    pub bias: Option<(u64, usize, DType)>,
    /// FP8 output: the D scale and the amax (one f32 each).
    pub d_scale: Option<(u64, usize)>,
    pub amax: Option<(u64, usize)>,
    pub opts: Fp8Options,
}

impl Fp8Call<'_> {
    pub(crate) fn out_bytes(&self) -> usize {
        match self.out {
            OutputKind::Dense(d) => d.size_bytes(),
            OutputKind::Fp8(_) => 1,
        }
    }

    /// The plan key for the sizes of `shape` (workspace and C/D alignment filled in by the
    /// backend from the launch's addresses).
    pub(crate) fn key(&self, shape: Fp8Shape) -> Fp8Key {
        Fp8Key {
            m: shape.m_used,
            n: shape.n_used,
            k: self.x.layout.ld,
            x: (self.x.format, self.x.layout.scaling),
            w: (self.w.format, self.w.layout.scaling),
            out: self.out,
            bias: self.bias.map(|b| b.2),
            fast_accum: self.opts.fast_accum,
            align: 16,
            workspace: 0,
        }
    }

    /// The launch's addresses: the operands' data and scales (`[x, w, x scales, w scales]`)
    /// and the output `d` (also C, unless the call has a separate C).
    pub(crate) fn operands(&self, [x, w, x_scales, w_scales]: [u64; 4], d: u64) -> Fp8Operands {
        Fp8Operands {
            w,
            x,
            w_scales,
            x_scales,
            c: self.c_in.map_or(d, |c| c.0),
            d,
            bias: self.bias.map(|b| b.0),
            d_scale: self.d_scale.map(|d| d.0),
            amax_d: self.amax.map(|a| a.0),
        }
    }

    /// Every check, in the order a user fixes them: pairing, platform, shapes, buffers.
    pub(crate) fn validate(&self, platform: ((i32, i32), usize)) -> Result<()> {
        let (x, w) = (&self.x.layout, &self.w.layout);
        if x.cols != w.cols {
            return Err(broken(
                Fp8Rule::InnerDimension,
                format!("x is [{}, {}] and w is [{}, {}]: both need the same K", x.rows, x.cols, w.rows, w.cols),
            ));
        }
        check_pair(
            (self.x.format, x.scaling),
            (self.w.format, w.scaling),
            self.out,
            self.bias.map(|b| b.2),
            self.opts.fast_accum,
        )?;
        check_support(platform.0, platform.1, x.scaling)?;
        check_support(platform.0, platform.1, w.scaling)?;
        let out_dtype = match self.out {
            OutputKind::Dense(d) => Some(d),
            OutputKind::Fp8(_) => None,
        };
        let (m, n) = (x.rows, w.rows);
        match out_dtype {
            Some(d) => check_extent(Which::C, self.y.0, self.y.1, m * n, d)?,
            None => Error::check_bytes(Which::C, self.y.1, m * n, 1)?,
        }
        match (self.c_in, out_dtype) {
            (Some((addr, len)), Some(d)) => check_extent(Which::CIn, addr, len, m * n, d)?,
            (Some(_), None) => {
                return Err(broken(Fp8Rule::OutputDtype, "a separate C needs a bf16, f16 or f32 output".into()))
            }
            (None, _) => {}
        }
        if let Some((addr, len, d)) = self.bias {
            check_extent(Which::Bias, addr, len, n, d)?;
        }
        for (addr, len) in [self.d_scale, self.amax].into_iter().flatten() {
            check_extent(Which::Scale, addr, len, 1, DType::F32)?;
        }
        Ok(())
    }
}

/// plan the staging → launch, for a validated call: `addrs` are the operands' data and scales
/// (`[x, w, x scales, w scales]`).
///
/// # Safety
/// Every address in `call` and `addrs` is device memory of the bound context valid for its
/// length until the GEMM has run on `stream`, a live stream of the context.
pub(crate) unsafe fn enqueue(
    st: &mut Locked<Libraries>,
    call: &Fp8Call,
    addrs: [u64; 4],
    stream: cudarc::driver::sys::CUstream,
) -> Result<()> {
    let shape = fp8_shape(&call.x.layout, &call.w.layout, call.out_bytes(), call.y.0, call.bias.map(|b| b.0));
    let key = call.key(shape);
    let lt = st.libs.lt.as_mut().ok_or_else(no_lt)?;
    let mut ops = call.operands(addrs, call.y.0);
    let scalars = (call.opts.alpha, call.opts.beta);
    if !shape.staged {
        // SAFETY: validated; the caller's contract.
        return unsafe { lt.enqueue_fp8(&mut st.dev, key, &ops, scalars, stream) };
    }
    // SAFETY: as above; the staging copies stay within `y` and the scratch.
    unsafe { staged(call, shape, &mut ops, stream, |ops| lt.enqueue_fp8(&mut st.dev, key, ops, scalars, stream)) }
}

/// The error for FP8 without cuBLASLt.
pub(crate) fn no_lt() -> Error {
    Error::LibraryNotFound {
        library: "cuBLASLt (libcublasLt)",
        tried: library::tried("cublasLt"),
        hint: "FP8 GEMM runs only on cuBLASLt; install it beside cuBLAS",
    }
}

/// The staged launch: `y` (and the bias) through an aligned scratch copy.
///
/// # Safety
/// As [`Gpu::fp8_run`]; `launch` enqueues the GEMM on `stream` with the operands given.
unsafe fn staged(
    call: &Fp8Call,
    shape: Fp8Shape,
    ops: &mut Fp8Operands,
    stream: cudarc::driver::sys::CUstream,
    launch: impl FnOnce(&Fp8Operands) -> Result<()>,
) -> Result<()> {
    let ob = call.out_bytes();
    let y_bytes = (shape.m_used * shape.n_used * ob).next_multiple_of(256);
    let bias_bytes = call.bias.map_or(0, |b| shape.n_used * b.2.size_bytes());
    // SAFETY: a live stream of the bound context (the caller's contract).
    let scratch = unsafe { Scratch::alloc(y_bytes + bias_bytes, stream)? };
    let rows = Pitched {
        src: call.y.0,
        src_pitch: shape.n * ob,
        src_slice: shape.n * ob * shape.m,
        dst: scratch.ptr,
        dst_pitch: shape.n_used * ob,
        dst_slice: shape.n_used * ob * shape.m,
        width_bytes: shape.n * ob,
        height: shape.m,
        depth: 1,
    };
    if call.opts.beta != 0.0 {
        // C comes from the separate C where there is one
        let c_rows = Pitched { src: call.c_in.map_or(call.y.0, |c| c.0), ..rows };
        // SAFETY: C holds [M, N] (validated); the scratch [m_used, n_used] was just allocated.
        unsafe { copy_pitched(&c_rows, stream)? };
    }
    if let Some((b, _, d)) = call.bias {
        let at = scratch.ptr + y_bytes as u64;
        let (len, used) = (shape.n * d.size_bytes(), shape.n_used * d.size_bytes());
        // SAFETY: the bias holds N elements (validated); the scratch tail holds n_used.
        unsafe {
            cudarc::driver::result::memset_d8_async(at, 0, used, stream)
                .map_err(crate::cuda::status::driver("cuMemsetD8Async"))?;
            cudarc::driver::result::memcpy_dtod_async(at, b, len, stream)
                .map_err(crate::cuda::status::driver("cuMemcpyDtoDAsync"))?;
        }
        ops.bias = Some(at);
    }
    ops.c = scratch.ptr;
    ops.d = scratch.ptr;
    launch(ops)?;
    // SAFETY: as for the copy in; the GEMM wrote the scratch before this copy, in stream order.
    unsafe { copy_pitched(&rows.reversed(), stream) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(m: usize, n: usize, scaling: Scaling, out_bytes: usize, y: u64) -> Fp8Shape {
        fp8_shape(&Fp8Layout::new(m, 256, scaling), &Fp8Layout::new(n, 256, scaling), out_bytes, y, None)
    }

    #[test]
    fn staging_is_planned_only_where_a_rule_needs_it() {
        let direct = |m, n| Fp8Shape { m, n, m_used: m, n_used: n, staged: false };
        // tensor and row scales take any M; the output's rows must be 16-byte aligned
        assert_eq!(shape(70, 264, Scaling::Tensor, 2, 0x1000), direct(70, 264));
        assert_eq!(shape(1, 256, Scaling::Row, 2, 0x1000), direct(1, 256));
        assert_eq!(
            shape(64, 260, Scaling::Tensor, 2, 0x1000),
            Fp8Shape { m: 64, n: 260, m_used: 64, n_used: 272, staged: true }
        );
        assert_eq!(shape(64, 260, Scaling::Tensor, 4, 0x1000), direct(64, 260));
        // block scales: M and N to the operands' padded rows (multiples of 16)
        assert_eq!(
            shape(70, 256, Scaling::Block1x128, 2, 0x1000),
            Fp8Shape { m: 70, n: 256, m_used: 80, n_used: 256, staged: true }
        );
        assert_eq!(
            shape(64, 264, Scaling::Block128x128, 4, 0x1000),
            Fp8Shape { m: 64, n: 264, m_used: 64, n_used: 272, staged: true }
        );
        assert_eq!(shape(128, 256, Scaling::Block1x128, 2, 0x1000), direct(128, 256));
        // an output or bias off 16 bytes
        assert!(shape(64, 256, Scaling::Tensor, 2, 0x1002).staged);
        let l = Fp8Layout::new(64, 256, Scaling::Tensor);
        assert!(fp8_shape(&l, &l, 2, 0x1000, Some(0x2008)).staged);
        assert!(!fp8_shape(&l, &l, 2, 0x1000, Some(0x2010)).staged);
    }
}
