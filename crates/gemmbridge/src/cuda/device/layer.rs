//! The launches of a transformer layer's elementwise kernels (`kernels/layer.cu`): RoPE in
//! place on a fused QKV buffer, SwiGLU and its backward. Each launch is planned on the host
//! ([`RopeLaunch::plan`], [`GluLaunch::plan`]: the instance, 8-wide where every access is
//! 16-byte aligned, and the grid), then enqueued on a raw stream; the entry points
//! (`cuda/api/layer_ops.rs`) check every buffer first.

use cudarc::driver::sys::CUstream;

use super::kernels::{arg, suffix, Kernels};
use crate::dtype::DType;
use crate::error::Result;
use crate::layer_ops::{GluLayout, Rope, RopeDirection, RopeStyle, SwiGlu, MAX_POSITION};

/// Threads per CTA of every layer kernel (their `__launch_bounds__`).
const THREADS: usize = 256;
/// Most CTAs of a grid-stride launch: 8 per SM of a 132-SM H100 or H200, 2048 threads each.
const MAX_CTAS: usize = 1056;
/// RoPE spreads a token's heads over more threads (each computing its own cosines and sines)
/// until about this many threads run: enough 16-byte accesses in flight to keep the memory busy
/// when tokens are few (decoding), while with many tokens each thread keeps many heads and the
/// angles are computed once per token and pair.
const ROPE_THREADS_TARGET: usize = 1 << 17;
/// The frequencies a RoPE kernel takes as one argument (`struct Freqs` in layer.cu).
const FREQS: usize = 256;

/// The grid of a grid-stride loop over `items`.
fn grid(items: usize) -> (u32, u32, u32) {
    (items.div_ceil(THREADS).clamp(1, MAX_CTAS) as u32, 1, 1)
}

/// One RoPE launch over a checked buffer: the problem, the direction and the device addresses
/// (`pos`, `cos`, `sin`: 0 where not used).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeLaunch<'a> {
    pub op: &'a Rope,
    pub direction: RopeDirection,
    pub dtype: DType,
    pub qkv: u64,
    /// The first position of contiguous positions (with `pos` 0).
    pub start: usize,
    pub pos: u64,
    pub cos: u64,
    pub sin: u64,
}

/// What a RoPE launch runs: the kernel, pairs per thread, head groups and grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RopePlan {
    pub kernel: String,
    /// Pairs each thread rotates per head: 8 (rotate-half, 8-wide), 4 (interleaved, 8-wide)
    /// or 1.
    pub pairs: usize,
    /// Threads a token's pairs are spread over per head group.
    pub groups: usize,
    pub grid: (u32, u32, u32),
}

