//! cuBLASLt: handle, descriptors, plans (descriptor + layouts + algorithm) and the launch.
//!
//! A [`Plan`] is built once per [`PlanKey`] (the column-major call, precision, epilogue, aux
//! layout and pointer-alignment class) by asking cuBLASLt's heuristic, and reused: a repeated
//! call costs a hash lookup and the `cublasLtMatmul` launch.

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::sys as lt;

use crate::dtype::{Compute, DType, Precision};
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::layout::Op;
use crate::mapping::{lt_epilogue, ColMajorCall};

fn check(s: lt::cublasStatus_t, operation: &'static str) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        // The enum's Debug form is its C name, e.g. CUBLAS_STATUS_NOT_SUPPORTED.
        Err(Error::Cublas { operation, status: format!("{s:?}"), problem: String::new() })
    }
}

/// An owned cuBLASLt handle.
pub(crate) struct LtHandle(pub lt::cublasLtHandle_t);

impl LtHandle {
    pub fn new() -> Result<LtHandle> {
        let mut h = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the library is loaded (checked by the caller).
        check(unsafe { lt::cublasLtCreate(&mut h) }, "cublasLtCreate")?;
        Ok(LtHandle(h))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created in new, destroyed once.
        let _ = unsafe { lt::cublasLtDestroy(self.0) };
    }
}

struct Desc(lt::cublasLtMatmulDesc_t);
struct Layout(lt::cublasLtMatrixLayout_t);
struct Pref(lt::cublasLtMatmulPreference_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatmulDescDestroy(self.0) };
    }
}
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatrixLayoutDestroy(self.0) };
    }
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once.
        let _ = unsafe { lt::cublasLtMatmulPreferenceDestroy(self.0) };
    }
}

unsafe fn set_desc<T>(d: &Desc, attr: lt::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    // SAFETY: v points to a value of the size passed, of the type the attribute takes
    // (cublasLtMatmulDescAttributes_t documentation); caller picks T accordingly.
    check(
        unsafe { lt::cublasLtMatmulDescSetAttribute(d.0, attr, v as *const T as *const c_void, size_of::<T>()) },
        "cublasLtMatmulDescSetAttribute",
    )
}

fn lt_dtype(d: DType) -> lt::cudaDataType {
    match d {
        DType::F32 => lt::cudaDataType::CUDA_R_32F,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
    }
}

fn lt_compute(c: Compute) -> lt::cublasComputeType_t {
    match c {
        Compute::F32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Compute::Tf32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
    }
}

fn lt_op(o: Op) -> cudarc::cublas::sys::cublasOperation_t {
    match o {
        Op::N => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        Op::T => cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
    }
}

/// The largest power of two (≤ 256) dividing an address: the alignment class cuBLASLt's
/// heuristic is told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), so that the algorithm it
/// picks never assumes more alignment than the pointers have.
pub(crate) fn alignment(address: u64) -> u32 {
    if address == 0 {
        256
    } else {
        (1u64 << address.trailing_zeros().min(8)) as u32
    }
}

/// Everything a plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub call: ColMajorCall,
    pub precision: Precision,
    pub epilogue: Epilogue,
    /// Aux leading dimension and batch stride, in elements (0 when there is no aux).
    pub aux_ld: i64,
    pub aux_stride: i64,
    /// Alignment classes of A_cm, B_cm, C/D and the bias (bytes, ≤ 256).
    pub align: [u32; 4],
    /// Workspace the algorithm may use, in bytes.
    pub workspace: usize,
}

/// A cuBLASLt algorithm as stored (opaque 64 bytes), with what running it needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Algorithm {
    /// cublasLtMatmulAlgo_t's opaque data.
    pub data: [u64; 8],
    /// Workspace it needs, in bytes.
    pub workspace: usize,
}

/// Descriptors, layouts and the algorithm for one [`PlanKey`].
pub(crate) struct Plan {
    desc: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    pub algo: Algorithm,
    /// The heuristic's candidates, best first (for tuning).
    pub candidates: Vec<Algorithm>,
}

// SAFETY: descriptors are plain host objects; cuBLASLt allows them to be used from any thread,
// and gemmbridge only uses them under the Gpu's lock.
unsafe impl Send for Plan {}

