//! cuDNN's graph (backend) API for the convolutions, the path PyTorch takes (through
//! cudnn-frontend): one operation graph per problem and direction — the convolution, and for the
//! fused forward a bias ADD and a RELU_FWD on virtual f32 intermediates —, cuDNN's ranked engine
//! configurations for it (heuristic mode A, then the fallback list), an execution plan
//! finalized for the chosen one and kept; per call only a variant pack (the data pointers and
//! the workspace; the last one is kept and reused while the pointers repeat) and
//! `cudnnBackendExecute`.
//!
//! Choice: [`ConvSearch::Heuristic`] takes the first configuration that finalizes, fits the
//! workspace limit and keeps the precision's promise; [`ConvSearch::Measured`] times up to
//! [`SEARCH_LIMIT`] of each list on the call's own buffers (PyTorch's `cudnn.benchmark`, whose
//! default limit is also 10) and keeps the fastest. No configuration with the
//! `DOWN_CONVERT_INPUTS` numerical note, and for strict f32 none with `TENSOR_CORE` (on Ampere
//! and later those are TF32): PyTorch's filter with `allow_tf32` off.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::cudnn::sys as raw;
use cudarc::driver::result::event;
use cudarc::driver::sys::CUevent_flags;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::sys::{check, types};
use super::{ConvBuffers, ConvCall, ConvOp, ConvSearch, EngineConfig, Measured};
use crate::conv::{Conv2d, ConvActivation, ConvLayout};
use crate::cuda::status;
use crate::error::Result;
use crate::precision::Precision;

/// At most this many configurations are timed by a measured search.
pub(crate) const SEARCH_LIMIT: usize = 10;

/// Unique ids of the graph's tensors (the variant pack names them).
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;
const BIAS: i64 = 4;
const CONV_OUT: i64 = 5;
const BIASED: i64 = 6;

/// An owned backend descriptor, destroyed on drop.
pub(crate) struct Desc(pub(super) raw::cudnnBackendDescriptor_t);

// SAFETY: a host-side cuDNN object, used under the device's Mutex only.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created in new, destroyed once here.
        let _ = unsafe { raw::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    pub(super) fn new(ty: D) -> Result<Desc> {
        let mut d = null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { raw::cudnnBackendCreateDescriptor(ty, &mut d) }, "cudnnBackendCreateDescriptor", || {
            format!("{ty:?}")
        })?;
        Ok(Desc(d))
    }

    /// Sets `attr` to `vals`, of cuDNN attribute type `ty`.
    ///
    /// # Safety
    /// `V` is the C type cuDNN reads for `ty` (`int64_t` for INT64, a pointer for VOID_PTR and
    /// BACKEND_DESCRIPTOR, `float` for FLOAT, the enum for enum types, `bool` for BOOLEAN).
    pub(super) unsafe fn set<V>(self, attr: A, ty: T, vals: &[V]) -> Result<Desc> {
        // SAFETY: a live descriptor; `vals.len()` elements of the type cuDNN expects (contract).
        let st = unsafe {
            raw::cudnnBackendSetAttribute(self.0, attr, ty, vals.len() as i64, vals.as_ptr() as *const c_void)
        };
        check(st, "cudnnBackendSetAttribute", || format!("{attr:?}"))?;
        Ok(self)
    }

    pub(super) fn i64s(self, attr: A, vals: &[i64]) -> Result<Desc> {
        // SAFETY: INT64 attributes read int64_t.
        unsafe { self.set(attr, T::CUDNN_TYPE_INT64, vals) }
    }

    pub(super) fn descs(self, attr: A, ds: &[&Desc]) -> Result<Desc> {
        let raws: Vec<raw::cudnnBackendDescriptor_t> = ds.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes read descriptor handles; every one is live.
        unsafe { self.set(attr, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raws) }
    }

    pub(super) fn handle(self, attr: A, h: raw::cudnnHandle_t) -> Result<Desc> {
        // SAFETY: HANDLE attributes read a cudnnHandle_t; the caller's handle is live.
        unsafe { self.set(attr, T::CUDNN_TYPE_HANDLE, &[h]) }
    }

    pub(super) fn finalize(self, what: impl FnOnce() -> String) -> Result<Desc> {
        // SAFETY: a live descriptor with its required attributes set.
        check(unsafe { raw::cudnnBackendFinalize(self.0) }, "cudnnBackendFinalize", what)?;
        Ok(self)
    }

    /// Reads up to `out.len()` elements of `attr`; the count cuDNN has.
    ///
    /// # Safety
    /// As [`Desc::set`], for the type cuDNN writes.
    pub(super) unsafe fn get<V>(&self, attr: A, ty: T, out: &mut [V]) -> Result<usize> {
        let mut n = 0i64;
        // SAFETY: a live, finalized descriptor; room for `out.len()` elements.
        let st = unsafe {
            raw::cudnnBackendGetAttribute(self.0, attr, ty, out.len() as i64, &mut n, out.as_mut_ptr() as *mut c_void)
        };
        check(st, "cudnnBackendGetAttribute", || format!("{attr:?}"))?;
        Ok(n.max(0) as usize)
    }

    pub(super) fn get_i64(&self, attr: A) -> Result<i64> {
        let mut v = [0i64];
        // SAFETY: INT64 attributes write int64_t.
        unsafe { self.get(attr, T::CUDNN_TYPE_INT64, &mut v) }?;
        Ok(v[0])
    }
}

