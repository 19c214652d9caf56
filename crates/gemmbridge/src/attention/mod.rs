//! Scaled-dot-product attention as data: [`Attention`] (PyTorch's
//! `F.scaled_dot_product_attention` without dropout), its tensors' strides ([`HeadLayout`]),
//! its masks ([`AttnMask`]) and every rule a problem must meet, checked on the CPU before
//! anything is launched. The module [`self::reference`] holds the float64 definitions of the
//! forward and the backward that tests check against; [`self::fp8`] the CPU emulation of FP8
//! attention (E4M3 q, k, v with tensor-wise scales); [`check_packed`] the rule under which
//! q, k, v (or their gradients) interleaved in one fused buffer share no element.
//!
//! Shapes, in PyTorch's names (logical order `[b, h, s, d]` whatever the strides):
//! - queries `q[b, h_q, s_q, d]`, keys `k[b, h_kv, s_kv, d]`, values `v[b, h_kv, s_kv, d]`;
//! - output `o[b, h_q, s_q, d]`; the softmax statistics `lse[b, h_q, s_q]` (f32, dense);
//! - gradients `dq`, `dk`, `dv`, `do` shaped (and strided) as `q`, `k`, `v`, `o`.
//!
//! Query head `hq` reads key/value head `hq / (h_q / h_kv)`: `h_kv = h_q` is multi-head,
//! `h_kv = 1` multi-query, anything between grouped-query attention (GQA).
//!
//! For batch entry `n`, query head `hq`, query row `i`:
//! `score[j] = scale · Σ_e q[n, hq, i, e] · k[n, hk, j, e]` over the visible keys `j`
//! ([`AttnMask`] and, with per-sequence lengths, `j < len_kv[n]`);
//! `lse[n, hq, i] = ln Σ_j exp(score[j])` (the natural-log log-sum-exp, what the backward needs);
//! `o[n, hq, i, e] = Σ_j exp(score[j] − lse) · v[n, hk, j, e]`.
//! A row with no visible key (possible only with the bottom-right causal mask when
//! `len_kv < len_q`) has `o = 0` and `lse = −∞` here; the GPU path refuses such problems
//! (cuDNN's engines give those rows no defined value: [`crate::Error::AttentionShape`]). With
//! per-sequence lengths, rows `i ≥ len_q[n]` are padding: nothing defines them.
//!
//! The backward, from `do`, `o` and `lse` (with `P = exp(score − lse)`, `D_i = Σ_e do·o`):
//! `dv = Pᵀ·do`, `dS = P ∘ (do·vᵀ − D)`, `dq = scale·dS·k`, `dk = scale·dSᵀ·q`; with GQA,
//! `dk` and `dv` are summed over the query heads that share a key/value head.
//!
//! # What a problem may be
//! f16 or bf16 with an f32 softmax, head dimensions that are multiples of 8 up to
//! [`MAX_HEAD_DIM`], scale `1/√d` unless set ([`Attention::with_scale`]), no dropout. Strides
//! per tensor ([`HeadLayout`]): BSHD (the default), BHSD ([`Attention::bhsd`]), or views into
//! one fused QKV projection's output `[b, s, 3, h, d]`, read in place
//! ([`HeadLayout::packed_qkv`]; q, k and v start [`HeadLayout::packed_qkv_offset`] elements in).
//! Masks: none, causal ([`AttnMask::Causal`], PyTorch's `is_causal`: the diagonal from the top
//! left) and bottom-right causal ([`AttnMask::CausalBottomRight`], as in decoding with a cache).
//! Variable-length batches: [`Attention::with_var_len`] and the lengths with each call — on the
//! GPU `SeqLens::host(&len_q, &len_kv)` (checked, then copied in stream order) or, capturable
//! and without a host copy, `unsafe { SeqLens::device(..) }` (the caller vouches for the
//! values); no mask tensor is made and padded rows cost nothing.
//!
//! ```no_run
//! use gemmbridge::attention::{AttnMask, AttnTensor, Attention};
//! use gemmbridge::cuda::{AttnSaved, Gpu, SeqLens};
//! use gemmbridge::half::bf16;
//! use gemmbridge::DType;
//!
//! let gpu = Gpu::new(0)?;
//! // a padded batch of 2 sequences of up to 4096 tokens, grouped-query heads 32/8, d = 128
//! let p = Attention::new(2, (32, 8), (4096, 4096), 128, DType::BF16).with_mask(AttnMask::Causal).with_var_len(true);
//! let (len_q, len_kv) = ([4096, 1500], [4096, 1500]);
//! let s = gpu.stream();
//! let buf = |t: AttnTensor| s.alloc_zeros::<bf16>(p.required_elems(t));
//! let (q, k, v) = (buf(AttnTensor::Q)?, buf(AttnTensor::K)?, buf(AttnTensor::V)?);
//! let (mut o, d_o) = (buf(AttnTensor::O)?, buf(AttnTensor::O)?); // d_o: the loss's gradient
//! let mut lse = s.alloc_zeros::<f32>(p.stats_elems())?; // softmax statistics, for the backward
//! gpu.attention().forward(&p, [&q, &k, &v], &mut o, Some(&mut lse), Some(SeqLens::host(&len_q, &len_kv)))?;
//! let (mut dq, mut dk, mut dv) = (buf(AttnTensor::Q)?, buf(AttnTensor::K)?, buf(AttnTensor::V)?);
//! let saved = AttnSaved { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, stats: &lse };
//! gpu.attention().backward(&p, saved, &mut dq, &mut dk, &mut dv, Some(SeqLens::host(&len_q, &len_kv)))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # On cuDNN
//! One operation graph per problem in the pattern cuDNN's fused flash-attention engines
//! recognise, an execution plan made on the first call and kept (later calls only launch and
//! can be captured into a CUDA graph; `Plans::attention` names the engine). Every rule is
//! checked before anything runs ([`crate::Error::AttentionShape`],
//! [`crate::Error::BufferTooSmall`], [`crate::Error::Misaligned`]: every address 16-byte
//! aligned). A bottom-right mask that would leave a query row without keys (`s_kv < s_q`, or a
//! sequence's `len_kv < len_q`) is refused on the GPU: cuDNN's engines define no value for such
//! rows. On cuDNN before 9.15.1 the backward of key lengths that are not a multiple of 128 runs
//! with a padding mask of the full lengths, which avoids that version's bug (cuDNN's release
//! notes). A measured search over cuDNN's configurations can be switched on per engine; its
//! choice goes into the tactic database (`Plans::attention_tactic`, kind `attention`).
//!
//! Without a GPU, [`crate::cpu::attention_forward`] and [`crate::cpu::attention_backward`]
//! compute the same on host slices (f32 products through the CPU GEMM, the same strides, masks,
//! grouped heads and lengths; the full score matrix per head, so for short sequences and
//! tests). Unlike the GPU they take a bottom-right mask that leaves rows without keys, which get
//! `o = 0` and `lse = −∞`.
//!
//! # FP8 (Hopper)
//! `GpuAttention::quantize(&p, AttnTensor::Q, &q)` (and k, v) makes E4M3 tensors with one scale
//! each on the GPU (the tensors dense, BSHD or BHSD, `d` and every stride multiples of 16);
//! `GpuAttention::fp8_output(&p)` makes the output; `GpuAttention::forward_fp8` runs cuDNN's
//! FP8 attention graph, every scale read on the device. On Hopper cuDNN writes an FP8
//! attention's output only in FP8: `o` is E4M3, the matrix `[b·s_q, h_q·d]` (BSHD) ready for an
//! FP8 GEMM such as the output projection, with a fixed scale of twice v's (o cannot exceed v's
//! largest value; up to 400 000 keys). The backward (`GpuAttention::quantize_grad` for do,
//! `GpuAttention::fp8_grads`, `GpuAttention::backward_fp8` with `AttnSavedFp8`) runs cuDNN's FP8
//! backward graph with dS's and the gradients' scales made on the device from the inputs'
//! scales ([`fp8::backward_scales`] derives them); gradients are E5M2 (under those scales E4M3 would lose
//! dk to underflow, so it is refused). On Hopper cuDNN offers it for `d` = 128 only, without the
//! bottom-right mask; gemmbridge refuses the causal mask there (cuDNN's FP8 backward kernel is
//! about twice as slow as its bf16 one, `GpuAttention::backward_fp8`), and takes query rows and keys that are multiples of 64 (at 7 or
//! 65, dq came out wrong on cuDNN 9.14 and 9.19); decoding (one query row) has no FP8 engine in
//! cuDNN 9.19. Anything else is [`crate::Error::Unsupported`].

