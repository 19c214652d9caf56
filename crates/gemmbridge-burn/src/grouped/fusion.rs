//! Under burn's fusion layer: f32, f16 and bf16 grouped products are custom operations of the
//! fusion stream (the queue is cut there), executed by the inner backend's [`GroupedOps`]
//! (gemmbridge or its fallback). Other dtypes, which gemmbridge never serves, run burn's ops
//! on the fusion backend itself, where burn can fuse them.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{burn_ops, GroupedOps};

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// A grouped product recorded in the fusion stream: `Forward` reads `[x, w]` and writes `[y]`,
/// `BackwardData` `[dy, w]` → `[dx]`, `BackwardWeight` `[dy, x]` → `[dw]`.
#[derive(Clone, Copy, Debug)]
enum Call {
    Forward,
    BackwardData,
    BackwardWeight,
}

#[derive(Clone, Debug)]
struct GroupedOp<B> {
    desc: CustomOpIr,
    call: Call,
    sizes: Vec<usize>,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + GroupedOps> Operation<B::FusionRuntime> for GroupedOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let mut ins = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t));
        let mut next = || ins.next().expect("a grouped product records two inputs");
        let (a, b, sizes) = (next(), next(), self.sizes.as_slice());
        let out = match self.call {
            Call::Forward => B::gemm_grouped_matmul(a, b, sizes),
            Call::BackwardData => B::gemm_grouped_backward_data(a, b, sizes),
            Call::BackwardWeight => B::gemm_grouped_backward_weight(a, b, sizes),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

/// Whether gemmbridge may serve the dtype (the inner backend decides the rest).
fn recorded(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Records `call` on `[a, b]` with one output of `shape` in a's dtype.
fn record<B: FusionBackend + GroupedOps>(
    call: Call,
    a: FusionTensor<B::FusionRuntime>,
    b: FusionTensor<B::FusionRuntime>,
    sizes: &[usize],
    shape: Vec<usize>,
) -> FusionTensor<B::FusionRuntime> {
    let client = a.client.clone();
    let dtype = a.dtype;
    let inputs = [a, b];
    let streams = OperationStreams::with_inputs(&inputs);
    let out = TensorIr::uninit(client.create_empty_handle(), Shape::from(shape), dtype);
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let id = match call {
        Call::Forward => "gemmbridge_grouped_matmul",
        Call::BackwardData => "gemmbridge_grouped_matmul_backward_data",
        Call::BackwardWeight => "gemmbridge_grouped_matmul_backward_weight",
    };
    let desc = CustomOpIr::new(id, &irs, &[out]);
    let op = GroupedOp::<B> { desc: desc.clone(), call, sizes: sizes.to_vec(), _b: std::marker::PhantomData };
    client.register(streams, OperationIr::Custom(desc), op).into_iter().next().expect("one output recorded")
}

impl<B: FusionBackend + GroupedOps> GroupedOps for Fusion<B> {
    fn gemm_grouped_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        if !recorded(x.dtype) {
            return burn_ops::forward::<Self>(x, w, sizes);
        }
        let shape = vec![x.shape[0], w.shape[1]];
        record::<B>(Call::Forward, x, w, sizes, shape)
    }

    fn gemm_grouped_backward_data(dy: FloatTensor<Self>, w: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        if !recorded(dy.dtype) {
            return burn_ops::backward_data::<Self>(dy, w, sizes);
        }
        let shape = vec![dy.shape[0], w.shape[2]];
        record::<B>(Call::BackwardData, dy, w, sizes, shape)
    }

    fn gemm_grouped_backward_weight(dy: FloatTensor<Self>, x: FloatTensor<Self>, sizes: &[usize]) -> FloatTensor<Self> {
        if !recorded(dy.dtype) {
            return burn_ops::backward_weight::<Self>(dy, x, sizes);
        }
        let shape = vec![sizes.len(), dy.shape[1], x.shape[1]];
        record::<B>(Call::BackwardWeight, dy, x, sizes, shape)
    }
}