/// A tensor of logical dims `[N, C, H, W]` (filters `[K, C/groups, R, S]`) in `layout`.
fn tensor(uid: i64, dtype: raw::cudnnDataType_t, dims: [usize; 4], layout: ConvLayout, align: i64) -> Result<Desc> {
    let i = |v: [usize; 4]| v.map(|x| x as i64);
    let virt = uid == CONV_OUT || uid == BIASED;
    // SAFETY: DATA_TYPE reads cudnnDataType_t, BOOLEAN a C bool.
    unsafe {
        Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_TENSOR_DATA_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[dtype])?
            .i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &i(dims))?
            .i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &i(layout.strides(dims)))?
            .i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?
            .i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[align])?
            .set(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, T::CUDNN_TYPE_BOOLEAN, &[virt])?
            .finalize(|| format!("tensor {uid} dims {dims:?} {layout}"))
    }
}

/// A pointwise operation `out = mode(x[, b])` in f32: the operation and its pointwise
/// descriptor.
fn pointwise(mode: raw::cudnnPointwiseMode_t, x: &Desc, b: Option<&Desc>, out: &Desc) -> Result<[Desc; 2]> {
    let f32_ = raw::cudnnDataType_t::CUDNN_DATA_FLOAT;
    // SAFETY: POINTWISE_MODE reads the enum, MATH_PREC a cudnnDataType_t.
    let pw = unsafe {
        Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_POINTWISE_MODE, T::CUDNN_TYPE_POINTWISE_MODE, &[mode])?
            .set(A::CUDNN_ATTR_POINTWISE_MATH_PREC, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
            .finalize(|| format!("pointwise {mode:?}"))?
    };
    let mut op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
    if let Some(b) = b {
        op = op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    let op =
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[out])?.finalize(|| format!("pointwise op {mode:?}"))?;
    Ok([op, pw])
}

/// The largest power of two ≤ 16 that divides every address (cuDNN's BYTE_ALIGNMENT; part of
/// the plan key, as PyTorch keys its plans on it).
pub(crate) fn alignment(b: &ConvBuffers) -> u8 {
    // an absent bias is 0, which constrains nothing
    let all = b.x | b.w | b.y | b.bias;
    1u8 << all.trailing_zeros().min(4)
}

