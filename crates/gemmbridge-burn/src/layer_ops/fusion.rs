//! Under burn's fusion layer: each layer operation is a custom operation of the fusion stream
//! (the queue is cut there), executed by the inner backend's [`LayerOps`].

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{LayerOps, RopeDirection, RopeStyle};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// A layer call recorded in the fusion stream, with its inputs and outputs:
/// `RmsNorm` `[x, w]` → `[y]`; `RmsNormTraining` `[x, w]` → `[y, inv_rms]`; `RmsNormBackward`
/// `[x, w, inv_rms, dy]` → `[dx, dw]`; `SwiGlu` `[gu]` → `[y]`; `SwiGluBackward` `[dy, gu]` →
/// `[dgu]`; `Rope` `[x, cos, sin]` → `[y]`.
#[derive(Clone, Debug)]
enum Call {
    RmsNorm(f64),
    RmsNormTraining(f64),
    RmsNormBackward,
    SwiGlu,
    SwiGluBackward,
    Rope(RopeStyle, RopeDirection),
}

#[derive(Clone, Debug)]
struct LayerOp<B> {
    desc: CustomOpIr,
    call: Call,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + LayerOps> Operation<B::FusionRuntime> for LayerOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let mut inputs: Vec<_> = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t)).collect();
        let mut next = || inputs.remove(0);
        let outs = match self.call {
            Call::RmsNorm(eps) => vec![B::layer_rms_norm(next(), next(), eps)],
            Call::RmsNormTraining(eps) => {
                let (y, inv) = B::layer_rms_norm_training(next(), next(), eps);
                vec![y, inv]
            }
            Call::RmsNormBackward => {
                let (dx, dw) = B::layer_rms_norm_backward(next(), next(), next(), next());
                vec![dx, dw]
            }
            Call::SwiGlu => vec![B::layer_swiglu(next())],
            Call::SwiGluBackward => vec![B::layer_swiglu_backward(next(), next())],
            Call::Rope(style, dir) => vec![B::layer_rope(next(), next(), next(), style, dir)],
        };
        for (ir, out) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, out);
        }
    }
}

/// Records `call` on `inputs` with outputs of the given shapes and dtypes.
fn record<B: FusionBackend + LayerOps>(
    id: &'static str,
    call: Call,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outs: Vec<(Vec<usize>, DType)>,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let outs: Vec<TensorIr> = outs
        .into_iter()
        .map(|(d, dtype)| TensorIr::uninit(client.create_empty_handle(), Shape::from(d), dtype))
        .collect();
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(id, &irs, &outs);
    let op = LayerOp::<B> { desc: desc.clone(), call, _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op)
}

fn two<T>(v: Vec<T>) -> (T, T) {
    let mut it = v.into_iter();
    let a = it.next().expect("two outputs recorded");
    (a, it.next().expect("two outputs recorded"))
}

fn one<T>(v: Vec<T>) -> T {
    v.into_iter().next().expect("one output recorded")
}

fn dims<R: FusionRuntime>(t: &FusionTensor<R>) -> Vec<usize> {
    t.shape.as_slice().to_vec()
}

impl<B: FusionBackend + LayerOps> LayerOps for Fusion<B> {
    fn layer_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let out = vec![(dims(&x), x.dtype)];
        one(record::<B>("gemmbridge_rms_norm", Call::RmsNorm(eps), vec![x, w], out))
    }

    fn layer_rms_norm_training(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = vec![(dims(&x), x.dtype), (vec![x.shape[0]], DType::F32)];
        two(record::<B>("gemmbridge_rms_norm_training", Call::RmsNormTraining(eps), vec![x, w], out))
    }

    fn layer_rms_norm_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        inv_rms: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = vec![(dims(&x), x.dtype), (dims(&w), w.dtype)];
        two(record::<B>("gemmbridge_rms_norm_backward", Call::RmsNormBackward, vec![x, w, inv_rms, dy], out))
    }

    fn layer_swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = vec![(vec![gu.shape[0], gu.shape[1] / 2], gu.dtype)];
        one(record::<B>("gemmbridge_swiglu", Call::SwiGlu, vec![gu], out))
    }

    fn layer_swiglu_backward(dy: FloatTensor<Self>, gu: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = vec![(dims(&gu), gu.dtype)];
        one(record::<B>("gemmbridge_swiglu_backward", Call::SwiGluBackward, vec![dy, gu], out))
    }

    fn layer_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        style: RopeStyle,
        direction: RopeDirection,
    ) -> FloatTensor<Self> {
        let out = vec![(dims(&x), x.dtype)];
        one(record::<B>("gemmbridge_rope", Call::Rope(style, direction), vec![x, cos, sin], out))
    }
}
