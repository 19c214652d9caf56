//! The arithmetic of RoPE and SwiGLU, operation by operation: the definition gemmbridge's GPU
//! kernels (`cuda/device/kernels/layer.cu`) follow in the same order with the same IEEE
//! operations (their f32 and f64 operations are the correctly rounded `__fmul_rn`,
//! `__fadd_rn`, `__fsub_rn`, `__frcp_rn`, `__fmaf_rn`, `__dmul_rn`, `__fma_rn`, never
//! contracted: a fused multiply-add is one only where written, here `mul_add`; and no library
//! function whose result could differ between the two sides), so the CPU backend and
//! the GPU give the same bits. Every function here is what one element (or one pair) computes;
//! the inputs are the stored values widened to f32 exactly, and the caller rounds each result
//! once to the storage type (round to nearest even).
//!
//! The exponential and the sine and cosine are written out rather than taken from a math
//! library (whose last bits differ between CUDA's and the host's): an f64 Cody–Waite
//! reduction and Taylor polynomials for the rotation's cosine and sine (then rounded to f32),
//! and an f32 exponential with a Cody–Waite reduction and a degree-5 polynomial in fused
//! multiply-adds (the coefficients of Cephes' `expf`) for the sigmoid. Both are within a few f32 units in the last
//! place of the true values (the float64 tests bound them).

/// `θ^(−2i/r)` for `i < r/2` (then LLaMA 3's scaling), computed in f64 and rounded once to f32:
/// the frequencies a θ problem's kernels take. `theta ≥ 1` and `r` even (the problem's rules).
/// Hugging Face computes `1 / θ^(2i/r)` in f32 (`torch.arange(0, r, 2).float() / r`): its
/// values can differ from these in the last place.
pub fn inv_freqs(theta: f64, rotary_dim: usize, llama3: Option<super::Llama3Scaling>) -> Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| {
            let f = theta.powf(-((2 * i) as f64) / rotary_dim as f64);
            match llama3 {
                None => f as f32,
                Some(s) => llama3_scaled(f, s) as f32,
            }
        })
        .collect()
}

/// One frequency under LLaMA 3's scaling ([`super::Llama3Scaling`]), in f64.
fn llama3_scaled(f: f64, s: super::Llama3Scaling) -> f64 {
    let l = s.original_max_position as f64;
    let wavelen = 2.0 * std::f64::consts::PI / f;
    if wavelen < l / s.high_freq_factor {
        f
    } else if wavelen > l / s.low_freq_factor {
        f / s.factor
    } else {
        let smooth = (l / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * f / s.factor + smooth * f
    }
}

/// The angle of position `p` (`0 ≤ p < 2²⁴`, so exact in f32) at frequency `inv_freq`: the f32
/// product `p·inv_freq`, rounded once (as Hugging Face's f32 `inv_freq ⊗ positions`).
pub fn angle(p: i32, inv_freq: f32) -> f32 {
    p as f32 * inv_freq
}

/// `π/2` as three f64 (`P1 + P2 + P3` to about 160 bits) and `2/π`, for the reduction.
const PIO2_1: f64 = std::f64::consts::FRAC_PI_2;
const PIO2_2: f64 = 6.123233995736766e-17;
const PIO2_3: f64 = -1.4973849048591698e-33;
const TWO_OVER_PI: f64 = std::f64::consts::FRAC_2_PI;

/// `±1/n!` of the sine's Taylor terms `r³ … r¹³` and the cosine's `r² … r¹⁴`.
const SIN: [f64; 6] = [
    -0.16666666666666666,
    0.008333333333333333,
    -0.0001984126984126984,
    2.7557319223985893e-06,
    -2.505210838544172e-08,
    1.6059043836821613e-10,
];
const COS: [f64; 7] = [
    -0.5,
    0.041666666666666664,
    -0.001388888888888889,
    2.48015873015873e-05,
    -2.755731922398589e-07,
    2.08767569878681e-09,
    -1.1470745597729725e-11,
];

/// `(cos a, sin a)` rounded to f32, for `0 ≤ a < 2²⁴` (any finite `a` gives defined bits):
/// in f64, `n = rint(a·2/π)` (ties to even), `r = a − n·π/2` by three fused multiply-adds
/// (the first exact), `z = r²`, the sine `r + (r·z)·S(z)` and the cosine `1 + z·C(z)` by
/// Horner's rule with fused multiply-adds (`S`, `C`: the Taylor coefficients above, highest
/// first), each rounded once to f32 after the quadrant `n mod 4` picks and signs them.
/// Accurate to about 1e-15 before the rounding to f32.
pub fn cos_sin(a: f32) -> (f32, f32) {
    let x = a as f64;
    let n = (x * TWO_OVER_PI).round_ties_even();
    let mut r = (-n).mul_add(PIO2_1, x);
    r = (-n).mul_add(PIO2_2, r);
    r = (-n).mul_add(PIO2_3, r);
    let z = r * r;
    let mut ps = SIN[5];
    for c in SIN[..5].iter().rev() {
        ps = ps.mul_add(z, *c);
    }
    let sn = (r * z).mul_add(ps, r);
    let mut pc = COS[6];
    for c in COS[..6].iter().rev() {
        pc = pc.mul_add(z, *c);
    }
    let cs = z.mul_add(pc, 1.0);
    let (c, s) = match (n as i64) & 3 {
        0 => (cs, sn),
        1 => (-sn, cs),
        2 => (-cs, -sn),
        _ => (sn, -cs),
    };
    (c as f32, s as f32)
}

/// One pair `(x₁, x₂)` rotated by the angle of `(c, s)`: `(x₁·c − x₂·s, x₂·c + x₁·s)`, each
/// product and the sum or difference rounded in f32 (no fused multiply-add).
pub fn rotate(x1: f32, x2: f32, c: f32, s: f32) -> (f32, f32) {
    (x1 * c - x2 * s, x2 * c + x1 * s)
}

/// `ln 2` as `LN2_HI + LN2_LO` (0.693359375, with 9 significant bits, so `j·LN2_HI` is exact
/// for the `|j| ≤ 126` used; −2.1219444e-4) and `log₂ e` (1.442695041), for the exponential's
/// reduction: by their bits, the f32 values layer.cu's decimal literals round to.
const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
const LN2_LO: f32 = f32::from_bits(0xb95e_8083);
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);

