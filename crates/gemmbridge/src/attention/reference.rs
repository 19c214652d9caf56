//! Float64 definitions of attention's forward and backward, straight from the sums in
//! [`super`]'s documentation (one query row at a time, no tiling), for tests. Every tensor in
//! the problem's strides, of the lengths [`Attention::required_elems`] gives; the statistics
//! `lse[b, h_q, s_q]` dense. O(b·h_q·s_q·s_kv·d) work, for small problems.
//!
//! With per-sequence lengths, the rows past a sequence's `len_q` are padding: the reference
//! leaves `o` there at NaN and `lse` at NaN (nothing defines them; compare with
//! [`rel_error_rows`], which skips them), and `dq` at 0. Key rows past `len_kv` get `dk = dv =
//! 0`. Elements of a strided buffer that belong to no tensor element stay 0.
//!
//! # Panics
//! Every function panics, naming the rule, on a problem [`Attention::validate`] refuses, on
//! lengths [`Attention::check_lengths`] refuses, or on a slice of the wrong length (these are
//! test references, not an API that returns errors).

use super::{Attention, AttnMask, AttnTensor};

/// Per-sequence lengths `(len_q, len_kv)`, one pair of slices of `b` each; `None` for a
/// problem without them.
pub type Lengths<'a> = Option<(&'a [i32], &'a [i32])>;

/// Whether query row `i` sees key `j` under `mask`, in a sequence of `len_q` queries and
/// `len_kv` keys.
pub fn visible(mask: AttnMask, i: usize, j: usize, len_q: usize, len_kv: usize) -> bool {
    j < len_kv
        && match mask {
            AttnMask::None => true,
            AttnMask::Causal => j <= i,
            AttnMask::CausalBottomRight => j as i64 <= i as i64 + len_kv as i64 - len_q as i64,
        }
}

/// Sequence `n`'s lengths: its own with per-sequence lengths, else the tensors' extents.
pub fn lengths(p: &Attention, lens: Lengths<'_>, n: usize) -> (usize, usize) {
    match lens {
        Some((lq, lkv)) => (lq[n] as usize, lkv[n] as usize),
        None => (p.s_q, p.s_kv),
    }
}

/// The forward's outputs: `o` (in o's strides) and `lse` (dense `[b, h_q, s_q]`).
#[derive(Clone, Debug)]
pub struct Forward {
    /// The output, in o's strides.
    pub o: Vec<f64>,
    /// The log-sum-exp statistics, dense `[b, h_q, s_q]`.
    pub lse: Vec<f64>,
}

/// The backward's outputs, each in its tensor's strides.
#[derive(Clone, Debug)]
pub struct Grads {
    /// The query gradient, in q's strides.
    pub dq: Vec<f64>,
    /// The key gradient (summed over the query heads of its group), in k's strides.
    pub dk: Vec<f64>,
    /// The value gradient (summed likewise), in v's strides.
    pub dv: Vec<f64>,
}

/// Panics unless `p` and `lens` are valid and each `(tensor, len)` has the problem's length.
pub(super) fn expect(p: &Attention, lens: Lengths<'_>, slices: &[(AttnTensor, usize)]) {
    expect_sizes(p, slices);
    match lens {
        Some((lq, lkv)) => {
            if let Err(e) = p.check_lengths(lq, lkv) {
                panic!("attention::reference: {e}");
            }
        }
        None => assert!(!p.var_len, "attention::reference: the problem has per-sequence lengths and none were given"),
    }
}

/// Panics unless `p` is valid and each `(tensor, len)` has the problem's length (what an
/// elementwise step that does not read the lengths needs).
pub(super) fn expect_sizes(p: &Attention, slices: &[(AttnTensor, usize)]) {
    if let Err(e) = p.validate() {
        panic!("attention::reference on an invalid problem: {e}");
    }
    for &(t, got) in slices {
        let want = p.required_elems(t);
        assert_eq!(got, want, "attention::reference: {} has {got} elements, the problem's is {want}", t.name());
    }
}

