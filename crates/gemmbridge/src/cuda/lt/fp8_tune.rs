//! Autotuning of FP8 GEMMs: the heuristic's candidates for the call's [`Fp8Key`] and for its
//! neighbouring queries, checked against its first choice and timed interleaved with it, as
//! for the other GEMMs ([`super::tune`]); the winner is kept under the key's FP8 signature.
//!
//! The neighbouring queries matter more here: with row-wise and block scales cuBLASLt 13.1's
//! heuristic offers one algorithm per query, and the one it offers depends on the workspace
//! limit and the C/D alignment it is told (row-wise 4096³ ran 7–9 % slower with the 256-byte
//! class than with the 16-byte one, docs/PERFORMANCE.md). So the heuristic is also asked with
//! 1 MiB and 4 MiB of workspace (PyTorch's limits) and with a 16-byte C/D class, and every
//! algorithm cuBLASLt accepts for the real call (`cublasLtMatmulAlgoCheck`) is a candidate.
//! Where that still leaves fewer than 8, the configuration search of [`super::search`] adds
//! up to 48 (tiles, stages, split-K, swizzling of each FP8 algorithm id).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::fp8::{fp8_signature, Fp8Key, Fp8Operands, Fp8Plan};
use super::plan::Algorithm;
use super::timing::{time_interleaved, Call, Timed};
use super::tune::{rel_error_bytes, TuneOptions, TuneReport};
use super::LtState;
use crate::cuda::device::Workspace;
use crate::cuda::status;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fp8::OutputKind;
use crate::tactics::Tactic;

/// Workspace limits and C/D alignment classes of the neighbouring queries.
const OTHER_WORKSPACES: [usize; 2] = [1 << 20, 4 << 20];
const OTHER_ALIGN: u32 = 16;
/// Below this many candidates, the configuration search adds up to `SEARCH_LIMIT` more (after
/// at most `SEARCH_CHECKS` checks): row-wise and block scales get one from the heuristic.
const SEARCH_BELOW: usize = 8;
const SEARCH_LIMIT: usize = 48;
const SEARCH_CHECKS: usize = 20_000;

/// The heuristic's candidates for the job's key (within its workspace), then those of the
/// neighbouring queries that cuBLASLt accepts for the key. Returns them and how many were
/// added (at the end).
fn candidates(h: &super::sys::LtHandle, plan: &Fp8Plan, job: &Fp8TuneJob, n: usize) -> (Vec<Algorithm>, usize) {
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
    if list.len() < SEARCH_BELOW {
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
        for cand in super::search::search_algos(h, &types, &check, ws, SEARCH_LIMIT, SEARCH_CHECKS) {
            if !list.iter().any(|c| c.data == cand.data) {
                list.push(cand);
            }
        }
    }
    let added = list.len() - before;
    (list, added)
}

/// One FP8 problem to tune: its key (workspace filled in), validated operands, scalars, the
/// stream's workspace.
pub(crate) struct Fp8TuneJob<'a> {
    pub key: Fp8Key,
    pub ops: Fp8Operands,
    pub alpha: f32,
    pub beta: f32,
    pub ws: Workspace,
    pub stream: &'a Arc<CudaStream>,
}

/// Tunes `job`, keeps the winner in `lt` (its FP8 plans are dropped), and returns the report
/// and the (signature, tactic) pair to store.
///
/// # Safety
/// The job's operands are valid for its key on its stream (validated by the caller).
pub(crate) unsafe fn autotune_fp8(
    lt: &mut LtState,
    job: &Fp8TuneJob,
    opts: TuneOptions,
) -> Result<(TuneReport, String, Tactic)> {
    let OutputKind::Dense(out) = job.key.out else {
        return Err(Error::Unsupported { backend: "autotune", what: "an FP8 GEMM with an FP8 output".into() });
    };
    let plan = Fp8Plan::build(&lt.handle, &job.key, &job.ops, opts.candidates)?;
    let (cands, added) = candidates(&lt.handle, &plan, job, opts.candidates);
    let handle = &lt.handle;
    let run = |algo: &Algorithm, beta: f32| {
        // SAFETY: validated operands (the caller's contract); workspace of this stream.
        unsafe { plan.launch(handle, algo, job.alpha, beta, &job.ops, &job.ws, job.stream.cu_stream() as _) }
    };
    let bytes = job.key.m * job.key.n * out.size_bytes();
    let output = |algo: &Algorithm| -> Result<Vec<u8>> {
        run(algo, 0.0)?;
        job.stream.synchronize().map_err(status::driver("cuStreamSynchronize"))?;
        let mut host = vec![0u8; bytes];
        // SAFETY: D holds m·n elements (validated); the stream is idle.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, job.ops.d) }
            .map_err(status::driver("cuMemcpyDtoH"))?;
        Ok(host)
    };
    // correctness first: only candidates whose output matches the first choice's are timed
    let want = output(&cands[0])?;
    let band = if out == DType::F32 { 1e-3 } else { 1e-2 };
    let mut timed: Vec<usize> = vec![0];
    for (i, c) in cands.iter().enumerate().skip(1) {
        if rel_error_bytes(&output(c)?, &want, out) <= band {
            timed.push(i);
        }
    }
    let mismatched = cands.len() - timed.len();
    timed.push(0); // the first choice twice: the noise
    let (cands_ref, run_ref) = (&cands, &run);
    let runs: Vec<Call<'_>> =
        timed.iter().map(|&i| Box::new(move || run_ref(&cands_ref[i], job.beta)) as Call<'_>).collect();
    let Timed { medians: ms, in_graph, graph_failed } = time_interleaved(job.stream, opts.reps, &runs)?;
    let (first, again) = (ms[0], ms[ms.len() - 1]);
    let threshold = opts.min_gain.max((first - again).abs() / first.min(again));
    let base = first.min(again);
    let best = (1..ms.len() - 1).min_by(|&x, &y| ms[x].total_cmp(&ms[y]));
    let (algo, best_ms, improved) = match best {
        Some(j) if !graph_failed && ms[j] < base * (1.0 - threshold) => (cands[timed[j]], ms[j], true),
        _ => (cands[0], base, false),
    };
    let sig = fp8_signature(&job.key);
    lt.tuned.insert(sig.clone(), algo);
    lt.fp8_plans.clear();
    let report = TuneReport {
        heuristic_ms: base,
        best_ms,
        candidates: cands.len(),
        added,
        kept_added: improved && cands.len() - added <= cands.iter().position(|c| c.data == algo.data).unwrap_or(0),
        timed_in_graph: in_graph,
        graph_failed,
        mismatched,
        threshold,
        improved,
        algorithm: algo,
    };
    // SAFETY: takes no arguments; libcublasLt is loaded (an LtState exists).
    let version = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
    Ok((report, sig, Tactic::lt_fp8_gemm(algo.data, algo.workspace, version, base, best_ms)))
}
