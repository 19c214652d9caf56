//! The launches of a mixture-of-experts layer's own kernels (`kernels/moe.cu`, compiled with
//! the layer kernels): the router's top-k and sort, group starts from host sizes, device
//! group starts clamped into range, the combine and its backward, rows gathered by index. The entry
//! points (`cuda/api/moe.rs`) check every buffer first; each launch here states what it reads
//! and writes.

use cudarc::driver::sys::CUstream;

use super::kernels::{arg, suffix, Kernels};
use crate::dtype::DType;
use crate::error::Result;
use crate::moe::{MoeCombine, MoeRouter};

/// Threads per CTA of the grid-stride kernels, the sort's place kernel (its tiles) and the
/// combine's backward (its reduction).
const THREADS: u32 = 256;
/// Most CTAs of a grid-stride launch: 8 per SM of a 132-SM H100 or H200.
const MAX_CTAS: usize = 1056;
/// Group starts one `moe_starts` launch takes by value (`struct MoeStarts` in moe.cu).
const STARTS_PER_LAUNCH: usize = 1000;

fn grid(items: usize) -> (u32, u32, u32) {
    (items.div_ceil(THREADS as usize).clamp(1, MAX_CTAS) as u32, 1, 1)
}

/// `struct MoeStarts` of moe.cu: a run of group starts passed by value.
#[repr(C)]
struct Starts {
    count: i32,
    first: i32,
    v: [i32; STARTS_PER_LAUNCH],
}

/// The MoE kernels of a compiled layer module, launched on one stream.
pub(crate) struct MoeKernels<'a> {
    pub k: &'a Kernels,
    pub stream: CUstream,
}

