//! RoPE in float64, for the reference: the angle of a pair ([`rope_angle`]), the elements a
//! pair holds ([`pair`], for the style [`RopeStyle`] of [`crate::layer_ops`]) and the rotation
//! of one head and its transpose (the backward).

use crate::layer_ops::RopeStyle;

/// The indices of pair `j` (`j < hd/2`) in a head of `hd` elements: `(j, j + hd/2)` for
/// [`RopeStyle::RotateHalf`], `(2j, 2j + 1)` for [`RopeStyle::Interleaved`].
pub(crate) const fn pair(style: RopeStyle, j: usize, hd: usize) -> (usize, usize) {
    match style {
        RopeStyle::RotateHalf => (j, j + hd / 2),
        RopeStyle::Interleaved => (2 * j, 2 * j + 1),
    }
}

/// The angle pair `j` (`j < hd/2`) is rotated by at position `pos`: `pos·θ^(−2j/hd)`,
/// in float64 (the GPU kernels and PyTorch's peer compute the inverse frequencies `1/θ^(2j/hd)`
/// and the product in f32, as Hugging Face's LLaMA does: [`crate::layer_ops::arith`]).
pub fn rope_angle(pos: usize, j: usize, hd: usize, theta: f64) -> f64 {
    pos as f64 * theta.powf(-2.0 * j as f64 / hd as f64)
}

/// Rotates one head `x[hd]` at position `pos` in place: each pair `(x₁, x₂)` becomes
/// `(x₁·cos − x₂·sin, x₂·cos + x₁·sin)`; `inverse` applies the transpose (the rotation by
/// the negative angle), which is also the backward of the forward rotation.
pub(crate) fn rotate(x: &mut [f64], pos: usize, theta: f64, style: RopeStyle, inverse: bool) {
    let hd = x.len();
    for j in 0..hd / 2 {
        let (a, b) = pair(style, j, hd);
        let (sin, cos) = rope_angle(pos, j, hd, theta).sin_cos();
        let sin = if inverse { -sin } else { sin };
        let (x1, x2) = (x[a], x[b]);
        x[a] = x1 * cos - x2 * sin;
        x[b] = x2 * cos + x1 * sin;
    }
}