impl RopeLaunch<'_> {
    /// The instance (8-wide where `ld`, the head dimension, the rotated half (rotate-half) or
    /// the rotary dimension (interleaved) are multiples of 8 elements and `qkv` 16-byte
    /// aligned), the head groups and the grid.
    pub fn plan(&self) -> RopePlan {
        let op = self.op;
        let half = op.rotary_dim / 2;
        let neox = op.style == RopeStyle::RotateHalf;
        let (name, wide_pairs, span) = if neox { ("neox", 8, half) } else { ("gptj", 4, op.rotary_dim) };
        let wide = op.ld.is_multiple_of(8)
            && op.head_dim.is_multiple_of(8)
            && span.is_multiple_of(8)
            && self.qkv.is_multiple_of(16);
        let pairs = if wide { wide_pairs } else { 1 };
        let units = op.tokens().saturating_mul(half / pairs).max(1);
        let heads = op.heads_q + op.heads_kv;
        let groups = ROPE_THREADS_TARGET.div_ceil(units).clamp(1, heads);
        let kernel = format!("rope_{name}{}_{}", if wide { "_v8" } else { "" }, suffix(self.dtype));
        RopePlan { kernel, pairs, groups, grid: grid(units.saturating_mul(groups)) }
    }

    /// Enqueues the rotation on `stream` (nothing for a problem without tokens).
    ///
    /// # Safety
    /// `qkv` holds the problem's [`Rope::qkv_elems`] elements of `dtype`, `pos` (when not 0)
    /// its tokens' `i32` positions and `cos`, `sin` (when not 0) [`Rope::table_elems`] f32
    /// each, all device memory of `k`'s context, none overlapping `qkv`; `stream` is a live
    /// stream of that context, which is current.
    pub unsafe fn enqueue(&self, k: &Kernels, stream: CUstream) -> Result<()> {
        let op = self.op;
        if op.tokens() == 0 {
            return Ok(());
        }
        let plan = self.plan();
        let mut freqs = [0f32; FREQS];
        for (f, v) in freqs.iter_mut().zip(op.inv_freqs()) {
            *f = v;
        }
        let max_pos = if self.cos == 0 { MAX_POSITION } else { op.position_limit() };
        let (mut qkv, mut pos, mut cos, mut sin) = (self.qkv, self.pos, self.cos, self.sin);
        let (mut ld, mut tokens) = (op.ld as i64, op.tokens() as i64);
        // every value below 2³¹ ([`Rope::validate`], [`Rope::check_start`])
        let [mut seq, mut heads, mut head_dim, mut half, mut groups, mut start, mut max_pos, mut backward] = [
            op.seq,
            op.heads_q + op.heads_kv,
            op.head_dim,
            op.rotary_dim / 2,
            plan.groups,
            self.start,
            max_pos,
            usize::from(self.direction == RopeDirection::Backward),
        ]
        .map(|v| v as i32);
        let mut args = [
            arg(&mut qkv),
            arg(&mut ld),
            arg(&mut tokens),
            arg(&mut seq),
            arg(&mut heads),
            arg(&mut head_dim),
            arg(&mut half),
            arg(&mut groups),
            arg(&mut start),
            arg(&mut pos),
            arg(&mut cos),
            arg(&mut sin),
            arg(&mut max_pos),
            arg(&mut backward),
            arg(&mut freqs),
        ];
        // SAFETY: the arguments are the kernel's parameters in order (Freqs: 256 f32); the
        // buffers are the caller's contract; the plan's instance is 8-wide only where every
        // access is 16-byte aligned.
        unsafe { k.launch(&plan.kernel, plan.grid, THREADS as u32, stream, &mut args) }
    }
}

/// One SwiGLU launch, forward (`out` is `y`; `dy` unused) or backward (`out` is the gate/up
/// gradient), over checked buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GluLaunch<'a> {
    pub op: &'a SwiGlu,
    pub dtype: DType,
    pub backward: bool,
    pub dy: u64,
    pub gu: u64,
    pub out: u64,
}

/// What a SwiGLU launch runs: the kernel, the 8-wide instances' `(n8, f8)` (`None`: the
/// scalar instance) and the grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GluPlan {
    pub kernel: String,
    pub wide: Option<(u32, u32)>,
    pub grid: (u32, u32, u32),
}

