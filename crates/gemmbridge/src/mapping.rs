//! The one place where row-major becomes column-major.
//!
//! Everything above this module speaks row-major; cuBLAS and cuBLASLt speak column-major. The
//! translation is [`column_major_call`], and no other code swaps operands or leading
//! dimensions.

use crate::epilogue::Epilogue;
use crate::layout::Op;
use crate::problem::GemmProblem;
use cudarc::cublaslt::sys::cublasLtEpilogue_t;

/// The arguments of a column-major BLAS GEMM call (`cublasGemmEx` /
/// `cublasGemmStridedBatchedEx`), in the order and meaning of the cuBLAS documentation:
/// `C_cm[m, n] = α·opa(A_cm)[m, k]·opb(B_cm)[k, n] + β·C_cm`, every matrix column-major.
///
/// `A_cm` is the buffer [`ColMajorCall::operands`] puts first — for a call produced by
/// [`column_major_call`] that is the row-major problem's **B** — and `B_cm` the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ColMajorCall {
    /// `transa`: op applied to the first operand.
    pub transa: Op,
    /// `transb`: op applied to the second operand.
    pub transb: Op,
    /// Rows of `C_cm`.
    pub m: i32,
    /// Columns of `C_cm`.
    pub n: i32,
    /// Reduction length.
    pub k: i32,
    /// Leading dimension (elements between columns) of the first operand.
    pub lda: i32,
    /// Batch stride of the first operand, in elements.
    pub stride_a: i64,
    /// Leading dimension of the second operand.
    pub ldb: i32,
    /// Batch stride of the second operand, in elements.
    pub stride_b: i64,
    /// Leading dimension of `C_cm`.
    pub ldc: i32,
    /// Batch stride of `C_cm`, in elements.
    pub stride_c: i64,
    /// Batch count.
    pub batch: i32,
}

impl ColMajorCall {
    /// Orders the row-major problem's operands as the column-major call takes them:
    /// returns `(first, second) = (b, a)`. Callers pass A and B in the row-major problem's
    /// order and use the result, so that the swap is written once, here.
    pub fn operands<T>(&self, a: T, b: T) -> (T, T) {
        (b, a)
    }
}

/// Maps a row-major problem to the column-major call that computes it.
///
/// # Derivation
///
/// A row-major `r × c` matrix with leading dimension `ld` occupies the same memory as the
/// column-major `c × r` matrix with leading dimension `ld`: row-major element `(i, j)` is at
/// `i·ld + j`, which is column-major element `(j, i)`. So every stored row-major matrix *is* its
/// own transpose when cuBLAS looks at it.
///
/// The row-major problem is `C = op(A)·op(B)` with `C [m, n]`. cuBLAS, handed C's memory, sees
/// `Cᵀ [n, m]`, so it must be asked for `Cᵀ = (op(A)·op(B))ᵀ = op(B)ᵀ·op(A)ᵀ`:
///
/// - the **first** operand is B, the second is A, and the column-major sizes are
///   `m_cm = n`, `n_cm = m`, `k_cm = k`;
/// - cuBLAS sees stored B as `B_sᵀ`. If `op(B) = B_s` (N) then `op(B)ᵀ = B_sᵀ`, which is what
///   cuBLAS already sees: `transa = N`. If `op(B) = B_sᵀ` (T) then `op(B)ᵀ = B_s`, the transpose of
///   what it sees: `transa = T`. So `transa = op(B)` and, likewise, `transb = op(A)`;
/// - leading dimensions are unchanged by the reinterpretation: `lda = ld(B)`, `ldb = ld(A)`,
///   `ldc = ld(C)` — lda is B's row stride, ldb is A's (swapping them is accepted by cuBLAS
///   and silently wrong, docs/BACKGROUND.md §1);
/// - batch strides follow their buffers: `stride_a = stride(B)`, `stride_b = stride(A)`.
///
/// cuBLAS's check `lda ≥ max(1, rows of the stored first operand)` then reads `ld(B) ≥ cols(B)`,
/// which [`GemmProblem::new`] has enforced. An ld of 0 is only possible for a matrix with no
/// columns, which no element is read from, so it is raised to 1 to satisfy cuBLAS's `max(1, ·)`.
///
/// Example (docs/BACKGROUND.md §1): `C[M,N] = A[M,K]·B[K,N]` maps to
/// `gemm(N, N, m=N, n=M, k=K, first=B lda=N, second=A ldb=K, ldc=N)`.
pub fn column_major_call(p: &GemmProblem) -> ColMajorCall {
    let (a, b, c) = (p.a(), p.b(), p.c());
    // GemmProblem::new has checked every dimension and ld against i32::MAX and every stride
    // against i64::MAX, so these conversions are exact.
    let dim = |v: usize| v as i32;
    let ld = |v: usize| v.max(1) as i32;
    ColMajorCall {
        transa: b.op,
        transb: a.op,
        m: dim(p.n()),
        n: dim(p.m()),
        k: dim(p.k()),
        lda: ld(b.layout.ld),
        stride_a: b.layout.batch_stride as i64,
        ldb: ld(a.layout.ld),
        stride_b: a.layout.batch_stride as i64,
        ldc: ld(c.ld),
        stride_c: c.batch_stride as i64,
        batch: dim(p.batch()),
    }
}

/// The cuBLASLt epilogue that computes a row-major [`Epilogue`] under [`column_major_call`].
///
/// Bias, activation and aux epilogues need no translation: cuBLASLt's bias has one value per
/// row of the column-major D, which is one per column n of the row-major C, and its aux
/// matrix is laid out like D, i.e. row-major `[m, n]`. The bias *gradient* epilogues swap,
/// because the operands swap: cuBLASLt's BGRADA reduces its first operand (the row-major B)
/// and BGRADB its second (the row-major A) (cuBLAS documentation, `cublasLtEpilogue_t`).
pub fn lt_epilogue(e: Epilogue) -> cublasLtEpilogue_t {
    use cublasLtEpilogue_t as L;
    match e {
        Epilogue::None => L::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Bias => L::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::Relu => L::CUBLASLT_EPILOGUE_RELU,
        Epilogue::ReluBias => L::CUBLASLT_EPILOGUE_RELU_BIAS,
        Epilogue::Gelu => L::CUBLASLT_EPILOGUE_GELU,
        Epilogue::GeluBias => L::CUBLASLT_EPILOGUE_GELU_BIAS,
        Epilogue::GeluAux => L::CUBLASLT_EPILOGUE_GELU_AUX,
        Epilogue::GeluAuxBias => L::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        Epilogue::DGelu => L::CUBLASLT_EPILOGUE_DGELU,
        Epilogue::DGeluBiasGrad => L::CUBLASLT_EPILOGUE_DGELU_BGRAD,
        Epilogue::BiasGradA => L::CUBLASLT_EPILOGUE_BGRADB,
        Epilogue::BiasGradB => L::CUBLASLT_EPILOGUE_BGRADA,
    }
}