/// The operation graph of `p` and `op`, and every descriptor it was made of (kept alive with
/// the plan: whether cuDNN copies a descriptor set as an attribute or refers to it is not
/// documented, and cudnn-frontend keeps them too).
pub(super) fn graph(h: raw::cudnnHandle_t, p: &Conv2d, op: ConvOp, align: u8) -> Result<(Desc, Vec<Desc>)> {
    let (dtype, _) = types(p.precision);
    let f32_ = raw::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let align = i64::from(align);
    let x = tensor(X, dtype, p.x_dims(), p.layout, align)?;
    let w = tensor(W, dtype, p.w_dims(), p.layout, align)?;
    let y = tensor(Y, dtype, p.y_dims(), p.layout, align)?;
    let two = |v: [usize; 2]| v.map(|x| x as i64);
    // SAFETY: COMP_TYPE reads a cudnnDataType_t, CONV_MODE a cudnnConvolutionMode_t.
    let conv = unsafe {
        Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?
            .set(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
            .set(
                A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                T::CUDNN_TYPE_CONVOLUTION_MODE,
                &[raw::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
            )?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &two(p.dilation))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &two(p.stride))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &two(p.pad))?
            .i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &two(p.pad))?
            .finalize(|| p.describe())?
    };
    let scalars = |d: Desc, alpha: A, beta: A| -> Result<Desc> {
        // SAFETY: FLOAT attributes read a float (the scaling type of float, half and bfloat16).
        unsafe { d.set(alpha, T::CUDNN_TYPE_FLOAT, &[1.0f32])?.set(beta, T::CUDNN_TYPE_FLOAT, &[0.0f32]) }
    };
    let describe = || format!("{} {op:?}", p.describe());
    let mut ops = Vec::with_capacity(3);
    let mut parts = Vec::new();
    match op {
        ConvOp::Forward | ConvOp::Fused(_) => {
            // the fused graph's convolution writes a virtual f32 tensor, its bias ADD (and ReLU)
            // write y
            let conv_out = match op {
                ConvOp::Fused(_) => Some(tensor(CONV_OUT, f32_, p.y_dims(), p.layout, align)?),
                _ => None,
            };
            let out = conv_out.as_ref().unwrap_or(&y);
            let d = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&x])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&w])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[out])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, &[&conv])?;
            let d = scalars(
                d,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            )?;
            ops.push(d.finalize(describe)?);
            if let ConvOp::Fused(act) = op {
                let bias = tensor(BIAS, dtype, [1, p.k, 1, 1], p.layout, align)?;
                use raw::cudnnPointwiseMode_t::*;
                if act == ConvActivation::Relu {
                    let biased = tensor(BIASED, f32_, p.y_dims(), p.layout, align)?;
                    let [add, add_pw] = pointwise(CUDNN_POINTWISE_ADD, out, Some(&bias), &biased)?;
                    let [relu, relu_pw] = pointwise(CUDNN_POINTWISE_RELU_FWD, &biased, None, &y)?;
                    ops.extend([add, relu]);
                    parts.extend([add_pw, relu_pw, biased]);
                } else {
                    let [add, add_pw] = pointwise(CUDNN_POINTWISE_ADD, out, Some(&bias), &y)?;
                    ops.push(add);
                    parts.push(add_pw);
                }
                parts.push(bias);
            }
            parts.extend(conv_out);
        }
        ConvOp::BackwardData => {
            let d = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, &[&x])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, &[&w])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, &[&y])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, &[&conv])?;
            let d = scalars(
                d,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            )?;
            ops.push(d.finalize(describe)?);
        }
        ConvOp::BackwardFilter => {
            let d = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, &[&x])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, &[&w])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, &[&y])?
                .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, &[&conv])?;
            let d = scalars(
                d,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            )?;
            ops.push(d.finalize(describe)?);
        }
    }
    let refs: Vec<&Desc> = ops.iter().collect();
    let g = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?
        .handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h)?
        .descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?
        .finalize(describe)?;
    parts.extend(ops);
    parts.extend([x, w, y, conv]);
    Ok((g, parts))
}

/// The engine configurations cuDNN ranks for `graph` under `mode`, best first.
fn configs(graph: &Desc, mode: raw::cudnnBackendHeurMode_t) -> Result<Vec<Desc>> {
    // SAFETY: HEUR_MODE reads the enum.
    let heur = unsafe {
        Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?
            .set(A::CUDNN_ATTR_ENGINEHEUR_MODE, T::CUDNN_TYPE_HEUR_MODE, &[mode])?
            .finalize(|| format!("engine heuristic {mode:?}"))?
    };
    let mut n = 0i64;
    // SAFETY: a count query (no elements requested).
    let st = unsafe {
        raw::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut n,
            null_mut(),
        )
    };
    check(st, "cudnnBackendGetAttribute", || "ENGINEHEUR_RESULTS count".into())?;
    let cfgs: Vec<Desc> =
        (0..n.max(0)).map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)).collect::<Result<_>>()?;
    let mut raws: Vec<raw::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    // SAFETY: cuDNN fills the caller's created ENGINECFG descriptors.
    let got = unsafe { heur.get(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raws) }?;
    Ok(cfgs.into_iter().take(got).collect())
}

/// A configuration's engine: its global index and numerical notes (as raw values).
pub(super) fn engine_of(cfg: &Desc) -> Result<(i64, Vec<u32>)> {
    let eng = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut slot = [eng.0];
    // SAFETY: cuDNN fills the created ENGINE descriptor.
    unsafe { cfg.get(A::CUDNN_ATTR_ENGINECFG_ENGINE, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut slot) }?;
    let index = eng.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let mut notes = [0u32; 16];
    // SAFETY: NUMERICAL_NOTE attributes write the (32-bit) enum.
    let n = unsafe { eng.get(A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T::CUDNN_TYPE_NUMERICAL_NOTE, &mut notes) }?;
    Ok((index, notes[..n.min(16)].to_vec()))
}