impl GluLaunch<'_> {
    /// The instance and grid: 8-wide where `f`, both leading dimensions and every address
    /// allow 16-byte accesses and `rows·f/8 < 2³¹`, else the scalar instance over `rows·f`
    /// elements.
    pub fn plan(&self) -> GluPlan {
        let op = self.op;
        let base = if self.backward { "dswiglu" } else { "swiglu" };
        let il = if op.layout == GluLayout::Interleaved { "_il" } else { "" };
        let n = op.rows.saturating_mul(op.f);
        let aligned = [op.f, op.ld_in, op.ld_out].iter().all(|v| v.is_multiple_of(8))
            && [self.dy, self.gu, self.out].iter().all(|a| a.is_multiple_of(16));
        if aligned && n / 8 < 1 << 31 {
            let kernel = format!("{base}{il}_v8_{}", suffix(self.dtype));
            return GluPlan { kernel, wide: Some(((n / 8) as u32, (op.f / 8) as u32)), grid: grid(n / 8) };
        }
        GluPlan { kernel: format!("{base}_{}", suffix(self.dtype)), wide: None, grid: grid(n) }
    }

    /// Enqueues the forward or the backward on `stream` (nothing without rows or columns).
    ///
    /// # Safety
    /// `gu` (and `dy` for the backward) hold what the problem reads ([`SwiGlu::in_elems`],
    /// [`SwiGlu::out_elems`]) and `out` what it writes, of `dtype`, device memory of `k`'s
    /// context, `out` overlapping neither input; `stream` is a live stream of that context,
    /// which is current.
    pub unsafe fn enqueue(&self, k: &Kernels, stream: CUstream) -> Result<()> {
        let op = self.op;
        if op.rows == 0 || op.f == 0 {
            return Ok(());
        }
        let GluPlan { kernel, wide, grid } = self.plan();
        let (mut dy, mut gu, mut out) = (self.dy, self.gu, self.out);
        let (mut ld_in, mut ld_out) = (op.ld_in as i64, op.ld_out as i64);
        let (mut rows, mut f, mut il) = (op.rows as i64, op.f as i64, i32::from(op.layout == GluLayout::Interleaved));
        let (mut n8, mut f8) = wide.unwrap_or_default();
        let mut args = Vec::with_capacity(8);
        if self.backward {
            args.push(arg(&mut dy));
        }
        args.extend([arg(&mut gu), arg(&mut out)]);
        match wide {
            Some(_) => args.extend([arg(&mut n8), arg(&mut f8), arg(&mut ld_in), arg(&mut ld_out)]),
            None => args.extend([arg(&mut rows), arg(&mut f), arg(&mut ld_in), arg(&mut ld_out), arg(&mut il)]),
        }
        // SAFETY: [dy,] gu, out, then (n8, f8, ld_in, ld_out) for the 8-wide instances or (rows,
        // f, ld_in, ld_out, il) for the scalar ones, as layer.cu declares them; the plan's
        // 8-wide instance only where every access is 16-byte aligned; the buffers are the
        // caller's contract.
        unsafe { k.launch(&kernel, grid, THREADS as u32, stream, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(op: &Rope, qkv: u64) -> RopePlan {
        RopeLaunch { op, direction: RopeDirection::Forward, dtype: DType::BF16, qkv, start: 0, pos: 0, cos: 0, sin: 0 }
            .plan()
    }

    #[test]
    fn rope_takes_the_8_wide_instances_where_aligned() {
        // LLaMA 3 8B: 8192 tokens, 32 + 8 rotated heads of 128; 8 pairs a thread, two head groups
        let op = Rope::new(1, 8192, (32, 8), 128);
        let p = rope(&op, 0x1000);
        assert_eq!((p.kernel.as_str(), p.pairs, p.groups), ("rope_neox_v8_bf16", 8, 2));
        assert_eq!(p.grid.0, 512);
        // decoding: a few tokens spread over every head
        let p = rope(&Rope::new(4, 1, (32, 8), 128), 0x1000);
        assert_eq!((p.pairs, p.groups), (8, 40));
        assert_eq!(rope(&op.with_style(RopeStyle::Interleaved), 0x1000).pairs, 4);
        // off 16 bytes, an odd ld, a rotated half not a multiple of 8: scalar
        for (o, addr) in [(op, 0x1002), (op.with_ld(6145), 0x1000), (op.with_rotary_dim(24), 0x1000)] {
            let p = rope(&o, addr);
            assert_eq!((p.kernel.as_str(), p.pairs), ("rope_neox_bf16", 1), "{}", o.describe());
        }
        // interleaved needs the rotary dimension, not its half, a multiple of 8
        assert_eq!(rope(&op.with_rotary_dim(24).with_style(RopeStyle::Interleaved), 0x1000).pairs, 4);
        assert!(rope(&Rope::new(3, 129, (8, 1), 64), 0).grid.0 as usize <= MAX_CTAS);
    }

    #[test]
    fn swiglu_takes_the_8_wide_instances_where_aligned() {
        let op = SwiGlu::new(8192, 14336, GluLayout::Halves);
        let l = |op: SwiGlu, dy: u64, gu: u64, out: u64| {
            GluLaunch { op: &op, dtype: DType::F16, backward: dy != 0, dy, gu, out }.plan()
        };
        let want = GluPlan { kernel: "swiglu_v8_f16".into(), wide: Some((8192 * 1792, 1792)), grid: (1056, 1, 1) };
        assert_eq!(l(op, 0, 0x1000, 0x2000), want);
        let il = SwiGlu::new(7, 16, GluLayout::Interleaved);
        assert_eq!(l(il, 0x10, 0x1000, 0x2000).kernel, "dswiglu_il_v8_f16");
        assert_eq!(l(il, 0x18, 0x1000, 0x2000).kernel, "dswiglu_f16");
        assert_eq!(l(SwiGlu::new(7, 11, GluLayout::Halves), 0, 0, 0).kernel, "swiglu_f16");
        assert_eq!(l(op.with_ld(28680, 14340), 0, 0, 0).wide, None);
        // past 32-bit indexing in units of 8: scalar
        assert_eq!(l(SwiGlu::new(1 << 20, 1 << 14, GluLayout::Halves), 0, 0, 0).wide, None);
    }
}
