//! The configuration search for tiny problems: cuBLASLt's algorithm ids and their tiles,
//! stages, custom options and split-K settings, beyond the heuristic's list (the search
//! cuBLASLt's `LtSgemmCustomFind` sample makes).

use cudarc::cublaslt::sys as lt;
use lt::cublasLtMatmulAlgoCapAttributes_t as Cap;
use lt::cublasLtMatmulAlgoConfigAttributes_t as Cfg;

use super::launch::Algorithm;
use super::plan::{Plan, PlanKey};
use super::sys::{lt_compute, lt_dtype, LtHandle};

/// The types an algorithm id is queried and initialised with (A, B, then C and D).
pub(super) struct Types {
    pub compute: lt::cublasComputeType_t,
    pub scale: lt::cudaDataType,
    pub input: lt::cudaDataType,
    pub input_b: lt::cudaDataType,
    pub output: lt::cudaDataType,
}

/// The algorithm ids cuBLASLt offers for `t` (`cublasLtMatmulAlgoGetIds`; none on failure).
fn algo_ids(h: &LtHandle, t: &Types) -> Vec<i32> {
    let mut ids = [0i32; 256];
    let mut n_ids = 0;
    // SAFETY: ids has 256 slots; the handle is live.
    let s = unsafe {
        lt::cublasLtMatmulAlgoGetIds(
            h.0,
            t.compute,
            t.scale,
            t.input,
            t.input_b,
            t.output,
            t.output,
            256,
            ids.as_mut_ptr(),
            &mut n_ids,
        )
    };
    if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Vec::new();
    }
    ids[..n_ids.clamp(0, 256) as usize].to_vec()
}

/// Algorithm `id` initialised for `t` (`cublasLtMatmulAlgoInit`), `None` where it fails.
fn init(h: &LtHandle, t: &Types, id: i32) -> Option<lt::cublasLtMatmulAlgo_t> {
    // SAFETY: zeroed is a valid cublasLtMatmulAlgo_t to initialise.
    let mut base: lt::cublasLtMatmulAlgo_t = unsafe { std::mem::zeroed() };
    // SAFETY: out-pointer to a local; the handle is live.
    let s = unsafe {
        lt::cublasLtMatmulAlgoInit(h.0, t.compute, t.scale, t.input, t.input_b, t.output, t.output, id, &mut base)
    };
    (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(base)
}

/// A capability that is a list of u32 (tile or stage ids); `[0]` when absent.
fn cap_u32s(algo: &lt::cublasLtMatmulAlgo_t, attr: Cap) -> Vec<u32> {
    let mut written = 0usize;
    // SAFETY: a size query (null buffer of 0 bytes); algo is initialised.
    let s = unsafe { lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut written) };
    if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || written == 0 {
        return vec![0];
    }
    let mut v = vec![0u32; written / 4];
    // SAFETY: v holds v.len() u32s, the attribute's documented element type.
    let s =
        unsafe { lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, v.as_mut_ptr() as _, v.len() * 4, &mut written) };
    if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || v.is_empty() {
        vec![0]
    } else {
        v
    }
}

/// A capability that is one i32; 0 when absent.
fn cap_i32(algo: &lt::cublasLtMatmulAlgo_t, attr: Cap) -> i32 {
    let (mut v, mut written) = (0i32, 0usize);
    // SAFETY: a 4-byte integer capability into a local i32.
    let s = unsafe { lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, &mut v as *mut i32 as _, 4, &mut written) };
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        v
    } else {
        0
    }
}

/// What an algorithm id can be configured with.
struct Caps {
    tiles: Vec<u32>,
    stages: Vec<u32>,
    custom: u32,
    /// (split-K count, reduction scheme); (1, 0) first.
    splits: Vec<(u32, u32)>,
    swizzle: u32,
}

impl Caps {
    fn of(base: &lt::cublasLtMatmulAlgo_t) -> Caps {
        let splitk = cap_i32(base, Cap::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
        let schemes_mask = cap_i32(base, Cap::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK) as u32;
        let mut splits: Vec<(u32, u32)> = vec![(1, 0)];
        if splitk {
            for k in [2u32, 4, 8] {
                for scheme in [1u32, 2, 4].into_iter().filter(|b| schemes_mask & b != 0) {
                    splits.push((k, scheme));
                }
            }
        }
        Caps {
            tiles: cap_u32s(base, Cap::CUBLASLT_ALGO_CAP_TILE_IDS),
            stages: cap_u32s(base, Cap::CUBLASLT_ALGO_CAP_STAGES_IDS),
            custom: cap_i32(base, Cap::CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX).clamp(0, 15) as u32,
            splits,
            swizzle: cap_i32(base, Cap::CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT).clamp(0, 1) as u32,
        }
    }

    /// Every configuration, in the order tile × stage × custom option × split × swizzle, as
    /// (attribute, value) settings.
    fn configs(&self) -> impl Iterator<Item = [(Cfg, u32); 6]> + '_ {
        self.tiles.iter().flat_map(move |&tile| {
            self.stages.iter().flat_map(move |&stage| {
                (0..=self.custom).flat_map(move |opt| {
                    self.splits.iter().flat_map(move |&(k, scheme)| {
                        (0..=self.swizzle).map(move |swz| {
                            [
                                (Cfg::CUBLASLT_ALGO_CONFIG_TILE_ID, tile),
                                (Cfg::CUBLASLT_ALGO_CONFIG_STAGES_ID, stage),
                                (Cfg::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, opt),
                                (Cfg::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, k),
                                (Cfg::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme),
                                (Cfg::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz),
                            ]
                        })
                    })
                })
            })
        })
    }
}

