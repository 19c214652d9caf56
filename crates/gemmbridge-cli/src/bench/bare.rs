//! The bare library calls beneath gemmbridge, for the launch row's floor (`bare_lt_us`,
//! `bare_blas_us`): the launch GEMM handed to cuBLASLt and to cuBLAS directly, through cudarc,
//! on handles of this command's own bound to the `Gpu`'s stream, with no validation and no
//! lookup per call. cuBLASLt: the descriptor, the layouts and the algorithm (cuBLASLt's first
//! heuristic choice for the `Gpu`'s workspace size) made once, then one `cublasLtMatmul` per
//! call; cuBLAS: one `cublasGemmEx` per call. The column-major call is gemmbridge's mapping
//! (`mapping::column_major_call`), so the library computes the same product.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{sys as blas, CudaBlas};
use cudarc::cublaslt::{result as lt_result, sys as lt};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use gemmbridge::cuda::{Gpu, RawOperands};
use gemmbridge::mapping::{column_major_call, ColMajorCall};
use gemmbridge::{Compute, DType, GemmProblem, Op};

/// One matmul planned for cuBLASLt once: handle, descriptor, layouts (A, B, C = D), algorithm
/// and workspace; destroyed at drop.
struct LtPlan {
    handle: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    /// The workspace's address (used on the one stream it was allocated on).
    ws: u64,
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created in `LtPlan::new`, destroyed once, after the stream was synchronised
        // by the caller (every measurement ends with a synchronisation).
        unsafe {
            for l in self.layouts {
                let _ = lt_result::destroy_matrix_layout(l);
            }
            let _ = lt_result::destroy_matmul_desc(self.desc);
            let _ = lt_result::destroy_handle(self.handle);
        }
    }
}

fn lt_dtype(d: DType) -> lt::cudaDataType {
    match d {
        DType::F32 => lt::cudaDataType::CUDA_R_32F,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        _ => lt::cudaDataType::CUDA_R_16BF,
    }
}

fn blas_dtype(d: DType) -> blas::cudaDataType {
    match d {
        DType::F32 => blas::cudaDataType::CUDA_R_32F,
        DType::F16 => blas::cudaDataType::CUDA_R_16F,
        _ => blas::cudaDataType::CUDA_R_16BF,
    }
}

/// The op, for cuBLAS and cuBLASLt alike (cuBLASLt's TRANSA/TRANSB take cuBLAS's type).
fn blas_op(o: Op) -> blas::cublasOperation_t {
    if o == Op::N {
        blas::cublasOperation_t::CUBLAS_OP_N
    } else {
        blas::cublasOperation_t::CUBLAS_OP_T
    }
}

impl LtPlan {
    /// The plan of `p` (no epilogue, batch 1) with `workspace_bytes` of workspace on `s`.
    fn new(p: &GemmProblem, s: &Arc<CudaStream>, workspace_bytes: usize) -> anyhow::Result<LtPlan> {
        let call = column_major_call(p);
        let pr = p.precision();
        let compute = match pr.compute() {
            Compute::Tf32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let handle = lt_result::create_handle().map_err(|e| anyhow::anyhow!("cublasLtCreate: {:?}", e.0))?;
        let desc = lt_result::create_matmul_desc(compute, lt::cudaDataType::CUDA_R_32F)
            .map_err(|e| anyhow::anyhow!("cublasLtMatmulDescCreate: {:?}", e.0))?;
        // the operands as the column-major call sees them: A (first) is B's storage, m×k
        // before op; B (second) is A's, k×n before op; C is m×n
        let stored = |op: Op, rows: i32, cols: i32| if op == Op::N { (rows, cols) } else { (cols, rows) };
        let (ar, ac) = stored(call.transa, call.m, call.k);
        let (br, bc) = stored(call.transb, call.k, call.n);
        let layout = |d: DType, rows: i32, cols: i32, ld: i32| {
            lt_result::create_matrix_layout(lt_dtype(d), rows as u64, cols as u64, ld as i64)
                .map_err(|e| anyhow::anyhow!("cublasLtMatrixLayoutCreate: {:?}", e.0))
        };
        let layouts = [
            layout(pr.input(), ar, ac, call.lda)?,
            layout(pr.input(), br, bc, call.ldb)?,
            layout(pr.output(), call.m, call.n, call.ldc)?,
        ];
        let mut workspace = s.alloc_zeros::<u8>(workspace_bytes.max(1))?;
        let ws = workspace.device_ptr_mut(s).0;
        let algo = Self::choose(handle, desc, &layouts, &call, workspace_bytes)?;
        Ok(LtPlan { handle, desc, layouts, algo, workspace, ws })
    }

    /// Sets the ops and asks cuBLASLt's heuristic for its first algorithm.
    fn choose(
        handle: lt::cublasLtHandle_t,
        desc: lt::cublasLtMatmulDesc_t,
        layouts: &[lt::cublasLtMatrixLayout_t; 3],
        call: &ColMajorCall,
        workspace_bytes: usize,
    ) -> anyhow::Result<lt::cublasLtMatmulAlgo_t> {
        let err =
            |what: &'static str| move |e: cudarc::cublaslt::result::CublasError| anyhow::anyhow!("{what}: {:?}", e.0);
        let (ta, tb) = (blas_op(call.transa), blas_op(call.transb));
        let size = std::mem::size_of::<blas::cublasOperation_t>();
        let bytes = workspace_bytes as u64;
        // SAFETY: live descriptors made above; each attribute's value is a local of the type
        // cuBLASLt documents for it (cublasOperation_t; uint64_t for the workspace limit).
        unsafe {
            use lt::cublasLtMatmulDescAttributes_t as A;
            let set = |attr, v: &blas::cublasOperation_t| {
                lt_result::set_matmul_desc_attribute(desc, attr, v as *const _ as *const c_void, size)
            };
            set(A::CUBLASLT_MATMUL_DESC_TRANSA, &ta).map_err(err("cublasLtMatmulDescSetAttribute"))?;
            set(A::CUBLASLT_MATMUL_DESC_TRANSB, &tb).map_err(err("cublasLtMatmulDescSetAttribute"))?;
            let pref = lt_result::create_matmul_pref().map_err(err("cublasLtMatmulPreferenceCreate"))?;
            let limit = lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;
            let chosen = lt_result::set_matmul_pref_attribute(pref, limit, &bytes as *const u64 as *const c_void, 8)
                .and_then(|()| {
                    lt_result::get_matmul_algo_heuristic(
                        handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
                    )
                });
            let _ = lt_result::destroy_matmul_pref(pref);
            Ok(chosen.map_err(err("cublasLtMatmulAlgoGetHeuristic"))?.algo)
        }
    }

    /// One `cublasLtMatmul`: `C = op(A)·op(B)` (α = 1, β = 0) on `stream`.
    ///
    /// # Safety
    /// The addresses hold the planned layouts; `stream` is the workspace's.
    unsafe fn launch(&self, [first, second, c]: [u64; 3], stream: lt::cudaStream_t) -> anyhow::Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, lc] = self.layouts;
        // SAFETY: the caller's contract; α and β are f32 host scalars (scale type 32F).
        unsafe {
            lt_result::matmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                first as *const c_void,
                la,
                second as *const c_void,
                lb,
                c as *const c_void,
                lc,
                c as *mut c_void,
                lc,
                &self.algo,
                self.ws as *mut c_void,
                self.workspace.len(),
                stream,
            )
        }
        .map_err(|e| anyhow::anyhow!("cublasLtMatmul: {:?}", e.0))
    }
}

