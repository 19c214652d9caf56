//! An attention execution plan: the graph of one problem and direction, cuDNN's best-ranked
//! engine configuration for it that finalizes and fits the workspace limit (heuristic mode A,
//! then the fallback list), and its launch — the lengths written into the workspace where the
//! plan takes them from there, a variant pack (the last one kept while the pointers repeat),
//! `cudnnBackendExecute`.

use std::ffi::c_void;

use cudarc::cudnn::sys as raw;
use cudarc::driver::sys as drv;

use super::fp8::{self, O_FACTOR, P_SCALE};
use super::graphs::{self, uid};
use super::{AttnBuffers, AttnCall, AttnOp, Extra, LensSource};
use crate::attention::Attention;
use crate::cuda::dnn::builder::{Builder, Scalar};
use crate::cuda::dnn::graph_desc::Desc;
use crate::cuda::dnn::graph_plan::pack;
use crate::cuda::dnn::graph_search::{configs, engine_of, execution_plan, SEARCH_LIMIT};
use crate::cuda::dnn::rebuild::config;
use crate::cuda::dnn::sys::check;
use crate::cuda::dnn::tactic::read_config;
use crate::cuda::dnn::{EngineConfig, Measured};
use crate::cuda::status;
use crate::error::{Error, Result};

/// The FP8 backward's scalars in the call's scratch, in this order (f32 each): P's scale and
/// inverse, dS's scale and inverse, the scales of dq, dk, dv, and the absolute maxima of dq, dk,
/// dv, dS.
pub(crate) const FP8_BWD_SCALARS: [i64; 11] = [
    uid::SCALE_S,
    uid::DESCALE_S,
    uid::SCALE_DP,
    uid::DESCALE_DP,
    uid::SCALE_DQ,
    uid::SCALE_DK,
    uid::SCALE_DV,
    uid::AMAX_DQ,
    uid::AMAX_DK,
    uid::AMAX_DV,
    uid::AMAX_DP,
];

/// A finalized attention plan and what a call needs to run it.
pub(crate) struct AttnPlan {
    plan: Desc,
    /// The engine configuration, the graph and what it was made of, alive as long as the plan.
    _made_of: Vec<Desc>,
    /// The workspace layout after cuDNN's part; `extra.total` bytes in all.
    pub extra: Extra,
    pub lens: LensSource,
    /// The engine's global index and notes, for the log and reports.
    pub name: String,
    /// The engine configuration (read back for a measured search's choice; the entry's for a
    /// plan from the tactic database).
    pub config: Option<EngineConfig>,
    /// A measured search's times (`None` for the heuristic's plan or the database's).
    pub measured: Option<Measured>,
    /// By-value scalars: unique ids and the values' bits (the variant pack points at them).
    scalar_uids: Vec<i64>,
    scalar_bits: Box<[u32]>,
    /// The last variant pack and the addresses it holds.
    pack: Option<([u64; 19], Desc)>,
}

// SAFETY: host-side cuDNN objects and plain data, used under the device's Mutex only.
unsafe impl Send for AttnPlan {}

/// How [`make`] chooses among cuDNN's engine configurations.
pub(crate) enum Choose<'a> {
    /// The first of cuDNN's ranked lists (heuristic mode A, then the fallback list) that
    /// finalizes and fits the workspace limit.
    Heuristic,
    /// The tactic database's engine and knobs.
    Tuned(&'a EngineConfig),
    /// The fastest of up to [`SEARCH_LIMIT`] qualifying configurations of each list, each
    /// timed by the closure (device ms; `None` where it fails to run).
    Measured(&'a mut dyn FnMut(&mut AttnPlan) -> Option<f64>),
}

/// What every plan of one graph shares: the problem, direction, lengths and the graph's
/// by-value scalars.
struct Common<'a> {
    h: raw::cudnnHandle_t,
    p: &'a Attention,
    op: AttnOp,
    lens: LensSource,
    limit: usize,
    scalars: &'a [(i64, Scalar)],
}

