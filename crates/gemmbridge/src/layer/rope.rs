//! Rotary position embedding (RoPE) as data and in float64: which elements pair up
//! ([`RopeStyle`]), the angle of a pair ([`rope_angle`]), and the rotation of one head and its
//! transpose (the backward), for the reference.

/// Which elements of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Element `j < hd/2` with `j + hd/2` (LLaMA's and Hugging Face's `rotate_half`).
    #[default]
    RotateHalf,
    /// Element `2j` with `2j + 1` (GPT-J's and Meta's complex-number form).
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

    /// The indices of pair `j` (`j < hd/2`) in a head of `hd` elements.
    pub const fn pair(self, j: usize, hd: usize) -> (usize, usize) {
        match self {
            RopeStyle::RotateHalf => (j, j + hd / 2),
            RopeStyle::Interleaved => (2 * j, 2 * j + 1),
        }
    }
}

/// The angle pair `j` (`j < hd/2`) is rotated by at position `pos`: `pos·θ^(−2j/hd)`,
/// in float64 (PyTorch's peer computes the inverse frequencies `1/θ^(2j/hd)` in f32, as
/// Hugging Face's LLaMA does).
pub fn rope_angle(pos: usize, j: usize, hd: usize, theta: f64) -> f64 {
    pos as f64 * theta.powf(-2.0 * j as f64 / hd as f64)
}

/// Rotates one head `x[hd]` at position `pos` in place: each pair `(x₁, x₂)` becomes
/// `(x₁·cos − x₂·sin, x₂·cos + x₁·sin)`; `inverse` applies the transpose (the rotation by
/// the negative angle), which is also the backward of the forward rotation.
pub(crate) fn rotate(x: &mut [f64], pos: usize, theta: f64, style: RopeStyle, inverse: bool) {
    let hd = x.len();
    for j in 0..hd / 2 {
        let (a, b) = style.pair(j, hd);
        let (sin, cos) = rope_angle(pos, j, hd, theta).sin_cos();
        let sin = if inverse { -sin } else { sin };
        let (x1, x2) = (x[a], x[b]);
        x[a] = x1 * cos - x2 * sin;
        x[b] = x2 * cos + x1 * sin;
    }
}
