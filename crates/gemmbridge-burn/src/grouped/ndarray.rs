//! burn's NdArray (CPU) backend: gemmbridge has no path for burn's CPU tensors here, so
//! [`GroupedOps`]' defaults (burn's own ops) serve every call.

use burn_ndarray::{FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray};

use super::GroupedOps;

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> GroupedOps for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>>,
    NdArrayTensor: From<SharedArray<I>>,
{
}