/// The exponential's polynomial (Cephes' `expf`): `e^r ≈ 1 + r + r²·P(r)` on `|r| ≤ ln2/2`,
/// `P`'s coefficients from `r⁰` up (5.0000001201e-1, exactly ½ in f32, 1.6666665459e-1,
/// 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3, 1.9875691500e-4) by their f32 bits.
const EXP: [f32; 6] = [
    f32::from_bits(0x3f00_0000),
    f32::from_bits(0x3e2a_aaaa),
    f32::from_bits(0x3d2a_a9c1),
    f32::from_bits(0x3c08_8908),
    f32::from_bits(0x3ab7_43ce),
    f32::from_bits(0x3950_6967),
];

/// `e^x` for `x ≤ 0` in f32 (NaN stays NaN): 0 below −87; else `j = rint(x·log₂e)`,
/// `r = fma(−j, LN2_LO, fma(−j, LN2_HI, x))` (the inner one exact), `e^r = fma(r², P(r), r) + 1`
/// with `P` by Horner's rule in fused multiply-adds, times `2^j` (exact: the result is normal).
/// Flushing below −87 (where `e^x` would be subnormal) makes `silu(g)` exactly −0 for `g` in
/// about (−103, −87] instead of a tiny normal number (silu(−88) ≈ −5.3e−37): harmless, and the
/// GPU kernels do the same, bit for bit.
pub fn exp_neg(x: f32) -> f32 {
    if x < -87.0 {
        return 0.0;
    }
    let j = (x * LOG2E).round_ties_even();
    let r = (-j).mul_add(LN2_LO, (-j).mul_add(LN2_HI, x));
    let mut p = EXP[5];
    for c in EXP[..5].iter().rev() {
        p = p.mul_add(r, *c);
    }
    let e = (r * r).mul_add(p, r) + 1.0;
    // j in −126..=0 for x in −87..=0: a normal power of two; NaN gives j = NaN and e = NaN
    let scale = f32::from_bits((((j as i32) + 127) as u32) << 23);
    e * scale
}

/// `σ(g) = 1/(1 + e^{−g})`: with `e = exp_neg(−|g|)` and `t = 1/(1 + e)` (a correctly rounded
/// reciprocal), `σ = t` for `g ≥ 0` and `e·t` for `g < 0` (so the exponential never overflows;
/// NaN gives NaN).
pub fn sigmoid(g: f32) -> f32 {
    let e = exp_neg(-g.abs());
    let t = 1.0 / (1.0 + e);
    if g < 0.0 {
        e * t
    } else {
        t
    }
}

/// SwiGLU's output: `(g·σ(g))·u`.
pub fn swiglu(g: f32, u: f32) -> f32 {
    let silu = g * sigmoid(g);
    silu * u
}