impl Common<'_> {
    fn what(&self) -> String {
        format!("attention {} {:?}", self.p.describe(), self.op)
    }

    /// The plan of configuration `cfg` where it finalizes and fits the limit (each refusal
    /// logged at debug level, or returned for a database entry).
    fn plan(&self, cfg: Desc, name: String) -> Result<AttnPlan> {
        let (plan, bytes) = execution_plan(self.h, &cfg, || format!("{} {name}", self.what()))?;
        if bytes > self.limit {
            let what =
                format!("{} {name} needs {bytes} bytes of workspace, over the limit of {}", self.what(), self.limit);
            return Err(Error::Unsupported { backend: "cuDNN", what });
        }
        let (scalar_uids, bits): (Vec<i64>, Vec<u32>) = self
            .scalars
            .iter()
            .map(|&(u, v)| {
                let bits = match v {
                    Scalar::F32(x) => x.to_bits(),
                    Scalar::I32(x) => x as u32,
                };
                (u, bits)
            })
            .unzip();
        Ok(AttnPlan {
            plan,
            _made_of: vec![cfg],
            extra: Extra::new(self.p, self.op, self.lens, bytes),
            lens: self.lens,
            name,
            config: None,
            measured: None,
            scalar_uids,
            scalar_bits: bits.into_boxed_slice(),
            pack: None,
        })
    }
}

/// Makes the plan of `p` and `op` for buffers aligned to `align` bytes, with lengths from
/// `lens`, needing at most `limit` bytes of cuDNN workspace, chosen as `choose` says.
/// `Ok(None)` when no engine configuration of cuDNN's lists finalizes within the limit.
///
/// # Errors
/// The graph's errors; for [`Choose::Tuned`], whatever cuDNN refuses of the entry.
pub(crate) fn make(
    h: raw::cudnnHandle_t,
    (p, op, align): (&Attention, AttnOp, u8),
    lens: LensSource,
    limit: usize,
    choose: Choose,
) -> Result<Option<AttnPlan>> {
    let mut g = Builder::new(align);
    match op {
        AttnOp::Forward { stats } => graphs::forward(&mut g, p, stats)?,
        AttnOp::ForwardFp8 { stats } => fp8::forward(&mut g, p, stats)?,
        AttnOp::Backward => graphs::backward(&mut g, p, lens != LensSource::None)?,
        AttnOp::BackwardFp8 { grad } => super::fp8_bwd::backward(&mut g, p, grad)?,
        AttnOp::PagedDecode(shape) => super::paged::decode(&mut g, p, shape)?,
    }
    let graph = g.finish(h, || format!("attention {} {op:?}", p.describe()))?;
    let common = Common { h, p, op, lens, limit, scalars: &graph.scalars };
    let chosen = match choose {
        Choose::Tuned(c) => {
            let (cfg, parts) = config(&graph.graph, c, || common.what())?;
            let name = format!("engine {} (tactic database, knobs {:?})", c.engine, c.knobs);
            let mut plan = common.plan(cfg, name)?;
            plan._made_of.extend(parts);
            plan.config = Some(c.clone());
            Some(plan)
        }
        Choose::Heuristic => ranked(&common, &graph.graph, &mut |_| Some(0.0), 1),
        Choose::Measured(time) => ranked(&common, &graph.graph, time, SEARCH_LIMIT),
    };
    Ok(chosen.map(|mut plan| {
        tracing::debug!(problem = %common.what(), name = %plan.name, workspace = plan.extra.total, "cuDNN attention plan");
        plan._made_of.push(graph.graph);
        plan._made_of.extend(graph.parts);
        plan
    }))
}

