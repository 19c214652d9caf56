//! Under `Autodiff`: each convolution is one autodiff node whose backward is the inner
//! backend's [`ConvOps`] backward (gemmbridge where it serves, burn's ops otherwise).
//!
//! The tracked forward keeps `x`, `w` and (for ReLU) its output `y` in the node's state. The
//! backward masks the incoming gradient with ReLU's derivative (burn's `relu_backward`: 0
//! where `y ≤ 0`), then computes only the gradients whose inputs need one: `dx` by backward
//! data, `dw` by backward filter, `db` as the sum of the masked gradient over `n`, `p`, `q` in
//! f32 (rounded once to the bias's dtype). Untracked calls (no input needs a gradient) record
//! nothing.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{FloatDType, Shape, TensorMetadata};

use super::{ConvActivation, ConvOps};

/// What the backward reads: the forward's x and w, its output y when the activation was ReLU,
/// and the options.
#[derive(Clone, Debug)]
struct Saved<B: ConvOps> {
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    relu_out: Option<FloatTensor<B>>,
    options: ConvOptions<2>,
}

/// A convolution without a bias (parents x, w).
#[derive(Debug)]
struct ConvBackward;

/// A convolution with a bias (parents x, w, bias).
#[derive(Debug)]
struct ConvBiasBackward;

impl<B: ConvOps> Backward<B, 2> for ConvBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        input_grads::<B>(ops.state, grad, [node_x.map(|n| n.id), node_w.map(|n| n.id)], grads);
    }
}

impl<B: ConvOps> Backward<B, 3> for ConvBiasBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let g = input_grads::<B>(ops.state, grad, [node_x.map(|n| n.id), node_w.map(|n| n.id)], grads);
        if let Some(node) = node_b {
            grads.register::<B>(node.id, bias_grad::<B>(g));
        }
    }
}

/// Registers `dx` and `dw` for the parents that need them from the node's gradient `grad`;
/// returns the gradient after the activation's mask (what the bias's gradient sums).
fn input_grads<B: ConvOps>(
    s: Saved<B>,
    grad: FloatTensor<B>,
    [node_x, node_w]: [Option<NodeId>; 2],
    grads: &mut Gradients,
) -> FloatTensor<B> {
    let g = match s.relu_out {
        Some(y) => B::relu_backward(y, grad),
        None => grad,
    };
    if let Some(node) = node_x {
        let dx = B::gemm_conv2d_backward_data(s.x.clone(), s.w.clone(), g.clone(), s.options.clone());
        grads.register::<B>(node, dx);
    }
    if let Some(node) = node_w {
        grads.register::<B>(node, B::gemm_conv2d_backward_filter(s.x, s.w, g.clone(), s.options));
    }
    g
}

/// `Σ_{n, p, q} g[n, k, p, q]` as `[k]`, summed in f32 and rounded once to g's dtype.
fn bias_grad<B: ConvOps>(g: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = g.dtype();
    let k = g.shape()[1];
    let mut sum = B::float_cast(g, FloatDType::F32);
    for dim in [0, 2, 3] {
        sum = B::float_sum_dim(sum, dim);
    }
    let sum = B::float_reshape(sum, Shape::new([k]));
    B::float_cast(sum, dtype.into())
}

impl<B: ConvOps, C: CheckpointStrategy> ConvOps for Autodiff<B, C> {
    fn gemm_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        act: ConvActivation,
    ) -> FloatTensor<Self> {
        let saved = |y: &FloatTensor<B>| Saved {
            x: x.primitive.clone(),
            w: weight.primitive.clone(),
            relu_out: (act == ConvActivation::Relu).then(|| y.clone()),
            options: options.clone(),
        };
        let forward = |b: Option<FloatTensor<B>>| {
            B::gemm_conv2d(x.primitive.clone(), weight.primitive.clone(), b, options.clone(), act)
        };
        match bias {
            Some(bias) => {
                let parents = [x.node.clone(), weight.node.clone(), bias.node.clone()];
                match ConvBiasBackward.prepare::<C>(parents).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => {
                        let y = forward(Some(bias.primitive));
                        prep.finish(saved(&y), y)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(forward(Some(bias.primitive))),
                }
            }
            None => match ConvBackward.prepare::<C>([x.node.clone(), weight.node.clone()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let y = forward(None);
                    prep.finish(saved(&y), y)
                }
                OpsKind::UnTracked(prep) => prep.finish(forward(None)),
            },
        }
    }

    fn gemm_conv2d_backward_data(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        // not differentiated again: the inner backend's gradient, as a constant
        Self::from_inner(B::gemm_conv2d_backward_data(x.primitive, weight.primitive, dy.primitive, options))
    }

    fn gemm_conv2d_backward_filter(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        // not differentiated again: the inner backend's gradient, as a constant
        Self::from_inner(B::gemm_conv2d_backward_filter(x.primitive, weight.primitive, dy.primitive, options))
    }
}
