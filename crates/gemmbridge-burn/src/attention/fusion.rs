//! Under burn's fusion layer: f16/bf16 attention calls are recorded as custom operations (the
//! fusion stream is cut there; the inner backend runs cuDNN or its fallback when the stream
//! executes). Other dtypes, which cuDNN never serves, run burn's ops on the fusion backend
//! itself, where burn can fuse them.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::composed::{self, compute_dtype};
use super::{half, AttentionOps, AttnMask, AttnResiduals};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// An attention call recorded in the fusion stream: `Forward` reads `[q, k, v]` and writes
/// `[o]`, `Stats` the same and `[o, lse]`, `Backward` reads `[q, k, v, o, lse, do]` and writes
/// `[dq, dk, dv]`.
#[derive(Clone, Debug)]
enum Call {
    Forward,
    Stats,
    Backward,
}

#[derive(Clone, Debug)]
struct AttnOp<B> {
    desc: CustomOpIr,
    call: Call,
    mask: AttnMask,
    scale: f32,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + AttentionOps> Operation<B::FusionRuntime> for AttnOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let mut ins = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t));
        let mut next = || ins.next().expect("an attention op records its inputs");
        let (q, k, v) = (next(), next(), next());
        let (mask, scale) = (&self.mask, self.scale);
        let outs = match self.call {
            Call::Forward => vec![B::gemm_attention(q, k, v, mask, scale)],
            Call::Stats => {
                let (o, lse) = B::gemm_attention_stats(q, k, v, mask, scale);
                vec![o, lse]
            }
            Call::Backward => {
                let (o, lse, d_o) = (next(), next(), next());
                B::gemm_attention_backward(AttnResiduals { q, k, v, o, lse }, d_o, mask, scale).into()
            }
        };
        for (ir, out) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, out);
        }
    }
}

/// Records `call` on `inputs` with outputs of the given shapes and dtypes.
fn record<B: FusionBackend + AttentionOps>(
    id: &'static str,
    (call, mask, scale): (Call, &AttnMask, f32),
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outs: Vec<(Shape, DType)>,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let outs: Vec<TensorIr> =
        outs.into_iter().map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype)).collect();
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(id, &irs, &outs);
    let op = AttnOp::<B> { desc: desc.clone(), call, mask: mask.clone(), scale, _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op)
}

/// The shape and dtype of `t`.
fn like<R: FusionRuntime>(t: &FusionTensor<R>) -> (Shape, DType) {
    (t.shape.clone(), t.dtype)
}

/// The statistics' shape `[b, h_q, s_q]` and dtype for queries `q`.
fn stats_of<R: FusionRuntime>(q: &FusionTensor<R>) -> (Shape, DType) {
    let s = q.shape.as_slice();
    (Shape::from([s[0], s[1], s[2]]), DType::from(compute_dtype(q.dtype)))
}

impl<B: FusionBackend + AttentionOps> AttentionOps for Fusion<B> {
    fn gemm_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> FloatTensor<Self> {
        if !half(q.dtype) {
            return composed::burn_attention::<Self>(q, k, v, mask, scale);
        }
        let out = vec![like(&q)];
        let mut o = record::<B>("gemmbridge_attention", (Call::Forward, mask, scale), vec![q, k, v], out);
        o.remove(0)
    }

    fn gemm_attention_stats(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !half(q.dtype) {
            return composed::forward_stats::<Self>(q, k, v, mask, scale);
        }
        let outs = vec![like(&q), stats_of(&q)];
        let mut outs =
            record::<B>("gemmbridge_attention_stats", (Call::Stats, mask, scale), vec![q, k, v], outs).into_iter();
        let o = outs.next().expect("two outputs recorded");
        (o, outs.next().expect("two outputs recorded"))
    }

    fn gemm_attention_backward(
        saved: AttnResiduals<Self>,
        d_o: FloatTensor<Self>,
        mask: &AttnMask,
        scale: f32,
    ) -> [FloatTensor<Self>; 3] {
        if !half(saved.q.dtype) {
            return composed::backward::<Self>(saved, d_o, mask, scale);
        }
        let AttnResiduals { q, k, v, o, lse } = saved;
        let outs = vec![like(&q), like(&k), like(&v)];
        let inputs = vec![q, k, v, o, lse, d_o];
        let outs = record::<B>("gemmbridge_attention_backward", (Call::Backward, mask, scale), inputs, outs);
        <[_; 3]>::try_from(outs).unwrap_or_else(|_| unreachable!("three outputs recorded"))
    }
}
