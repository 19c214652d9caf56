//! RoPE as data: [`Rope`] (the fused QKV buffer's shape, the pairs, the angles), its rules, and
//! where each pair and angle of a call comes from (the module documentation of
//! [`crate::layer_ops`] gives the definition).

use super::{arith, bad, MAX_ELEM_BYTES, MAX_POSITION, MAX_ROTARY_DIM, MAX_SIZE};
use crate::error::{Error, Result};

/// Which elements of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pair `i` is `(x[i], x[i + r/2])`: LLaMA's and GPT-NeoX's `rotate_half`.
    #[default]
    RotateHalf,
    /// Pair `i` is `(x[2i], x[2i + 1])`: GPT-J's interleaved pairs (`rotate_every_two`).
    Interleaved,
}

impl RopeStyle {
    /// `rotate-half` or `interleaved`.
    pub const fn name(self) -> &'static str {
        match self {
            RopeStyle::RotateHalf => "rotate-half",
            RopeStyle::Interleaved => "interleaved",
        }
    }
}

/// LLaMA 3's frequency scaling (Meta's `apply_scaling`, Hugging Face's `rope_type =
/// "llama3"`): with wavelength `λ_i = 2π/inv_freq_i`, `L = original_max_position`,
/// frequencies with `λ_i < L/high_freq_factor` are kept, those with `λ_i > L/low_freq_factor`
/// divided by `factor`, and those between blended: `s = (L/λ_i − low_freq_factor) /
/// (high_freq_factor − low_freq_factor)`, `inv_freq_i ← (1 − s)·inv_freq_i/factor +
/// s·inv_freq_i`. LLaMA 3.1: factor 8, low 1, high 4, L = 8192.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// The divisor of the low frequencies, at least 1.
    pub factor: f64,
    /// Wavelengths above `L / low_freq_factor` are divided by `factor` in full.
    pub low_freq_factor: f64,
    /// Wavelengths below `L / high_freq_factor` are kept as they are.
    pub high_freq_factor: f64,
    /// The context length `L` the model was pretrained with.
    pub original_max_position: usize,
}

impl Llama3Scaling {
    /// LLaMA 3.1's (and 3.2's, 3.3's) values: factor 8, low 1, high 4, L = 8192.
    pub const LLAMA_3_1: Llama3Scaling =
        Llama3Scaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 8192 };
}

/// Where the rotation angles come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeAngles {
    /// `θ_i(p) = p·inv_freq_i`, `inv_freq_i = θ^(−2i/r)` (then LLaMA 3's scaling, when
    /// given), computed as [`arith::inv_freqs`] and [`arith::cos_sin`] say. Positions lie in
    /// `0..`[`MAX_POSITION`].
    Theta {
        /// The base θ (LLaMA 2: 10 000; LLaMA 3: 500 000); finite, at least 1.
        theta: f64,
        /// LLaMA 3's frequency scaling, if any.
        llama3: Option<Llama3Scaling>,
    },
    /// The caller's f32 tables `cos[max_pos, r/2]` and `sin[max_pos, r/2]` (row `p` holds
    /// position `p`'s values, `r/2` apart), given with each call ([`RopeTables`]); positions
    /// lie in `0..max_pos`.
    Tables {
        /// Rows of each table.
        max_pos: usize,
    },
}

/// The rotation's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeDirection {
    /// Rotate q and k by `+θ_i(p)`.
    Forward,
    /// Rotate dq and dk by `−θ_i(p)`: the gradient of the forward (sines negated, exactly).
    Backward,
}

/// The positions of a call's tokens: `P` is `&[i32]` on the CPU and a device buffer
/// (`&dyn cudarc::driver::DevicePtr<i32>`) on the GPU.
#[derive(Clone, Copy, Debug)]
pub enum Positions<P> {
    /// Token `t` of every sequence is at position `start + t` (training, prefill, or a batch
    /// of decodes at one offset).
    Contiguous {
        /// The first token's position.
        start: usize,
    },
    /// One `i32` per token, `[b, s]` contiguous (packed variable-length batches, decoding with
    /// per-sequence offsets).
    Given(P),
}

/// The caller's cosine and sine tables, `[max_pos, r/2]` f32 each ([`RopeAngles::Tables`]):
/// `B` is `&[f32]` on the CPU and a device buffer on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct RopeTables<B> {
    /// `cos[p, i]`.
    pub cos: B,
    /// `sin[p, i]`.
    pub sin: B,
}