/// The fastest by `time` of the first `per_list` qualifying plans of each of cuDNN's ranked
/// lists (mode A, then the fallback list); with `per_list` 1 and a constant time, the
/// heuristic's first. A measured choice other than the heuristic's first keeps both times (the
/// tactic database stores only such a choice).
fn ranked(
    c: &Common,
    graph: &Desc,
    time: &mut dyn FnMut(&mut AttnPlan) -> Option<f64>,
    per_list: usize,
) -> Option<AttnPlan> {
    use raw::cudnnBackendHeurMode_t::*;
    // the best, and whether it is the first that ran (the heuristic's own choice)
    let (mut best, mut first_ms): (Option<(f64, AttnPlan, bool)>, Option<f64>) = (None, None);
    for mode in [CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK] {
        let cfgs = match configs(graph, mode) {
            Ok(cfgs) => cfgs,
            Err(e) => {
                tracing::debug!(problem = %c.what(), ?mode, error = %e, "cuDNN heuristic list unavailable");
                continue;
            }
        };
        let mut taken = 0;
        for cfg in cfgs {
            let Ok((index, notes)) = engine_of(&cfg) else { continue };
            let config = if per_list > 1 { read_config(&cfg).ok() } else { None };
            let mut plan = match c.plan(cfg, format!("engine {index} ({mode:?}, notes {notes:?})")) {
                Ok(plan) => plan,
                Err(e) => {
                    tracing::debug!(problem = %c.what(), error = %e, "skipped");
                    continue;
                }
            };
            let Some(ms) = time(&mut plan) else { continue };
            if per_list == 1 {
                return Some(plan);
            }
            tracing::debug!(problem = %c.what(), name = %plan.name, ms, "timed");
            let first = first_ms.is_none();
            first_ms.get_or_insert(ms);
            plan.config = config;
            if best.as_ref().is_none_or(|(t, _, _)| ms < *t) {
                best = Some((ms, plan, first));
            }
            taken += 1;
            if taken >= per_list {
                break;
            }
        }
    }
    let (ms, mut plan, first) = best?;
    plan.pack = None;
    // the heuristic's own choice is what a call without the database gets: nothing to store
    if !first {
        plan.measured = first_ms.map(|heuristic_ms| Measured { heuristic_ms, tuned_ms: ms });
    }
    Some(plan)
}

impl AttnPlan {
    /// The variant pack's unique ids and addresses for the call's buffers, with the workspace
    /// at `ws` and the lengths at `lens` (q, kv).
    fn variant(&self, op: AttnOp, b: &AttnBuffers, ws: u64, lens: (u64, u64)) -> (Vec<i64>, Vec<*mut c_void>) {
        let v = |a: u64| a as *mut c_void;
        let (mut uids, mut ptrs) = match op {
            AttnOp::Forward { stats } | AttnOp::ForwardFp8 { stats } => {
                let mut u = vec![uid::Q, uid::K, uid::V, uid::O];
                let mut p = vec![v(b.q), v(b.k), v(b.v), v(b.o)];
                if stats {
                    u.push(uid::STATS);
                    p.push(v(b.stats));
                }
                if matches!(op, AttnOp::ForwardFp8 { .. }) {
                    let at = |i: u64| v(ws + self.extra.fp8 as u64 + 4 * i);
                    u.extend([uid::DESCALE_Q, uid::DESCALE_K]);
                    p.extend([v(b.descale[0]), v(b.descale[1])]);
                    u.extend([uid::SCALE_S, uid::DESCALE_S, uid::SCALE_O, uid::DESCALE_V, uid::AMAX_O]);
                    p.extend([at(0), at(1), at(2), at(3), at(4)]);
                }
                (u, p)
            }
            AttnOp::PagedDecode(_) => (
                vec![uid::Q, uid::K, uid::V, uid::O, uid::PAGE_TABLE_K, uid::PAGE_TABLE_V],
                vec![v(b.q), v(b.k), v(b.v), v(b.o), v(b.table), v(b.table)],
            ),
            AttnOp::BackwardFp8 { .. } => {
                let mut u = vec![uid::Q, uid::K, uid::V, uid::O, uid::DO, uid::STATS, uid::DQ, uid::DK, uid::DV];
                let mut p = vec![v(b.q), v(b.k), v(b.v), v(b.o), v(b.d_o), v(b.stats), v(b.dq), v(b.dk), v(b.dv)];
                u.extend([uid::DESCALE_Q, uid::DESCALE_K, uid::DESCALE_V, uid::DESCALE_O, uid::DESCALE_DO]);
                p.extend(b.descale.map(v));
                u.extend(FP8_BWD_SCALARS);
                p.extend((0..FP8_BWD_SCALARS.len() as u64).map(|i| v(b.scalars + 4 * i)));
                (u, p)
            }
            AttnOp::Backward => (
                vec![
                    uid::Q,
                    uid::K,
                    uid::V,
                    uid::O,
                    uid::DO,
                    uid::STATS,
                    uid::DQ,
                    uid::DK,
                    uid::DV,
                    uid::SOFTMAX_SUM,
                    uid::DQ_ACCUM,
                ],
                vec![
                    v(b.q),
                    v(b.k),
                    v(b.v),
                    v(b.o),
                    v(b.d_o),
                    v(b.stats),
                    v(b.dq),
                    v(b.dk),
                    v(b.dv),
                    v(ws + self.extra.softmax_sum as u64),
                    v(ws + self.extra.dq_accum as u64),
                ],
            ),
        };
        if self.lens != LensSource::None {
            uids.extend([uid::LEN_Q, uid::LEN_KV]);
            ptrs.extend([v(lens.0), v(lens.1)]);
        }
        uids.extend(&self.scalar_uids);
        ptrs.extend(self.scalar_bits.iter().map(|b| b as *const u32 as *mut c_void));
        (uids, ptrs)
    }

