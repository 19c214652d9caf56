//! The legacy API's launches of a planned call (`cudnnConvolutionForward`,
//! `cudnnConvolutionBiasActivationForward` with its unfused fallback,
//! `cudnnConvolutionBackwardData`, `cudnnConvolutionBackwardFilter`), and the unfused bias +
//! activation tail (`cudnnAddTensor`, `cudnnActivationForward`) the graph API's unfused
//! forward shares.

use std::ffi::c_void;

use cudarc::cudnn::sys;
use cudarc::cudnn::sys::cudnnHandle_t;

use super::legacy::{Algo, ConvPlan};
use super::sys::{check, ActivationDesc, TensorDesc};
use super::{ConvCall, ConvOp};
use crate::conv::ConvActivation;
use crate::error::{Error, Result};

/// The unfused tail of a forward with bias and activation, after the convolution wrote `y`:
/// `y += bias` (`cudnnAddTensor`, the bias `[1, K, 1, 1]` broadcast), then (ReLU)
/// `y = relu(y)` (`cudnnActivationForward`, in place).
///
/// # Safety
/// `h` is live and bound to the call's stream; `y` (described by `yd`) and `bias` (by `bd`)
/// are device buffers of the problem's sizes.
pub(crate) unsafe fn bias_activation(
    h: cudnnHandle_t,
    (bd, bias): (&TensorDesc, u64),
    (yd, y): (&TensorDesc, u64),
    act: (&ActivationDesc, ConvActivation),
    describe: &dyn Fn() -> String,
) -> Result<()> {
    let one = 1.0f32;
    let a = &one as *const f32 as *const c_void;
    let zero = 0.0f32;
    let z = &zero as *const f32 as *const c_void;
    // SAFETY: live descriptors, device buffers per the caller's contract, f32 host scalars.
    unsafe {
        let st = sys::cudnnAddTensor(h, a, bd.raw(), bias as *const c_void, a, yd.raw(), y as *mut c_void);
        check(st, "cudnnAddTensor", describe)?;
        if act.1 == ConvActivation::Relu {
            let st = sys::cudnnActivationForward(
                h,
                act.0.raw(),
                a,
                yd.raw(),
                y as *const c_void,
                z,
                yd.raw(),
                y as *mut c_void,
            );
            check(st, "cudnnActivationForward", describe)?;
        }
    }
    Ok(())
}

/// The launch of one planned call (α = 1, β = 0: every output is overwritten).
///
/// # Safety
/// `h` is live and bound to the call's stream; the call's buffers are device buffers of its
/// problem's sizes; `ws` has at least the plan's workspace.
pub(crate) unsafe fn launch(h: cudnnHandle_t, call: &ConvCall, plan: &mut ConvPlan, ws: u64) -> Result<()> {
    let (p, op, b) = (call.problem, call.op, call.buffers);
    let (one, zero) = (1.0f32, 0.0f32);
    let (a, z) = (&one as *const f32 as *const c_void, &zero as *const f32 as *const c_void);
    let (wsp, wsb) = (ws as *mut c_void, plan.choice.workspace);
    let (x, w, y, conv) = (plan.x.raw(), plan.w.raw(), plan.y.raw(), plan.conv.raw());
    let (cx, cw, cy, my) = (b.x as *const c_void, b.w as *const c_void, b.y as *const c_void, b.y as *mut c_void);
    let describe = || format!("{} {op:?} {}", p.describe(), plan.choice.algo.name());
    // SAFETY (every call): live descriptors of the problem, device buffers of its sizes (the
    // caller's contract), a workspace of at least `wsb` bytes, host scalars of f32 (cuDNN's
    // scaling type for float, half and bfloat16 data).
    unsafe {
        match (op, plan.choice.algo) {
            (ConvOp::Forward, Algo::Forward(algo)) => {
                let st = sys::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
                check(st, "cudnnConvolutionForward", describe)
            }
            (ConvOp::Fused(act), Algo::Forward(algo)) => fused_forward(h, call, plan, ws, algo, act),
            (ConvOp::BackwardData, Algo::Data(algo)) => {
                let st = sys::cudnnConvolutionBackwardData(
                    h,
                    a,
                    w,
                    cw,
                    y,
                    cy,
                    conv,
                    algo,
                    wsp,
                    wsb,
                    z,
                    x,
                    b.x as *mut c_void,
                );
                check(st, "cudnnConvolutionBackwardData", describe)
            }
            (ConvOp::BackwardFilter, Algo::Filter(algo)) => {
                let st = sys::cudnnConvolutionBackwardFilter(
                    h,
                    a,
                    x,
                    cx,
                    y,
                    cy,
                    conv,
                    algo,
                    wsp,
                    wsb,
                    z,
                    w,
                    b.w as *mut c_void,
                );
                check(st, "cudnnConvolutionBackwardFilter", describe)
            }
            (op, algo) => Err(Error::Unsupported { backend: "cuDNN", what: format!("{op:?} with {}", algo.name()) }),
        }
    }
}