/// One RoPE problem: the fused QKV buffer's shape and the rotation (see the module
/// documentation). Made with [`Rope::new`] and the `with_` methods; fields public to be read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key heads (and value heads).
    pub heads_kv: usize,
    /// Elements per head, `d`.
    pub head_dim: usize,
    /// Rotated elements per head, `r` (even, `2 ≤ r ≤ d`, at most [`MAX_ROTARY_DIM`]); the
    /// rest of each head is left as it is (partial rotary).
    pub rotary_dim: usize,
    /// Which elements form the pairs.
    pub style: RopeStyle,
    /// Where the angles come from.
    pub angles: RopeAngles,
    /// Elements from one token's row to the next, at least [`Rope::width`].
    pub ld: usize,
}

impl Rope {
    /// `batch` sequences of `seq` tokens, `heads_q` query and `heads_kv` key/value heads of
    /// `head_dim` elements, rows contiguous; every element of q and k rotated
    /// ([`RopeStyle::RotateHalf`], θ = 10 000, no scaling). Not checked here (problems are
    /// data): [`Rope::validate`] and every call check it.
    pub fn new(batch: usize, seq: usize, (heads_q, heads_kv): (usize, usize), head_dim: usize) -> Rope {
        let width = heads_q.saturating_add(heads_kv.saturating_mul(2)).saturating_mul(head_dim);
        Rope {
            batch,
            seq,
            heads_q,
            heads_kv,
            head_dim,
            rotary_dim: head_dim,
            style: RopeStyle::RotateHalf,
            angles: RopeAngles::Theta { theta: 10_000.0, llama3: None },
            ld: width,
        }
    }

    /// The same rotating only the first `rotary_dim` elements of each head.
    #[must_use]
    pub fn with_rotary_dim(self, rotary_dim: usize) -> Rope {
        Rope { rotary_dim, ..self }
    }

    /// The same with `style`.
    #[must_use]
    pub fn with_style(self, style: RopeStyle) -> Rope {
        Rope { style, ..self }
    }

    /// The same with angles from base `theta` and, optionally, LLaMA 3's scaling.
    #[must_use]
    pub fn with_theta(self, theta: f64, llama3: Option<Llama3Scaling>) -> Rope {
        Rope { angles: RopeAngles::Theta { theta, llama3 }, ..self }
    }

    /// The same with angles from the caller's tables of `max_pos` rows.
    #[must_use]
    pub fn with_tables(self, max_pos: usize) -> Rope {
        Rope { angles: RopeAngles::Tables { max_pos }, ..self }
    }

    /// The same with rows `ld` elements apart.
    #[must_use]
    pub fn with_ld(self, ld: usize) -> Rope {
        Rope { ld, ..self }
    }

    /// Elements of one token's heads, `(h_q + 2·h_kv)·d` (saturating).
    pub fn width(&self) -> usize {
        self.heads_q.saturating_add(self.heads_kv.saturating_mul(2)).saturating_mul(self.head_dim)
    }

    /// Tokens, `b·s` (saturating).
    pub fn tokens(&self) -> usize {
        self.batch.saturating_mul(self.seq)
    }

    /// Elements the `qkv` buffer must hold: `(b·s − 1)·ld + width` (0 without tokens;
    /// saturating).
    pub fn qkv_elems(&self) -> usize {
        match self.tokens() {
            0 => 0,
            t => (t - 1).saturating_mul(self.ld).saturating_add(self.width()),
        }
    }

    /// Elements each table must hold: `max_pos·r/2` (0 for angles from θ; saturating).
    pub fn table_elems(&self) -> usize {
        match self.angles {
            RopeAngles::Tables { max_pos } => max_pos.saturating_mul(self.rotary_dim / 2),
            RopeAngles::Theta { .. } => 0,
        }
    }

    /// Positions lie in `0..position_limit()`: [`MAX_POSITION`] for angles from θ, the tables'
    /// rows otherwise.
    pub fn position_limit(&self) -> usize {
        match self.angles {
            RopeAngles::Theta { .. } => MAX_POSITION,
            RopeAngles::Tables { max_pos } => max_pos,
        }
    }

    /// Bytes one call reads and writes with `elem`-byte elements: every rotated element of q
    /// and k once each way, `2·b·s·(h_q + h_kv)·r·elem` (the tables' and positions' reads not
    /// counted).
    pub fn bytes_moved(&self, elem: usize) -> f64 {
        // the head count in f64: h_q + h_kv may pass usize on a problem `validate` refuses
        let heads = self.heads_q as f64 + self.heads_kv as f64;
        2.0 * self.tokens() as f64 * heads * self.rotary_dim as f64 * elem as f64
    }

