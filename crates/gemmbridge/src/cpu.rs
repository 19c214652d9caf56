//! The CPU backend: the same row-major problems over host slices, through the `matrixmultiply`
//! crate's f32 GEMM (used where no GPU is present, and by the benchmark without a GPU).
//!
//! f16/bf16 inputs are widened to f32 (exactly) before the product and a f16/bf16 output is
//! rounded from the f32 result, which is what f32 accumulation means on the GPU too. tf32 is
//! computed in full f32 here (more accurate than the GPU's tf32, within the same band).

use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::grouped::GroupedProblem;
use crate::layout::{Op, Operand};
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::validate::{check_buffers, BufferDesc};

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
/// Epilogues are not offered on the CPU ([`Error::Unsupported`]).
///
/// # Errors
/// [`Error::DTypeMismatch`] when an element type does not match
/// the precision, [`Error::BufferTooSmall`] when a slice is
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

/// The grouped product `p` ([`crate::grouped`]: a mixture-of-experts layer's forward or either
/// backward product) on the CPU: each group's GEMM through [`gemm`] on its slices of `a`, `b`
/// and `c` (the buffers [`crate::grouped::reference::run`] and the GPU's `grouped_gemm` take:
/// row-major, contiguous, argument order as [`crate::grouped::GroupedOp::names`], lengths as
/// [`GroupedProblem::lens`]), the forward's `bias[E, N]` added in f32 before the output is
/// rounded (as the GPU's bias epilogue adds it). An empty group writes nothing in the forward
/// and backward data and zeros into its `dw[e]`; rows past the last group are not written.
///
/// # Errors
/// Before anything is written: [`Error::DTypeMismatch`] when `TI` is not the precision's input
/// type or `TO` (the output's and the bias's) not its output type;
/// [`Error::BufferTooSmall`] for `a`, `b`, `c` or the bias (`E · N`);
/// [`Error::EpilogueOperand`] for a bias given to a problem without one
/// ([`GroupedProblem::with_bias`]) or missing from one with it.
pub fn grouped_gemm<TI: Element, TO: Element>(
    p: &GroupedProblem,
    a: &[TI],
    b: &[TI],
    c: &mut [TO],
    bias: Option<&[TO]>,
) -> Result<()> {
    check_grouped::<TI, TO>(p, [a.len(), b.len(), c.len()], bias.map(<[TO]>::len))?;
    for e in 0..p.groups() {
        let (g, [a0, b0, c0]) = p.group(e)?;
        match bias {
            Some(bias) if p.sizes()[e] > 0 => {
                let (m, n) = (g.m(), g.n());
                // the product in f32, then the bias, then one rounding to the output type
                let wide = Precision::new(p.precision().input(), p.precision().compute(), crate::DType::F32)?;
                let plain = GemmProblem::linear(m, n, g.k(), wide)?;
                let mut out = vec![0f32; m * n];
                gemm(&plain, 1.0, &a[a0..], &b[b0..], 0.0, &mut out)?;
                let row = &bias[e * n..(e + 1) * n];
                for (dst, (v, bv)) in c[c0..c0 + m * n].iter_mut().zip(out.iter().zip(row.iter().cycle())) {
                    *dst = TO::from_f32(v + bv.to_f32());
                }
            }
            Some(_) => {}
            None => gemm(&g, 1.0, &a[a0..], &b[b0..], 0.0, &mut c[c0..])?,
        }
    }
    Ok(())
}

/// [`grouped_gemm`]'s checks: element types, lengths (`a`, `b`, `c`, bias), the bias against
/// the problem.
fn check_grouped<TI: Element, TO: Element>(p: &GroupedProblem, lens: [usize; 3], bias: Option<usize>) -> Result<()> {
    let pr = p.precision();
    for (operand, expected, got) in
        [(Which::A, pr.input(), TI::DTYPE), (Which::B, pr.input(), TI::DTYPE), (Which::C, pr.output(), TO::DTYPE)]
    {
        if expected != got {
            return Err(Error::DTypeMismatch { operand, expected, got });
        }
    }
    if bias.is_some() != p.has_bias() {
        let problem = if p.has_bias() { "is required but missing" } else { "was given but is not used" };
        return Err(Error::EpilogueOperand { epilogue: crate::Epilogue::Bias, operand: "bias", problem });
    }
    let needed = p.lens().into_iter().chain(bias.map(|_| p.groups() * p.n()));
    let have = lens.into_iter().chain(bias);
    let elem = |w: Which| if w == Which::C || w == Which::Bias { TO::DTYPE } else { TI::DTYPE }.size_bytes();
    for ((operand, have), needed) in [Which::A, Which::B, Which::C, Which::Bias].into_iter().zip(have).zip(needed) {
        if have < needed {
            let elem_bytes = elem(operand);
            return Err(Error::BufferTooSmall {
                operand,
                len_bytes: have * elem_bytes,
                needed_bytes: needed * elem_bytes,
                needed_elems: needed,
                elem_bytes,
            });
        }
    }
    Ok(())
}
