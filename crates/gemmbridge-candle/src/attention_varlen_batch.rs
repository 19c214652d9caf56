//! The arguments of [`crate::sdpa_varlen`] that describe its batch: the mask ([`Causal`]), the
//! cumulative lengths ([`CuSeqlens`]), and the lengths checked on the host ([`Packing`]), which
//! both the served path ([`crate::attention_varlen_op`]) and candle's fallback read.

use candle_core::{DType, Result, Tensor};
use gemmbridge::attention::AttnMask;

/// Which keys a query row sees in [`crate::sdpa_varlen`], within its own sequence (a sequence of
/// `len_q` queries and `len_kv` keys; rows and keys counted from the sequence's start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Causal {
    /// Every key of the sequence.
    #[default]
    None,
    /// Query `i` sees keys `j ≤ i` (the diagonal from the top left: PyTorch's `is_causal`).
    TopLeft,
    /// Query `i` sees keys `j ≤ i + len_kv − len_q` (the diagonal ends at the bottom right: the
    /// last query sees every key, as in decoding or chunked prefill with a cache;
    /// FlashAttention's `causal`, PyTorch's `causal_lower_right`). Needs `len_q ≤ len_kv` in
    /// every sequence: otherwise the first rows see no key and have no defined value.
    BottomRight,
}

impl Causal {
    /// gemmbridge's mask.
    pub(crate) fn mask(self) -> AttnMask {
        match self {
            Causal::None => AttnMask::None,
            Causal::TopLeft => AttnMask::Causal,
            Causal::BottomRight => AttnMask::CausalBottomRight,
        }
    }

    /// Whether query `i` sees key `j` in a sequence of `lq` queries and `lkv` keys.
    pub(crate) fn visible(self, i: usize, j: usize, lq: usize, lkv: usize) -> bool {
        match self {
            Causal::None => true,
            Causal::TopLeft => j <= i,
            Causal::BottomRight => j + lq <= i + lkv,
        }
    }
}

/// Cumulative sequence lengths `[0, l₀, l₀ + l₁, …, total]` (`b + 1` values for `b`
/// sequences): on the host, or as candle's `u32` tensor `[b + 1]` (candle-flash-attn's
/// `seqlens_q` / `seqlens_k`). Made with `.into()` from `&Tensor`, `&[u32]`, `&Vec<u32>` or
/// `&[u32; N]`.
///
/// The lengths are needed on the host either way: every call checks them before anything is
/// launched (a bad length would make the GPU read out of bounds), lays the sequences out as a
/// padded batch from them and hands them to cuDNN. A tensor on a GPU is therefore read back
/// (`Tensor::to_vec1`), which waits for the work queued on its stream; host lengths cost no
/// synchronisation, so a training loop that knows its batch's lengths on the host (it packed
/// the batch) should pass them as such.
#[derive(Clone, Copy, Debug)]
pub enum CuSeqlens<'a> {
    /// Host values: no synchronisation.
    Host(&'a [u32]),
    /// A 1-D `u32` tensor on any device, read to the host by each call.
    Tensor(&'a Tensor),
}

impl<'a> From<&'a Tensor> for CuSeqlens<'a> {
    fn from(t: &'a Tensor) -> Self {
        CuSeqlens::Tensor(t)
    }
}

impl<'a> From<&'a [u32]> for CuSeqlens<'a> {
    fn from(v: &'a [u32]) -> Self {
        CuSeqlens::Host(v)
    }
}

impl<'a> From<&'a Vec<u32>> for CuSeqlens<'a> {
    fn from(v: &'a Vec<u32>) -> Self {
        CuSeqlens::Host(v)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for CuSeqlens<'a> {
    fn from(v: &'a [u32; N]) -> Self {
        CuSeqlens::Host(v)
    }
}

impl CuSeqlens<'_> {
    /// The values on the host (a tensor read back).
    fn host(self, which: &str) -> Result<Vec<u32>> {
        match self {
            CuSeqlens::Host(v) => Ok(v.to_vec()),
            CuSeqlens::Tensor(t) => {
                if t.dtype() != DType::U32 || t.rank() != 1 {
                    candle_core::bail!(
                        "sdpa_varlen: {which} is a {:?} tensor of shape {:?}, not u32 [b + 1]",
                        t.dtype(),
                        t.dims()
                    );
                }
                t.to_vec1::<u32>()
            }
        }
    }
}

/// The batch's checked lengths, on the host.
#[derive(Clone, Debug)]
pub(crate) struct Packing {
    /// Cumulative query lengths, `b + 1`.
    pub cu_q: Vec<u32>,
    /// Cumulative key/value lengths, `b + 1`.
    pub cu_kv: Vec<u32>,
    /// The bounds given, `max_seqlen_q` and `max_seqlen_kv`.
    pub max: [usize; 2],
}

