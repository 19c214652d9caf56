//! Under `Autodiff`: a tracked attention call is one node. Its forward asks the inner backend
//! for the output and the softmax statistics ([`AttentionOps::gemm_attention_stats`]) and keeps
//! both with q, k and v; its backward is one call of [`AttentionOps::gemm_attention_backward`]
//! (cuDNN's fused backward where the inner backend serves it), whose `dq`, `dk`, `dv` go to the
//! inputs that track a gradient. An untracked call runs the inner forward without statistics.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::{AttentionOps, AttnMask, AttnResiduals};

#[derive(Debug)]
struct AttentionBackward;

/// (the forward's residuals, its mask, its scale)
type State<B> = (AttnResiduals<B>, AttnMask, f32);

impl<B: AttentionOps> Backward<B, 3> for AttentionBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (saved, mask, scale) = ops.state;
        let out = B::gemm_attention_backward(saved, grad, &mask, scale);
        for (parent, g) in ops.parents.into_iter().zip(out) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

impl<B: AttentionOps, C: CheckpointStrategy> AttentionOps for Autodiff<B, C> {
    fn gemm_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> FloatTensor<Self> {
        let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
        match AttentionBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (q, k, v) = (q.primitive, k.primitive, v.primitive);
                let (o, lse) = B::gemm_attention_stats(q.clone(), k.clone(), v.clone(), mask, scale);
                // the residuals are kept as tensors (not checkpointed): the backward needs the
                // forward's own output and statistics, which a recomputation would not give
                // without running the forward again
                let saved = AttnResiduals { q, k, v, o: o.clone(), lse };
                prep.finish((saved, mask.clone(), scale), o)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::gemm_attention(q.primitive, k.primitive, v.primitive, mask, scale))
            }
        }
    }
}
