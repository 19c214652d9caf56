//! Under `Autodiff`: the backward is two more gemmbridge GEMMs, `dA = dC·Bᵀ` and `dB = Aᵀ·dC`,
//! with the transposes as stride views (op flags in gemmbridge, no copies), and gradients summed
//! over the batch dimensions an input was broadcast along.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{broadcast_shape, Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::GemmOps;

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
}
