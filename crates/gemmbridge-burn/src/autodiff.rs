//! Under `Autodiff`: the backward is two more gemmbridge GEMMs, `dA = dC·Bᵀ` and `dB = Aᵀ·dC`,
//! with the transposes as stride views (op flags in gemmbridge, no copies), and gradients summed
//! over the batch dimensions an input was broadcast along.
//!
//! `linear` without an activation is one node: forward `x·W + b` with the bias fused;
//! backward `dx = dy·Wᵀ`, and `dW = xᵀ·dy` with `db = Σ dy` fused into the same GEMM's
//! epilogue (x and dy viewed as `[m, ·]` matrices), through gemmbridge. With an activation, a tracked call is that
//! node followed by burn's activation op (whose backward burn owns); an untracked call (no
//! gradient needed, e.g. inference) fuses the activation into the GEMM's epilogue too.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{broadcast_shape, Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::{activate, Activation, GemmOps};

#[derive(Debug)]
struct GemmMatmulBackward;

impl<B: GemmOps> Backward<B, 2> for GemmMatmulBackward {
    /// (lhs checkpoint, rhs checkpoint, lhs shape, rhs shape)
    type State = (Option<NodeId>, Option<NodeId>, Shape, Shape);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_lhs, node_rhs] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (lhs_id, rhs_id, lhs_shape, rhs_shape) = ops.state;
        if let (Some(node), Some(id)) = (node_lhs, rhs_id) {
            let rhs: FloatTensor<B> = checkpointer.retrieve_node_output(id);
            let d_lhs = B::gemm_matmul(grad.clone(), B::float_transpose(rhs));
            grads.register::<B>(node.id, broadcast_shape::<B>(d_lhs, &lhs_shape));
        }
        if let (Some(node), Some(id)) = (node_rhs, lhs_id) {
            let lhs: FloatTensor<B> = checkpointer.retrieve_node_output(id);
            let d_rhs = B::gemm_matmul(B::float_transpose(lhs), grad);
            grads.register::<B>(node.id, broadcast_shape::<B>(d_rhs, &rhs_shape));
        }
    }
}

impl<B: GemmOps, C: CheckpointStrategy> GemmOps for Autodiff<B, C> {
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
        let (lhs_shape, rhs_shape) = (lhs.primitive.shape(), rhs.primitive.shape());
        match GemmMatmulBackward.prepare::<C>([lhs.node.clone(), rhs.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                // dA needs B, dB needs A: checkpoint only what a tracked input's gradient uses
                let lhs_state = rhs_tracked.then(|| prep.checkpoint(&lhs));
                let rhs_state = lhs_tracked.then(|| prep.checkpoint(&rhs));
                let out = B::gemm_matmul(lhs.primitive, rhs.primitive);
                prep.finish((lhs_state, rhs_state, lhs_shape, rhs_shape), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::gemm_matmul(lhs.primitive, rhs.primitive)),
        }
    }

    fn gemm_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        act: Activation,
    ) -> FloatTensor<Self> {
        let tracked = x.is_tracked() || weight.is_tracked() || bias.as_ref().is_some_and(|b| b.is_tracked());
        if act == Activation::None || tracked {
            // the activation (if any) as burn's op, so that burn differentiates it
            activate::<Self>(linear_node::<B, C>(x, weight, bias), act)
        } else {
            // nothing to differentiate: the whole layer as one fused GEMM
            let out = B::gemm_linear(x.primitive, weight.primitive, bias.map(|b| b.primitive), act);
            <Self as burn::tensor::backend::AutodiffBackend>::from_inner(out)
        }
    }
}

/// `x` and `dy` as the 2-D `[m, d_in]` and `[m, d_out]` matrices the weight gradient needs
/// (x's leading dims folded into m).
fn fold<B: GemmOps>(x: FloatTensor<B>, grad: &FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>) {
    let (xs, gs) = (x.shape(), grad.shape());
    let (d_in, d_out) = (xs[xs.num_dims() - 1], gs[gs.num_dims() - 1]);
    let m: usize = (0..xs.num_dims() - 1).map(|i| xs[i]).product();
    (B::float_reshape(x, Shape::from([m, d_in])), B::float_reshape(grad.clone(), Shape::from([m, d_out])))
}