impl Packing {
    /// Every rule of [`crate::sdpa_varlen`]'s errors, checked before anything runs.
    pub(crate) fn check(
        [q, k, v]: [&Tensor; 3],
        [sq, skv]: [CuSeqlens; 2],
        max: [usize; 2],
        mask: Causal,
        scale: Option<f32>,
    ) -> Result<Packing> {
        if let Some(s) = scale.filter(|s| !(s.is_finite() && *s > 0.0)) {
            candle_core::bail!("sdpa_varlen: scale = {s:?} is not finite and positive");
        }
        let shapes = (q.dims3(), k.dims3(), v.dims());
        let (Ok((total_q, h_q, d)), Ok((total_kv, h_kv, dk)), vd) = shapes else {
            candle_core::bail!(
                "sdpa_varlen: q {:?}, k {:?}, v {:?} are not [total_q, h_q, d], [total_kv, h_kv, d] twice",
                q.dims(),
                k.dims(),
                v.dims()
            )
        };
        if vd != k.dims() || dk != d {
            candle_core::bail!("sdpa_varlen: q {:?}, k {:?}, v {:?} disagree", q.dims(), k.dims(), vd);
        }
        if h_kv == 0 || h_q % h_kv != 0 {
            candle_core::bail!("sdpa_varlen: {h_q} query heads are not a multiple of {h_kv} key/value heads");
        }
        if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
            candle_core::bail!("sdpa_varlen: q, k, v are {:?}, {:?}, {:?}", q.dtype(), k.dtype(), v.dtype());
        }
        let cu_q = cumulative(sq.host("seqlens_q")?, "seqlens_q", total_q)?;
        let cu_kv = cumulative(skv.host("seqlens_kv")?, "seqlens_kv", total_kv)?;
        if cu_q.len() != cu_kv.len() {
            candle_core::bail!(
                "sdpa_varlen: seqlens_q has {} values and seqlens_kv {}: not the same b + 1",
                cu_q.len(),
                cu_kv.len()
            );
        }
        let pk = Packing { cu_q, cu_kv, max };
        pk.check_sequences(mask)?;
        Ok(pk)
    }

    /// Each sequence within its bounds, and with keys for every query row under `mask`.
    fn check_sequences(&self, mask: Causal) -> Result<()> {
        for n in 0..self.b() {
            let (lq, lkv) = self.lens(n);
            for (name, l, max) in [("q", lq, self.max[0]), ("kv", lkv, self.max[1])] {
                if l > max {
                    candle_core::bail!(
                        "sdpa_varlen: sequence {n} has {l} {name} rows, more than max_seqlen_{name} = {max}"
                    );
                }
            }
            if lq > 0 && lkv == 0 {
                candle_core::bail!("sdpa_varlen: sequence {n} has {lq} query rows and no keys");
            }
            if mask == Causal::BottomRight && lq > lkv {
                candle_core::bail!(
                    "sdpa_varlen: sequence {n} has {lq} query rows and {lkv} keys: the bottom-right causal mask \
                     leaves its first {} rows without keys",
                    lq - lkv
                );
            }
        }
        Ok(())
    }

    /// The number of sequences.
    pub fn b(&self) -> usize {
        self.cu_q.len() - 1
    }

    /// Sequence `n`'s `(len_q, len_kv)`.
    pub fn lens(&self, n: usize) -> (usize, usize) {
        let len = |cu: &[u32]| (cu[n + 1] - cu[n]) as usize;
        (len(&self.cu_q), len(&self.cu_kv))
    }
}

/// `cu` checked as cumulative lengths of `rows` rows: at least one value, the first 0, none
/// below the one before, the last `rows`.
fn cumulative(cu: Vec<u32>, name: &str, rows: usize) -> Result<Vec<u32>> {
    match (cu.first(), cu.last()) {
        (None, _) => candle_core::bail!("sdpa_varlen: {name} is empty, not b + 1 cumulative lengths"),
        (Some(&first), _) if first != 0 => {
            candle_core::bail!("sdpa_varlen: {name} starts at {first}, not 0")
        }
        (_, Some(&last)) if last as usize != rows => {
            candle_core::bail!("sdpa_varlen: {name} ends at {last}, not at the tensor's {rows} rows")
        }
        _ => {}
    }
    if let Some(n) = (1..cu.len()).find(|&n| cu[n] < cu[n - 1]) {
        candle_core::bail!("sdpa_varlen: {name} decreases at {n} ({} after {})", cu[n], cu[n - 1]);
    }
    Ok(cu)
}
