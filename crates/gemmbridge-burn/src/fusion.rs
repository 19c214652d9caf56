//! Under burn's fusion layer: the matmul is registered as a custom operation, so it runs in
//! the fusion stream's order (the queue is cut there; the GEMM itself is not fused).

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use crate::GemmOps;

#[derive(Clone, Debug)]
struct GemmMatmulOp<B> {
    desc: CustomOpIr,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + GemmOps> Operation<B::FusionRuntime> for GemmMatmulOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let ([lhs, rhs], [out]) = self.desc.as_fixed();
        let lhs = handles.get_float_tensor::<B>(lhs);
        let rhs = handles.get_float_tensor::<B>(rhs);
        handles.register_float_tensor::<B>(&out.id, B::gemm_matmul(lhs, rhs));
    }
}

impl<B: FusionBackend + GemmOps> GemmOps for Fusion<B> {
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = lhs.shape.num_dims();
        // burn's broadcasting of the batch dims; the inner backend checks the rest
        let mut dims: Vec<usize> = (0..d.saturating_sub(2)).map(|i| lhs.shape[i].max(rhs.shape[i])).collect();
        dims.push(lhs.shape[d - 2]);
        dims.push(rhs.shape[d - 1]);
        let client = lhs.client.clone();
        let streams = OperationStreams::with_inputs([&lhs, &rhs]);
        let out = TensorIr::uninit(client.create_empty_handle(), Shape::from(dims), lhs.dtype);
        let desc = CustomOpIr::new("gemmbridge_matmul", &[lhs.into_ir(), rhs.into_ir()], &[out]);
        let op = GemmMatmulOp::<B> { desc: desc.clone(), _b: std::marker::PhantomData };
        client.register(streams, OperationIr::Custom(desc), op).output()
    }
}
