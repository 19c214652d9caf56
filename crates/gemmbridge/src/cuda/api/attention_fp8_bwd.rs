//! The FP8 attention backward on cuDNN's FP8 backward graph: E4M3 q, k, v and o (as the FP8
//! forward wrote it), do quantised by gemmbridge's kernels ([`Gpu::attention_quantize_grad`]),
//! the forward's statistics; dq, dk, dv in do's FP8 format with scales made on the device from
//! the inputs' scales by one kernel of gemmbridge's own (fixed bounds: nothing can overflow,
//! nothing comes back to the host; `gemmbridge::attention::fp8::backward_scales` documents them).
//!
//! What cuDNN's FP8 backward offers, from cudnn-frontend's support checks for it: compute
//! capability 9.0 or later; on 9.x a head dimension of 128 only (10.x and later: at most 128, a
//! multiple of 16); the bottom-right causal mask only on 10.x and later; padded per-sequence
//! lengths yes; cuDNN 9.1.0 or later, not 9.10.0. The rest is refused by name before anything
//! runs ([`Error::Unsupported`]).

use cudarc::driver::DevicePtr;

use super::attention_fp8::check_fp8_layout;
use super::engine::Gpu;
use crate::attention::{Attention, AttnMask, AttnTensor};
use crate::cuda::device::{Relaxed, RelaxedDrop};
use crate::cuda::route::fp8::Fp8Tensor;
use crate::cuda::status;
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::fp8::{Fp8Format, Fp8Layout, Scaling, Source};

/// What the FP8 backward reads: the FP8 forward's inputs `q`, `k`, `v` (E4M3, from
/// [`Gpu::attention_quantize`]), its output `o` ([`Gpu::attention_forward_fp8`]) and statistics
/// (`lse[b, h_q, s_q]`, f32, dense), and the output's gradient `d_o` from
/// [`Gpu::attention_quantize_grad`] (E4M3 or E5M2, one scale).
#[derive(Clone, Copy)]
pub struct AttnSavedFp8<'a> {
    /// The queries (E4M3).
    pub q: &'a Fp8Tensor,
    /// The keys (E4M3).
    pub k: &'a Fp8Tensor,
    /// The values (E4M3).
    pub v: &'a Fp8Tensor,
    /// The FP8 forward's output (E4M3, its scale twice v's).
    pub o: &'a Fp8Tensor,
    /// The output's gradient, shaped as o; its format is the gradients'.
    pub d_o: &'a Fp8Tensor,
    /// The forward's statistics (f32, dense).
    pub stats: &'a dyn DevicePtr<f32>,
}

/// cudnn-frontend's support checks of the FP8 backward, for compute capability `cc`.
fn check_offered(p: &Attention, cc: (i32, i32)) -> Result<()> {
    let no = |what: String| Err(Error::Unsupported { backend: "cuDNN", what });
    if cc.0 < 9 {
        return no(format!("the FP8 attention backward on compute capability {}.{} (it needs 9.0)", cc.0, cc.1));
    }
    if cc.0 == 9 && p.d != 128 {
        return no(format!("the FP8 attention backward with head dimension {} on Hopper (only 128)", p.d));
    }
    if p.d > 128 {
        return no(format!("the FP8 attention backward with head dimension {} (at most 128)", p.d));
    }
    if p.mask == AttnMask::CausalBottomRight && cc.0 < 10 {
        return no("the FP8 attention backward with the bottom-right causal mask before Blackwell".into());
    }
    Ok(())
}

impl Gpu {
    /// The output's gradient `do` of `p` (shaped and strided as o, dense, in `p.dtype`) quantised
    /// to `format` with one scale from its current absolute maximum, for
    /// [`Gpu::attention_backward_fp8`] (as [`Gpu::attention_quantize`] does for q, k, v).
    /// E5M2 (the usual format of gradients) is what the backward's fixed scales suit best.
    ///
    /// # Errors
    /// As [`Gpu::attention_quantize`].
    pub fn attention_quantize_grad<T: Element, S: DevicePtr<T>>(
        &self,
        p: &Attention,
        d_o: &S,
        format: Fp8Format,
    ) -> Result<Fp8Tensor> {
        p.validate()?;
        check_fp8_layout(p)?;
        if T::DTYPE != p.dtype {
            return Err(Error::DTypeMismatch { operand: Which::AttnDo, expected: p.dtype, got: T::DTYPE });
        }
        let [b, h, s] = p.dims(AttnTensor::O);
        let n = b * h * s * p.d;
        if p.required_elems(AttnTensor::O) != n {
            return Err(Error::AttentionShape {
                what: "a tensor to quantise is not dense (its elements leave gaps)",
                detail: format!("do spans {} elements for {n} ({})", p.required_elems(AttnTensor::O), p.describe()),
            });
        }
        self.quantize(d_o, n / p.d, p.d, Source::RowMajor, format, Scaling::Tensor)
    }

    /// The FP8 gradients dq, dk, dv of `p` in `format`, for [`Gpu::attention_backward_fp8`]:
    /// each in its tensor's layout (one byte per element) as the matrix `[b·h·s, d]` with one
    /// dequantisation scale, allocated from the stream-ordered pool (not yet written).
    ///
    /// # Errors
    /// [`Error::AttentionShape`] (the problem's rules, the FP8 layout rule); [`Error::Fp8`] on a
    /// GPU without FP8; [`Error::Driver`].
    pub fn attention_fp8_grads(&self, p: &Attention, format: Fp8Format) -> Result<[Fp8Tensor; 3]> {
        p.validate()?;
        check_fp8_layout(p)?;
        self.check_fp8(Scaling::Tensor)?;
        let s = self.stream();
        let _relaxed = Relaxed::enter()?;
        let one = |t: AttnTensor| -> Result<Fp8Tensor> {
            let [b, h, sq] = p.dims(t);
            let layout = Fp8Layout::new(b * h * sq, p.d, Scaling::Tensor);
            let data = s.alloc_zeros::<u8>(layout.data_len()).map_err(status::driver("cuMemAllocAsync"))?;
            let scales = s.alloc_zeros::<f32>(1).map_err(status::driver("cuMemAllocAsync"))?;
            Ok(Fp8Tensor { data: RelaxedDrop::new(data), scales: RelaxedDrop::new(scales), layout, format })
        };
        Ok([one(AttnTensor::Q)?, one(AttnTensor::K)?, one(AttnTensor::V)?])
    }
}