    /// A short description: `b2 s129 h32/8 d128 r64 rotate_half θ500000 ld6144`.
    pub fn describe(&self) -> String {
        let style = match self.style {
            RopeStyle::RotateHalf => "rotate_half",
            RopeStyle::Interleaved => "interleaved",
        };
        let angles = match self.angles {
            RopeAngles::Theta { theta, llama3: None } => format!("θ{theta}"),
            RopeAngles::Theta { theta, llama3: Some(s) } => format!("θ{theta} llama3×{}", s.factor),
            RopeAngles::Tables { max_pos } => format!("tables[{max_pos}]"),
        };
        format!(
            "b{} s{} h{}/{} d{} r{} {style} {angles} ld{}",
            self.batch, self.seq, self.heads_q, self.heads_kv, self.head_dim, self.rotary_dim, self.ld
        )
    }

    /// Checks every rule of the problem (nothing is launched):
    /// - at least one query and one key/value head; every size, head count and `ld` at most
    ///   [`MAX_SIZE`], and the buffer's extent `(b·s − 1)·ld + width` addressable: at most
    ///   `isize::MAX` bytes of the widest element RoPE takes (f32, 4 bytes), so every count
    ///   below ([`Rope::qkv_elems`] and its bytes) is exact;
    /// - `rotary_dim` even, `2 ≤ rotary_dim ≤ head_dim`, at most [`MAX_ROTARY_DIM`];
    /// - `ld ≥ width`;
    /// - θ finite and at least 1 (so every `inv_freq_i ≤ 1`); LLaMA 3's scaling with a finite
    ///   factor of at least 1, `0 < low_freq_factor < high_freq_factor`, both finite, and
    ///   `original_max_position ≥ 1`;
    /// - tables of 1 to [`MAX_SIZE`] rows.
    ///
    /// Zero tokens (`batch = 0` or `seq = 0`) are allowed: the call reads and writes nothing
    /// and returns `Ok` (as SwiGLU with zero rows; RMSNorm refuses zero rows,
    /// [`crate::norm::RmsNorm::validate`]); zero heads are refused. Any `h_q`, `h_kv` pair is
    /// taken: RoPE rotates each head on its own, so `h_q` need not be a multiple of `h_kv`
    /// (attention requires that, [`crate::attention::Attention`]).
    ///
    /// # Errors
    /// [`Error::LayerOp`] naming the rule and the values that break it.
    pub fn validate(&self) -> Result<()> {
        let op = "RoPE";
        let d = || self.describe();
        if self.heads_q == 0 || self.heads_kv == 0 {
            return bad(op, "there is no query or no key/value head", d());
        }
        for (name, v) in [
            ("batch", self.batch),
            ("seq", self.seq),
            ("heads_q + heads_kv", self.heads_q.saturating_add(self.heads_kv)),
            ("head_dim", self.head_dim),
            ("width", self.width()),
            ("ld", self.ld),
        ] {
            if v > MAX_SIZE {
                return bad(op, "a size is too large", format!("{name} = {v} > {MAX_SIZE} ({})", d()));
            }
        }
        let r = self.rotary_dim;
        if !r.is_multiple_of(2) || r < 2 || r > self.head_dim || r > MAX_ROTARY_DIM {
            return bad(
                op,
                "the rotary dimension is not even, from 2 to the head dimension and at most 512",
                format!("rotary_dim = {r}, head_dim = {} ({})", self.head_dim, d()),
            );
        }
        if self.ld < self.width() {
            return bad(
                op,
                "the leading dimension is less than a token's heads",
                format!("ld = {}, (h_q + 2·h_kv)·d = {} ({})", self.ld, self.width(), d()),
            );
        }
        // every factor is at most MAX_SIZE here, so b·s and the detail's numbers are exact
        let extent = match self.tokens() {
            0 => Some(0),
            t => (t - 1).checked_mul(self.ld).and_then(|x| x.checked_add(self.width())),
        };
        if extent.is_none_or(|e| e.checked_mul(MAX_ELEM_BYTES).is_none_or(|b| b > isize::MAX as usize)) {
            return bad(
                op,
                "the buffer's extent is not addressable (more than isize::MAX bytes of 4-byte elements)",
                format!(
                    "(b·s − 1)·ld + width = ({} − 1)·{} + {} elements ({})",
                    self.tokens(),
                    self.ld,
                    self.width(),
                    d()
                ),
            );
        }
        self.validate_angles()
    }

