//! cuDNN's MoE grouped matmul (`CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR`, cuDNN
//! 9.18 and later) in its plain mode: the call ([`MoeCall`]), the plan kept per product and
//! buffer alignment ([`MoeKey`]) and its launch. The graph is one operation over tensors of
//! three dimensions, as cudnn-frontend's `MoeGroupedMatmulNode` lowers it: tokens
//! `[1, R, in]`, the weight `[E, in, out]` (the forward's `w[E, N, K]` with strides
//! `{N·K, 1, K}`: K contiguous, the documented layout), the int32 group starts `[E, 1, 1]`,
//! the output `[1, R, out]`; f32 accumulation. What cuDNN 9.19 does with it on Hopper
//! (`bench/probes/moe_grouped.py`; docs/DESIGN.md, "Grouped GEMMs"): the forward is served
//! in f16, bf16, f32 and E4M3; the backward data's layout (`w` read with N as the inner
//! dimension, strides `{N·K, K, 1}`) has no engine; the gather mode faulted with an illegal
//! address and the scatter mode has no engine, so neither is built.
//!
//! The plan is cuDNN's best-ranked engine configuration that finalizes within the workspace
//! limit (`plan.rs`); a call's way through the room is `run.rs`.

mod plan;
mod run;

use cudarc::driver::sys::CUstream;

use crate::moe::MoeGemm;

pub(crate) use plan::MoePlan;

/// The first cuDNN with the MoE grouped matmul (9.18.0: cudnn-frontend's samples skip
/// before it).
pub(crate) const MOE_VERSION: usize = 91800;

/// Device addresses of one call: the input, the weight, the output and the group starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MoeBuffers {
    pub input: u64,
    pub w: u64,
    pub out: u64,
    pub starts: u64,
}

impl MoeBuffers {
    /// The largest power of two ≤ 16 bytes dividing every address (cuDNN's BYTE_ALIGNMENT).
    pub fn alignment(&self) -> u8 {
        let all = self.input | self.w | self.out | self.starts;
        1u8 << all.trailing_zeros().min(4)
    }
}

/// One MoE grouped matmul call, carried from the entry point to its launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MoeCall<'a> {
    pub problem: &'a MoeGemm,
    pub buffers: MoeBuffers,
    /// The stream's workspace (address, bytes).
    pub workspace: (u64, usize),
    pub stream: CUstream,
}

/// A plan's key: the product (what its graph is made of) and the buffers' alignment.
pub(crate) type MoeKey = (MoeGemm, u8);
