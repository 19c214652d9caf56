//! The CPU backend: the same problems over host slices, through the `matrixmultiply` crate's
//! f32 GEMM (used where no GPU is present, and by the benchmark without a GPU): dense GEMMs
//! ([`gemm`], and [`gemm_c_in`] with a read-only C apart from the output), grouped ones
//! ([`grouped_gemm`], `grouped.rs`), attention ([`attention_forward`], [`attention_backward`],
//! `attention.rs`), RMSNorm ([`rms_norm_forward`], [`rms_norm_backward`], `norm.rs`), a
//! transformer layer's elementwise operations ([`rope`], [`swiglu`], [`swiglu_backward`],
//! `layer.rs`: the GPU kernels' f32 arithmetic, bit for bit) and the append into a paged KV
//! cache ([`paged_append`], `paged.rs`: a copy, bit for bit the GPU kernel's); a whole decoder
//! layer built from them is [`crate::layer::cpu::CpuDecoderLayer`].
//!
//! f16/bf16 inputs are widened to f32 (exactly) before the product and a f16/bf16 output is
//! rounded from the f32 result, which is what f32 accumulation means on the GPU too. tf32 is
//! computed in full f32 here (more accurate than the GPU's tf32, within the same band).

mod attention;
mod grouped;
mod layer;
mod norm;
mod paged;

pub use attention::{attention_backward, attention_forward, MAX_CPU_SCORES};
pub use grouped::grouped_gemm;
pub use layer::{rope, swiglu, swiglu_backward};
pub use norm::{rms_norm_backward, rms_norm_forward, DwSlice};
pub use paged::paged_append;

use crate::dtype::Element;
use crate::error::Result;
use crate::layout::{Op, Operand};
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, check_c_in, BufferDesc};

fn host_desc<T: Element>(s: &[T]) -> BufferDesc {
    BufferDesc { address: s.as_ptr() as u64, len_bytes: std::mem::size_of_val(s), dtype: T::DTYPE }
}

/// Row and column strides (in elements) of `op(X)` over its stored row-major buffer.
fn strides(x: &Operand) -> (isize, isize) {
    let ld = x.layout.ld as isize;
    match x.op {
        Op::N => (ld, 1),
        Op::T => (1, ld),
    }
}

/// Widens the addressed prefix of a buffer to f32 (no copy for f32 itself).
fn widen<T: Element>(buf: &[T], len: usize) -> std::borrow::Cow<'_, [f32]> {
    let buf = &buf[..len];
    match T::as_f32s(buf) {
        Some(f) => std::borrow::Cow::Borrowed(f),
        None => std::borrow::Cow::Owned(buf.iter().map(|v| v.to_f32()).collect()),
    }
}