pub mod fp8;
mod fp8_bwd;
mod packed;
pub mod reference;

pub use packed::check_packed;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The largest head dimension a problem may have: cuDNN's fused attention engines take head
/// dimensions up to 256 (cuDNN's developer guide, "Scaled Dot Product Attention"); where a
/// loaded library has no engine for a head dimension, the GPU path says so
/// ([`crate::Error::Unsupported`] naming the cuDNN version) before anything runs.
pub const MAX_HEAD_DIM: usize = 256;

/// The largest size, stride or element count cuDNN's tensor descriptors take (`int64_t`
/// strides, but every engine indexes in 32 bits within a tensor).
pub const MAX_ELEMS: usize = i32::MAX as usize;

/// One of the problem's tensors (for layouts and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnTensor {
    /// Queries `q` (and `dq`).
    Q,
    /// Keys `k` (and `dk`).
    K,
    /// Values `v` (and `dv`).
    V,
    /// Output `o` (and `do`).
    O,
}

impl AttnTensor {
    /// `q`, `k`, `v` or `o`.
    pub const fn name(self) -> &'static str {
        match self {
            AttnTensor::Q => "q",
            AttnTensor::K => "k",
            AttnTensor::V => "v",
            AttnTensor::O => "o",
        }
    }
}

/// Where element `[n, h, s, e]` of a `[b, heads, seq, d]` tensor lives: at
/// `n·batch + h·head + s·seq + e` elements from its start (the head dimension is always
/// contiguous, as cuDNN's engines need). Strides in elements; the constructors saturate at
/// `usize::MAX` for sizes no buffer can have ([`Attention::validate`] refuses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadLayout {
    /// Elements from one batch entry to the next.
    pub batch: usize,
    /// Elements from one head to the next.
    pub head: usize,
    /// Elements from one row (query or key position) to the next.
    pub seq: usize,
}

