//! burn's NdArray (CPU) backend: `AttentionOps`' defaults (burn's attention op; the composed
//! forward with statistics and backward under `Autodiff`).

use burn_ndarray::{FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray};

use super::AttentionOps;

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> AttentionOps for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>>,
    NdArrayTensor: From<SharedArray<I>>,
{
}
