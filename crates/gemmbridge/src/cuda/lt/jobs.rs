//! What the tuner ([`super::tune`]) tunes: a dense GEMM ([`TuneJob`]) and an FP8 GEMM
//! ([`Fp8TuneJob`]), each with the candidates it offers beyond the heuristic's list.
//!
//! Dense: the same GEMM without its epilogue (the heuristic ranks fused kernels on their own
//! and can leave out tiles that also run the epilogue faster: up to 17 % faster at
//! 5120×8192×2048 on the H200), smaller workspace limits, and for problems of at most 256³
//! multiply-adds the configuration search ([`super::search`]).
//!
//! FP8: with row-wise and block scales cuBLASLt 13.1's heuristic offers one algorithm per
//! query, and the one it offers depends on the workspace limit and the C/D alignment it is
//! told (row-wise 4096³ ran 7–9 % slower with the 256-byte class than with the 16-byte one).
//! So the heuristic is also asked with 1 MiB and 4 MiB of workspace (PyTorch's limits) and
//! with a 16-byte C/D class, and every algorithm cuBLASLt accepts for the real call
//! (`cublasLtMatmulAlgoCheck`) is a candidate; where that still leaves fewer than 8, the
//! configuration search adds up to 48 (tiles, stages, split-K, swizzling of each FP8
//! algorithm id).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::fp8::{fp8_signature, Fp8Key, Fp8Operands, Fp8Plan};
use super::launch::Algorithm;
use super::plan::{signature, LtOperands, Plan, PlanKey};
use super::sys::LtHandle;
use super::tune::{logical_elements, Tunable};
use super::LtState;
use crate::cuda::device::Workspace;
use crate::cuda::status;
use crate::dtype::DType;
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::fp8::OutputKind;
use crate::problem::GemmProblem;
use crate::tactics::Tactic;

/// One dense problem to tune: its plan key, validated operands and scalars, the stream's
/// workspace.
pub(crate) struct TuneJob<'a> {
    pub problem: &'a GemmProblem,
    pub key: PlanKey,
    pub ops: LtOperands,
    pub alpha: f32,
    pub beta: f32,
    pub ws: Workspace,
    pub stream: &'a Arc<CudaStream>,
}

/// D's bytes after a run (the stream is idle).
fn read_back(addr: u64, bytes: usize) -> Result<Vec<u8>> {
    let mut host = vec![0u8; bytes];
    // SAFETY: the output holds `bytes` (validated by the caller); its stream is idle.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, addr) }.map_err(status::driver("cuMemcpyDtoH"))?;
    Ok(host)
}

impl Tunable for TuneJob<'_> {
    type Plan = Plan;

    fn plan(&self, h: &LtHandle, n: usize) -> Result<Plan> {
        Plan::build(h, &self.key, n)
    }

    fn candidates(&self, h: &LtHandle, plan: &Plan, n: usize) -> (Vec<Algorithm>, usize) {
        let search = self.problem.macs() <= SEARCH_MAX_MACS;
        dense_candidates(h, plan, &self.key, n, self.ws.matmul_bytes, search)
    }

    unsafe fn run(&self, h: &LtHandle, plan: &Plan, algo: &Algorithm, beta: f32) -> Result<()> {
        // SAFETY: the caller's contract; the workspace is this stream's.
        unsafe { plan.launch(h, algo, (self.alpha, beta), &self.ops, &self.ws, self.stream.cu_stream() as _) }
    }

    fn output(&self) -> Result<Vec<u8>> {
        let (p, out) = (self.problem, self.problem.precision().output());
        let c_bytes = p.c().required_elems(p.batch()).unwrap_or(0) * out.size_bytes();
        Ok(logical_elements(read_back(self.ops.c, c_bytes)?, p.c(), p.batch(), out.size_bytes()))
    }

    fn band(&self) -> (DType, f64) {
        let prec = self.problem.precision();
        (prec.output(), prec.tolerance())
    }

    fn beta(&self) -> f32 {
        self.beta
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    fn describe(&self) -> String {
        self.problem.describe()
    }

    fn signature(&self) -> String {
        signature(&self.key)
    }

    fn tactic(&self, algo: &Algorithm, version: usize, base_ms: f64, best_ms: f64) -> Tactic {
        Tactic::lt_gemm(algo.data, algo.workspace, version, base_ms, best_ms)
    }

    fn forget(&self, lt: &mut LtState, sig: &str) {
        lt.forget_plans(|k| signature(k) == sig);
    }
}