impl HeadLayout {
    /// `[b, s, h, d]` contiguous: a projection's output reshaped to heads, no copy (also
    /// PyTorch's `q.transpose(1, 2)` of a `[b, s, h, d]` tensor).
    pub const fn bshd(seq: usize, heads: usize, d: usize) -> HeadLayout {
        let row = heads.saturating_mul(d);
        HeadLayout { batch: seq.saturating_mul(row), head: d, seq: row }
    }

    /// `[b, h, s, d]` contiguous (PyTorch's default for `[b, h, s, d]` tensors).
    pub const fn bhsd(seq: usize, heads: usize, d: usize) -> HeadLayout {
        let head = seq.saturating_mul(d);
        HeadLayout { batch: heads.saturating_mul(head), head, seq: d }
    }

    /// One of q, k, v in a fused projection's output `[b, s, 3, h, d]` (q, k, v one after the
    /// other in each row, `h` heads each, as `x·w_qkvᵀ` gives them): strides of the view, whose
    /// start is `which · h·d` elements into the buffer ([`HeadLayout::packed_qkv_offset`]).
    pub const fn packed_qkv(seq: usize, heads: usize, d: usize) -> HeadLayout {
        let row = heads.saturating_mul(d).saturating_mul(3);
        HeadLayout { batch: seq.saturating_mul(row), head: d, seq: row }
    }

    /// Where q (0), k (1) or v (2) starts in a packed `[b, s, 3, h, d]` buffer, in elements.
    pub const fn packed_qkv_offset(which: usize, heads: usize, d: usize) -> usize {
        which.saturating_mul(heads).saturating_mul(d)
    }
}

/// Which keys a query row sees, besides the sequence lengths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnMask {
    /// Every key.
    #[default]
    None,
    /// Row `i` sees keys `j ≤ i` (PyTorch's `is_causal=True`: the diagonal starts at the top
    /// left).
    Causal,
    /// Row `i` sees keys `j ≤ i + len_kv − len_q` (the diagonal ends at the bottom right: the
    /// last query sees every key, as in decoding with a cache; PyTorch's
    /// `causal_lower_right`). With per-sequence lengths the offset is each sequence's own.
    CausalBottomRight,
}

