//! The settings of the misaligned-operand path (`padded.rs`).

use crate::precision::Precision;
use crate::{Compute, DType};

/// When a call whose operands are off the 16-byte alignment cuBLASLt's fast kernels need is
/// run on aligned copies instead ([`Gpu::set_padding`](super::Gpu::set_padding)).
///
/// A call qualifies when an operand's (A, B or C) base address, leading dimension or batch
/// stride is not a multiple of 16 bytes and the problem has at least the precision's
/// `min_macs` multiply-adds (m·n·k·batch): the misaligned operands are copied, in stream order
/// on the call's stream, into zero-padded buffers with aligned leading dimensions from the
/// context's stream-ordered memory pool, the aligned GEMM runs on them, and a misaligned C gets
/// its logical part copied back. The result is the direct call's within the precision's
/// rounding (the same products; K extended with zeros only where both A and B are copied).
/// When the scratch memory cannot be had, the call runs directly (a `tracing` warning says so).
/// The thresholds come from measurements on the H200 (docs/PERFORMANCE.md, "Misaligned
/// shapes").
///
/// Build it from [`Padding::default`] or [`Padding::off`] and the `with_*` methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Padding {
    /// Whether the path is used at all. Default: on.
    pub enabled: bool,
    /// Least multiply-adds for f16 and bf16 inputs.
    pub min_macs_half: u64,
    /// Least multiply-adds for f32 inputs with tf32 compute.
    pub min_macs_tf32: u64,
    /// Least multiply-adds for f32 inputs with f32 compute.
    pub min_macs_f32: u64,
}

impl Default for Padding {
    /// On for f16/bf16 and tf32 from 2²⁹ multiply-adds (between 512³ and 1024³), off for
    /// strict f32 (`u64::MAX`): on the H200 a misaligned strict-f32 GEMM ran as fast as the
    /// aligned one (4096×4096×4095: 2.75–2.88 ms, the aligned 4095×4096×4096 2.67–2.78 ms),
    /// while a bf16 one ran 5.5× slower (1.00 ms against 0.18 ms) and a tf32 one 2.9× slower.
    fn default() -> Self {
        Padding { enabled: true, min_macs_half: 1 << 29, min_macs_tf32: 1 << 29, min_macs_f32: u64::MAX }
    }
}

impl Padding {
    /// The path off: every call runs directly.
    pub fn off() -> Self {
        Padding { enabled: false, ..Padding::default() }
    }

    /// These settings with the three thresholds (multiply-adds) set: f16/bf16, tf32, f32.
    #[must_use = "returns new settings; pass them to Gpu::set_padding"]
    pub fn with_min_macs(self, half: u64, tf32: u64, f32: u64) -> Self {
        Padding { min_macs_half: half, min_macs_tf32: tf32, min_macs_f32: f32, ..self }
    }

    /// The threshold for `p`.
    pub fn min_macs(&self, p: Precision) -> u64 {
        match (p.input(), p.compute()) {
            (DType::F16 | DType::BF16, _) => self.min_macs_half,
            (_, Compute::Tf32) => self.min_macs_tf32,
            _ => self.min_macs_f32,
        }
    }
}
