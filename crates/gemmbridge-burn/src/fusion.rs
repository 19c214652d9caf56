//! Under burn's fusion layer: matmul and linear are registered as custom operations, so they
//! run in the fusion stream's order (the queue is cut there; the GEMM itself is not fused with
//! burn's kernels, its epilogue is).

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use crate::layout::matmul_out_shape;
use crate::{Activation, GemmOps};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// A gemmbridge call recorded in the fusion stream: `Matmul` has inputs `[lhs, rhs]`,
/// `Linear` `[x, weight]` or `[x, weight, bias]`; one output.
#[derive(Clone, Debug)]
enum Call {
    Matmul,
    Linear(Activation),
}

#[derive(Clone, Debug)]
struct GemmOp<B> {
    desc: CustomOpIr,
    call: Call,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + GemmOps> Operation<B::FusionRuntime> for GemmOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs: Vec<_> = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t)).collect();
        let out = match (self.call.clone(), <[_; 2]>::try_from(inputs)) {
            (Call::Matmul, Ok([lhs, rhs])) => B::gemm_matmul(lhs, rhs),
            (Call::Linear(act), Ok([x, w])) => B::gemm_linear(x, w, None, act),
            (Call::Linear(act), Err(v)) => {
                let [x, w, b] = <[_; 3]>::try_from(v).expect("a linear op records 2 or 3 inputs");
                B::gemm_linear(x, w, Some(b), act)
            }
            (Call::Matmul, Err(_)) => unreachable!("a matmul op records 2 inputs"),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

/// Records `call` on `inputs` with an output of shape `out_dims`.
fn record<B: FusionBackend + GemmOps>(
    id: &'static str,
    call: Call,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    out_dims: Vec<usize>,
) -> FusionTensor<B::FusionRuntime> {
    let client = inputs[0].client.clone();
    let dtype = inputs[0].dtype;
    let streams = OperationStreams::with_inputs(&inputs);
    let out = TensorIr::uninit(client.create_empty_handle(), Shape::from(out_dims), dtype);
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(id, &irs, &[out]);
    let op = GemmOp::<B> { desc: desc.clone(), call, _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op).output()
}

impl<B: FusionBackend + GemmOps> GemmOps for Fusion<B> {
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        // burn's broadcasting of the batch dims; the inner backend checks the rest
        let dims = matmul_out_shape(lhs.shape.as_slice(), rhs.shape.as_slice());
        record::<B>("gemmbridge_matmul", Call::Matmul, vec![lhs, rhs], dims)
    }

    fn gemm_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        act: Activation,
    ) -> FloatTensor<Self> {
        let d = x.shape.num_dims();
        let dims: Vec<usize> = (0..d - 1).map(|i| x.shape[i]).chain([weight.shape[1]]).collect();
        let inputs = [x, weight].into_iter().chain(bias).collect();
        record::<B>("gemmbridge_linear", Call::Linear(act), inputs, dims)
    }
}
