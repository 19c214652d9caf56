//! Under `Autodiff`: a tracked grouped matmul is one node. Its state is the forward's `x`, `w`
//! and group sizes; its backward runs the inner backend's [`GroupedOps`] backward products
//! (gemmbridge's grouped backward data and backward weight where it serves, burn's ops
//! otherwise) for the inputs that track a gradient only. An untracked call runs the inner
//! forward and records nothing. The backward products themselves are not differentiated
//! again: under `Autodiff` they return the inner backend's results as constants.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use super::GroupedOps;

#[derive(Debug)]
struct GroupedBackward;

impl<B: GroupedOps> Backward<B, 2> for GroupedBackward {
    /// (x, w, sizes)
    type State = (FloatTensor<B>, FloatTensor<B>, Vec<usize>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w, sizes) = ops.state;
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::gemm_grouped_backward_weight(dy.clone(), x, &sizes));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::gemm_grouped_backward_data(dy, w, &sizes));
        }
    }
}

impl<B: GroupedOps, C: CheckpointStrategy> GroupedOps for Autodiff<B, C> {
    fn gemm_grouped_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        match GroupedBackward.prepare::<C>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::gemm_grouped_matmul(x.primitive.clone(), w.primitive.clone(), sizes);
                prep.finish((x.primitive, w.primitive, sizes.to_vec()), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::gemm_grouped_matmul(x.primitive, w.primitive, sizes)),
        }
    }

    fn gemm_grouped_backward_data(dy: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(B::gemm_grouped_backward_data(dy.primitive, w.primitive, sizes))
    }

    fn gemm_grouped_backward_weight(dy: FloatTensor<Self>, x: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(B::gemm_grouped_backward_weight(dy.primitive, x.primitive, sizes))
    }
}