/// The fused forward with the plan's bias and activation: `cudnnConvolutionBiasActivationForward`
/// until cuDNN refuses it (logged once; the plan runs unfused from then on), else the
/// convolution, then the bias add and the activation ([`bias_activation`]).
///
/// # Safety
/// As [`launch`]; `plan` is a fused forward's (its bias and activation descriptors set).
unsafe fn fused_forward(
    h: cudnnHandle_t,
    call: &ConvCall,
    plan: &mut ConvPlan,
    ws: u64,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    act: ConvActivation,
) -> Result<()> {
    let (p, op, b) = (call.problem, call.op, call.buffers);
    let (one, zero) = (1.0f32, 0.0f32);
    let (a, z) = (&one as *const f32 as *const c_void, &zero as *const f32 as *const c_void);
    let (wsp, wsb) = (ws as *mut c_void, plan.choice.workspace);
    let (x, w, y, conv) = (plan.x.raw(), plan.w.raw(), plan.y.raw(), plan.conv.raw());
    let (cx, cw, cy, my) = (b.x as *const c_void, b.w as *const c_void, b.y as *const c_void, b.y as *mut c_void);
    let describe = || format!("{} {op:?} {}", p.describe(), plan.choice.algo.name());
    // SAFETY (every call): live descriptors of the problem, device buffers of its sizes (the
    // caller's contract), a workspace of at least `wsb` bytes, host scalars of f32 (cuDNN's
    // scaling type for float, half and bfloat16 data).
    unsafe {
        let (bias, act_desc) = (plan.bias.as_ref().expect("fused plan"), plan.act.as_ref().expect("fused plan"));
        let cb = b.bias as *const c_void;
        if plan.fused {
            // y = act(1·conv(x, w) + 0·z + bias), z = y (not read: α2 = 0)
            let st = sys::cudnnConvolutionBiasActivationForward(
                h,
                a,
                x,
                cx,
                w,
                cw,
                conv,
                algo,
                wsp,
                wsb,
                z,
                y,
                cy,
                bias.raw(),
                cb,
                act_desc.raw(),
                y,
                my,
            );
            let refused = matches!(
                st,
                sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED | sys::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM
            );
            if !refused {
                return check(st, "cudnnConvolutionBiasActivationForward", describe);
            }
            plan.fused = false;
            tracing::info!(
                problem = %p.describe(), status = ?st,
                "cuDNN refused the fused convolution + bias + activation; running it unfused (3 calls)"
            );
        }
        let st = sys::cudnnConvolutionForward(h, a, x, cx, w, cw, conv, algo, wsp, wsb, z, y, my);
        check(st, "cudnnConvolutionForward", describe)?;
        bias_activation(h, (bias, b.bias), (&plan.y, b.y), (act_desc, act), &describe)
    }
}
