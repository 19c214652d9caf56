//! Under burn's fusion layer: matmul and linear are registered as custom operations, so they
//! run in the fusion stream's order (the queue is cut there; the GEMM itself is not fused with
//! burn's kernels, its epilogue is).

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::layout::matmul_out_shape;
use crate::{Activation, GemmOps};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// A gemmbridge call recorded in the fusion stream: `Matmul` has inputs `[lhs, rhs]`,
/// `Linear` `[x, weight]` or `[x, weight, bias]`, one output each; `ParamGrads` (a linear
/// layer's weight and bias gradients from one GEMM) inputs `[x, dy]`, outputs `[dw, db]`.
#[derive(Clone, Debug)]
enum Call {
    Matmul,
    Linear(Activation),
    ParamGrads,
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
        let outs = match (self.call.clone(), <[_; 2]>::try_from(inputs)) {
            (Call::Matmul, Ok([lhs, rhs])) => vec![B::gemm_matmul(lhs, rhs)],
            (Call::Linear(act), Ok([x, w])) => vec![B::gemm_linear(x, w, None, act)],
            (Call::Linear(act), Err(v)) => {
                let [x, w, b] = <[_; 3]>::try_from(v).expect("a linear op records 2 or 3 inputs");
                vec![B::gemm_linear(x, w, Some(b), act)]
            }
            (Call::ParamGrads, Ok([x, dy])) => {
                let (dw, db) = B::gemm_linear_param_grads(x, dy);
                vec![dw, db]
            }
            (Call::Matmul | Call::ParamGrads, Err(_)) => unreachable!("matmul and parameter gradients record 2 inputs"),
        };
        for (ir, out) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, out);
        }
    }
}

/// Records `call` on `inputs` with outputs of the shapes `out_dims` (the inputs' dtype).
fn record<B: FusionBackend + GemmOps>(
    id: &'static str,
    call: Call,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    out_dims: Vec<Vec<usize>>,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = inputs[0].client.clone();
    let dtype = inputs[0].dtype;
    let streams = OperationStreams::with_inputs(&inputs);
    let outs: Vec<TensorIr> =
        out_dims.into_iter().map(|d| TensorIr::uninit(client.create_empty_handle(), Shape::from(d), dtype)).collect();
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(id, &irs, &outs);
    let op = GemmOp::<B> { desc: desc.clone(), call, _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op)
}

/// [`record`] of a one-output call.
fn record_one<B: FusionBackend + GemmOps>(
    id: &'static str,
    call: Call,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    out_dims: Vec<usize>,
) -> FusionTensor<B::FusionRuntime> {
    record::<B>(id, call, inputs, vec![out_dims]).into_iter().next().expect("one output recorded")
}

impl<B: FusionBackend + GemmOps> GemmOps for Fusion<B> {
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        // burn's broadcasting of the batch dims; the inner backend checks the rest
        let dims = matmul_out_shape(lhs.shape.as_slice(), rhs.shape.as_slice());
        record_one::<B>("gemmbridge_matmul", Call::Matmul, vec![lhs, rhs], dims)
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
        record_one::<B>("gemmbridge_linear", Call::Linear(act), inputs, dims)
    }

    fn gemm_linear_param_grads(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dims = vec![vec![x.shape[1], dy.shape[1]], vec![dy.shape[1]]];
        let mut outs = record::<B>("gemmbridge_linear_param_grads", Call::ParamGrads, vec![x, dy], dims).into_iter();
        let dw = outs.next().expect("two outputs recorded");
        (dw, outs.next().expect("two outputs recorded"))
    }
}