/// `base` with `settings` applied, `None` where cuBLASLt refuses one.
fn configured(base: &lt::cublasLtMatmulAlgo_t, settings: &[(Cfg, u32)]) -> Option<lt::cublasLtMatmulAlgo_t> {
    let mut algo = *base;
    for &(attr, v) in settings {
        // SAFETY: every config attribute set here is a 4-byte integer (u32, or i32 for
        // SPLITK_NUM) (cublasLtMatmulAlgoConfigAttributes_t); algo is initialised.
        let s = unsafe { lt::cublasLtMatmulAlgoConfigSetAttribute(&mut algo, attr, &v as *const u32 as _, 4) };
        if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return None;
        }
    }
    Some(algo)
}

/// One id's share of the search: at most `accept` accepted configurations after at most
/// `checks` checks.
struct Budget {
    accept: usize,
    checks: usize,
}

impl Plan {
    /// Configurations cuBLASLt offers for this plan's types beyond the heuristic's list
    /// ([`search_algos`], with `cublasLtMatmulAlgoCheck` against this plan). Meant for tiny
    /// problems, where the heuristic offers few candidates and a kernel's launch overhead is
    /// its run time.
    pub fn search(&self, h: &LtHandle, key: &PlanKey, workspace: usize, limit: usize, checks: usize) -> Vec<Algorithm> {
        let p = key.precision;
        let types = Types {
            compute: lt_compute(p.compute()),
            scale: lt::cudaDataType::CUDA_R_32F,
            input: lt_dtype(p.input()),
            input_b: lt_dtype(p.input()),
            output: lt_dtype(p.output()),
        };
        search_algos(h, &types, &|c| self.check_algo(h, c), workspace, limit, checks)
    }
}

/// Configurations cuBLASLt offers for `types`: for each algorithm id
/// (`cublasLtMatmulAlgoGetIds`), its tiles × stages × custom options × split-K 1, 2, 4, 8
/// (where supported, with each supported reduction scheme) × CTA swizzling, kept where `check`
/// (`cublasLtMatmulAlgoCheck` for the caller's plan) accepts it with at most `workspace` bytes.
/// Cluster and inner shapes are left at the algorithm's default. Bounded: each id in turn gets
/// an equal share of what is left of `limit` accepted configurations and of `checks` checks
/// (each a host call of a few µs), so what one id leaves unused goes to the next.
pub(super) fn search_algos(
    h: &LtHandle,
    types: &Types,
    check: &dyn Fn(&Algorithm) -> Option<usize>,
    workspace: usize,
    limit: usize,
    checks: usize,
) -> Vec<Algorithm> {
    let ids = algo_ids(h, types);
    let (mut found, mut checks_used) = (Vec::new(), 0usize);
    for (i, &id) in ids.iter().enumerate() {
        let left = ids.len() - i;
        let budget =
            Budget { accept: (limit - found.len()).div_ceil(left), checks: (checks - checks_used).div_ceil(left) };
        let Some(base) = init(h, types, id) else { continue };
        match search_id(check, &base, workspace, limit, &budget, &mut found) {
            Some(checked) => checks_used += checked,
            None => return found,
        }
    }
    found
}

/// Adds to `found` the accepted configurations of one id within `budget`; returns the checks
/// made, or `None` once `found` holds `limit`.
fn search_id(
    check: &dyn Fn(&Algorithm) -> Option<usize>,
    base: &lt::cublasLtMatmulAlgo_t,
    workspace: usize,
    limit: usize,
    budget: &Budget,
    found: &mut Vec<Algorithm>,
) -> Option<usize> {
    let (found_before, mut checked) = (found.len(), 0usize);
    for settings in Caps::of(base).configs() {
        if found.len() >= limit {
            return None;
        }
        if checked >= budget.checks || found.len() - found_before >= budget.accept {
            return Some(checked);
        }
        let Some(algo) = configured(base, &settings) else { continue };
        checked += 1;
        let cand = Algorithm { data: algo.data, workspace: 0 };
        if let Some(need) = check(&cand).filter(|&need| need <= workspace) {
            found.push(Algorithm { data: algo.data, workspace: need });
        }
    }
    Some(checked)
}