/// One attention problem (see the module documentation for shapes and the definition).
///
/// The fields are public to be read; [`Attention::new`] derives the strides and the default
/// scale from the sizes, so a problem with other sizes is made with `new` again (changing `d`
/// or a head count in place keeps the old strides and scale, which [`Attention::validate`]
/// then judges as given).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    /// Batch size.
    pub b: usize,
    /// Query heads (and output heads).
    pub h_q: usize,
    /// Key/value heads; `h_q` is a multiple of it.
    pub h_kv: usize,
    /// Query rows per sequence (the tensors' extent; per-sequence lengths may be shorter).
    pub s_q: usize,
    /// Key/value rows per sequence.
    pub s_kv: usize,
    /// Head dimension (of q, k, v and o alike).
    pub d: usize,
    /// The factor on `q·kᵀ`; default `1/√d`.
    pub scale: f32,
    /// Which keys each query row sees.
    pub mask: AttnMask,
    /// Whether per-sequence lengths (`len_q[b]`, `len_kv[b]`, `i32` on the device) come with
    /// each call: a padded batch of variable-length sequences, without a mask tensor.
    pub var_len: bool,
    /// The tensors' element type: [`DType::F16`] or [`DType::BF16`] (f32 softmax and
    /// accumulation).
    pub dtype: DType,
    /// Strides of q, k, v, o (in that order; the gradients share them).
    pub layouts: [HeadLayout; 4],
}

impl Attention {
    /// `b` sequences of `h_q` query heads and `h_kv` key/value heads, `s_q` queries and `s_kv`
    /// keys each, head dimension `d`, in BSHD (every tensor `[b, s, h, d]` contiguous), scale
    /// `1/√d`, no mask, no per-sequence lengths.
    pub fn new(b: usize, (h_q, h_kv): (usize, usize), (s_q, s_kv): (usize, usize), d: usize, dtype: DType) -> Self {
        let layouts = [
            HeadLayout::bshd(s_q, h_q, d),
            HeadLayout::bshd(s_kv, h_kv, d),
            HeadLayout::bshd(s_kv, h_kv, d),
            HeadLayout::bshd(s_q, h_q, d),
        ];
        let scale = if d == 0 { 1.0 } else { (1.0 / (d as f64).sqrt()) as f32 };
        Attention { b, h_q, h_kv, s_q, s_kv, d, scale, mask: AttnMask::None, var_len: false, dtype, layouts }
    }

    /// The same with every tensor `[b, h, s, d]` contiguous.
    #[must_use]
    pub fn bhsd(self) -> Self {
        let (q, kv) = (HeadLayout::bhsd(self.s_q, self.h_q, self.d), HeadLayout::bhsd(self.s_kv, self.h_kv, self.d));
        Attention { layouts: [q, kv, kv, q], ..self }
    }

    /// The same with `tensor`'s strides replaced.
    #[must_use]
    pub fn with_layout(mut self, tensor: AttnTensor, layout: HeadLayout) -> Self {
        self.layouts[tensor as usize] = layout;
        self
    }

    /// The same with `mask`.
    #[must_use]
    pub fn with_mask(self, mask: AttnMask) -> Self {
        Attention { mask, ..self }
    }

    /// The same with `scale`.
    #[must_use]
    pub fn with_scale(self, scale: f32) -> Self {
        Attention { scale, ..self }
    }

    /// The same with (or without) per-sequence lengths.
    #[must_use]
    pub fn with_var_len(self, var_len: bool) -> Self {
        Attention { var_len, ..self }
    }

    /// `[b, heads, seq]` of a tensor.
    pub fn dims(&self, t: AttnTensor) -> [usize; 3] {
        match t {
            AttnTensor::Q | AttnTensor::O => [self.b, self.h_q, self.s_q],
            AttnTensor::K | AttnTensor::V => [self.b, self.h_kv, self.s_kv],
        }
    }

