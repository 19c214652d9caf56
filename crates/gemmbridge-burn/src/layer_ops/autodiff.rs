//! Under `Autodiff`: each layer operation is one autodiff node whose backward is the inner
//! backend's [`LayerOps`] backward (gemmbridge where it serves, burn's ops otherwise).
//!
//! - RMSNorm: the tracked forward runs the training form and keeps `x`, `w` and the f32
//!   inverse RMS in the node's state; the backward computes `dx` and `dw` together (cuDNN's
//!   backward graph writes both) and registers those asked for.
//! - SwiGLU: the state is the forward's input `gu`; the backward writes `[dg | du]`.
//! - RoPE: the state is the tables; `dx` is the gradient rotated back. The tables enter as
//!   constants (no gradient flows to them, tracked or not).
//!
//! Untracked calls (no input needs a gradient) run the inference forms and record nothing.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::{LayerOps, RopeDirection, RopeStyle};

#[derive(Debug)]
struct RmsNormBackward;

impl<B: LayerOps> Backward<B, 2> for RmsNormBackward {
    /// (x, w, inv_rms)
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x, w, inv) = ops.state;
        let (dx, dw) = B::layer_rms_norm_backward(x, w, inv, grad);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, dw);
        }
    }
}

#[derive(Debug)]
struct SwiGluBackward;

impl<B: LayerOps> Backward<B, 1> for SwiGluBackward {
    /// gu
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::layer_swiglu_backward(grad, ops.state));
        }
    }
}

#[derive(Debug)]
struct RopeBackward;

impl<B: LayerOps> Backward<B, 1> for RopeBackward {
    /// (cos, sin, style)
    type State = (FloatTensor<B>, FloatTensor<B>, RopeStyle);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (cos, sin, style) = ops.state;
        if let Some(node) = node {
            grads.register::<B>(node.id, B::layer_rope(grad, cos, sin, style, RopeDirection::Backward));
        }
    }
}

impl<B: LayerOps, C: CheckpointStrategy> LayerOps for Autodiff<B, C> {
    fn layer_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        rms_norm_node::<B, C>(x, w, eps, false).0
    }

    fn layer_rms_norm_training(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (y, inv) = rms_norm_node::<B, C>(x, w, eps, true);
        // the inverse RMS as a constant beside the differentiable y
        let inv = inv.expect("the training form saves inv_rms");
        (y, <Self as burn::tensor::backend::AutodiffBackend>::from_inner(inv))
    }

    fn layer_rms_norm_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        inv_rms: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // not differentiated again: the inner backend's gradients, as constants
        let (dx, dw) = B::layer_rms_norm_backward(x.primitive, w.primitive, inv_rms.primitive, dy.primitive);
        let inner = <Self as burn::tensor::backend::AutodiffBackend>::from_inner;
        (inner(dx), inner(dw))
    }

    fn layer_swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self> {
        match SwiGluBackward.prepare::<C>([gu.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::layer_swiglu(gu.primitive.clone());
                prep.finish(gu.primitive, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::layer_swiglu(gu.primitive)),
        }
    }

    fn layer_swiglu_backward(dy: FloatTensor<Self>, gu: FloatTensor<Self>) -> FloatTensor<Self> {
        // not differentiated again: the inner backend's gradient, as a constant
        <Self as burn::tensor::backend::AutodiffBackend>::from_inner(B::layer_swiglu_backward(
            dy.primitive,
            gu.primitive,
        ))
    }

    fn layer_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        style: RopeStyle,
        direction: RopeDirection,
    ) -> FloatTensor<Self> {
        match RopeBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::layer_rope(x.primitive, cos.primitive.clone(), sin.primitive.clone(), style, direction);
                // the gradient of a rotation by −θ (direction Backward) is a rotation by θ
                let state_sin = match direction {
                    RopeDirection::Forward => sin.primitive,
                    RopeDirection::Backward => B::float_neg(sin.primitive),
                };
                prep.finish((cos.primitive, state_sin, style), y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::layer_rope(x.primitive, cos.primitive, sin.primitive, style, direction))
            }
        }
    }
}

/// RMSNorm as one node: `(y, inv_rms)`, the inverse RMS (inner backend) when the node is
/// tracked or `training` asks for it.
fn rms_norm_node<B: LayerOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    w: FloatTensor<Autodiff<B, C>>,
    eps: f64,
    training: bool,
) -> (FloatTensor<Autodiff<B, C>>, Option<FloatTensor<B>>) {
    match RmsNormBackward.prepare::<C>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (y, inv) = B::layer_rms_norm_training(x.primitive.clone(), w.primitive.clone(), eps);
            (prep.finish((x.primitive, w.primitive, inv.clone()), y), Some(inv))
        }
        OpsKind::UnTracked(prep) if training => {
            let (y, inv) = B::layer_rms_norm_training(x.primitive, w.primitive, eps);
            (prep.finish(y), Some(inv))
        }
        OpsKind::UnTracked(prep) => (prep.finish(B::layer_rms_norm(x.primitive, w.primitive, eps)), None),
    }
}