/// One FP8 problem to tune: its key (workspace filled in), validated operands, scalars, the
/// stream's workspace. Only dense outputs are tuned.
pub(crate) struct Fp8TuneJob<'a> {
    pub key: Fp8Key,
    pub ops: Fp8Operands,
    pub alpha: f32,
    pub beta: f32,
    pub ws: Workspace,
    pub stream: &'a Arc<CudaStream>,
}

impl Fp8TuneJob<'_> {
    /// The dense output dtype, or the error for an FP8 output.
    pub fn out(&self) -> Result<DType> {
        match self.key.out {
            OutputKind::Dense(d) => Ok(d),
            OutputKind::Fp8(_) => {
                Err(Error::Unsupported { backend: "autotune", what: "an FP8 GEMM with an FP8 output".into() })
            }
        }
    }
}

impl Tunable for Fp8TuneJob<'_> {
    type Plan = Fp8Plan;

    fn plan(&self, h: &LtHandle, n: usize) -> Result<Fp8Plan> {
        self.out()?;
        Fp8Plan::build(h, &self.key, &self.ops, n)
    }

    fn candidates(&self, h: &LtHandle, plan: &Fp8Plan, n: usize) -> (Vec<Algorithm>, usize) {
        fp8_candidates(h, plan, self, n)
    }

    unsafe fn run(&self, h: &LtHandle, plan: &Fp8Plan, algo: &Algorithm, beta: f32) -> Result<()> {
        // SAFETY: the caller's contract; the workspace is this stream's.
        unsafe { plan.launch(h, algo, (self.alpha, beta), &self.ops, &self.ws, self.stream.cu_stream() as _) }
    }

    fn output(&self) -> Result<Vec<u8>> {
        read_back(self.ops.d, self.key.m * self.key.n * self.out()?.size_bytes())
    }

    fn band(&self) -> (DType, f64) {
        let out = self.out().unwrap_or(DType::F32);
        (out, if out == DType::F32 { 1e-3 } else { 1e-2 })
    }

    fn beta(&self) -> f32 {
        self.beta
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    fn describe(&self) -> String {
        format!("FP8 {}", fp8_signature(&self.key))
    }

    fn signature(&self) -> String {
        fp8_signature(&self.key)
    }

    fn tactic(&self, algo: &Algorithm, version: usize, base_ms: f64, best_ms: f64) -> Tactic {
        Tactic::lt_fp8_gemm(algo.data, algo.workspace, version, base_ms, best_ms)
    }

    fn forget(&self, lt: &mut LtState, _sig: &str) {
        lt.fp8_plans.clear();
    }
}

/// Smaller workspace limits the heuristic is also asked with, bytes (PyTorch's cuBLASLt calls
/// run with 1 MiB or 4 MiB, depending on its version and settings): its ranking changes with
/// the limit, and an algorithm that needs little workspace can be the fastest.
const OTHER_WORKSPACES: [usize; 2] = [1 << 20, 4 << 20];

