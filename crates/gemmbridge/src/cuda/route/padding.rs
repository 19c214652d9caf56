//! The settings of the misaligned-operand path (`padded.rs`).

use crate::precision::Precision;
use crate::{Compute, DType};

/// When a call whose operands are off the 16-byte alignment cuBLASLt's fast kernels need is
/// run on aligned copies instead ([`GpuOptions::padding`](crate::cuda::GpuOptions::padding)).
///
/// A call qualifies when the problem has at least the precision's `min_macs` multiply-adds
/// (m·n·k·batch) and an operand (A, B or C) is off 16 bytes: its base address, leading
/// dimension or batch stride, or K or N themselves (for f16/bf16: not a multiple of 8). The
/// operands that need it are copied, in stream order on the call's stream, into buffers from
/// the context's stream-ordered memory pool with aligned leading dimensions, K and N rounded up
/// and the extra range zero-filled (in B and the bias; C is staged, its extra columns computed
/// into scratch and its logical part copied back); the aligned GEMM runs on the copies. The
/// result is the direct call's within the precision's rounding (the same products; each extra
/// product is 0·0). These always run directly, whatever the threshold: α = 0 without an
/// epilogue (A and B are not read), an odd M along A entering transposed, an odd N with an
/// epilogue that writes aux or a bias gradient (the caller's buffers are sized for N), and a
/// misaligned batched operand whose batch stride is not a multiple of its leading dimension.
/// When the scratch memory cannot be had, the call runs directly (a `tracing` warning says so).
/// The thresholds come from measurements on the H200 (docs/DESIGN.md, Design rationale, "Misaligned
/// shapes").
///
/// Build it from [`Padding::default`] or [`Padding::off`] and [`Padding::with_enabled`] /
/// [`Padding::with_min_macs`].
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
    /// On for f16/bf16 from 2²⁹ multiply-adds (between 512³ and 1024³) and for tf32 from 2³¹
    /// (between 1024³ and 2048³), off for strict f32 (`u64::MAX`). On the H200 a misaligned
    /// strict-f32 GEMM ran as fast as an aligned one (4096×4096×4095: 2.73–2.88 ms; the aligned
    /// 4095×4096×4096: 2.65–2.78 ms) and copies only added to it. Padded f16/bf16 calls beat
    /// the direct ones from 1024×1024×1023 on (1.3× PyTorch's direct call there); at
    /// 512×512×511 a padded bf16 call took 0.020–0.023 ms, the direct one 0.011 ms. Padded tf32
    /// calls win from 2048×2048×2047 on (1.3×) and lose at 1024×1024×1023 (0.86–0.91×).
    fn default() -> Self {
        Padding { enabled: true, min_macs_half: 1 << 29, min_macs_tf32: 1 << 31, min_macs_f32: u64::MAX }
    }
}

impl Padding {
    /// The path off: every call runs directly.
    pub fn off() -> Self {
        Padding { enabled: false, ..Padding::default() }
    }

    /// These settings switched on or off.
    #[must_use = "returns new settings; put them in GpuOptions::padding"]
    pub fn with_enabled(self, enabled: bool) -> Self {
        Padding { enabled, ..self }
    }

    /// These settings with the three thresholds (multiply-adds) set: f16/bf16, tf32, f32.
    #[must_use = "returns new settings; put them in GpuOptions::padding"]
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