/// Whether an engine with `notes` keeps `precision`'s promise: none that down-converts its
/// inputs (tf32 to half precision, say), and for strict f32 no tensor-core (TF32) engine —
/// PyTorch's filter with `allow_tf32` off.
pub(super) fn notes_ok(precision: Precision, notes: &[u32]) -> bool {
    use raw::cudnnBackendNumericalNote_t::*;
    let down = CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as u32;
    let tensor_core = CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32;
    !notes.contains(&down) && (precision != Precision::F32 || !notes.contains(&tensor_core))
}

/// A finalized execution plan and what a call needs to run it.
pub(crate) struct GraphPlan {
    pub(super) plan: Desc,
    /// The engine configuration, the graph and what it was made of, alive as long as the plan.
    pub(super) _made_of: Vec<Desc>,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// The engine's global index and notes, and (measured) its time: for the log and
    /// [`crate::cuda::Gpu::conv2d_plan`].
    pub name: String,
    pub(super) uids: Vec<i64>,
    /// The last variant pack and the pointers it holds (x, w, y, bias, workspace).
    pub(super) pack: Option<([u64; 5], Desc)>,
    /// The engine configuration, once read for the tactic database (`tactic.rs`).
    pub config: Option<EngineConfig>,
    /// A measured search's times (the heuristic's choice and this plan's); `None` otherwise.
    pub measured: Option<Measured>,
}

/// The variant pack's unique ids and pointers of a call, in the same order.
pub(super) fn variant(op: ConvOp, b: &ConvBuffers) -> (Vec<i64>, Vec<*mut c_void>) {
    let v = |a: u64| a as *mut c_void;
    match op {
        ConvOp::Fused(_) => (vec![X, W, Y, BIAS], vec![v(b.x), v(b.w), v(b.y), v(b.bias)]),
        _ => (vec![X, W, Y], vec![v(b.x), v(b.w), v(b.y)]),
    }
}

fn pack(uids: &[i64], ptrs: &[*mut c_void], ws: u64) -> Result<Desc> {
    // SAFETY: VOID_PTR attributes read pointers.
    unsafe {
        Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?
            .i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T::CUDNN_TYPE_VOID_PTR, ptrs)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T::CUDNN_TYPE_VOID_PTR, &[ws as *mut c_void])?
            .finalize(|| "variant pack".into())
    }
}

impl GraphPlan {
    /// Enqueues the plan on the handle's stream with `b` and the workspace at `ws`.
    ///
    /// # Safety
    /// `h` is the live handle the plan was made with, bound to the call's stream; `b` holds
    /// device buffers of the problem's sizes; `ws` has at least [`GraphPlan::workspace`]
    /// bytes.
    pub unsafe fn launch(&mut self, h: raw::cudnnHandle_t, op: ConvOp, b: &ConvBuffers, ws: u64) -> Result<()> {
        let key = [b.x, b.w, b.y, b.bias, ws];
        if self.pack.as_ref().is_none_or(|(k, _)| *k != key) {
            let (uids, ptrs) = variant(op, b);
            debug_assert_eq!(uids, self.uids);
            self.pack = Some((key, pack(&uids, &ptrs, ws)?));
        }
        let vp = &self.pack.as_ref().expect("set above").1;
        // SAFETY: a finalized plan and variant pack of this handle (contract).
        check(unsafe { raw::cudnnBackendExecute(h, self.plan.0, vp.0) }, "cudnnBackendExecute", || self.name.clone())
    }
}

/// Device ms per call of `plan` with the call's buffers on its stream: two warm-up calls,
/// then the faster of two rounds of 3 calls between events.
///
/// # Safety
/// As [`GraphPlan::launch`]; the call's stream is the handle's.
unsafe fn time(h: raw::cudnnHandle_t, call: &ConvCall, plan: &mut GraphPlan, ws: u64) -> Result<f64> {
    let (op, b, stream) = (call.op, &call.buffers, call.stream);
    let drv = status::driver;
    let create = || event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"));
    let (e0, e1) = (create()?, create()?);
    // SAFETY: live events and stream; launches per the caller's contract.
    let r = unsafe {
        (|| -> Result<f64> {
            plan.launch(h, op, b, ws)?;
            plan.launch(h, op, b, ws)?;
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                event::record(e0, stream).map_err(drv("cuEventRecord"))?;
                for _ in 0..3 {
                    plan.launch(h, op, b, ws)?;
                }
                event::record(e1, stream).map_err(drv("cuEventRecord"))?;
                event::synchronize(e1).map_err(drv("cuEventSynchronize"))?;
                best = best.min(event::elapsed(e0, e1).map_err(drv("cuEventElapsedTime"))? as f64 / 3.0);
            }
            Ok(best)
        })()
    };
    // SAFETY: created above, not used after.
    unsafe {
        let _ = event::destroy(e0);
        let _ = event::destroy(e1);
    }
    r
}

