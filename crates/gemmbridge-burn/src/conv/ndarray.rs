//! burn's NdArray (CPU) backend: gemmbridge has no path for burn's CPU tensors here, so
//! [`ConvOps`]' defaults (burn's own convolution) serve every call.

use burn_ndarray::{FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray};

use super::ConvOps;

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> ConvOps for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>>,
    NdArrayTensor: From<SharedArray<I>>,
{
}