fn layout(dtype: DType, rows: i32, cols: i32, ld: i32, batch: i32, stride: i64) -> Result<Layout> {
    let mut l = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; sizes are non-negative i32s from the mapping.
    check(
        unsafe { lt::cublasLtMatrixLayoutCreate(&mut l, lt_dtype(dtype), rows as u64, cols as u64, ld as i64) },
        "cublasLtMatrixLayoutCreate",
    )?;
    let l = Layout(l);
    if batch > 1 {
        let set = |attr, v: *const c_void, n| {
            // SAFETY: v points to a value of n bytes of the attribute's type (i32 count, i64 stride).
            check(unsafe { lt::cublasLtMatrixLayoutSetAttribute(l.0, attr, v, n) }, "cublasLtMatrixLayoutSetAttribute")
        };
        set(lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch as *const i32 as _, 4)?;
        set(
            lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &stride as *const i64 as _,
            8,
        )?;
    }
    Ok(l)
}

impl Plan {
    /// Builds descriptors and layouts and asks the heuristic for up to `candidates` algorithms.
    ///
    /// # Errors
    /// [`Error::Cublas`] from any cuBLASLt call; `CUBLAS_STATUS_NOT_SUPPORTED` when the
    /// heuristic has no algorithm for the problem.
    pub fn build(h: &LtHandle, key: &PlanKey, candidates: usize) -> Result<Plan> {
        let c = &key.call;
        let p = key.precision;
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(
            unsafe { lt::cublasLtMatmulDescCreate(&mut d, lt_compute(p.compute()), lt::cudaDataType::CUDA_R_32F) },
            "cublasLtMatmulDescCreate",
        )?;
        let desc = Desc(d);
        use lt::cublasLtMatmulDescAttributes_t as A;
        // SAFETY (all set_desc calls): each value has the attribute's documented type.
        unsafe {
            set_desc(&desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &lt_op(c.transa))?;
            set_desc(&desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &lt_op(c.transb))?;
            let epi = lt_epilogue(key.epilogue);
            if epi != lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT {
                set_desc(&desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
                let out = lt_dtype(p.output());
                if key.epilogue.vector() != crate::epilogue::VectorUse::None {
                    set_desc(&desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out)?;
                }
                if key.epilogue.aux() != crate::epilogue::AuxUse::None {
                    set_desc(&desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &key.aux_ld)?;
                    set_desc(&desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &out)?;
                    if c.batch > 1 {
                        set_desc(&desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &key.aux_stride)?;
                    }
                }
            }
        }
        let (a_rows, a_cols) = if c.transa == Op::N { (c.m, c.k) } else { (c.k, c.m) };
        let (b_rows, b_cols) = if c.transb == Op::N { (c.k, c.n) } else { (c.n, c.k) };
        let a = layout(p.input(), a_rows, a_cols, c.lda, c.batch, c.stride_a)?;
        let b = layout(p.input(), b_rows, b_cols, c.ldb, c.batch, c.stride_b)?;
        let cl = layout(p.output(), c.m, c.n, c.ldc, c.batch, c.stride_c)?;

        let mut pr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { lt::cublasLtMatmulPreferenceCreate(&mut pr) }, "cublasLtMatmulPreferenceCreate")?;
        let pref = Pref(pr);
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let ws = key.workspace as u64;
        let set = |attr, v: *const c_void, n| {
            // SAFETY: v points to n bytes of the attribute's type (u64 bytes, u32 alignments).
            check(
                unsafe { lt::cublasLtMatmulPreferenceSetAttribute(pref.0, attr, v, n) },
                "cublasLtMatmulPreferenceSetAttribute",
            )
        };
        set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as _, 8)?;
        for (attr, v) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align[0]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align[1]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align[2]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align[2]),
        ] {
            set(attr, v as *const u32 as _, 4)?;
        }
        let want = candidates.clamp(1, 32);
        // SAFETY: cublasLtMatmulHeuristicResult_t is plain data; zeroed is a valid value.
        let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; want];
        let mut found = 0;
        // SAFETY: every descriptor is live; results has `want` slots.
        check(
            unsafe {
                lt::cublasLtMatmulAlgoGetHeuristic(
                    h.0,
                    desc.0,
                    a.0,
                    b.0,
                    cl.0,
                    cl.0,
                    pref.0,
                    want as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
            },
            "cublasLtMatmulAlgoGetHeuristic",
        )?;
        let ok = |r: &lt::cublasLtMatmulHeuristicResult_t| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
        let list: Vec<Algorithm> = results[..found.max(0) as usize]
            .iter()
            .filter(|r| ok(r))
            .map(|r| Algorithm { data: r.algo.data, workspace: r.workspaceSize })
            .collect();
        let Some(&best) = list.first() else {
            return Err(Error::Cublas {
                operation: "cublasLtMatmulAlgoGetHeuristic",
                status: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
                problem: format!("no algorithm for {c:?} {p} epilogue {}", key.epilogue),
            });
        };
        Ok(Plan { desc, a, b, c: cl, algo: best, candidates: list })
    }

    /// Whether `algo` is valid for this plan (cublasLtMatmulAlgoCheck), and its workspace.
    pub fn check_algo(&self, h: &LtHandle, algo: &Algorithm) -> Option<usize> {
        let a = lt::cublasLtMatmulAlgo_t { data: algo.data };
        // SAFETY: zeroed heuristic result is valid plain data; descriptors are live.
        let mut r: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let s = unsafe {
            lt::cublasLtMatmulAlgoCheck(h.0, self.desc.0, self.a.0, self.b.0, self.c.0, self.c.0, &a, &mut r)
        };
        (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(r.workspaceSize)
    }

    /// Configurations cuBLASLt offers for this plan's types beyond the heuristic's list (the
    /// search cuBLASLt's `LtSgemmCustomFind` sample makes): for each algorithm id
    /// (`cublasLtMatmulAlgoGetIds`), its tiles × stages × custom options × split-K 1, 2, 4, 8
    /// (where supported, with each supported reduction scheme) × CTA swizzling, kept where
    /// `cublasLtMatmulAlgoCheck` accepts it for this plan with at most `workspace` bytes.
    /// Cluster and inner shapes are left at the algorithm's default. Bounded: each id in turn
    /// gets an equal share of what is left of `limit` accepted configurations and of `checks`
    /// checks (each a host call of a few µs), so what one id leaves unused goes to the next. Meant for tiny problems, where the heuristic offers
    /// few candidates and a kernel's launch overhead is its run time.
    pub fn search(&self, h: &LtHandle, key: &PlanKey, workspace: usize, limit: usize, checks: usize) -> Vec<Algorithm> {
        use lt::cublasLtMatmulAlgoCapAttributes_t as Cap;
        use lt::cublasLtMatmulAlgoConfigAttributes_t as Cfg;
        let p = key.precision;
        let (compute, scale, input, output) =
            (lt_compute(p.compute()), lt::cudaDataType::CUDA_R_32F, lt_dtype(p.input()), lt_dtype(p.output()));
        let mut ids = [0i32; 256];
        let mut n_ids = 0;
        // SAFETY: ids has 256 slots; the handle is live.
        let s = unsafe {
            lt::cublasLtMatmulAlgoGetIds(
                h.0,
                compute,
                scale,
                input,
                input,
                output,
                output,
                256,
                ids.as_mut_ptr(),
                &mut n_ids,
            )
        };
        if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Vec::new();
        }
        // SAFETY (cap_u32s, cap_i32, set): the buffers are of the attribute's documented type
        // and size (cublasLtMatmulAlgoCapAttributes_t / ConfigAttributes_t); algo is initialised.
        let cap_u32s = |algo: &lt::cublasLtMatmulAlgo_t, attr: Cap| -> Vec<u32> {
            let mut written = 0usize;
            let s = unsafe { lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut written) };
            if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || written == 0 {
                return vec![0];
            }
            let mut v = vec![0u32; written / 4];
            let s = unsafe {
                lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, v.as_mut_ptr() as _, v.len() * 4, &mut written)
            };
            if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || v.is_empty() {
                vec![0]
            } else {
                v
            }
        };
        let cap_i32 = |algo: &lt::cublasLtMatmulAlgo_t, attr: Cap| -> i32 {
            let (mut v, mut written) = (0i32, 0usize);
            let s =
                unsafe { lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, &mut v as *mut i32 as _, 4, &mut written) };
            if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                v
            } else {
                0
            }
        };
        let set = |algo: &mut lt::cublasLtMatmulAlgo_t, attr: Cfg, v: u32| {
            // every config attribute set here is a 4-byte integer (u32, or i32 for SPLITK_NUM)
            let s = unsafe { lt::cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &v as *const u32 as _, 4) };
            s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        };
        let ids = &ids[..n_ids.clamp(0, 256) as usize];
        let (mut found, mut checks_used) = (Vec::new(), 0usize);
        'ids: for (i, &id) in ids.iter().enumerate() {
            let left = ids.len() - i;
            let id_limit = (limit - found.len()).div_ceil(left);
            let id_checks = (checks - checks_used).div_ceil(left);
            let (found_before, mut checked) = (found.len(), 0usize);
            // SAFETY: zeroed is a valid cublasLtMatmulAlgo_t to initialise.
            let mut base: lt::cublasLtMatmulAlgo_t = unsafe { std::mem::zeroed() };
            // SAFETY: out-pointer to a local; the handle is live.
            let s =
                unsafe { lt::cublasLtMatmulAlgoInit(h.0, compute, scale, input, input, output, output, id, &mut base) };
            if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                continue;
            }
            let tiles = cap_u32s(&base, Cap::CUBLASLT_ALGO_CAP_TILE_IDS);
            let stages = cap_u32s(&base, Cap::CUBLASLT_ALGO_CAP_STAGES_IDS);
            let splitk = cap_i32(&base, Cap::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
            let schemes_mask = cap_i32(&base, Cap::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK) as u32;
            let swizzle = cap_i32(&base, Cap::CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT).clamp(0, 1) as u32;
            let custom = cap_i32(&base, Cap::CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX).clamp(0, 15) as u32;
            let mut splits: Vec<(u32, u32)> = vec![(1, 0)];
            if splitk {
                for k in [2u32, 4, 8] {
                    for scheme in [1u32, 2, 4].into_iter().filter(|b| schemes_mask & b != 0) {
                        splits.push((k, scheme));
                    }
                }
            }
            for &tile in &tiles {
                for &stage in &stages {
                    for opt in 0..=custom {
                        for &(k, scheme) in &splits {
                            for swz in 0..=swizzle {
                                if found.len() >= limit {
                                    return found;
                                }
                                if checked >= id_checks || found.len() - found_before >= id_limit {
                                    checks_used += checked;
                                    continue 'ids;
                                }
                                let mut algo = base;
                                let ok = set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_TILE_ID, tile)
                                    && set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_STAGES_ID, stage)
                                    && set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, opt)
                                    && set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, k)
                                    && set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme)
                                    && set(&mut algo, Cfg::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz);
                                if !ok {
                                    continue;
                                }
                                checked += 1;
                                let cand = Algorithm { data: algo.data, workspace: 0 };
                                if let Some(need) = self.check_algo(h, &cand).filter(|&need| need <= workspace) {
                                    found.push(Algorithm { data: algo.data, workspace: need });
                                }
                            }
                        }
                    }
                }
            }
            checks_used += checked;
        }
        found
    }

    /// Enqueues `D = epilogue(α·opa(A)·opb(B) + β·C)` with C = D in place.
    ///
    /// # Safety
    /// Addresses valid for the plan's layouts (checked by the caller); `bias`/`aux` given
    /// exactly when the epilogue uses them; `workspace` valid for `workspace_len` bytes and used
    /// by nothing else on another stream; `stream` of the handle's context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        h: &LtHandle,
        algo: &Algorithm,
        alpha: f32,
        first: u64,
        second: u64,
        beta: f32,
        c: u64,
        bias: Option<u64>,
        aux: Option<u64>,
        workspace: u64,
        workspace_len: usize,
        stream: lt::cudaStream_t,
    ) -> Result<()> {
        use lt::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: pointer-valued attributes take a void* (cublasLtMatmulDescAttributes_t).
        unsafe {
            if let Some(b) = bias {
                set_desc(&self.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &(b as *const c_void))?;
            }
            if let Some(x) = aux {
                set_desc(&self.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &(x as *const c_void))?;
            }
        }
        let a = lt::cublasLtMatmulAlgo_t { data: algo.data };
        let ptr = |v: u64| v as *const c_void;
        // SAFETY: see the function's contract; alpha/beta are f32 host scalars (scale type 32F).
        check(
            unsafe {
                lt::cublasLtMatmul(
                    h.0,
                    self.desc.0,
                    &alpha as *const f32 as *const c_void,
                    ptr(first),
                    self.a.0,
                    ptr(second),
                    self.b.0,
                    &beta as *const f32 as *const c_void,
                    ptr(c),
                    self.c.0,
                    c as *mut c_void,
                    self.c.0,
                    &a,
                    workspace as *mut c_void,
                    workspace_len,
                    stream,
                )
            },
            "cublasLtMatmul",
        )
    }
}
