//! Scaled-dot-product attention on cuDNN's graph API: the call ([`AttnOp`], [`AttnBuffers`],
//! [`AttnCall`]), the plan kept per problem, direction and buffer alignment, and its launch.
//! The operation graphs are built in `graphs.rs` (with the room's graph builder,
//! `dnn/builder.rs`); the plan is cuDNN's best-ranked engine configuration for the graph that
//! finalizes and fits the workspace limit (`plan.rs`).
//!
//! A backward plan needs f32 scratch besides cuDNN's workspace — the per-row `Σ do·o` and the
//! dq accumulator — and, where lengths are used, the lengths; all of it lives in the call's
//! workspace after cuDNN's own part (the layout is [`Extra`]).

mod fp8;
mod fp8_bwd;
mod graphs;
mod paged;
mod plan;
mod run;
mod tactic;

use cudarc::driver::sys::CUstream;

use crate::attention::{Attention, AttnMask, HeadLayout};
use crate::dtype::DType;
use crate::fp8::Fp8Format;

pub(crate) use fp8::{MAX_KEYS, O_FACTOR};
pub(crate) use paged::PagedShape;
pub(crate) use plan::AttnPlan;
pub(crate) use tactic::key_text;

/// cuDNN 9.15.1 fixed an attention-backward bug for key lengths that are not a multiple of
/// 128 without a padding mask; before it, the backward runs with a padding mask of the full
/// lengths (cudnn-frontend applies the same workaround up to 9.15.0).
pub(crate) const BACKWARD_FIX_VERSION: usize = 91501;

/// One attention direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AttnOp {
    /// The forward; `stats`: the statistics are written.
    Forward { stats: bool },
    /// The backward.
    Backward,
    /// The FP8 forward (E4M3 q, k, v and o); `stats` as for `Forward`.
    ForwardFp8 { stats: bool },
    /// The FP8 backward (E4M3 q, k, v, o; do, dS and the gradients in `grad`).
    BackwardFp8 { grad: Fp8Format },
    /// Decode over a paged KV cache (`paged.rs`): one query row per sequence, k and v read
    /// from containers of this shape through the call's page table, no statistics.
    PagedDecode(PagedShape),
}

/// Device addresses of one call (0 where the direction has no such tensor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AttnBuffers {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub stats: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// Per-sequence lengths on the device (the caller's); 0 for host lengths or none.
    pub len_q: u64,
    pub len_kv: u64,
    /// FP8: the dequantisation scales of q, k (the forward's; v's enters the output's scale),
    /// and for the backward of v, o and do (one f32 each).
    pub descale: [u64; 5],
    /// FP8 backward: the graph's scales and absolute maxima (`fp8_bwd.rs`), 11 f32 in the
    /// order of `plan.rs`'s variant pack.
    pub scalars: u64,
    /// Paged decode: the page table `[b, width]` int32 on the device (k and v are the
    /// containers).
    pub table: u64,
}

impl AttnBuffers {
    /// The largest power of two ≤ 16 bytes dividing every address (cuDNN's BYTE_ALIGNMENT).
    pub fn alignment(&self) -> u8 {
        let all = [self.q, self.k, self.v, self.o, self.stats, self.d_o, self.dq, self.dk, self.dv]
            .iter()
            .fold(0u64, |a, b| a | b);
        1u8 << all.trailing_zeros().min(4)
    }
}

/// One attention call, carried as one value from the entry point to its launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnCall<'a> {
    pub problem: &'a Attention,
    pub op: AttnOp,
    pub buffers: AttnBuffers,
    /// Host lengths (checked), copied into the workspace in stream order before the launch.
    pub host_lens: Option<(&'a [i32], &'a [i32])>,
    /// The stream's workspace (address, bytes).
    pub workspace: (u64, usize),
    pub stream: CUstream,
}

/// Where a plan's lengths come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LensSource {
    /// No lengths in the graph.
    None,
    /// The call's (device buffers, or host lengths copied into the workspace).
    Call,
    /// The full extents, written into the workspace by the launch (the pre-9.15.1 backward).
    Full,
    /// Paged decode: q lengths of 1 written into the workspace by the launch, the call's
    /// device kv lengths.
    Decode,
}

/// A plan's key: the problem (scale by its bits), direction and buffer alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AttnKey {
    sizes: [usize; 6],
    scale: u32,
    mask: AttnMask,
    var_len: bool,
    dtype: DType,
    layouts: [HeadLayout; 4],
    op: AttnOp,
    align: u8,
}

