//! FP8 as a mode of the cuBLASLt backend: the plan of a scaled FP8 GEMM (descriptor with scale
//! modes, FP8 layouts, algorithm), cached per [`Fp8Key`], and its launch with the scale
//! pointers of the call.
//!
//! The row-major `y[M, N] = x[M, K]·w[N, K]ᵀ` is cuBLASLt's column-major
//! `D[N, M] = op_T(A = w) · op_N(B = x)`: the "TN" layout Hopper's FP8 kernels take, with
//! `lda = ldb = ld` (K padded to 16) and `ldc = ldd = N`.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use super::launch::Algorithm;
use super::launch::{matmul, Matmul};
use super::sys::{algo_check, heuristic, lt_dtype, Desc, DescAttr as A, Layout, LtHandle, Pref};
use crate::cuda::device::Workspace;
use crate::dtype::{Compute, DType};
use crate::error::{Error, Result};
use crate::fp8::{Fp8Format, OutputKind, Scaling};

/// Everything an FP8 plan depends on. Sizes are those cuBLASLt is given (`m`, `n` possibly
/// rounded up by the entry point's staging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fp8Key {
    /// Rows of the row-major output (cuBLASLt's n).
    pub m: usize,
    /// Columns of the row-major output (cuBLASLt's m), also its leading dimension.
    pub n: usize,
    /// K as stored: the operands' leading dimension (a multiple of 16).
    pub k: usize,
    pub x: (Fp8Format, Scaling),
    pub w: (Fp8Format, Scaling),
    pub out: OutputKind,
    /// The bias's dtype when the BIAS epilogue runs.
    pub bias: Option<DType>,
    pub fast_accum: bool,
    /// Alignment class of C/D (bytes, ≤ 256: [`super::plan::alignment`]), told to the
    /// heuristic; the operands and scales are gemmbridge's own 256-byte-aligned allocations.
    pub align: u32,
    /// Workspace the algorithm may use, in bytes.
    pub workspace: usize,
}

/// The stable text key of an FP8 plan in the tactic database (problem kind `fp8_gemm`, whose
/// keys start with `fp8_gemm `; M bucketed as for GEMMs).
pub(crate) fn fp8_signature(k: &Fp8Key) -> String {
    format!(
        "fp8_gemm m{} n{} k{} x{}/{} w{}/{} out{} bias{} fast{} al{} ws{}",
        crate::tactics::m_bucket(k.m),
        k.n,
        k.k,
        k.x.0,
        k.x.1,
        k.w.0,
        k.w.1,
        k.out,
        k.bias.map_or("none", |d| d.name()),
        u8::from(k.fast_accum),
        k.align,
        k.workspace
    )
}

pub(super) fn fp8_type(f: Fp8Format) -> lt::cudaDataType {
    match f {
        Fp8Format::E4M3 => lt::cudaDataType::CUDA_R_8F_E4M3,
        Fp8Format::E5M2 => lt::cudaDataType::CUDA_R_8F_E5M2,
    }
}

fn scale_mode(s: Scaling) -> lt::cublasLtMatmulMatrixScale_t {
    use lt::cublasLtMatmulMatrixScale_t as M;
    match s {
        Scaling::Tensor => M::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
        Scaling::Row => M::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
        Scaling::Block1x128 => M::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
        Scaling::Block128x128 => M::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
    }
}

/// The device addresses of one FP8 launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fp8Operands {
    pub w: u64,
    pub x: u64,
    pub w_scales: u64,
    pub x_scales: u64,
    /// C (read when β ≠ 0); the same as `d` for a dense output.
    pub c: u64,
    pub d: u64,
    pub bias: Option<u64>,
    /// FP8 output: the D scale (multiplier) and where the amax of the result goes.
    pub d_scale: Option<u64>,
    pub amax_d: Option<u64>,
}

/// Descriptor, layouts and algorithm of one [`Fp8Key`].
pub(crate) struct Fp8Plan {
    desc: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    d: Layout,
    /// Whether D is FP8 (C is then bf16, a separate matrix).
    fp8_out: bool,
    pub algo: Algorithm,
    /// The heuristic's candidates, best first (for tuning).
    pub candidates: Vec<Algorithm>,
}

/// Sets the call's scale, bias, D-scale and amax pointers on `desc`.
fn set_pointers(desc: &Desc, ops: &Fp8Operands) -> Result<()> {
    let ptr = |v: u64| v as *const c_void;
    // SAFETY: pointer-valued attributes take a void* (cublasLtMatmulDescAttributes_t).
    unsafe {
        desc.set(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptr(ops.w_scales))?;
        desc.set(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ptr(ops.x_scales))?;
        if let Some(b) = ops.bias {
            desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr(b))?;
        }
        if let Some(s) = ops.d_scale {
            desc.set(A::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &ptr(s))?;
        }
        if let Some(x) = ops.amax_d {
            desc.set(A::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &ptr(x))?;
        }
    }
    Ok(())
}

