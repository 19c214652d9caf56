//! Which library serves a validated call, and the fallbacks between them: α = 0 and k = 0 go
//! to cuBLAS (BLAS semantics), `Backend::Auto` falls back to cuBLAS where cuBLASLt has no
//! algorithm, and a bias gradient without a cuBLASLt BGRAD algorithm runs unfused (the plain
//! GEMM, then the gradient as a cuBLAS GEMM against a ones vector); and before all of that, a
//! call with misaligned operands may run on aligned copies (`padded.rs`).

use cudarc::driver::sys::CUstream;

use crate::cuda::blas::BlasGemm;
use crate::cuda::call::GemmCall;
use crate::cuda::device::{copy_pitched, Locked, Pitched};
use crate::cuda::library;
use crate::cuda::lt::LtFailure;
use crate::cuda::route::padded;
use crate::cuda::route::{Backend, Libraries, Served};
use crate::cuda::status;
use crate::dtype::DType;
use crate::epilogue::{Epilogue, VectorUse};
use crate::error::{Error, Result};
use crate::layout::{MatrixLayout, Operand};
use crate::mapping::column_major_call;
use crate::precision::Precision;
use crate::problem::GemmProblem;

/// Runs the request on aligned copies where its operands are misaligned and the padding
/// settings call for it ([`padded`]), directly otherwise; returns which library served.
///
/// # Safety
/// The request's operands were validated for its problem and stay valid until it has run on
/// its stream, a live stream of the bound context.
pub(crate) unsafe fn enqueue(st: &mut Locked<Libraries>, r: &GemmCall) -> Result<Served> {
    if let Some(plan) = padded::plan(&st.libs.padding, r) {
        // SAFETY: forwarded; `route` runs the aligned request as it would run `r`.
        if let Some(served) = unsafe { padded::enqueue(st, r, &plan, route) } {
            return served;
        }
    }
    // SAFETY: forwarded.
    unsafe { route(st, r) }
}

/// Picks the library and enqueues; returns which served.
///
/// # Safety
/// As [`enqueue`].
pub(crate) unsafe fn route(st: &mut Locked<Libraries>, r: &GemmCall) -> Result<Served> {
    let p = r.problem;
    let fused = p.epilogue() != Epilogue::None;
    if r.alpha == 0.0 && !fused {
        // BLAS semantics: A and B are not read; cuBLAS's k = 0 call gives C = β·C.
        // SAFETY: forwarded.
        unsafe { blas(st, r) }?;
        return Ok(Served::Blas);
    }
    if !use_lt(&st.libs, p)? {
        // SAFETY: forwarded.
        unsafe { blas(st, r) }?;
        return Ok(Served::Blas);
    }
    let Locked { dev, libs } = st;
    let lt = libs.lt.as_mut().expect("use_lt implies a handle");
    // SAFETY: forwarded.
    let backend = libs.backend;
    match unsafe { lt.enqueue(dev, r) } {
        Ok(()) => Ok(Served::Lt),
        Err(LtFailure::NoAlgorithm(e)) => match without_lt(backend, p) {
            // SAFETY (both): forwarded.
            Some(WithoutLt::Blas) => unsafe { blas(st, r) }.map(|()| Served::Blas),
            Some(WithoutLt::BiasGradUnfused) => unsafe { bias_grad_unfused(st, r) }.map(|()| Served::Lt),
            None => Err(e),
        },
        Err(LtFailure::Other(e)) => Err(e),
    }
}

/// What runs a problem cuBLASLt has no algorithm for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WithoutLt {
    /// cuBLAS (`Backend::Auto`, no epilogue).
    Blas,
    /// The plain GEMM, then the bias gradient as a second GEMM ([`bias_grad_unfused`]).
    BiasGradUnfused,
}

/// The fallback where cuBLASLt has no algorithm for `p` under `backend`; `None`: the call fails.
pub(crate) fn without_lt(backend: Backend, p: &GemmProblem) -> Option<WithoutLt> {
    if backend == Backend::Auto && p.epilogue() == Epilogue::None {
        Some(WithoutLt::Blas)
    } else if p.epilogue().vector() == VectorUse::WritesGrad {
        Some(WithoutLt::BiasGradUnfused)
    } else {
        None
    }
}