impl MoeKernels<'_> {
    /// The router on `logits` `[S, E]`: ids and weights `[R]`, then the sort — starts `[E]`,
    /// index, ks, slots and pos `[R]` — with `counts` (`[CTAs, E]` int32,
    /// [`MoeRouter::sort_blocks`]) as scratch.
    ///
    /// # Safety
    /// The router passed [`MoeRouter::validate`]; every address is device memory of the
    /// stream's context holding what is named above (`logits` of `r.dtype`), the outputs
    /// overlapping nothing; the context is current.
    pub unsafe fn route(
        &self,
        r: &MoeRouter,
        logits: u64,
        [ids, weights, counts]: [u64; 3],
        sorted: [u64; 5],
    ) -> Result<()> {
        let [starts, index, ks, slots, pos] = sorted;
        let (blocks, _) = r.sort_blocks();
        let [mut s_n, mut e_n, mut k_n, mut rows, mut b_n] =
            [r.tokens, r.experts, r.top_k, r.rows(), blocks].map(|v| v as i32);
        let (mut logits, mut ids, mut weights, mut counts) = (logits, ids, weights, counts);
        let (mut starts, mut index, mut ks, mut slots, mut pos) = (starts, index, ks, slots, pos);
        let warps = (THREADS / 32) as usize;
        let topk = format!("moe_topk_{}", suffix(r.dtype));
        // SAFETY (all four): the arguments are moe.cu's parameters in order; every buffer is
        // the caller's contract; each grid covers its rows (one warp a token; one CTA a chunk).
        unsafe {
            let mut a =
                [arg(&mut logits), arg(&mut s_n), arg(&mut e_n), arg(&mut k_n), arg(&mut ids), arg(&mut weights)];
            self.k.launch(&topk, (r.tokens.div_ceil(warps) as u32, 1, 1), THREADS, self.stream, &mut a)?;
            let mut a = [arg(&mut ids), arg(&mut rows), arg(&mut e_n), arg(&mut counts)];
            self.k.launch("moe_count", (blocks as u32, 1, 1), THREADS, self.stream, &mut a)?;
            let mut a = [arg(&mut counts), arg(&mut b_n), arg(&mut e_n), arg(&mut starts)];
            self.k.launch("moe_scan", (1, 1, 1), 1024, self.stream, &mut a)?;
            let mut a = [
                arg(&mut ids),
                arg(&mut rows),
                arg(&mut e_n),
                arg(&mut k_n),
                arg(&mut counts),
                arg(&mut index),
                arg(&mut ks),
                arg(&mut slots),
                arg(&mut pos),
            ];
            self.k.launch("moe_place", (blocks as u32, 1, 1), THREADS, self.stream, &mut a)
        }
    }

    /// Writes `starts` (host values, int32) to the device at `out`, by value in launches of
    /// [`STARTS_PER_LAUNCH`].
    ///
    /// # Safety
    /// `out` holds `starts.len()` int32 of the stream's context; the context is current.
    pub unsafe fn starts(&self, starts: &[i32], out: u64) -> Result<()> {
        for (c, chunk) in starts.chunks(STARTS_PER_LAUNCH).enumerate() {
            let mut s =
                Starts { count: chunk.len() as i32, first: (c * STARTS_PER_LAUNCH) as i32, v: [0; STARTS_PER_LAUNCH] };
            s.v[..chunk.len()].copy_from_slice(chunk);
            let mut out = out;
            let mut a = [arg(&mut s), arg(&mut out)];
            // SAFETY: moe_starts(MoeStarts by value, int*); `out` holds every start written.
            unsafe {
                self.k.launch(
                    "moe_starts",
                    (STARTS_PER_LAUNCH.div_ceil(THREADS as usize) as u32, 1, 1),
                    THREADS,
                    self.stream,
                    &mut a,
                )
            }?;
        }
        Ok(())
    }

    /// Copies `starts` (`[experts]` int32) into `out` clamped into range: non-decreasing
    /// within `[0, rows]`.
    ///
    /// # Safety
    /// Both hold `experts` int32 of the stream's context, apart; the context is current.
    pub unsafe fn clamp(&self, starts: u64, out: u64, (experts, rows): (usize, usize)) -> Result<()> {
        let (mut starts, mut out) = (starts, out);
        let [mut e_n, mut r_n] = [experts, rows].map(|v| v as i32);
        let mut a = [arg(&mut starts), arg(&mut out), arg(&mut e_n), arg(&mut r_n)];
        // SAFETY: moe_clamp's parameters in order; the buffers are the caller's contract.
        unsafe { self.k.launch("moe_clamp", (1, 1, 1), 32, self.stream, &mut a) }
    }

    /// The capacity layout of a routing: from the sorted `starts` `[E]`, `index`, `ks`,
    /// `slots`, `pos` and `ids` (`[R]` each), the padded `index`, `ks`, `slots`
    /// (`[E·cap]`, −1 on pad rows) and `pos` (`[R]`, −1 for a slot past its expert's `cap`).
    ///
    /// # Safety
    /// The buffers are device memory of the stream's context of those lengths (int32), the
    /// outputs apart from the inputs; `E·cap` and R fit an int32; the context is current.
    pub unsafe fn pad(
        &self,
        (rows, experts, cap): (usize, usize, usize),
        sorted: [u64; 6],
        out: [u64; 4],
    ) -> Result<()> {
        let [mut starts, mut index, mut ks, mut slots, mut pos, mut ids] = sorted;
        let [mut index_p, mut ks_p, mut slots_p, mut pos_p] = out;
        let [mut r_n, mut e_n, mut c_n] = [rows, experts, cap].map(|v| v as i32);
        let mut a = [
            arg(&mut starts),
            arg(&mut index),
            arg(&mut ks),
            arg(&mut slots),
            arg(&mut pos),
            arg(&mut ids),
            arg(&mut r_n),
            arg(&mut e_n),
            arg(&mut c_n),
            arg(&mut index_p),
            arg(&mut ks_p),
            arg(&mut slots_p),
            arg(&mut pos_p),
        ];
        let items = rows.max(experts * cap);
        // SAFETY: moe_pad's parameters in order; the buffers are the caller's contract.
        unsafe { self.k.launch("moe_pad", grid(items), THREADS, self.stream, &mut a) }
    }

    /// The combine `y[S, N]` from `o` `[o_rows, N]` (slot q's row at `rows[q]`, or q with
    /// `rows` 0; a negative row adds nothing) and the weights `w` `[S·k]` f32 (0: ones).
    ///
    /// # Safety
    /// The combine passed [`MoeCombine::validate`]; the buffers are device memory of the
    /// stream's context of those lengths, of `c.dtype` (w f32, rows int32), `o_rows` ≥ 1 (S·k
    /// without rows), `y` apart from the inputs; the context is current.
    pub unsafe fn combine(&self, c: &MoeCombine, [o, w, rows]: [u64; 3], o_rows: usize, y: u64) -> Result<()> {
        let (mut o, mut w, mut rows, mut y) = (o, w, rows, y);
        let [mut s_n, mut k_n, mut o_n] = [c.tokens, c.top_k, o_rows].map(|v| v as i32);
        let mut n = c.n as i64;
        let name = format!("moe_combine_{}", suffix(c.dtype));
        let mut a = [
            arg(&mut o),
            arg(&mut w),
            arg(&mut rows),
            arg(&mut y),
            arg(&mut s_n),
            arg(&mut k_n),
            arg(&mut n),
            arg(&mut o_n),
        ];
        // SAFETY: moe_combine's parameters in order; the buffers are the caller's contract.
        unsafe { self.k.launch(&name, grid(c.tokens.saturating_mul(c.n)), THREADS, self.stream, &mut a) }
    }

    /// The combine's backward: from `dy` `[S, N]`, `o` `[o_rows, N]` (rows as
    /// [`MoeKernels::combine`]'s), the weights and the router's ids `[S·k]`, writes `do`
    /// `[o_rows, N]` (the rows the slots name), `dw` `[S·k]` f32 and `dlogits` `[S, E]`.
    ///
    /// # Safety
    /// As [`MoeKernels::combine`]; no two slots name one row (`rows` non-zero: distinct where
    /// not negative); the outputs apart from everything else.
    pub unsafe fn combine_backward(
        &self,
        (c, experts, o_rows): (&MoeCombine, usize, usize),
        [dy, o, w, ids, rows]: [u64; 5],
        [d_o, dw, dlogits]: [u64; 3],
    ) -> Result<()> {
        let (mut dy, mut o, mut w, mut ids, mut rows) = (dy, o, w, ids, rows);
        let (mut d_o, mut dw, mut dl) = (d_o, dw, dlogits);
        let [mut k_n, mut e_n, mut o_n] = [c.top_k, experts, o_rows].map(|v| v as i32);
        let mut n = c.n as i64;
        let name = format!("moe_combine_bwd_{}", suffix(c.dtype));
        let mut a = [
            arg(&mut dy),
            arg(&mut o),
            arg(&mut w),
            arg(&mut ids),
            arg(&mut rows),
            arg(&mut d_o),
            arg(&mut dw),
            arg(&mut dl),
            arg(&mut k_n),
            arg(&mut n),
            arg(&mut e_n),
            arg(&mut o_n),
        ];
        // SAFETY: moe_combine_bwd's parameters in order, one 256-thread CTA per token.
        unsafe { self.k.launch(&name, (c.tokens as u32, 1, 1), THREADS, self.stream, &mut a) }
    }

    /// `out[r, ·] = in[index[r], ·]` for `rows` rows of `width` elements of `dtype`, each
    /// index clamped below `in_rows`, a negative one writing zeros.
    ///
    /// # Safety
    /// `index` holds `rows` int32, `in` `in_rows·width` elements (`in_rows` ≥ 1), `out`
    /// `rows·width`, all device memory of the stream's context, `out` apart from the inputs;
    /// the context is current.
    pub unsafe fn gather(
        &self,
        dtype: DType,
        [input, index, out]: [u64; 3],
        (rows, in_rows): (usize, usize),
        width: usize,
    ) -> Result<()> {
        let (mut input, mut index, mut out) = (input, index, out);
        let [mut r_n, mut in_n] = [rows, in_rows].map(|v| v as i32);
        let mut w = width as i64;
        let name = format!("moe_gather_{}", suffix(dtype));
        let mut a = [arg(&mut input), arg(&mut index), arg(&mut out), arg(&mut r_n), arg(&mut w), arg(&mut in_n)];
        // SAFETY: moe_gather's parameters in order; the buffers are the caller's contract.
        unsafe { self.k.launch(&name, grid(rows.saturating_mul(width)), THREADS, self.stream, &mut a) }
    }

    /// Zeros the rows of `out` (`[rows, width]` of `dtype`) whose `index` entry is negative.
    ///
    /// # Safety
    /// `index` holds `rows` int32, `out` `rows·width` elements, device memory of the stream's
    /// context, apart; the context is current.
    pub unsafe fn zero_rows(&self, dtype: DType, [index, out]: [u64; 2], (rows, width): (usize, usize)) -> Result<()> {
        let (mut index, mut out) = (index, out);
        let mut r_n = rows as i32;
        let mut w = width as i64;
        let name = format!("moe_zero_rows_{}", suffix(dtype));
        let mut a = [arg(&mut index), arg(&mut out), arg(&mut r_n), arg(&mut w)];
        // SAFETY: moe_zero_rows's parameters in order; the buffers are the caller's contract.
        unsafe { self.k.launch(&name, grid(rows.saturating_mul(width)), THREADS, self.stream, &mut a) }
    }
}