/// Where a plan's workspace comes from: `bytes` → the address of at least that many bytes,
/// usable on the call's stream (the stream's workspace, or the room's larger one).
pub(crate) type WorkspaceFor<'a> = dyn FnMut(usize) -> Result<u64> + 'a;

/// Makes the plan for the call's problem and direction with buffers aligned as the call's:
/// the graph, cuDNN's ranked configurations (mode A, then the fallback list), and the first
/// that finalizes, needs at most `limit` bytes of workspace and keeps the precision's promise
/// — or, with `search` measured, the fastest of up to [`SEARCH_LIMIT`] such plans from each
/// list, timed on the call's buffers (that synchronises its stream and overwrites the output;
/// `ws` gives each its workspace). `Ok(None)` when no configuration qualifies (the caller then
/// takes the legacy API).
///
/// # Safety
/// `h` is live and bound to the call's stream; with a measured search the call's buffers are
/// device buffers of the problem's sizes and `ws` gives valid workspaces.
pub(crate) unsafe fn make(
    h: raw::cudnnHandle_t,
    call: &ConvCall,
    ws: &mut WorkspaceFor<'_>,
    limit: usize,
    search: ConvSearch,
) -> Result<Option<GraphPlan>> {
    let (p, op, b) = (call.problem, call.op, &call.buffers);
    let (g, mut parts) = graph(h, p, op, alignment(b))?;
    let (uids, _) = variant(op, b);
    let (mut best, mut first_ms): (Option<(f64, GraphPlan)>, Option<f64>) = (None, None);
    let what = || format!("{} {op:?}", p.describe());
    use raw::cudnnBackendHeurMode_t::*;
    'modes: for mode in [CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK] {
        // a mode cuDNN cannot serve for this graph is skipped, not an error
        let cfgs = match configs(&g, mode) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(problem = %what(), ?mode, error = %e, "cuDNN heuristic list unavailable");
                continue;
            }
        };
        let mut timed = 0usize;
        for cfg in cfgs {
            let Ok((index, notes)) = engine_of(&cfg) else { continue };
            let name = format!("engine {index} ({mode:?}, notes {notes:?})");
            if !notes_ok(p.precision, &notes) {
                tracing::debug!(problem = %what(), %name, "skipped: numerical notes break the precision");
                continue;
            }
            let made = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
                .and_then(|d| d.handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h))
                .and_then(|d| d.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg]))
                .and_then(|d| d.finalize(String::new));
            let Ok(plan) = made else {
                tracing::debug!(problem = %what(), %name, "skipped: the plan does not finalize");
                continue;
            };
            let Ok(bytes) = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) else { continue };
            let bytes = bytes.max(0) as usize;
            if bytes > limit {
                tracing::debug!(problem = %what(), %name, bytes, limit, "skipped: workspace over the limit");
                continue;
            }
            let mut gp = GraphPlan::new(plan, vec![cfg], bytes, name, uids.clone());
            if search == ConvSearch::Heuristic {
                best = Some((0.0, gp));
                break 'modes;
            }
            let timing = ws(bytes).and_then(|addr| {
                // SAFETY: forwarded; `addr` holds `bytes`.
                unsafe { time(h, call, &mut gp, addr) }
            });
            let ms = match timing {
                Ok(ms) => ms,
                Err(e) => {
                    tracing::debug!(problem = %what(), name = %gp.name, error = %e, "skipped: the plan fails to run");
                    continue;
                }
            };
            tracing::debug!(problem = %what(), name = %gp.name, bytes, ms, "timed");
            first_ms.get_or_insert(ms); // the heuristic's choice: the first that runs
            gp.name = format!("{} {ms:.4} ms", gp.name);
            if best.as_ref().is_none_or(|(t, _)| ms < *t) {
                best = Some((ms, gp));
            }
            timed += 1;
            if timed >= SEARCH_LIMIT {
                continue 'modes;
            }
        }
    }
    let Some((ms, mut plan)) = best else { return Ok(None) };
    plan.pack = None;
    plan.measured = first_ms.map(|heuristic_ms| Measured { heuristic_ms, tuned_ms: ms });
    parts.push(g);
    plan._made_of.append(&mut parts);
    tracing::debug!(problem = %p.describe(), ?op, plan = %plan.name, workspace = plan.workspace, "cuDNN graph plan");
    Ok(Some(plan))
}