    /// Enqueues the plan on the handle's stream with the call's buffers and the workspace at
    /// `ws` (at least `extra.total` bytes): the lengths first where the plan takes them from
    /// the workspace (the call's host lengths copied, the full extents set, or a paged
    /// decode's q lengths of 1 set), then the execution.
    ///
    /// # Safety
    /// `h` is the live handle the plan was made with, bound to the call's stream; the call's
    /// buffers are device buffers of the problem's sizes; `ws` holds `extra.total` bytes.
    pub unsafe fn launch(&mut self, h: raw::cudnnHandle_t, call: &AttnCall, ws: u64) -> Result<()> {
        let (p, b, stream) = (call.problem, &call.buffers, call.stream);
        let in_ws = (ws + self.extra.lens as u64, ws + self.extra.lens_kv(p) as u64);
        let lens = match self.lens {
            LensSource::None => (0, 0),
            LensSource::Call if b.len_q != 0 => (b.len_q, b.len_kv),
            LensSource::Call => {
                let (q, kv) = call.host_lens.expect("the entry passes host lengths when there are no device ones");
                // SAFETY: `in_ws` holds b int32 each (Extra::new); the host slices have b
                // elements (checked); a pageable copy is staged before this returns.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(in_ws.0, q, stream)
                        .map_err(status::driver("cuMemcpyHtoDAsync"))?;
                    cudarc::driver::result::memcpy_htod_async(in_ws.1, kv, stream)
                        .map_err(status::driver("cuMemcpyHtoDAsync"))?;
                }
                in_ws
            }
            LensSource::Decode => {
                // SAFETY: `in_ws.0` holds b int32 (Extra::new); a stream-ordered memset.
                unsafe { drv::cuMemsetD32Async(in_ws.0, 1, p.b, stream) }
                    .result()
                    .map_err(status::driver("cuMemsetD32Async"))?;
                (in_ws.0, b.len_kv)
            }
            LensSource::Full => {
                for (at, len) in [(in_ws.0, p.s_q), (in_ws.1, p.s_kv)] {
                    // SAFETY: `at` holds b int32 (Extra::new); a stream-ordered memset.
                    unsafe { drv::cuMemsetD32Async(at, len as u32, p.b, stream) }
                        .result()
                        .map_err(status::driver("cuMemsetD32Async"))?;
                }
                in_ws
            }
        };
        if matches!(call.op, AttnOp::ForwardFp8 { .. }) {
            // P's scale, its inverse, o's scale and the graph's constant v descale (`fp8.rs`), set
            // for every call (the workspace is shared with other calls on the stream)
            let at = ws + self.extra.fp8 as u64;
            for (i, x) in [P_SCALE, 1.0 / P_SCALE, 1.0, O_FACTOR].into_iter().enumerate() {
                // SAFETY: `at` holds 5 f32 (Extra::new); a stream-ordered memset.
                unsafe { drv::cuMemsetD32Async(at + 4 * i as u64, x.to_bits(), 1, stream) }
                    .result()
                    .map_err(status::driver("cuMemsetD32Async"))?;
            }
        }
        let d = b.descale;
        let key = [
            b.q, b.k, b.v, b.o, b.stats, b.d_o, b.dq, b.dk, b.dv, lens.0, lens.1, ws, d[0], d[1], d[2], d[3], d[4],
            b.scalars, b.table,
        ];
        if self.pack.as_ref().is_none_or(|(k, _)| *k != key) {
            let (uids, ptrs) = self.variant(call.op, b, ws, lens);
            self.pack = Some((key, pack(&uids, &ptrs, ws)?));
        }
        let vp = &self.pack.as_ref().expect("set above").1;
        // SAFETY: a finalized plan and variant pack of this handle (contract); the by-value
        // scalars the pack points at live in `self`.
        check(unsafe { raw::cudnnBackendExecute(h, self.plan.0, vp.0) }, "cudnnBackendExecute", || self.name.clone())
    }
}