/// The scaled scores of query row `(n, hq, i)` against every key of its sequence, `None` where
/// the key is not visible.
pub(super) fn scores(
    p: &Attention,
    q: &[f64],
    k: &[f64],
    (n, hq, i): (usize, usize, usize),
    (lq, lkv): (usize, usize),
) -> Vec<Option<f64>> {
    let hk = hq / p.group();
    (0..p.s_kv)
        .map(|j| {
            visible(p.mask, i, j, lq, lkv).then(|| {
                let dot: f64 = (0..p.d)
                    .map(|e| q[p.index(AttnTensor::Q, [n, hq, i, e])] * k[p.index(AttnTensor::K, [n, hk, j, e])])
                    .sum();
                p.scale as f64 * dot
            })
        })
        .collect()
}

/// `ln Σ exp(s)` over the visible scores, computed from their maximum (−∞ when none).
fn log_sum_exp(s: &[Option<f64>]) -> f64 {
    if s.iter().flatten().any(|x| x.is_nan()) {
        return f64::NAN; // NaN in, NaN out (f64::max would skip it)
    }
    let m = s.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + s.iter().flatten().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Index of `lse[n, hq, i]`.
pub fn stats_index(p: &Attention, n: usize, hq: usize, i: usize) -> usize {
    (n * p.h_q + hq) * p.s_q + i
}

/// The forward: `o` and `lse` (module documentation).
pub fn forward(p: &Attention, q: &[f64], k: &[f64], v: &[f64], lens: Lengths<'_>) -> Forward {
    use AttnTensor::{K, O, Q, V};
    expect(p, lens, &[(Q, q.len()), (K, k.len()), (V, v.len())]);
    let mut o = vec![0.0; p.required_elems(O)];
    let mut lse = vec![f64::NAN; p.stats_elems()];
    for n in 0..p.b {
        let (lq, lkv) = lengths(p, lens, n);
        for hq in 0..p.h_q {
            let hk = hq / p.group();
            for i in 0..p.s_q {
                if i >= lq {
                    (0..p.d).for_each(|e| o[p.index(O, [n, hq, i, e])] = f64::NAN);
                    continue;
                }
                let s = scores(p, q, k, (n, hq, i), (lq, lkv));
                let l = log_sum_exp(&s);
                lse[stats_index(p, n, hq, i)] = l;
                for e in 0..p.d {
                    let acc: f64 = s
                        .iter()
                        .enumerate()
                        .filter_map(|(j, x)| x.map(|x| (x - l).exp() * v[p.index(V, [n, hk, j, e])]))
                        .sum();
                    o[p.index(O, [n, hq, i, e])] = acc;
                }
            }
        }
    }
    Forward { o, lse }
}

/// The backward: `dq`, `dk`, `dv` from `do` (in o's strides), `o` and `lse` as the forward
/// gives them (module documentation).
pub fn backward(
    p: &Attention,
    (q, k, v): (&[f64], &[f64], &[f64]),
    o: &[f64],
    d_o: &[f64],
    lse: &[f64],
    lens: Lengths<'_>,
) -> Grads {
    use AttnTensor::{K, O, Q, V};
    expect(p, lens, &[(Q, q.len()), (K, k.len()), (V, v.len()), (O, o.len()), (O, d_o.len())]);
    assert_eq!(lse.len(), p.stats_elems(), "attention::reference: lse has {} elements", lse.len());
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let sc = p.scale as f64;
    for VisibleRow { n, hq, hk, i, lse: l, lens: (lq, lkv) } in visible_rows(p, lens, lse) {
        let row = |t: AttnTensor, h: usize, r: usize, e: usize| p.index(t, [n, h, r, e]);
        let dd: f64 = (0..p.d).map(|e| d_o[row(O, hq, i, e)] * o[row(O, hq, i, e)]).sum();
        for (j, s) in scores(p, q, k, (n, hq, i), (lq, lkv)).into_iter().enumerate() {
            let Some(s) = s else { continue };
            let pj = (s - l).exp();
            let dp: f64 = (0..p.d).map(|e| d_o[row(O, hq, i, e)] * v[row(V, hk, j, e)]).sum();
            let ds = pj * (dp - dd);
            for e in 0..p.d {
                dv[row(V, hk, j, e)] += pj * d_o[row(O, hq, i, e)];
                dq[row(Q, hq, i, e)] += sc * ds * k[row(K, hk, j, e)];
                dk[row(K, hk, j, e)] += sc * ds * q[row(Q, hq, i, e)];
            }
        }
    }
    Grads { dq, dk, dv }
}

/// A query row that sees at least one key: sequence `n`, query head `hq` and its key/value
/// head `hk`, row `i`, the row's log-sum-exp `lse`, and the sequence's lengths `(lq, lkv)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VisibleRow {
    pub n: usize,
    pub hq: usize,
    pub hk: usize,
    pub i: usize,
    pub lse: f64,
    pub lens: (usize, usize),
}