    /// A tensor's strides.
    pub fn layout(&self, t: AttnTensor) -> HeadLayout {
        self.layouts[t as usize]
    }

    /// Elements a buffer of tensor `t` must hold: one past its last element (saturating at
    /// `usize::MAX` for a problem [`Attention::validate`] refuses).
    pub fn required_elems(&self, t: AttnTensor) -> usize {
        let [b, h, s] = self.dims(t);
        let l = self.layout(t);
        if b == 0 || h == 0 || s == 0 || self.d == 0 {
            return 0;
        }
        let last = [(b - 1, l.batch), (h - 1, l.head), (s - 1, l.seq), (self.d - 1, 1)]
            .iter()
            .try_fold(0usize, |acc, &(i, st)| acc.checked_add(i.checked_mul(st)?));
        last.and_then(|x| x.checked_add(1)).unwrap_or(usize::MAX)
    }

    /// Elements of the statistics `lse[b, h_q, s_q]` (dense, f32).
    pub fn stats_elems(&self) -> usize {
        self.b.saturating_mul(self.h_q).saturating_mul(self.s_q)
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.h_q / self.h_kv.max(1)
    }

    /// Floating-point operations of the forward as PyTorch's and FlashAttention's benchmarks
    /// count them: `4·b·h_q·s_q·s_kv·d`, halved under a causal mask (square problems'
    /// convention); the backward counts 2.5× the forward.
    pub fn forward_flops(&self) -> f64 {
        self.forward_flops_with(None)
    }

    /// [`Attention::forward_flops`] with per-sequence lengths `(len_q, len_kv)`: each sequence
    /// counts `4·h_q·len_q·len_kv·d` (halved under a causal mask) instead of the extents'.
    pub fn forward_flops_with(&self, lens: Option<(&[i32], &[i32])>) -> f64 {
        let pairs: f64 = match lens {
            Some((q, kv)) => q.iter().zip(kv).map(|(&a, &b)| a as f64 * b as f64).sum(),
            None => self.b as f64 * self.s_q as f64 * self.s_kv as f64,
        };
        let full = 4.0 * self.h_q as f64 * self.d as f64 * pairs;
        if self.mask == AttnMask::None {
            full
        } else {
            full / 2.0
        }
    }

    /// A short description: `b2 h8/2 s129/129 d64 bf16 causal var_len`.
    pub fn describe(&self) -> String {
        let mask = match self.mask {
            AttnMask::None => "",
            AttnMask::Causal => " causal",
            AttnMask::CausalBottomRight => " causal_bottom_right",
        };
        format!(
            "b{} h{}/{} s{}/{} d{} {}{mask}{}",
            self.b,
            self.h_q,
            self.h_kv,
            self.s_q,
            self.s_kv,
            self.d,
            self.dtype,
            if self.var_len { " var_len" } else { "" }
        )
    }