/// Which bare library call [`host_us`] times.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// `cublasLtMatmul` with a plan made once.
    Lt,
    /// `cublasGemmEx`.
    Blas,
}

/// The bare calls of one launch problem, on the `Gpu`'s stream.
pub struct Bare {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    lt: Option<LtPlan>,
    problem: GemmProblem,
}

impl Bare {
    /// Handles and (with cuBLASLt loaded) the plan for `p` (no epilogue, batch 1) on `gpu`'s
    /// stream, with its workspace size.
    pub fn new(gpu: &Gpu, p: &GemmProblem) -> anyhow::Result<Bare> {
        anyhow::ensure!(p.batch() == 1 && p.epilogue() == gemmbridge::Epilogue::None, "bare calls: plain GEMMs only");
        let stream = gpu.stream().clone();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| anyhow::anyhow!("cublasCreate: {:?}", e.0))?;
        let ws = gpu.options().workspace_bytes.unwrap_or(0);
        let lt = if gemmbridge::cuda::library::has_cublaslt() { Some(LtPlan::new(p, &stream, ws)?) } else { None };
        Ok(Bare { stream, blas, lt, problem: *p })
    }

    /// Whether the cuBLASLt call is there (the library loaded).
    pub fn has_lt(&self) -> bool {
        self.lt.is_some()
    }

    /// Host time per call, µs, of `calls` back-to-back bare calls of `library` on `ops` (A, B,
    /// C of the row-major problem), timed on the host clock from an idle stream without
    /// waiting for the GPU (keep `calls` below the launch-queue depth); waits for them after.
    ///
    /// # Safety
    /// As `Gpu::gemm_raw` with the `Gpu`'s own stream: `ops` hold the problem's operands.
    pub unsafe fn host_us(&self, library: Library, ops: RawOperands, calls: usize) -> anyhow::Result<f64> {
        let call = column_major_call(&self.problem);
        let (first, second) = call.operands(ops.a.address, ops.b.address);
        let addrs = [first, second, ops.c.address];
        let s = self.stream.clone();
        s.synchronize()?;
        let t = Instant::now();
        match library {
            Library::Lt => {
                let plan = self.lt.as_ref().ok_or_else(|| anyhow::anyhow!("cuBLASLt is not loaded"))?;
                for _ in 0..calls {
                    // SAFETY: the caller's contract; the workspace is this stream's.
                    unsafe { plan.launch(addrs, s.cu_stream() as _) }?;
                }
            }
            Library::Blas => {
                for _ in 0..calls {
                    // SAFETY: the caller's contract.
                    unsafe { self.gemm_ex(&call, addrs) }?;
                }
            }
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
        s.synchronize()?;
        Ok(us)
    }

    /// One `cublasGemmEx` of the column-major call (α = 1, β = 0).
    ///
    /// # Safety
    /// The addresses hold the call's operands.
    unsafe fn gemm_ex(&self, call: &ColMajorCall, [first, second, c]: [u64; 3]) -> anyhow::Result<()> {
        let pr = self.problem.precision();
        let (ti, to) = (blas_dtype(pr.input()), blas_dtype(pr.output()));
        let compute = match pr.compute() {
            Compute::Tf32 => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's contract; α and β are f32 host scalars, as the 32F compute types
        // require (cuBLAS documentation, cublasGemmEx).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                blas_op(call.transa),
                blas_op(call.transb),
                call.m,
                call.n,
                call.k,
                &alpha as *const f32 as *const c_void,
                first as *const c_void,
                ti,
                call.lda,
                second as *const c_void,
                ti,
                call.ldb,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                to,
                call.ldc,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| anyhow::anyhow!("cublasGemmEx: {:?}", e.0))
    }
}
