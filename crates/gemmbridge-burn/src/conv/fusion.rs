//! Under burn's fusion layer: each convolution is a custom operation of the fusion stream (the
//! queue is cut there), executed by the inner backend's [`ConvOps`].

use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{out_dims, ConvActivation, ConvOps};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// A convolution recorded in the fusion stream, with its inputs (the output is one tensor):
/// `Forward` `[x, w]` or `[x, w, bias]` → `[y]`; `Data` `[x, w, dy]` → `[dx]`; `Filter`
/// `[x, w, dy]` → `[dw]`.
#[derive(Clone, Debug)]
enum Call {
    Forward(ConvActivation),
    Data,
    Filter,
}

#[derive(Clone, Debug)]
struct ConvOp<B> {
    desc: CustomOpIr,
    call: Call,
    options: ConvOptions<2>,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + ConvOps> Operation<B::FusionRuntime> for ConvOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let mut inputs = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t));
        let recorded = "x and w recorded";
        let (x, w, third) = (inputs.next().expect(recorded), inputs.next().expect(recorded), inputs.next());
        let o = self.options.clone();
        let out = match self.call {
            Call::Forward(act) => B::gemm_conv2d(x, w, third, o, act),
            Call::Data => B::gemm_conv2d_backward_data(x, w, third.expect("dy recorded"), o),
            Call::Filter => B::gemm_conv2d_backward_filter(x, w, third.expect("dy recorded"), o),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

/// Records `call` on `inputs` with one output of `dims` and `dtype`.
fn record<B: FusionBackend + ConvOps>(
    id: &'static str,
    call: Call,
    options: ConvOptions<2>,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    (dims, dtype): ([usize; 4], DType),
) -> FusionTensor<B::FusionRuntime> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let out = TensorIr::uninit(client.create_empty_handle(), Shape::from(dims.to_vec()), dtype);
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(id, &irs, &[out]);
    let op = ConvOp::<B> { desc: desc.clone(), call, options, _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op).into_iter().next().expect("one output recorded")
}

fn dims<R: FusionRuntime>(t: &FusionTensor<R>) -> [usize; 4] {
    let s = t.shape.as_slice();
    [s[0], s[1], s[2], s[3]]
}

impl<B: FusionBackend + ConvOps> ConvOps for Fusion<B> {
    fn gemm_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        act: ConvActivation,
    ) -> FloatTensor<Self> {
        let out = (out_dims(&dims(&x), &dims(&weight), &options), x.dtype);
        let mut inputs = vec![x, weight];
        inputs.extend(bias);
        record::<B>("gemmbridge_conv2d", Call::Forward(act), options, inputs, out)
    }

    fn gemm_conv2d_backward_data(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let out = (dims(&x), x.dtype);
        record::<B>("gemmbridge_conv2d_backward_data", Call::Data, options, vec![x, weight, dy], out)
    }

    fn gemm_conv2d_backward_filter(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let out = (dims(&weight), weight.dtype);
        record::<B>("gemmbridge_conv2d_backward_filter", Call::Filter, options, vec![x, weight, dy], out)
    }
}
