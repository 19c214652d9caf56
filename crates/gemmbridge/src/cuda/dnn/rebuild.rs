//! A plan rebuilt from a tactic database entry without searching: the graph API's engine by
//! its global index with the recorded knob choices, or the legacy API's algorithm with its math
//! type — used only where cuDNN finalizes it, it keeps the precision's promise and its
//! workspace fits.

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::graph::{self, variant};
use super::graph_desc::Desc;
use super::graph_plan::GraphPlan;
use super::graph_search::{engine_of, notes_ok};
use super::legacy::{self, Algo, ConvPlan};
use super::sys::{math_ok, types, ActivationDesc, ConvDesc, FilterDesc, TensorDesc};
use super::{ConvCall, ConvOp, EngineConfig, Planned, Tail};
use crate::error::{Error, Result};
use crate::tactics::Choice;

/// The plan `choice` describes for the call's problem and direction (`fuse`: a fused forward
/// runs fused) and buffers aligned as the call's, without a search: the graph API's engine
/// configuration needing at most `limit` bytes of workspace, or the legacy API's algorithm
/// needing at most the stream's workspace.
///
/// # Errors
/// Whatever cuDNN refuses (an engine index that does not exist, knobs it does not take, a plan
/// that does not finalize), a choice that breaks the precision's promise, needs more workspace
/// than allowed, or is of an unknown kind: [`Error::Cudnn`] or [`Error::Unsupported`]. The
/// caller plans the problem as without the database.
///
/// # Safety
/// `h` is a live handle.
pub(super) unsafe fn rebuild(
    h: raw::cudnnHandle_t,
    call: &ConvCall,
    fuse: bool,
    choice: &Choice,
    limit: usize,
) -> Result<Planned> {
    let (p, op, legacy_limit) = (call.problem, call.op, call.workspace.1);
    let refused = |what: String| Error::Unsupported { backend: "cuDNN", what };
    match choice {
        &Choice::CudnnEngine { engine, ref knobs, unfused, .. } => {
            // a fused forward's tail: the forward graph's engine, then the bias and activation
            let tail = match op {
                ConvOp::Fused(act) if unfused || !fuse => Some(Tail::new(p, act)?),
                _ => None,
            };
            let graph_op = if tail.is_some() { ConvOp::Forward } else { op };
            let config = EngineConfig { engine, knobs: knobs.clone() };
            let g = engine_plan(h, &ConvCall { op: graph_op, ..*call }, config, limit)?;
            Ok(Planned::Graph(g, tail))
        }
        &Choice::CudnnAlgo { algo, math, .. } => {
            let algo = algo_of(op, algo).ok_or_else(|| refused(format!("no legacy algorithm {algo} for {op:?}")))?;
            let math = math_of(math).ok_or_else(|| refused(format!("no math type {math}")))?;
            if !math_ok(p.precision, math) {
                return Err(refused(format!("{math:?} breaks {}'s promise", p.precision)));
            }
            let (dtype, _) = types(p.precision);
            let x = TensorDesc::new(dtype, p.x_dims(), p.layout)?;
            let w = FilterDesc::new(dtype, p.w_dims(), p.layout)?;
            let y = TensorDesc::new(dtype, p.y_dims(), p.layout)?;
            let conv = ConvDesc::new(p, math)?;
            // SAFETY: live descriptors, the math type set.
            let workspace = unsafe { legacy::workspace_size(h, (x.raw(), w.raw(), y.raw(), conv.raw()), algo)? };
            if workspace > legacy_limit {
                return Err(refused(format!(
                    "{} needs {workspace} bytes of workspace, over {legacy_limit}",
                    algo.name()
                )));
            }
            let (bias, act) = match op {
                ConvOp::Fused(a) => {
                    (Some(TensorDesc::new(dtype, [1, p.k, 1, 1], p.layout)?), Some(ActivationDesc::new(a)?))
                }
                _ => (None, None),
            };
            let choice = legacy::Choice { algo, math, workspace, measured: None };
            Ok(Planned::Legacy(ConvPlan { x, w, y, conv, choice, bias, act, fused: fuse, from_database: true }))
        }
        other => Err(refused(format!("{other:?} is not a convolution plan"))),
    }
}