    /// Checks every rule of the problem (nothing is launched):
    /// - every size at least 1 and at most [`MAX_ELEMS`];
    /// - `h_q` a multiple of `h_kv`;
    /// - `d` a multiple of 8 (16-byte rows of half-precision elements), at most
    ///   [`MAX_HEAD_DIM`];
    /// - `dtype` f16 or bf16;
    /// - `scale` finite and positive;
    /// - each tensor's strides multiples of 8 elements (16-byte aligned rows, which cuDNN's
    ///   engines need), no two of its elements at one address, and its span at most
    ///   [`MAX_ELEMS`].
    ///
    /// # Errors
    /// [`Error::AttentionShape`] naming the rule and the values that break it.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::AttentionShape { what, detail });
        for (name, v) in [
            ("b", self.b),
            ("h_q", self.h_q),
            ("h_kv", self.h_kv),
            ("s_q", self.s_q),
            ("s_kv", self.s_kv),
            ("d", self.d),
        ] {
            if v == 0 {
                return bad("a size is zero", format!("{name} = 0 ({})", self.describe()));
            }
            if v > MAX_ELEMS {
                return bad("a size is too large", format!("{name} = {v} > {MAX_ELEMS} ({})", self.describe()));
            }
        }
        if !self.h_q.is_multiple_of(self.h_kv) {
            return bad(
                "query heads are not a multiple of the key/value heads",
                format!("h_q = {}, h_kv = {} ({})", self.h_q, self.h_kv, self.describe()),
            );
        }
        if !self.d.is_multiple_of(8) || self.d > MAX_HEAD_DIM {
            return bad(
                "the head dimension is not a multiple of 8 up to 256",
                format!("d = {} ({})", self.d, self.describe()),
            );
        }
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return bad("the element type is not f16 or bf16", format!("{} ({})", self.dtype, self.describe()));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return bad(
                "the scale is not finite and positive",
                format!("scale = {} ({})", self.scale, self.describe()),
            );
        }
        for t in [AttnTensor::Q, AttnTensor::K, AttnTensor::V, AttnTensor::O] {
            self.check_layout(t)?;
        }
        Ok(())
    }

    /// The layout rules of [`Attention::validate`] for one tensor.
    fn check_layout(&self, t: AttnTensor) -> Result<()> {
        let l = self.layout(t);
        let [b, h, s] = self.dims(t);
        let what =
            || format!("{} strides batch {}, head {}, seq {} ({})", t.name(), l.batch, l.head, l.seq, self.describe());
        let bad = |rule: &'static str| Err(Error::AttentionShape { what: rule, detail: what() });
        if self.required_elems(t) > MAX_ELEMS {
            return bad("a tensor spans more than 2³¹ − 1 elements");
        }
        if [l.batch, l.head, l.seq].iter().any(|st| !st.is_multiple_of(8)) {
            return bad("a stride is not a multiple of 8 elements (16 bytes)");
        }
        // no overlap: in stride order, each dimension (of extent > 1) starts past the whole
        // span of the ones below it
        let mut dims: Vec<(usize, usize)> =
            [(l.batch, b), (l.head, h), (l.seq, s), (1, self.d)].into_iter().filter(|&(_, n)| n > 1).collect();
        dims.sort_unstable();
        let mut span = 1usize;
        for (stride, n) in dims {
            if stride < span {
                return bad("two elements of a tensor share an address");
            }
            span = stride.saturating_mul(n);
        }
        Ok(())
    }

    /// Checks per-sequence lengths against the problem: `b` of each, every `len_q` in
    /// `1..=s_q` and every `len_kv` in `1..=s_kv` (cuDNN's padding mask reads them on the device;
    /// the GPU path checks a host copy before launching, so a bad length is an error, never a
    /// read out of bounds).
    ///
    /// # Errors
    /// [`Error::AttentionShape`] naming the sequence and the length.
    pub fn check_lengths(&self, len_q: &[i32], len_kv: &[i32]) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::AttentionShape { what, detail });
        if !self.var_len {
            return bad("lengths given to a problem without per-sequence lengths", self.describe());
        }
        for (name, lens, max) in [("len_q", len_q, self.s_q), ("len_kv", len_kv, self.s_kv)] {
            if lens.len() != self.b {
                return bad(
                    "there is not one length per sequence",
                    format!("{name} has {} length(s) for b = {} ({})", lens.len(), self.b, self.describe()),
                );
            }
            if let Some((n, &l)) = lens.iter().enumerate().find(|&(_, &l)| l < 1 || l as usize > max) {
                return bad(
                    "a sequence length is outside 1 to the tensor's extent",
                    format!("{name}[{n}] = {l}, extent {max} ({})", self.describe()),
                );
            }
        }
        Ok(())
    }

    /// Element index of `[n, h, s, e]` in tensor `t`.
    pub fn index(&self, t: AttnTensor, [n, h, s, e]: [usize; 4]) -> usize {
        let l = self.layout(t);
        n * l.batch + h * l.head + s * l.seq + e
    }

    /// Every element `[n, h, s, e]` of tensor `t`, in logical order.
    pub fn elements(&self, t: AttnTensor) -> impl Iterator<Item = [usize; 4]> {
        let ([b, h, s], d) = (self.dims(t), self.d);
        (0..b)
            .flat_map(move |n| (0..h).flat_map(move |hh| (0..s).flat_map(move |r| (0..d).map(move |e| [n, hh, r, e]))))
    }
}

#[cfg(test)]
mod tests;