/// The heuristic's candidates for `key` (best first, those needing more than `ws_bytes` of
/// workspace left out), then the distinct candidates of neighbouring queries that cuBLASLt
/// accepts for `key` (`cublasLtMatmulAlgoCheck`): the same GEMM without its epilogue (the
/// heuristic ranks fused kernels on their own and can leave out tiles that also run the
/// epilogue faster: up to 17 % faster at 5120×8192×2048 on the H200, docs/DESIGN.md, Design rationale),
/// and [`OTHER_WORKSPACES`]; with `search`, then [`Plan::search`]'s distinct configurations.
/// Returns the list and how many were added (they are at its end).
fn dense_candidates(
    lt: &LtHandle,
    plan: &Plan,
    key: &PlanKey,
    n: usize,
    ws_bytes: usize,
    search: bool,
) -> (Vec<Algorithm>, usize) {
    let mut list: Vec<Algorithm> = plan.candidates.iter().copied().filter(|c| c.workspace <= ws_bytes).collect();
    let before = list.len();
    let plain = PlanKey { epilogue: Epilogue::None, aux_ld: 0, aux_stride: 0, ..*key };
    let mut queries: Vec<PlanKey> = Vec::new();
    if key.epilogue != Epilogue::None {
        queries.push(plain);
    }
    for ws in OTHER_WORKSPACES.into_iter().filter(|&ws| ws < key.workspace) {
        queries.push(PlanKey { workspace: ws, ..*key });
        if key.epilogue != Epilogue::None {
            queries.push(PlanKey { workspace: ws, ..plain });
        }
    }
    for q in &queries {
        let Ok(other) = Plan::build(lt, q, n) else { continue };
        for cand in &other.candidates {
            if list.iter().any(|c| c.data == cand.data) {
                continue;
            }
            if let Some(need) = plan.check_algo(lt, cand).filter(|&need| need <= ws_bytes) {
                list.push(Algorithm { data: cand.data, workspace: need });
            }
        }
    }
    if search {
        for cand in plan.search(lt, key, ws_bytes, SEARCH_LIMIT, SEARCH_CHECKS) {
            if !list.iter().any(|c| c.data == cand.data) {
                list.push(cand);
            }
        }
    }
    let added = list.len() - before;
    (list, added)
}

/// Problems of at most this many multiply-adds (256³) also get configurations from
/// [`Plan::search`] as candidates: the heuristic gives them 1–15 (measured when tuning the
/// benchmark's suites on the H200), and each costs only µs to check and time.
const SEARCH_MAX_MACS: u64 = 1 << 24;
/// At most this many searched configurations are added, after at most this many checks (both
/// shared among the algorithm ids).
const SEARCH_LIMIT: usize = 160;
const SEARCH_CHECKS: usize = 20_000;

/// Workspace limits and C/D alignment classes of the neighbouring queries.
const OTHER_ALIGN: u32 = 16;
/// Below this many candidates, the configuration search adds up to `FP8_SEARCH_LIMIT` more
/// (after at most `SEARCH_CHECKS` checks): row-wise and block scales get one from the heuristic.
const FP8_SEARCH_BELOW: usize = 8;
const FP8_SEARCH_LIMIT: usize = 48;

/// The heuristic's candidates for the job's key (within its workspace), then those of the
/// neighbouring queries that cuBLASLt accepts for the key. Returns them and how many were
/// added (at the end).
fn fp8_candidates(h: &LtHandle, plan: &Fp8Plan, job: &Fp8TuneJob, n: usize) -> (Vec<Algorithm>, usize) {
    let ws = job.ws.matmul_bytes;
    let mut list: Vec<Algorithm> = plan.candidates.iter().copied().filter(|c| c.workspace <= ws).collect();
    let before = list.len();
    let mut queries: Vec<Fp8Key> = OTHER_WORKSPACES.iter().map(|&w| Fp8Key { workspace: w, ..job.key }).collect();
    if job.key.align > OTHER_ALIGN {
        queries.push(Fp8Key { align: OTHER_ALIGN, ..job.key });
    }
    for q in &queries {
        let Ok(other) = Fp8Plan::build(h, q, &job.ops, n) else { continue };
        for cand in &other.candidates {
            if list.iter().any(|c| c.data == cand.data) {
                continue;
            }
            if let Some(need) = plan.check_algo(h, cand).filter(|&need| need <= ws) {
                list.push(Algorithm { data: cand.data, workspace: need });
            }
        }
    }
    if list.len() < FP8_SEARCH_BELOW {
        let types = super::search::Types {
            compute: cudarc::cublaslt::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            scale: cudarc::cublaslt::sys::cudaDataType::CUDA_R_32F,
            input: super::fp8::fp8_type(job.key.w.0),
            input_b: super::fp8::fp8_type(job.key.x.0),
            output: match job.key.out {
                OutputKind::Dense(d) => super::sys::lt_dtype(d),
                OutputKind::Fp8(f) => super::fp8::fp8_type(f),
            },
        };
        let check = |c: &Algorithm| plan.check_algo(h, c);
        for cand in super::search::search_algos(h, &types, &check, ws, FP8_SEARCH_LIMIT, SEARCH_CHECKS) {
            if !list.iter().any(|c| c.data == cand.data) {
                list.push(cand);
            }
        }
    }
    let added = list.len() - before;
    (list, added)
}