// SAFETY: plain host descriptors, used only under the device's lock (as `Plan`).
unsafe impl Send for Fp8Plan {}

fn descriptor(key: &Fp8Key) -> Result<Desc> {
    let desc = Desc::new(Compute::F32)?;
    use cudarc::cublas::sys::cublasOperation_t as Op;
    // SAFETY (every set): each value has the attribute's documented type.
    unsafe {
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &Op::CUBLAS_OP_T)?;
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &Op::CUBLAS_OP_N)?;
        if key.x.1 != Scaling::Tensor {
            desc.set(A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &scale_mode(key.w.1))?;
            desc.set(A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &scale_mode(key.x.1))?;
        }
        if key.fast_accum {
            desc.set(A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &1i8)?;
        }
        if let Some(b) = key.bias {
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE, &lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS)?;
            desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &lt_dtype(b))?;
        }
    }
    Ok(desc)
}

impl Fp8Plan {
    /// Builds the descriptor and layouts and asks the heuristic for up to `candidates`
    /// algorithms. The call's operand addresses are set first: with vector and block scale
    /// modes, cuBLASLt 13.1's heuristic answers `CUBLAS_STATUS_INVALID_VALUE` while the scale
    /// pointers are unset (measured on the H200).
    ///
    /// # Errors
    /// [`Error::Cublas`]; `CUBLAS_STATUS_NOT_SUPPORTED` when the heuristic has none.
    pub fn build(h: &LtHandle, key: &Fp8Key, ops: &Fp8Operands, candidates: usize) -> Result<Fp8Plan> {
        let desc = descriptor(key)?;
        set_pointers(&desc, ops)?;
        let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
        let a = Layout::plain(fp8_type(key.w.0), k, n, key.k as i64)?;
        let b = Layout::plain(fp8_type(key.x.0), k, m, key.k as i64)?;
        let (c_type, d_type) = match key.out {
            OutputKind::Dense(d) => (lt_dtype(d), lt_dtype(d)),
            // cuBLASLt: with an FP8 D, C is bf16 (never read here: β = 0)
            OutputKind::Fp8(f) => (lt_dtype(DType::BF16), fp8_type(f)),
        };
        let c = Layout::plain(c_type, n, m, key.n as i64)?;
        let d = Layout::plain(d_type, n, m, key.n as i64)?;
        let pref = Pref::new(key.workspace, [256, 256, key.align])?;
        let list: Vec<Algorithm> = heuristic(h, &desc, [&a, &b, &c, &d], &pref, candidates)?
            .into_iter()
            .map(|(data, workspace)| Algorithm { data, workspace })
            .collect();
        let Some(&best) = list.first() else {
            return Err(Error::Cublas {
                operation: "cublasLtMatmulAlgoGetHeuristic",
                status: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
                problem: format!("no algorithm for FP8 {}", fp8_signature(key)),
            });
        };
        let fp8_out = matches!(key.out, OutputKind::Fp8(_));
        Ok(Fp8Plan { desc, a, b, c, d, fp8_out, algo: best, candidates: list })
    }

    /// Whether `algo` is valid for this plan (cublasLtMatmulAlgoCheck), and its workspace.
    pub fn check_algo(&self, h: &LtHandle, algo: &Algorithm) -> Option<usize> {
        algo_check(h, &self.desc, [&self.a, &self.b, &self.c, &self.d], algo.data)
    }

    /// Enqueues the GEMM with `algo` and the scalars `(α, β)` on `stream`.
    ///
    /// # Safety
    /// Addresses valid for the plan's layouts and scale layouts (checked by the caller);
    /// `bias`, `d_scale`, `amax_d` given exactly when the key uses them; `ws` used by nothing
    /// else on another stream; `stream` of the handle's context.
    pub unsafe fn launch(
        &self,
        h: &LtHandle,
        algo: &Algorithm,
        scalars: (f32, f32),
        ops: &Fp8Operands,
        ws: &Workspace,
        stream: lt::cudaStream_t,
    ) -> Result<()> {
        set_pointers(&self.desc, ops)?;
        // An FP8 D has a bf16 C of another type: C may not alias D then (cuBLASLt answers
        // INVALID_VALUE), and with β = 0 it is never read, so it points at the workspace.
        let c = if ops.c == ops.d && self.fp8_out { ws.ptr } else { ops.c };
        let m =
            Matmul { desc: &self.desc, layouts: [&self.a, &self.b, &self.c, &self.d], ptrs: [ops.w, ops.x, c, ops.d] };
        // SAFETY: the function's contract.
        unsafe { matmul(h, &m, algo, scalars, ws, stream) }
    }
}
