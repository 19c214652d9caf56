//! Float64 definitions of the three convolution directions, straight from the sum in
//! [`super`]'s documentation (no im2col, no tricks), for tests and the probe. Every tensor in
//! the problem's layout, of the lengths [`Conv2d::lens`] gives (the bias: K);
//! O(N·K·P·Q·C/groups·R·S) work, for small problems.
//!
//! # Panics
//! Every function panics, naming the rule, on a problem [`Conv2d::validate`] refuses or a
//! slice of the wrong length (these are test references, not an API that returns errors).

use super::Conv2d;

/// Calls `f(n, k, p, q, c, r, s, h, w)` for every tap that reads an input element inside the
/// image: output `[n, k, p, q]`, filter `[k, c, r, s]` (c within the group) and the input
/// position `[h, w]` of channel `g·C/groups + c`, passed as the input's channel index `ci`.
fn for_each_tap(p: &Conv2d, mut f: impl FnMut([usize; 4], [usize; 4], [usize; 4])) {
    let [n_, k_, p_, q_] = p.y_dims();
    let (cg, kg) = (p.c_per_group(), p.k / p.groups);
    for n in 0..n_ {
        for k in 0..k_ {
            let g = k / kg;
            for op in 0..p_ {
                for oq in 0..q_ {
                    for c in 0..cg {
                        for r in 0..p.r {
                            let h = (op * p.stride[0] + r * p.dilation[0]).checked_sub(p.pad[0]);
                            let Some(h) = h.filter(|&h| h < p.h) else { continue };
                            for s in 0..p.s {
                                let w = (oq * p.stride[1] + s * p.dilation[1]).checked_sub(p.pad[1]);
                                let Some(w) = w.filter(|&w| w < p.w) else { continue };
                                f([n, k, op, oq], [k, c, r, s], [n, g * cg + c, h, w]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Panics unless `p` is valid and the slices have its lengths (`[x, w, y]`, `None` for a
/// tensor the function does not take).
fn expect(p: &Conv2d, lens: [Option<usize>; 3]) {
    if let Err(e) = p.validate() {
        panic!("conv::reference on an invalid problem: {e}");
    }
    for ((name, got), want) in ["x (or dx)", "w (or dw)", "y (or dy)"].into_iter().zip(lens).zip(p.lens()) {
        if let Some(got) = got {
            assert_eq!(got, want, "conv::reference: {name} has {got} elements, the problem's is {want}");
        }
    }
}

/// `y = x ⋆ w` (the forward).
pub fn forward(p: &Conv2d, x: &[f64], w: &[f64]) -> Vec<f64> {
    expect(p, [Some(x.len()), Some(w.len()), None]);
    let mut y = vec![0.0; p.lens()[2]];
    for_each_tap(p, |yi, wi, xi| y[p.y_index(yi)] += x[p.x_index(xi)] * w[p.w_index(wi)]);
    y
}

/// `y = act(x ⋆ w + b)` with `relu` or the identity (the fused forward).
pub fn forward_fused(p: &Conv2d, x: &[f64], w: &[f64], b: &[f64], relu: bool) -> Vec<f64> {
    assert_eq!(b.len(), p.k, "conv::reference: the bias has {} elements, K is {}", b.len(), p.k);
    let mut y = forward(p, x, w);
    let [n_, k_, p_, q_] = p.y_dims();
    for n in 0..n_ {
        for k in 0..k_ {
            for op in 0..p_ {
                for oq in 0..q_ {
                    let v = &mut y[p.y_index([n, k, op, oq])];
                    *v += b[k];
                    if relu {
                        *v = v.max(0.0);
                    }
                }
            }
        }
    }
    y
}

/// `dx` from the output gradient `dy` (the backward-data direction).
pub fn backward_data(p: &Conv2d, w: &[f64], dy: &[f64]) -> Vec<f64> {
    expect(p, [None, Some(w.len()), Some(dy.len())]);
    let mut dx = vec![0.0; p.lens()[0]];
    for_each_tap(p, |yi, wi, xi| dx[p.x_index(xi)] += dy[p.y_index(yi)] * w[p.w_index(wi)]);
    dx
}

/// `dw` from the input `x` and the output gradient `dy` (the backward-filter direction).
pub fn backward_filter(p: &Conv2d, x: &[f64], dy: &[f64]) -> Vec<f64> {
    expect(p, [Some(x.len()), None, Some(dy.len())]);
    let mut dw = vec![0.0; p.lens()[1]];
    for_each_tap(p, |yi, wi, xi| dw[p.w_index(wi)] += dy[p.y_index(yi)] * x[p.x_index(xi)]);
    dw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvLayout;
    use crate::precision::Precision;

    /// A tiny case worked by hand: one 3×3 image, a 2×2 filter, stride 1, pad 0.
    #[test]
    fn hand_worked_case() {
        let p = Conv2d::new([1, 1, 3, 3], [1, 2, 2], Precision::F32);
        let x: Vec<f64> = (1..=9).map(f64::from).collect();
        let w = [1.0, 0.0, 0.0, -1.0]; // x[i][j] − x[i+1][j+1]
        assert_eq!(forward(&p, &x, &w), vec![-4.0; 4]);
        // dx: each output's gradient 1 spreads +1 at its top-left tap, −1 at its bottom-right
        let dx = backward_data(&p, &w, &[1.0; 4]);
        assert_eq!(dx, vec![1.0, 1.0, 0.0, 1.0, 0.0, -1.0, 0.0, -1.0, -1.0]);
        // dw[r][s] = Σ over outputs of x at the tap
        assert_eq!(backward_filter(&p, &x, &[1.0; 4]), vec![12.0, 16.0, 24.0, 28.0]);
        assert_eq!(forward_fused(&p, &x, &w, &[5.0], true), vec![1.0; 4]);
        assert_eq!(forward_fused(&p, &x, &w, &[1.0], true), vec![0.0; 4]);
    }

    #[test]
    #[should_panic(expected = "channels are not a multiple of the groups")]
    fn an_invalid_problem_is_refused_by_name() {
        let p = Conv2d::new([1, 6, 4, 4], [4, 3, 3], Precision::F32).with_groups(3);
        let [lx, lw, _] = p.lens();
        forward(&p, &vec![1.0; lx], &vec![1.0; lw]);
    }

    #[test]
    #[should_panic(expected = "x (or dx) has 31 elements")]
    fn a_short_slice_is_refused_by_name() {
        let p = Conv2d::new([2, 1, 4, 4], [1, 3, 3], Precision::F32);
        forward(&p, &[0.0; 31], &[0.0; 9]);
    }

    /// Every logical index of a tensor with `dims`.
    fn indices(dims: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
        let [a, b, c, d] = dims;
        (0..a * b * c * d).map(move |i| [i / (b * c * d), i / (c * d) % b, i / d % c, i % d])
    }

    /// The backwards are the forward's adjoints: ⟨dy, conv(x, w)⟩ = ⟨dx(w, dy), x⟩ =
    /// ⟨dw(x, dy), w⟩ for any x, w, dy, on a problem with every feature (stride, padding,
    /// dilation, groups), in both layouts; and NCHW copies of the NHWC tensors give the same
    /// logical output.
    #[test]
    fn backwards_are_adjoints_and_layouts_agree() {
        let base = Conv2d::new([2, 4, 7, 6], [6, 3, 2], Precision::F32)
            .with_stride(2, 1)
            .with_pad(1, 2)
            .with_dilation(1, 2)
            .with_groups(2);
        let mut state = 7u64;
        let mut draw = |n: usize| {
            (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                })
                .collect::<Vec<_>>()
        };
        let [lx, lw, ly] = base.lens();
        let (x, w, dy) = (draw(lx), draw(lw), draw(ly));
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
        for layout in [ConvLayout::Nhwc, ConvLayout::Nchw] {
            let p = base.with_layout(layout);
            let y = forward(&p, &x, &w);
            let (a, b, c) =
                (dot(&dy, &y), dot(&backward_data(&p, &w, &dy), &x), dot(&backward_filter(&p, &x, &dy), &w));
            assert!((a - b).abs() < 1e-12 && (a - c).abs() < 1e-12, "{layout}: {a} {b} {c}");
        }
        let (nhwc, nchw) = (base, base.with_layout(ConvLayout::Nchw));
        let mut x2 = vec![0.0; lx];
        indices(base.x_dims()).for_each(|i| x2[nchw.x_index(i)] = x[nhwc.x_index(i)]);
        let mut w2 = vec![0.0; lw];
        indices(base.w_dims()).for_each(|i| w2[nchw.w_index(i)] = w[nhwc.w_index(i)]);
        let (y1, y2) = (forward(&nhwc, &x, &w), forward(&nchw, &x2, &w2));
        for i in indices(base.y_dims()) {
            assert!((y1[nhwc.y_index(i)] - y2[nchw.y_index(i)]).abs() < 1e-12, "{i:?}");
        }
    }
}