/// Every query row within its sequence's length whose statistics in `lse` are finite, in
/// order (a row with no visible key has `lse = −∞` and contributes nothing).
pub(crate) fn visible_rows<'a>(
    p: &'a Attention,
    lens: Lengths<'a>,
    lse: &'a [f64],
) -> impl Iterator<Item = VisibleRow> + 'a {
    (0..p.b)
        .flat_map(move |n| {
            let (lq, lkv) = lengths(p, lens, n);
            (0..p.h_q).flat_map(move |hq| {
                (0..lq).map(move |i| {
                    let lse = lse[stats_index(p, n, hq, i)];
                    VisibleRow { n, hq, hk: hq / p.group(), i, lse, lens: (lq, lkv) }
                })
            })
        })
        .filter(|r| r.lse != f64::NEG_INFINITY)
}

/// ‖got − want‖ / ‖want‖ (Frobenius) over the elements `at`: 0 where `got` equals `want` (an
/// infinity included — a row without keys has `lse = −∞`), ∞ where `got` is otherwise not
/// finite or `want` is not finite; an infinite reference adds nothing to the norm, and an
/// all-zero reference gives the absolute error.
fn relative(got: &[f64], want: &[f64], at: impl Iterator<Item = usize>) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for i in at {
        let (g, w) = (got[i], want[i]);
        diff += if g == w {
            0.0
        } else if g.is_finite() && w.is_finite() {
            (g - w) * (g - w)
        } else {
            f64::INFINITY
        };
        norm += if w.is_finite() { w * w } else { 0.0 };
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// ‖got − want‖ / ‖want‖ (Frobenius) over tensor `t`'s elements in defined rows: rows within
/// each sequence's length (`len_q` for q and o, `len_kv` for k and v). A non-finite `got`
/// element in a defined row makes the result ∞ (NaN never passes).
pub fn rel_error_rows(p: &Attention, t: AttnTensor, got: &[f64], want: &[f64], lens: Lengths<'_>) -> f64 {
    expect(p, lens, &[(t, got.len()), (t, want.len())]);
    let [b, h, _] = p.dims(t);
    let at = (0..b).flat_map(|n| {
        let (lq, lkv) = lengths(p, lens, n);
        let rows = if matches!(t, AttnTensor::Q | AttnTensor::O) { lq } else { lkv };
        (0..h).flat_map(move |hh| (0..rows).flat_map(move |r| (0..p.d).map(move |e| p.index(t, [n, hh, r, e]))))
    });
    relative(got, want, at)
}

/// ‖got − want‖ / ‖want‖ (Frobenius) of the statistics `lse[b, h_q, s_q]` over the defined rows
/// (within each sequence's `len_q`), as [`rel_error_rows`] for a tensor: a non-finite `got` in a
/// defined row makes it ∞ unless it equals the reference (a row without keys: `lse = −∞`).
pub fn rel_error_stats(p: &Attention, got: &[f64], want: &[f64], lens: Lengths<'_>) -> f64 {
    assert!(
        got.len() == p.stats_elems() && want.len() == p.stats_elems(),
        "attention::reference: statistics of {} and {} elements, the problem's are {}",
        got.len(),
        want.len(),
        p.stats_elems()
    );
    let at = (0..p.b).flat_map(|n| {
        let (lq, _) = lengths(p, lens, n);
        (0..p.h_q).flat_map(move |h| (0..lq).map(move |i| stats_index(p, n, h, i)))
    });
    relative(got, want, at)
}
