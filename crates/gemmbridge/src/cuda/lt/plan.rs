//! cuBLASLt plans: a [`Plan`] (descriptor, layouts, algorithm) is built once per [`PlanKey`]
//! (the column-major call, precision, epilogue, aux layout, pointer-alignment class and
//! workspace size) by asking cuBLASLt's heuristic, and reused: a repeated call costs a hash
//! lookup and the `cublasLtMatmul` launch.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use super::launch::{matmul, Algorithm, Matmul};
use super::sys::{algo_check, heuristic, lt_dtype, lt_op, Desc, DescAttr as A, Layout, LtHandle, Pref};
use crate::cuda::device::Workspace;
use crate::epilogue::{AuxUse, Epilogue, VectorUse};
use crate::error::{Error, Result};
use crate::layout::Op;
use crate::mapping::{lt_epilogue, ColMajorCall};
use crate::precision::Precision;
use crate::problem::GemmProblem;
use crate::tactics::m_bucket;

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
    /// Alignment classes of A_cm, B_cm, C/D (the lesser of C's and D's where C is apart) and
    /// the bias (bytes, ≤ 256).
    pub align: [u32; 4],
    /// Workspace the algorithm may use, in bytes.
    pub workspace: usize,
    /// SMs the kernel is told to use (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`); 0: all of them
    /// (the attribute is not set). [`crate::cuda::GpuOptions::sm_count_target`].
    pub sm_count: u32,
}

impl PlanKey {
    /// The key of `p` computed as `call` (its column-major call) on `ops`, with a library
    /// workspace of `workspace` bytes.
    pub fn of(p: &GemmProblem, call: ColMajorCall, ops: &LtOperands, workspace: usize) -> PlanKey {
        let aux = p.aux();
        let (aux_ld, aux_stride) = if p.uses_aux() { (aux.ld as i64, aux.batch_stride as i64) } else { (0, 0) };
        PlanKey {
            call,
            precision: p.precision(),
            epilogue: p.epilogue(),
            aux_ld,
            aux_stride,
            align: [
                alignment(ops.first),
                alignment(ops.second),
                alignment(ops.c).min(ops.c_in.map_or(256, alignment)),
                ops.bias.map_or(256, alignment),
            ],
            workspace,
            sm_count: 0,
        }
    }

    /// The key of `p` computed as `call` for operands at addresses aligned to `align` bytes (a
    /// power of two, at most 256) — the bias at least 16 (cuBLASLt is given no other: see
    /// `staging`) — with a library workspace of `workspace` bytes: what a plan made ahead of
    /// its operands is keyed by. With `align` 256 it is the key [`PlanKey::of`] gives for
    /// operands at 256-byte-aligned addresses, as CUDA's allocators return them.
    pub fn aligned(p: &GemmProblem, call: ColMajorCall, align: u32, workspace: usize) -> PlanKey {
        let at = u64::from(align);
        let bias = (p.epilogue().vector() != VectorUse::None).then_some(at.max(16));
        let ops = LtOperands { first: at, second: at, c: at, c_in: None, bias, aux: None };
        PlanKey::of(p, call, &ops, workspace)
    }
}

/// The stable text signature of a plan key under the tactic database's bucketing rule
/// ([`crate::tactics`]): the key of a cuBLASLt "gemm" entry. Unchanged since format 1: the engine looks tuned algorithms up by it.
/// A key with an SM count target ends in ` sm<count>`, so that algorithms tuned on the whole
/// GPU are not applied to it, and those tuned under that target (tuning runs under the `Gpu`'s
/// target) only to it.
pub(crate) fn signature(key: &PlanKey) -> String {
    let c = &key.call;
    let sm = if key.sm_count > 0 { format!(" sm{}", key.sm_count) } else { String::new() };
    format!(
        "{}{} m{} n{} k{} lda{} ldb{} ldc{} b{} {} {} aux{} al{}/{}/{}/{} ws{}{}",
        c.transa,
        c.transb,
        c.m,
        m_bucket(c.n as usize),
        c.k,
        c.lda,
        c.ldb,
        c.ldc,
        c.batch,
        key.precision,
        key.epilogue,
        key.aux_ld,
        key.align[0],
        key.align[1],
        key.align[2],
        key.align[3],
        key.workspace,
        sm
    )
}

