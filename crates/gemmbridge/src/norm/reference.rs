//! The float64 definitions of RMSNorm's forward and backward (the module documentation of
//! [`crate::norm`] gives the formulas), on dense `[rows, features]` arrays: tests gather a
//! strided buffer's rows first ([`RmsNorm::gather`]).

use super::RmsNorm;

/// The forward's results: `y[rows, features]` and `inv_rms[rows]`, dense.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// The output.
    pub y: Vec<f64>,
    /// The inverse RMS of every row.
    pub inv_rms: Vec<f64>,
}

/// The backward's results: `dx[rows, features]` (dense) and `dw[features]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Backward {
    /// The input's gradient.
    pub dx: Vec<f64>,
    /// The weight's gradient.
    pub dw: Vec<f64>,
}

/// The inverse RMS of each row of the dense `x[rows, features]`, with `p.eps`.
pub fn inv_rms(p: &RmsNorm, x: &[f64]) -> Vec<f64> {
    let c = p.features;
    x.chunks_exact(c)
        .take(p.rows)
        .map(|row| 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / c as f64 + f64::from(p.eps)).sqrt())
        .collect()
}

/// `y = x · inv_rms · w` of the dense `x[rows, features]` and `w[features]`.
///
/// # Panics
/// When `x` holds fewer than `rows · features` values or `w` fewer than `features`.
pub fn forward(p: &RmsNorm, x: &[f64], w: &[f64]) -> Forward {
    let c = p.features;
    let inv = inv_rms(p, x);
    let mut y = Vec::with_capacity(p.rows * c);
    for (row, r) in x.chunks_exact(c).zip(&inv) {
        y.extend(row.iter().zip(&w[..c]).map(|(v, w)| v * r * w));
    }
    Forward { y, inv_rms: inv }
}

/// `dx` and `dw` of the dense `x`, `dy` (`[rows, features]`) and `w[features]`, with the
/// inverse RMS computed here from `x` (not a saved one).
///
/// # Panics
/// As [`forward`], and when `dy` holds fewer than `rows · features` values.
pub fn backward(p: &RmsNorm, x: &[f64], w: &[f64], dy: &[f64]) -> Backward {
    let c = p.features;
    let inv = inv_rms(p, x);
    let (mut dx, mut dw) = (Vec::with_capacity(p.rows * c), vec![0.0; c]);
    for ((xr, gr), r) in x.chunks_exact(c).zip(dy.chunks_exact(c)).zip(&inv) {
        // Σ_k g·x̂ / C with g = dy·w
        let dot = xr.iter().zip(gr).zip(&w[..c]).map(|((x, g), w)| g * w * x * r).sum::<f64>() / c as f64;
        for (j, ((x, g), w)) in xr.iter().zip(gr).zip(&w[..c]).enumerate() {
            let xh = x * r;
            dx.push(r * (g * w - xh * dot));
            dw[j] += g * xh;
        }
    }
    Backward { dx, dw }
}
