//! burn's NdArray (CPU) backend: nothing for gemmbridge to serve, so `GemmOps`' defaults (burn's
//! own matmul and linear) keep models written against `GemmOps` running there.

use burn_ndarray::{FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray};

use crate::GemmOps;

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> GemmOps for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>>,
    NdArrayTensor: From<SharedArray<I>>,
{
}