/// Whether cuBLASLt serves `p` under the chosen backend (α ≠ 0 or an epilogue), or a named
/// error where nothing can.
pub(crate) fn use_lt(libs: &Libraries, p: &GemmProblem) -> Result<bool> {
    let fused = p.epilogue() != Epilogue::None;
    Ok(match libs.backend {
        Backend::Blas if fused => {
            return Err(Error::Unsupported {
                backend: "cuBLAS (Backend::Blas)",
                what: format!("epilogue {} (use Backend::Auto or Backend::Lt)", p.epilogue()),
            })
        }
        Backend::Blas => false,
        Backend::Lt | Backend::Auto if libs.lt.is_none() => {
            if libs.backend == Backend::Lt || fused {
                return Err(Error::LibraryNotFound {
                    library: "cuBLASLt (libcublasLt)",
                    tried: library::tried("cublasLt"),
                    hint: "install the CUDA 13 toolkit's cuBLAS (it ships libcublasLt) and add its folder to LD_LIBRARY_PATH",
                });
            }
            false
        }
        Backend::Lt => true,
        // cuBLASLt does not take k = 0; cuBLAS does (C = β·C).
        Backend::Auto => p.k() > 0 || fused,
    })
}

/// The request on cuBLAS (no epilogue). With α = 0, A and B are not read (an inf or NaN there
/// must not reach C): C = β·C is the k = 0 product. cuBLAS has no C apart from its output: a
/// separate read-only C is first copied into the output on the stream (β ≠ 0; β = 0 reads
/// no C), then the GEMM runs on it in place.
///
/// # Safety
/// As [`enqueue`].
pub(crate) unsafe fn blas(st: &mut Locked<Libraries>, r: &GemmCall) -> Result<()> {
    if let Some(c_in) = r.c_in.filter(|_| r.beta != 0.0) {
        // SAFETY: C_in and the output were validated for the problem's C layout and share no
        // byte; stream-ordered before the GEMM that reads the copy.
        unsafe { copy_c(r.problem, c_in, r.abc.2, r.stream) }?;
    }
    let mut g = BlasGemm::of(r);
    if r.alpha == 0.0 {
        g.call.k = 0;
    }
    // SAFETY: forwarded.
    unsafe { st.libs.blas.gemm(&mut st.dev, &g, r.stream) }.map_err(|e| status::with_problem(e, r.problem))
}

/// Copies C's addressed elements (`p.c()`'s logical `m × n` of every batch entry) from
/// `src` to `dst`, both laid out as `p.c()`: one pitched copy where the batch stride is a
/// multiple of the leading dimension (or there is one matrix), one per matrix otherwise.
///
/// # Safety
/// Both are device memory valid for `p.c()` over the batch, not overlapping; `stream` is a
/// live stream of the bound context.
unsafe fn copy_c(p: &GemmProblem, src: u64, dst: u64, stream: CUstream) -> Result<()> {
    let (l, esize) = (p.c(), p.precision().output().size_bytes());
    let one = |offset: usize, depth: usize, slice: usize| Pitched {
        src: src + offset as u64,
        src_pitch: l.ld * esize,
        src_slice: slice * esize,
        dst: dst + offset as u64,
        dst_pitch: l.ld * esize,
        dst_slice: slice * esize,
        width_bytes: l.cols * esize,
        height: l.rows,
        depth,
    };
    let batch = p.batch();
    if batch == 1 || l.batch_stride.is_multiple_of(l.ld) {
        // SAFETY: the caller's contract.
        let slice = if batch == 1 { l.rows * l.ld } else { l.batch_stride };
        return unsafe { copy_pitched(&one(0, batch, slice), stream) };
    }
    for z in 0..batch {
        // SAFETY: the caller's contract; matrix z of each side.
        unsafe { copy_pitched(&one(z * l.batch_stride * esize, 1, l.rows * l.ld), stream) }?;
    }
    Ok(())
}