    /// The angle rules of [`Rope::validate`].
    fn validate_angles(&self) -> Result<()> {
        let op = "RoPE";
        match self.angles {
            RopeAngles::Theta { theta, llama3 } => {
                if !(theta.is_finite() && theta >= 1.0) {
                    return bad(op, "θ is not finite and at least 1", format!("θ = {theta} ({})", self.describe()));
                }
                if let Some(s) = llama3 {
                    let ok = s.factor.is_finite()
                        && s.factor >= 1.0
                        && s.low_freq_factor > 0.0
                        && s.high_freq_factor.is_finite()
                        && s.low_freq_factor < s.high_freq_factor
                        && s.original_max_position >= 1;
                    if !ok {
                        return bad(
                            op,
                            "LLaMA 3's scaling needs factor ≥ 1, 0 < low_freq_factor < high_freq_factor and a \
                             pretraining length ≥ 1",
                            format!("{s:?} ({})", self.describe()),
                        );
                    }
                }
            }
            RopeAngles::Tables { max_pos } => {
                if max_pos == 0 || max_pos > MAX_SIZE {
                    return bad(
                        op,
                        "the tables' rows are not from 1 to 2³¹ − 1",
                        format!("max_pos = {max_pos} ({})", self.describe()),
                    );
                }
            }
        }
        Ok(())
    }

    /// [`Rope::validate`], then tables given exactly when the angles come from tables.
    ///
    /// # Errors
    /// As [`Rope::validate`]; [`Error::LayerOp`] for tables missing or not used.
    pub fn check_call(&self, tables_given: bool) -> Result<()> {
        self.validate()?;
        match (self.angles, tables_given) {
            (RopeAngles::Tables { .. }, false) => {
                bad("RoPE", "a problem with angles from tables was given no tables", self.describe())
            }
            (RopeAngles::Theta { .. }, true) => {
                bad("RoPE", "tables were given to a problem with angles from θ", self.describe())
            }
            _ => Ok(()),
        }
    }

    /// The f32 frequencies a θ problem's kernels take ([`arith::inv_freqs`]); empty for
    /// tables.
    pub fn inv_freqs(&self) -> Vec<f32> {
        match self.angles {
            RopeAngles::Theta { theta, llama3 } => arith::inv_freqs(theta, self.rotary_dim, llama3),
            RopeAngles::Tables { .. } => Vec::new(),
        }
    }

    /// Checks contiguous positions: the last, `start + s − 1`, below
    /// [`Rope::position_limit`] (nothing to check without tokens).
    ///
    /// # Errors
    /// [`Error::LayerOp`] with the positions and the limit.
    pub fn check_start(&self, start: usize) -> Result<()> {
        let last = start.saturating_add(self.seq.saturating_sub(1));
        if self.tokens() > 0 && last >= self.position_limit() {
            return bad(
                "RoPE",
                "a position is past the angles' range",
                format!("positions {start}..={last}, limit {} ({})", self.position_limit(), self.describe()),
            );
        }
        Ok(())
    }

    /// Checks host positions: one per token, each in `0..`[`Rope::position_limit`].
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] for fewer positions than tokens; [`Error::LayerOp`] naming the
    /// first position out of range.
    pub fn check_positions(&self, positions: &[i32]) -> Result<()> {
        let tokens = self.tokens();
        Error::check_len(crate::Which::LayerOp("positions"), positions.len(), tokens, 4)?;
        let limit = self.position_limit();
        if let Some((t, &p)) = positions[..tokens].iter().enumerate().find(|&(_, &p)| p < 0 || p as usize >= limit) {
            return bad(
                "RoPE",
                "a position is past the angles' range",
                format!("positions[{t}] = {p}, limit {limit} ({})", self.describe()),
            );
        }
        Ok(())
    }

    /// The position of token `t` (`t = n·s + i`): `start + i`, or `given[t]`.
    pub(crate) fn position(&self, positions: &Positions<&[i32]>, t: usize) -> i32 {
        match positions {
            Positions::Contiguous { start } => (start + t % self.seq) as i32,
            Positions::Given(p) => p[t],
        }
    }

    /// The rotation's `(cos, sin)` of pair `i` at position `p` (`freqs`: [`arith::inv_freqs`]
    /// of θ problems; `tables`: the tables of table problems), the sine negated for the
    /// backward.
    pub(crate) fn cos_sin_at(
        &self,
        (p, i): (i32, usize),
        freqs: &[f32],
        tables: Option<&RopeTables<&[f32]>>,
        direction: RopeDirection,
    ) -> (f32, f32) {
        let (c, s) = match tables {
            Some(t) => {
                let at = p as usize * (self.rotary_dim / 2) + i;
                (t.cos[at], t.sin[at])
            }
            None => arith::cos_sin(arith::angle(p, freqs[i])),
        };
        match direction {
            RopeDirection::Forward => (c, s),
            RopeDirection::Backward => (c, -s),
        }
    }

    /// The element offsets, within a head, of pair `i`.
    pub(crate) fn pair(&self, i: usize) -> (usize, usize) {
        match self.style {
            RopeStyle::RotateHalf => (i, i + self.rotary_dim / 2),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        }
    }
}