impl AttnKey {
    pub fn new(p: &Attention, op: AttnOp, align: u8) -> AttnKey {
        AttnKey {
            sizes: [p.b, p.h_q, p.h_kv, p.s_q, p.s_kv, p.d],
            scale: p.scale.to_bits(),
            mask: p.mask,
            var_len: p.var_len,
            dtype: p.dtype,
            layouts: p.layouts,
            op,
            align,
        }
    }
}

/// The workspace a plan uses after cuDNN's own `cudnn` bytes: byte offsets of the backward's
/// f32 `Σ do·o` rows and dq accumulator, of the lengths, and of the FP8 forward's five f32
/// scalars (P's scale and its inverse, o's scale, the graph's v descale, o's absolute maximum,
/// in that order); `total` bytes in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extra {
    pub softmax_sum: usize,
    pub dq_accum: usize,
    pub lens: usize,
    pub fp8: usize,
    pub total: usize,
}

impl Extra {
    /// The layout for `p`, `op` and `lens`, after `cudnn` bytes of cuDNN's workspace (each
    /// part 256-byte aligned).
    pub fn new(p: &Attention, op: AttnOp, lens: LensSource, cudnn: usize) -> Extra {
        let up = |x: usize| x.div_ceil(256) * 256;
        let mut at = up(cudnn);
        let (mut softmax_sum, mut dq_accum, mut lens_at) = (0, 0, 0);
        if op == AttnOp::Backward {
            softmax_sum = at;
            at += up(p.stats_elems() * 4);
            dq_accum = at;
            at += up(p.stats_elems() * p.d * 4);
        }
        if lens != LensSource::None {
            lens_at = at;
            at += up(p.b * 4) * 2;
        }
        let mut fp8 = 0;
        if matches!(op, AttnOp::ForwardFp8 { .. }) {
            fp8 = at;
            at += 256;
        }
        Extra { softmax_sum, dq_accum, lens: lens_at, fp8, total: at }
    }

    /// Byte offset of the kv lengths (the q lengths are at [`Extra::lens`]).
    pub fn lens_kv(&self, p: &Attention) -> usize {
        self.lens + (p.b * 4).div_ceil(256) * 256
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> Attention {
        Attention::new(3, (8, 2), (100, 130), 64, DType::BF16)
    }

    #[test]
    fn the_workspace_layout_puts_every_part_apart_and_256_byte_aligned() {
        let p = problem();
        let e = Extra::new(&p, AttnOp::Backward, LensSource::Full, 1000);
        // cuDNN's 1000 bytes, then Σ do·o (3·8·100 f32), the dq accumulator (·64), the lengths
        assert_eq!(e.softmax_sum, 1024);
        assert_eq!(e.dq_accum, 1024 + 9728);
        assert_eq!(e.lens, e.dq_accum + 3 * 8 * 100 * 64 * 4);
        assert_eq!(e.lens_kv(&p), e.lens + 256);
        assert_eq!(e.total, e.lens + 512);
        for at in [e.softmax_sum, e.dq_accum, e.lens, e.lens_kv(&p), e.total] {
            assert_eq!(at % 256, 0, "{e:?}");
        }
        // a forward without lengths needs nothing past cuDNN's part; the FP8 forward its scalars
        let f = Extra::new(&p, AttnOp::Forward { stats: true }, LensSource::None, 1000);
        assert_eq!(f.total, 1024);
        let f8 = Extra::new(&p, AttnOp::ForwardFp8 { stats: false }, LensSource::Call, 0);
        assert_eq!((f8.lens, f8.fp8, f8.total), (0, 512, 768));
    }

    #[test]
    fn the_common_alignment_and_the_plan_key_tell_problems_apart() {
        let b = AttnBuffers { q: 0x1000, k: 0x2010, v: 0x3000, o: 0x4000, ..Default::default() };
        assert_eq!(b.alignment(), 16);
        assert_eq!(AttnBuffers { k: 0x2008, ..b }.alignment(), 8);
        let p = problem();
        let key = AttnKey::new(&p, AttnOp::Forward { stats: true }, 16);
        assert_eq!(key, AttnKey::new(&p, AttnOp::Forward { stats: true }, 16));
        assert_ne!(key, AttnKey::new(&p.with_scale(0.5), AttnOp::Forward { stats: true }, 16));
        assert_ne!(key, AttnKey::new(&p.bhsd(), AttnOp::Forward { stats: true }, 16));
        assert_ne!(key, AttnKey::new(&p, AttnOp::Forward { stats: false }, 16));
        assert_ne!(key, AttnKey::new(&p, AttnOp::ForwardFp8 { stats: true }, 16));
    }
}