/// SwiGLU's gradients `(dg, du)` from the output's gradient `dy`:
/// `dg = (dy·u)·(σ·fma(g, 1 − σ, 1))`, `du = dy·(g·σ)` with `σ = sigmoid(g)`, each operation
/// rounded in f32.
pub fn swiglu_grad(dy: f32, g: f32, u: f32) -> (f32, f32) {
    let s = sigmoid(g);
    let dsilu = s * g.mul_add(1.0 - s, 1.0);
    ((dy * u) * dsilu, dy * (g * s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cos_sin_is_near_float64_over_the_position_range() {
        let mut worst = 0f64;
        for k in 0..200_000u32 {
            // angles from 0 to past 2^23, dense near 0
            let a = (k as f32) * (k as f32) * 3.3e-4 + (k as f32) * 1e-3;
            let (c, s) = cos_sin(a);
            let (wc, ws) = ((a as f64).cos(), (a as f64).sin());
            worst = worst.max((c as f64 - wc).abs()).max((s as f64 - ws).abs());
        }
        // f32 rounding of values in [−1, 1]: at most 2⁻²⁴ with a nearly exact f64 kernel
        assert!(worst <= 6.0e-8, "worst abs error {worst:e}");
    }

    #[test]
    fn cos_sin_quadrants_and_exact_points() {
        assert_eq!(cos_sin(0.0), (1.0, 0.0));
        let (c, s) = cos_sin(std::f32::consts::FRAC_PI_2);
        assert!(c.abs() < 1e-7 && s == 1.0, "{c} {s}");
        let (c, s) = cos_sin(std::f32::consts::PI);
        assert!(c == -1.0 && s.abs() < 1e-7, "{c} {s}");
        let (c, s) = cos_sin(4.0);
        assert!(((c as f64) - 4f64.cos()).abs() < 6e-8 && ((s as f64) - 4f64.sin()).abs() < 6e-8);
    }

    #[test]
    fn exp_and_sigmoid_are_near_float64() {
        let mut worst_exp = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = exp_neg(x) as f64;
            let want = (x as f64).exp();
            worst_exp = worst_exp.max((got - want).abs() / want);
            x += 0.000_731;
        }
        assert!(worst_exp < 3.0 * f32::EPSILON as f64, "exp rel error {worst_exp:e}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-88.0), 0.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert!(exp_neg(f32::NAN).is_nan());
        for g in [-30.0f32, -5.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 5.0, 30.0, 100.0, -100.0] {
            let want = 1.0 / (1.0 + (-(g as f64)).exp());
            let got = sigmoid(g) as f64;
            assert!((got - want).abs() <= 4.0 * f32::EPSILON as f64 * want.max(1e-30), "σ({g}) = {got}, not {want}");
        }
        assert!(sigmoid(f32::NAN).is_nan() && swiglu(f32::NAN, 1.0).is_nan());
        assert_eq!(swiglu(f32::INFINITY, 2.0), f32::INFINITY);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn swiglu_grad_matches_its_float64_derivative() {
        for (g, u, dy) in [(0.7f32, -1.3f32, 0.25f32), (-4.0, 2.0, -1.0), (12.0, 0.5, 3.0), (-0.01, 8.0, 1.0)] {
            let (g64, u64, dy64) = (g as f64, u as f64, dy as f64);
            let s = 1.0 / (1.0 + (-g64).exp());
            let (wdg, wdu) = (dy64 * u64 * s * (1.0 + g64 * (1.0 - s)), dy64 * g64 * s);
            let (dg, du) = swiglu_grad(dy, g, u);
            assert!((dg as f64 - wdg).abs() <= 1e-6 * wdg.abs().max(1e-3), "dg {dg} vs {wdg}");
            assert!((du as f64 - wdu).abs() <= 1e-6 * wdu.abs().max(1e-3), "du {du} vs {wdu}");
        }
    }

    #[test]
    fn frequencies_follow_theta_and_llama3_scaling() {
        let f = inv_freqs(10_000.0, 128, None);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[32], 0.01); // θ^(−1/2) = 1/100, rounded to f32
        let s = super::super::Llama3Scaling::LLAMA_3_1;
        let g = inv_freqs(500_000.0, 128, Some(s));
        let plain = inv_freqs(500_000.0, 128, None);
        // high frequencies (short wavelengths) kept, the lowest divided by the factor
        assert_eq!(g[0], plain[0]);
        assert_eq!(g[63], (500_000f64.powf(-126.0 / 128.0) / 8.0) as f32);
        assert!(g.iter().zip(&plain).all(|(a, b)| a <= b && *a >= b / 8.0));
    }
}