/// The operands of one cuBLASLt launch by device address, in the column-major call's order
/// (`first` is the row-major B: [`ColMajorCall::operands`]). `c` is D, and C too unless
/// `c_in` is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtOperands {
    pub first: u64,
    pub second: u64,
    pub c: u64,
    /// C read apart from D (same layout); `None`: C is D (in place).
    pub c_in: Option<u64>,
    /// The bias the epilogue reads or the bias gradient it writes.
    pub bias: Option<u64>,
    /// The aux matrix the epilogue reads or writes.
    pub aux: Option<u64>,
}

impl LtOperands {
    /// The operands of `call` for the row-major A, B and C.
    pub fn new(call: &ColMajorCall, (a, b, c): (u64, u64, u64), bias: Option<u64>, aux: Option<u64>) -> LtOperands {
        let (first, second) = call.operands(a, b);
        LtOperands { first, second, c, c_in: None, bias, aux }
    }

    /// The same with C read from `c_in` (`None`: in place).
    pub fn with_c_in(self, c_in: Option<u64>) -> LtOperands {
        LtOperands { c_in, ..self }
    }

    /// Every address, absent ones as 0 (a replay key's operands).
    pub fn addresses(&self) -> [u64; 6] {
        let (bias, aux, c_in) = (self.bias.unwrap_or(0), self.aux.unwrap_or(0), self.c_in.unwrap_or(0));
        [self.first, self.second, self.c, c_in, bias, aux]
    }
}

/// Descriptors, layouts and the algorithm for one [`PlanKey`].
pub(crate) struct Plan {
    pub(super) desc: Desc,
    pub(super) a: Layout,
    pub(super) b: Layout,
    pub(super) c: Layout,
    pub algo: Algorithm,
    /// The heuristic's candidates, best first (for tuning).
    pub candidates: Vec<Algorithm>,
}

// SAFETY: descriptors are plain host objects; cuBLASLt allows them to be used from any thread,
// and gemmbridge only uses them under the device's lock.
unsafe impl Send for Plan {}

/// The matmul descriptor of `key`: ops, epilogue, bias and aux types and layout.
fn descriptor(key: &PlanKey) -> Result<Desc> {
    let (c, p) = (&key.call, key.precision);
    let desc = Desc::new(p.compute())?;
    // SAFETY (every set): each value has the attribute's documented type.
    unsafe {
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &lt_op(c.transa))?;
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &lt_op(c.transb))?;
        if key.sm_count > 0 {
            // int32_t (cublasLtMatmulDescAttributes_t)
            desc.set(A::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &(key.sm_count as i32))?;
        }
        let epi = lt_epilogue(key.epilogue);
        if epi == lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT {
            return Ok(desc);
        }
        desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        let out = lt_dtype(p.output());
        if key.epilogue.vector() != VectorUse::None {
            desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out)?;
        }
        if key.epilogue.aux() != AuxUse::None {
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &key.aux_ld)?;
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &out)?;
            if c.batch > 1 {
                desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &key.aux_stride)?;
            }
        }
    }
    Ok(desc)
}

/// The layouts of the first and second operand and of C/D for `key`.
fn layouts(key: &PlanKey) -> Result<[Layout; 3]> {
    let (c, p) = (&key.call, key.precision);
    let (a_rows, a_cols) = if c.transa == Op::N { (c.m, c.k) } else { (c.k, c.m) };
    let (b_rows, b_cols) = if c.transb == Op::N { (c.k, c.n) } else { (c.n, c.k) };
    Ok([
        Layout::new(p.input(), a_rows, a_cols, c.lda, c.batch, c.stride_a)?,
        Layout::new(p.input(), b_rows, b_cols, c.ldb, c.batch, c.stride_b)?,
        Layout::new(p.output(), c.m, c.n, c.ldc, c.batch, c.stride_c)?,
    ])
}

impl Plan {
    /// Builds descriptors and layouts and asks the heuristic for up to `candidates` algorithms.
    ///
    /// # Errors
    /// [`Error::Cublas`] from any cuBLASLt call; `CUBLAS_STATUS_NOT_SUPPORTED` when the
    /// heuristic has no algorithm for the problem.
    pub fn build(h: &LtHandle, key: &PlanKey, candidates: usize) -> Result<Plan> {
        let desc = descriptor(key)?;
        let [a, b, c] = layouts(key)?;
        let pref = Pref::new(key.workspace, [key.align[0], key.align[1], key.align[2]])?;
        let list: Vec<Algorithm> = heuristic(h, &desc, [&a, &b, &c, &c], &pref, candidates)?
            .into_iter()
            .map(|(data, workspace)| Algorithm { data, workspace })
            .collect();
        let Some(&best) = list.first() else {
            return Err(Error::Cublas {
                operation: "cublasLtMatmulAlgoGetHeuristic",
                status: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
                problem: format!("no algorithm for {:?} {} epilogue {}", key.call, key.precision, key.epilogue),
            });
        };
        Ok(Plan { desc, a, b, c, algo: best, candidates: list })
    }