/// The execution plan of engine configuration `c` for the graph of the call's problem and
/// direction, with buffers aligned as the call's: finalized, its engine's numerical notes
/// keeping the precision's promise, its workspace at most `limit`.
fn engine_plan(h: raw::cudnnHandle_t, call: &ConvCall, c: EngineConfig, limit: usize) -> Result<GraphPlan> {
    let (p, op, b) = (call.problem, call.op, &call.buffers);
    let what = || format!("{} {op:?} engine {}", p.describe(), c.engine);
    let (g, mut parts) = graph::graph(h, p, op, graph::alignment(b))?;
    let (cfg, made_of) = config(&g, &c, what)?;
    let (_, notes) = engine_of(&cfg)?;
    if !notes_ok(p.precision, &notes) {
        let what = format!("{}: numerical notes {notes:?} break {}'s promise", what(), p.precision);
        return Err(Error::Unsupported { backend: "cuDNN", what });
    }
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?
        .handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h)?
        .descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg])?
        .finalize(what)?;
    let bytes = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
    if bytes > limit {
        let what = format!("{} needs {bytes} bytes of workspace, over the limit of {limit}", what());
        return Err(Error::Unsupported { backend: "cuDNN", what });
    }
    let (uids, _) = variant(op, b);
    let name = format!("engine {} (tactic database, knobs {:?}, notes {notes:?})", c.engine, c.knobs);
    parts.push(g);
    parts.extend(made_of);
    let mut made_of = vec![cfg];
    made_of.append(&mut parts);
    let mut g = GraphPlan::new(plan, made_of, bytes, name, uids);
    g.config = Some(c);
    Ok(g)
}

/// The finalized engine configuration `c` describes for `graph`: the configuration, and the
/// engine and knob descriptors it was made of (alive as long as it).
///
/// # Errors
/// [`Error::Cudnn`] where cuDNN refuses the engine index or a knob.
pub(super) fn config(graph: &Desc, c: &EngineConfig, what: impl Fn() -> String) -> Result<(Desc, Vec<Desc>)> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[graph])?
        .i64s(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &[c.engine])?
        .finalize(&what)?;
    let mut knobs = Vec::with_capacity(c.knobs.len());
    for &(ty, value) in &c.knobs {
        // SAFETY: KNOB_TYPE reads the (32-bit) enum, passed as its value (cuDNN refuses values
        // it does not know); KNOB_VALUE an int64_t.
        let k = unsafe {
            Desc::new(D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?.set(
                A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                T::CUDNN_TYPE_KNOB_TYPE,
                &[ty],
            )?
        };
        knobs
            .push(k.i64s(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, &[value])?.finalize(|| format!("knob {ty} = {value}"))?);
    }
    let mut cfg =
        Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?.descs(A::CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
    if !knobs.is_empty() {
        cfg = cfg.descs(A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, &knobs.iter().collect::<Vec<_>>())?;
    }
    let cfg = cfg.finalize(&what)?;
    let mut made_of = vec![engine];
    made_of.extend(knobs);
    Ok((cfg, made_of))
}

/// The legacy algorithm of `op`'s direction whose enum value is `v`.
fn algo_of(op: ConvOp, v: u32) -> Option<Algo> {
    use raw::cudnnConvolutionBwdDataAlgo_t::*;
    use raw::cudnnConvolutionBwdFilterAlgo_t::*;
    use raw::cudnnConvolutionFwdAlgo_t::*;
    match op {
        ConvOp::Forward | ConvOp::Fused(_) => [
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
            CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
            CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
            CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
            CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        ]
        .into_iter()
        .find(|a| *a as u32 == v)
        .map(Algo::Forward),
        ConvOp::BackwardData => [
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        ]
        .into_iter()
        .find(|a| *a as u32 == v)
        .map(Algo::Data),
        ConvOp::BackwardFilter => [
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        ]
        .into_iter()
        .find(|a| *a as u32 == v)
        .map(Algo::Filter),
    }
}

/// The math type whose enum value is `v`.
fn math_of(v: u32) -> Option<raw::cudnnMathType_t> {
    use raw::cudnnMathType_t::*;
    [CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH]
        .into_iter()
        .find(|m| *m as u32 == v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvActivation;

    #[test]
    fn legacy_enum_values_map_back_and_unknown_ones_are_refused() {
        for (op, n) in [(ConvOp::Forward, 8), (ConvOp::BackwardData, 6), (ConvOp::BackwardFilter, 7)] {
            for v in 0..n {
                let a = algo_of(op, v).unwrap_or_else(|| panic!("{op:?} {v}"));
                assert_eq!(a.value(), v);
            }
            assert_eq!(algo_of(op, n), None, "{op:?}: the COUNT value is no algorithm");
            assert_eq!(algo_of(op, u32::MAX), None);
        }
        assert!(matches!(algo_of(ConvOp::Fused(ConvActivation::Relu), 1), Some(Algo::Forward(_))));
        for v in 0..4 {
            assert_eq!(math_of(v).map(|m| m as u32), Some(v));
        }
        assert_eq!(math_of(4), None);
    }
}