/// The bias gradient where cuBLASLt has no BGRAD algorithm (on the H200 with cuBLASLt 13.1:
/// BiasGradA needs op(A) = T, BiasGradB needs op(B) = N; docs/PERFORMANCE.md): the GEMM
/// without it (plain, or `DGelu` for `DGeluBiasGrad`), then the gradient — sums of op(A)'s
/// rows or op(B)'s columns over k, or of the result's columns over m — as a cuBLAS GEMM
/// against a vector of ones held in the stream's scratch region, written to the bias operand.
///
/// # Safety
/// As [`enqueue`]; `r.bias` is the validated gradient buffer.
unsafe fn bias_grad_unfused(st: &mut Locked<Libraries>, r: &GemmCall) -> Result<()> {
    let p = r.problem;
    let ws = st.dev.workspaces.get(r.stream, &|| p.describe())?;
    let e = p.epilogue();
    // the ones' length and the dtype they multiply: the operands' (over k) or the result's (over m)
    let (len, dtype) = match e {
        Epilogue::DGeluBiasGrad => (p.m(), p.precision().output()),
        _ => (p.k(), p.precision().input()),
    };
    if len * dtype.size_bytes() > ws.scratch_bytes {
        return Err(Error::Unsupported {
            backend: "cuBLASLt",
            what: format!(
                "the bias gradient of {} (no BGRAD algorithm, and {len} ones exceed the {}-byte scratch)",
                p.describe(),
                ws.scratch_bytes
            ),
        });
    }
    let (without, aux) = match e {
        Epilogue::DGeluBiasGrad => (p.with_epilogue(Epilogue::DGelu)?, r.aux),
        _ => (p.with_epilogue(Epilogue::None)?, None),
    };
    // SAFETY: forwarded; this problem reads and writes a subset of p's operands.
    unsafe { route(st, &GemmCall { problem: &without, bias: None, aux, ..*r }) }?;
    // SAFETY: the scratch region is this stream's, sized above; stream-ordered memsets.
    unsafe {
        use cudarc::driver::sys::{cuMemsetD16Async, cuMemsetD32Async};
        let s = match dtype {
            DType::F32 => cuMemsetD32Async(ws.scratch, 1.0f32.to_bits(), len, r.stream),
            DType::F16 => cuMemsetD16Async(ws.scratch, crate::half::f16::ONE.to_bits(), len, r.stream),
            DType::BF16 => cuMemsetD16Async(ws.scratch, crate::half::bf16::ONE.to_bits(), len, r.stream),
        };
        s.result().map_err(status::driver("cuMemsetD16Async/cuMemsetD32Async"))?;
    }
    let (a, b, c) = r.abc;
    let (k, prec) = (p.k(), p.precision());
    let (g, ga, gb) = match e {
        Epilogue::BiasGradA => {
            // grad[m] = op(A)[m, k]·ones[k]
            let ones = Operand::n(MatrixLayout::row_major(k, 1));
            (GemmProblem::new(p.a(), ones, MatrixLayout::row_major(p.m(), 1), 1, prec)?, a, ws.scratch)
        }
        Epilogue::BiasGradB => {
            // grad[n] = ones[k]ᵀ·op(B)[k, n]
            let ones = Operand::n(MatrixLayout::row_major(1, k));
            (GemmProblem::new(ones, p.b(), MatrixLayout::row_major(1, p.n()), 1, prec)?, ws.scratch, b)
        }
        _ => {
            // grad[n] = ones[m]ᵀ·C[m, n], in the result's own dtype
            let ones = Operand::n(MatrixLayout::row_major(1, p.m()));
            let own = match dtype {
                DType::F32 => Precision::F32,
                DType::F16 => Precision::F16,
                DType::BF16 => Precision::BF16,
            };
            (GemmProblem::new(ones, Operand::n(p.c()), MatrixLayout::row_major(1, p.n()), 1, own)?, ws.scratch, c)
        }
    };
    let grad = GemmCall {
        problem: &g,
        cm: column_major_call(&g),
        alpha: 1.0,
        beta: 0.0,
        abc: (ga, gb, r.bias.unwrap_or(0)),
        c_in: None,
        bias: None,
        aux: None,
        stream: r.stream,
    };
    // SAFETY: forwarded; the gradient buffer was validated for p's vector length.
    unsafe { blas(st, &grad) }
}