/// `dx = dy·Wᵀ` (shape of x), `dW = xᵀ·dy` summed over x's leading dims (shape `[d_in,
/// d_out]`) and, with `bias`, `db = Σ dy` over the same dims — the weight and bias gradients
/// from one GEMM with the bias gradient fused ([`GemmOps::gemm_linear_param_grads`]). Each is
/// computed only when it is asked for (`x` given: dW; `weight` given: dx).
fn linear_grads<B: GemmOps>(
    grad: &FloatTensor<B>,
    x: Option<FloatTensor<B>>,
    weight: Option<FloatTensor<B>>,
    bias: bool,
) -> [Option<FloatTensor<B>>; 3] {
    let dx = weight.map(|w| B::gemm_linear(grad.clone(), B::float_transpose(w), None, Activation::None));
    let (dw, db) = match (x, bias) {
        (Some(x), true) if crate::fused_bias_grad() => {
            let (x2, g2) = fold::<B>(x, grad);
            let (dw, db) = B::gemm_linear_param_grads(x2, g2);
            (Some(dw), Some(db))
        }
        (Some(x), bias) => {
            let (x2, g2) = fold::<B>(x, grad);
            let db = bias.then(|| B::linear_bias_backward(grad.clone()));
            (Some(B::gemm_matmul(B::float_transpose(x2), g2)), db)
        }
        (None, true) => (None, Some(B::linear_bias_backward(grad.clone()))),
        (None, false) => (None, None),
    };
    [dx, dw, db]
}

#[derive(Debug)]
struct GemmLinearBackward;

/// (x checkpoint, weight checkpoint)
type LinearState = (Option<NodeId>, Option<NodeId>);

fn retrieve<B: GemmOps>(checkpointer: &mut Checkpointer, id: Option<NodeId>) -> Option<FloatTensor<B>> {
    id.map(|id| checkpointer.retrieve_node_output(id))
}

/// Registers `dx`, `dW` and `db` for the linear node's x, weight and bias parents (the ids of
/// the tracked ones), from the checkpointed inputs in `state`.
fn register_linear_grads<B: GemmOps>(
    ids: [Option<NodeId>; 3],
    grad: &FloatTensor<B>,
    state: LinearState,
    grads: &mut Gradients,
    checkpointer: &mut Checkpointer,
) {
    let [id_x, id_w, id_b] = ids;
    let (x, w) = (retrieve::<B>(checkpointer, state.0), retrieve::<B>(checkpointer, state.1));
    let g = linear_grads::<B>(grad, x.filter(|_| id_w.is_some()), w.filter(|_| id_x.is_some()), id_b.is_some());
    for (id, g) in ids.into_iter().zip(g) {
        if let (Some(id), Some(g)) = (id, g) {
            grads.register::<B>(id, g);
        }
    }
}

impl<B: GemmOps> Backward<B, 3> for GemmLinearBackward {
    type State = LinearState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let ids = [node_x.map(|n| n.id), node_w.map(|n| n.id), node_b.map(|n| n.id)];
        register_linear_grads::<B>(ids, &grad, ops.state, grads, checkpointer);
    }
}

impl<B: GemmOps> Backward<B, 2> for GemmLinearBackward {
    type State = LinearState;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let ids = [node_x.map(|n| n.id), node_w.map(|n| n.id), None];
        register_linear_grads::<B>(ids, &grad, ops.state, grads, checkpointer);
    }
}

/// `x·W (+ b)` as one autodiff node whose backward runs through gemmbridge.
fn linear_node<B: GemmOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
) -> FloatTensor<Autodiff<B, C>> {
    let (x_tracked, w_tracked) = (x.is_tracked(), weight.is_tracked());
    let forward = |x, w, b| B::gemm_linear(x, w, b, Activation::None);
    match bias {
        Some(bias) => match GemmLinearBackward
            .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                // x is needed only for dW, W only for dx
                let state = (w_tracked.then(|| prep.checkpoint(&x)), x_tracked.then(|| prep.checkpoint(&weight)));
                prep.finish(state, forward(x.primitive, weight.primitive, Some(bias.primitive)))
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive, Some(bias.primitive))),
        },
        None => match GemmLinearBackward.prepare::<C>([x.node.clone(), weight.node.clone()]).compute_bound().stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (w_tracked.then(|| prep.checkpoint(&x)), x_tracked.then(|| prep.checkpoint(&weight)));
                prep.finish(state, forward(x.primitive, weight.primitive, None))
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive, None)),
        },
    }
}