    /// Whether `algo` is valid for this plan (cublasLtMatmulAlgoCheck), and its workspace.
    pub fn check_algo(&self, h: &LtHandle, algo: &Algorithm) -> Option<usize> {
        algo_check(h, &self.desc, [&self.a, &self.b, &self.c, &self.c], algo.data)
    }

    /// Enqueues `D = epilogue(α·opa(A)·opb(B) + β·C)` with C read from `ops.c_in` where given
    /// (same layout as D), else from D in place, with `algo`, the scalars `(α, β)` and the
    /// stream's workspace `ws`.
    ///
    /// # Safety
    /// Addresses valid for the plan's layouts (checked by the caller); `bias`/`aux` given
    /// exactly when the epilogue uses them; `ws` used by nothing else on another stream;
    /// `stream` of the handle's context.
    pub unsafe fn launch(
        &self,
        h: &LtHandle,
        algo: &Algorithm,
        scalars: (f32, f32),
        ops: &LtOperands,
        ws: &Workspace,
        stream: lt::cudaStream_t,
    ) -> Result<()> {
        // SAFETY: pointer-valued attributes take a void* (cublasLtMatmulDescAttributes_t).
        unsafe {
            if let Some(b) = ops.bias {
                self.desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &(b as *const c_void))?;
            }
            if let Some(x) = ops.aux {
                self.desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &(x as *const c_void))?;
            }
        }
        let m = Matmul {
            desc: &self.desc,
            layouts: [&self.a, &self.b, &self.c, &self.c],
            ptrs: [ops.first, ops.second, ops.c_in.unwrap_or(ops.c), ops.c],
        };
        // SAFETY: the function's contract.
        unsafe { matmul(h, &m, algo, scalars, ws, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::column_major_call;

    #[test]
    fn an_sm_count_target_keeps_tuned_algorithms_away() {
        let p = GemmProblem::linear(3537, 12288, 2048, Precision::BF16).unwrap();
        let call = column_major_call(&p);
        let ops = LtOperands::new(&call, (256, 512, 1024), None, None);
        let whole = PlanKey::of(&p, call, &ops, 32 << 20);
        assert_eq!(whole.sm_count, 0);
        let fewer = PlanKey { sm_count: 131, ..whole };
        assert_ne!(whole, fewer, "plans are cached per target");
        // the signature of the whole GPU is the database's, unchanged; a target appends itself
        let sig = signature(&whole);
        assert!(sig.starts_with("TN m12288 n4096 k2048 lda2048 ldb2048 ldc12288 b1 bf16 none"), "{sig}");
        assert!(sig.ends_with("ws33554432"), "{sig}");
        assert_eq!(signature(&fewer), format!("{sig} sm131"));
    }

    #[test]
    fn a_key_made_ahead_of_its_operands_is_the_key_of_operands_so_aligned() {
        let p = GemmProblem::linear(64, 96, 32, Precision::BF16).unwrap();
        let call = column_major_call(&p);
        let at_256 = LtOperands::new(&call, (0x7f00_0000_0100, 0x7f00_0000_0200, 0x7f00_0000_0300), None, None);
        assert_eq!(PlanKey::aligned(&p, call, 256, 1 << 20), PlanKey::of(&p, call, &at_256, 1 << 20));
        let at_16 = LtOperands::new(&call, (0x1010, 0x2030, 0x3050), None, None);
        assert_eq!(PlanKey::aligned(&p, call, 16, 1 << 20), PlanKey::of(&p, call, &at_16, 1 << 20));
        assert_eq!(PlanKey::aligned(&p, call, 4, 0).align, [4, 4, 4, 256]);
        let biased = GemmProblem::linear(64, 96, 32, Precision::BF16).unwrap().with_epilogue(Epilogue::Bias).unwrap();
        assert_eq!(PlanKey::aligned(&biased, column_major_call(&biased), 4, 0).align, [4, 4, 4, 16]);
    }
}