/// `C = α·op(A)·op(B) + β·C` on the CPU, for a problem of any precision.
///
/// - `a`, `b`: stored row-major A and B as the problem's layouts describe them, element type
///   the precision's input dtype;
/// - `c`: stored C, element type the precision's output dtype. Written through `&mut`; padding
///   between rows is left untouched.
///
/// BLAS semantics: `β = 0` never reads C; `α = 0` never reads A or B; `k = 0` gives
/// `C = β·C`; m, n or batch 0 is a no-op (and then only the dtypes of the slices are
/// checked); `α = 0` (or `k = 0`) with `β = 1` returns without touching C, as reference BLAS
/// does (a signalling NaN in C stays signalling). Non-finite α or β are applied as given. f16/bf16 inputs are widened into
/// temporary f32 copies on every call (this backend is the fallback, not the fast path).
/// Epilogues are not offered on the CPU ([`Error::Unsupported`](crate::Error::Unsupported)).
///
/// # Errors
/// [`Error::DTypeMismatch`](crate::Error::DTypeMismatch) when an element type does not match
/// the precision, [`Error::BufferTooSmall`](crate::Error::BufferTooSmall) when a slice is
/// shorter than its layout addresses. Nothing is written on error.
pub fn gemm<TI: Element, TO: Element>(
    p: &GemmProblem,
    alpha: f32,
    a: &[TI],
    b: &[TI],
    beta: f32,
    c: &mut [TO],
) -> Result<()> {
    check_buffers(p, host_desc(a), host_desc(b), host_desc(c))?;
    if p.epilogue() != crate::Epilogue::None {
        return Err(crate::Error::Unsupported {
            backend: "the CPU backend",
            what: format!("epilogue {}", p.epilogue()),
        });
    }
    if p.is_empty() || ((alpha == 0.0 || p.k() == 0) && beta == 1.0) {
        // nothing to compute: C = 1·C, left as it is (reference BLAS's quick return)
        return Ok(());
    }
    let (oa, ob, lc) = (p.a(), p.b(), p.c());
    let batch = p.batch();
    // check_buffers has verified these lengths cover every batch entry's addressed elements.
    let len = |o: &Operand| o.layout.required_elems(batch).unwrap_or(0);
    let (wa, wb) = (widen(a, len(&oa)), widen(b, len(&ob)));
    let ((rsa, csa), (rsb, csb)) = (strides(&oa), strides(&ob));
    // BLAS semantics: with α = 0, A and B are not read (inf/NaN there cannot reach C) and
    // C = β·C, which is the k = 0 product.
    let (m, n, k) = (p.m(), p.n(), if alpha == 0.0 { 0 } else { p.k() });
    let direct = TO::as_f32s_mut(c).is_some();
    let mut tmp = if direct { Vec::new() } else { vec![0f32; m * n] };
    for bt in 0..batch {
        let pa = wa.as_ptr().wrapping_add(bt * oa.layout.batch_stride);
        let pb = wb.as_ptr().wrapping_add(bt * ob.layout.batch_stride);
        if let Some(cf) = TO::as_f32s_mut(c) {
            let pc = cf[lc.offset(bt, 0, 0)..].as_mut_ptr();
            // SAFETY: check_buffers verified that a, b and c hold every element the layouts
            // address for every batch entry (offsets up to (batch-1)·stride + (rows-1)·ld +
            // cols - 1), and `widen` kept that prefix; strides describe exactly those layouts.
            // C's rows do not alias (ld ≥ cols, checked by GemmProblem::new).
            unsafe {
                matrixmultiply::sgemm(m, k, n, alpha, pa, rsa, csa, pb, rsb, csb, beta, pc, lc.ld as isize, 1);
            }
        } else {
            if beta != 0.0 {
                for i in 0..m {
                    for j in 0..n {
                        tmp[i * n + j] = c[lc.offset(bt, i, j)].to_f32();
                    }
                }
            }
            // SAFETY: as above for a and b; tmp is a contiguous m×n f32 buffer.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    alpha,
                    pa,
                    rsa,
                    csa,
                    pb,
                    rsb,
                    csb,
                    beta,
                    tmp.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            for i in 0..m {
                for j in 0..n {
                    c[lc.offset(bt, i, j)] = TO::from_f32(tmp[i * n + j]);
                }
            }
        }
    }
    Ok(())
}

/// `D = α·op(A)·op(B) + β·C_in` on the CPU: [`gemm`] with C read from `c_in` and written to
/// `d` only (the GPU's [`Extras::c_in`](crate::cuda::Extras::c_in)). Both are laid out as the
/// problem's C, of its output dtype; C_in is left untouched, and with β = 0 it is not read.
/// The elements `d` addresses are C_in's copied, then [`gemm`] runs on `d` in place, so every
/// rule of [`gemm`] holds (its quick return for α = 0 and β = 1 leaves D = C_in).
///
/// # Errors
/// As [`gemm`], and for `c_in` as for C ([`Which::CIn`](crate::Which::CIn)). Nothing is
/// written on error.
pub fn gemm_c_in<TI: Element, TO: Element>(
    p: &GemmProblem,
    (alpha, beta): (f32, f32),
    a: &[TI],
    b: &[TI],
    c_in: &[TO],
    d: &mut [TO],
) -> Result<()> {
    let descs = [host_desc(a), host_desc(b), host_desc(d)];
    check_buffers(p, descs[0], descs[1], descs[2])?;
    check_c_in(p, descs, host_desc(c_in), None, None)?;
    if p.epilogue() != crate::Epilogue::None {
        return gemm(p, alpha, a, b, beta, d); // its error, before anything is written
    }
    if beta != 0.0 && !p.is_empty() {
        let l = p.c();
        for bt in 0..p.batch() {
            for i in 0..l.rows {
                let at = l.offset(bt, i, 0);
                d[at..at + l.cols].copy_from_slice(&c_in[at..at + l.cols]);
            }
        }
    }
    gemm(p, alpha, a, b, beta, d)
}
