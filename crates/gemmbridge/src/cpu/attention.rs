//! Attention on the CPU, [`crate::attention`]'s definition on host slices: per batch entry and
//! query head, the scores `scale·q·kᵀ`, `o = P·v` and the backward's products through the
//! `matrixmultiply` crate's f32 GEMM, the softmax in f32 with its row maximum subtracted, every
//! f16/bf16 element widened to f32 and each output rounded once. Masks, grouped-query heads,
//! per-sequence lengths and strides as on the GPU.

use crate::attention::reference::{lengths, stats_index, visible};
use crate::attention::{Attention, AttnTensor};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};

/// `o = softmax(scale·q·kᵀ + mask)·v` on the CPU for the problem `p` (shapes, strides, masks,
/// GQA: [`crate::attention`]): `q`, `k`, `v` read and `o` written in their strides, of `T`,
/// the problem's element type (f16 or bf16); with `stats`, the softmax statistics `lse[b, h_q,
/// s_q]` (f32, dense, natural log) too; `lens` the per-sequence lengths of a `p.var_len`
/// problem (`len_q[b]`, `len_kv[b]`). Rows past a sequence's `len_q` (padding) are not
/// written. A row that sees no key (the bottom-right causal mask with `len_kv < len_q`, which
/// the GPU path refuses) gets `o = 0` and `lse = −∞`, as the definition says. Scores are f32,
/// as on the GPU: past f32's range (a huge scale or inputs) they overflow to ∞ and NaN, and a
/// NaN input makes its rows NaN. Work and memory: the full `[len_q, len_kv]` score matrix per
/// head (f32; masked keys are computed, then dropped), so a causal mask costs as much as none;
/// one `[s_q, s_kv]` matrix is allocated per call (two for the backward), at most
/// [`MAX_CPU_SCORES`] scores.
///
/// # Errors
/// Before anything is written: [`Error::AttentionShape`] (the problem's rules, lengths missing
/// for a `var_len` problem or given to one without, a length outside its extent);
/// [`Error::DTypeMismatch`] (`T` against `p.dtype`); [`Error::BufferTooSmall`] for a tensor
/// shorter than [`Attention::required_elems`] or statistics shorter than
/// [`Attention::stats_elems`]; [`Error::DimensionTooLarge`] for `s_q·s_kv` past
/// [`MAX_CPU_SCORES`]; [`Error::Unsupported`] where the score matrix cannot be allocated (its
/// bytes named).
pub fn attention_forward<T: Element>(
    p: &Attention,
    [q, k, v]: [&[T]; 3],
    o: &mut [T],
    mut stats: Option<&mut [f32]>,
    lens: Option<(&[i32], &[i32])>,
) -> Result<()> {
    check::<T>(p, lens)?;
    let tensors = [(Which::AttnQ, AttnTensor::Q, q.len()), (Which::AttnK, AttnTensor::K, k.len())];
    let more = [(Which::AttnV, AttnTensor::V, v.len()), (Which::AttnO, AttnTensor::O, o.len())];
    check_lens(p, tensors.into_iter().chain(more))?;
    if let Some(s) = stats.as_deref() {
        check_stats(p, s.len())?;
    }
    let mut scores = scratch(p)?;
    for n in 0..p.b {
        let (lq, lkv) = lengths(p, lens, n);
        for hq in 0..p.h_q {
            let hk = hq / p.group();
            let (qm, km, vm) = (
                rows(p, AttnTensor::Q, q, (n, hq), lq),
                rows(p, AttnTensor::K, k, (n, hk), lkv),
                rows(p, AttnTensor::V, v, (n, hk), lkv),
            );
            let s = &mut scores[..lq * lkv];
            mm((&qm, false), (&km, true), [lq, p.d, lkv], p.scale, s);
            let lse = softmax_rows(p, s, (lq, lkv));
            let mut om = vec![0f32; lq * p.d];
            mm((s, false), (&vm, false), [lq, lkv, p.d], 1.0, &mut om);
            put(p, AttnTensor::O, o, (n, hq), &om);
            if let Some(st) = stats.as_deref_mut() {
                for (i, l) in lse.into_iter().enumerate() {
                    st[stats_index(p, n, hq, i)] = l;
                }
            }
        }
    }
    Ok(())
}

/// The backward on the CPU ([`crate::attention`]'s definition): `dq`, `dk`, `dv` (in q's,
/// k's, v's strides, of `T`) from `q`, `k`, `v`, the forward's `o`, the output's gradient
/// `d_o` (in o's strides) and the statistics `lse` (f32, dense `[b, h_q, s_q]`, as
/// [`attention_forward`] or the GPU writes them). With GQA, `dk` and `dv` are summed over
/// the query heads that share them. Every element of the three gradients is written: rows
/// past a sequence's length get zeros. The three are separate buffers (`&mut` borrows), each
/// in its own tensor's strides: for a fused QKV layout, give each its own buffer of the
/// packed size (views of one buffer cannot be borrowed mutably at once).
///
/// # Errors
/// As [`attention_forward`], for every buffer.
pub fn attention_backward<T: Element>(
    p: &Attention,
    [q, k, v, o, d_o]: [&[T]; 5],
    lse: &[f32],
    [dq, dk, dv]: [&mut [T]; 3],
    lens: Option<(&[i32], &[i32])>,
) -> Result<()> {
    use AttnTensor::{K, O, Q, V};
    check::<T>(p, lens)?;
    let read = [(Which::AttnQ, Q, q.len()), (Which::AttnK, K, k.len()), (Which::AttnV, V, v.len())];
    let more = [(Which::AttnO, O, o.len()), (Which::AttnDo, O, d_o.len())];
    let written = [(Which::AttnDq, Q, dq.len()), (Which::AttnDk, K, dk.len()), (Which::AttnDv, V, dv.len())];
    check_lens(p, read.into_iter().chain(more).chain(written))?;
    check_stats(p, lse.len())?;
    let mut scores = [scratch(p)?, scratch(p)?];
    for (t, g) in [(Q, &mut *dq), (K, &mut *dk), (V, &mut *dv)] {
        p.elements(t).for_each(|at| g[p.index(t, at)] = T::from_f32(0.0));
    }
    for n in 0..p.b {
        let (lq, lkv) = lengths(p, lens, n);
        for hk in 0..p.h_kv {
            let (km, vm) = (rows(p, K, k, (n, hk), lkv), rows(p, V, v, (n, hk), lkv));
            let (mut dkm, mut dvm) = (vec![0f32; lkv * p.d], vec![0f32; lkv * p.d]);
            for hq in hk * p.group()..(hk + 1) * p.group() {
                let at = |i| lse[stats_index(p, n, hq, i)];
                let head = Head {
                    q: rows(p, Q, q, (n, hq), lq),
                    o: rows(p, O, o, (n, hq), lq),
                    d_o: rows(p, O, d_o, (n, hq), lq),
                    lse: (0..lq).map(at).collect(),
                };
                let dqm = head_backward(p, &head, (&km, &vm), (lq, lkv), (&mut dkm, &mut dvm), &mut scores);
                put(p, Q, dq, (n, hq), &dqm);
            }
            put(p, K, dk, (n, hk), &dkm);
            put(p, V, dv, (n, hk), &dvm);
        }
    }
    Ok(())
}

/// One query head's rows for the backward, widened to f32 (`[len_q, d]` each).
struct Head {
    q: Vec<f32>,
    o: Vec<f32>,
    d_o: Vec<f32>,
    lse: Vec<f32>,
}

/// One query head's backward: returns its `dq` (`[lq, d]`) and adds its share to the key/value
/// head's `dk` and `dv` (`[lkv, d]`); `scores`: two [`scratch`] matrices for `P` and `dS`.
fn head_backward(
    p: &Attention,
    h: &Head,
    (km, vm): (&[f32], &[f32]),
    (lq, lkv): (usize, usize),
    (dkm, dvm): (&mut [f32], &mut [f32]),
    scores: &mut [Vec<f32>; 2],
) -> Vec<f32> {
    let d = p.d;
    let [pm, ds] = scores;
    let (pm, ds) = (&mut pm[..lq * lkv], &mut ds[..lq * lkv]);
    // P = exp(scale·q·kᵀ − lse) where visible, 0 elsewhere (and in rows without a key)
    mm((&h.q, false), (km, true), [lq, d, lkv], p.scale, pm);
    for (i, row) in pm.chunks_exact_mut(lkv.max(1)).enumerate().take(lq) {
        for (j, x) in row.iter_mut().enumerate() {
            let seen = visible(p.mask, i, j, lq, lkv) && h.lse[i] != f32::NEG_INFINITY;
            *x = if seen { (*x - h.lse[i]).exp() } else { 0.0 };
        }
    }
    // dv += Pᵀ·do; dP = do·vᵀ; dS = P ∘ (dP − D), D_i = Σ_e do·o
    mm_acc((pm, true), (&h.d_o, false), [lkv, lq, d], 1.0, dvm);
    mm((&h.d_o, false), (vm, true), [lq, d, lkv], 1.0, ds);
    for i in 0..lq {
        let di: f32 = (0..d).map(|e| h.d_o[i * d + e] * h.o[i * d + e]).sum();
        for j in 0..lkv {
            ds[i * lkv + j] = pm[i * lkv + j] * (ds[i * lkv + j] - di);
        }
    }
    // dq = scale·dS·k; dk += scale·dSᵀ·q
    let mut dqm = vec![0f32; lq * d];
    mm((ds, false), (km, false), [lq, lkv, d], p.scale, &mut dqm);
    mm_acc((ds, true), (&h.q, false), [lkv, lq, d], p.scale, dkm);
    dqm
}

/// The rows `0..count` of head `h` of batch entry `n` of tensor `t`, widened: `[count, d]`.
fn rows<T: Element>(p: &Attention, t: AttnTensor, buf: &[T], (n, h): (usize, usize), count: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(count * p.d);
    for r in 0..count {
        let start = p.index(t, [n, h, r, 0]);
        out.extend(buf[start..start + p.d].iter().map(|x| x.to_f32()));
    }
    out
}

/// `m` (`[rows, d]`) rounded into rows `0..rows` of head `h` of batch entry `n` of tensor `t`.
fn put<T: Element>(p: &Attention, t: AttnTensor, buf: &mut [T], (n, h): (usize, usize), m: &[f32]) {
    for (r, row) in m.chunks_exact(p.d).enumerate() {
        let start = p.index(t, [n, h, r, 0]);
        for (dst, &x) in buf[start..start + p.d].iter_mut().zip(row) {
            *dst = T::from_f32(x);
        }
    }
}

/// Each row of the scores `s` (`[lq, lkv]`) to its softmax under the mask, in place; returns
/// each row's `lse`. A row that sees no key (by the mask and the lengths) becomes zeros with
/// `lse = −∞`; a NaN score makes its row NaN, and scores past f32's range overflow (as on the
/// GPU, which also scores in f32).
fn softmax_rows(p: &Attention, s: &mut [f32], (lq, lkv): (usize, usize)) -> Vec<f32> {
    let mut lse = vec![f32::NEG_INFINITY; lq];
    if lkv == 0 {
        return lse;
    }
    for (i, row) in s.chunks_exact_mut(lkv).enumerate() {
        let mut seen = 0usize;
        for (j, x) in row.iter_mut().enumerate() {
            if visible(p.mask, i, j, lq, lkv) {
                seen += 1;
            } else {
                *x = f32::NEG_INFINITY;
            }
        }
        if seen == 0 {
            row.fill(0.0);
            continue;
        }
        // the largest visible score, NaN if any is NaN
        let max =
            row.iter().fold(f32::NEG_INFINITY, |m, &x| if m.is_nan() || x.is_nan() { f32::NAN } else { m.max(x) });
        let mut sum = 0f32;
        for x in row.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        row.iter_mut().for_each(|x| *x /= sum);
        lse[i] = max + sum.ln();
    }
    lse
}

/// `c = alpha·op(a)·op(b)` with `[m, k, n]`: `a` stored `[m, k]` (or `[k, m]`, transposed),
/// `b` stored `[k, n]` (or `[n, k]`), `c` `[m, n]`, all row-major f32.
fn mm(a: (&[f32], bool), b: (&[f32], bool), dims: [usize; 3], alpha: f32, c: &mut [f32]) {
    gemm_f32(a, b, dims, alpha, 0.0, c);
}

/// `c += alpha·op(a)·op(b)`, as [`mm`].
fn mm_acc(a: (&[f32], bool), b: (&[f32], bool), dims: [usize; 3], alpha: f32, c: &mut [f32]) {
    gemm_f32(a, b, dims, alpha, 1.0, c);
}

fn gemm_f32(
    (a, at): (&[f32], bool),
    (b, bt): (&[f32], bool),
    [m, k, n]: [usize; 3],
    alpha: f32,
    beta: f32,
    c: &mut [f32],
) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "cpu attention: operand sizes");
    if m == 0 || n == 0 {
        return;
    }
    let (rsa, csa) = if at { (1, m as isize) } else { (k as isize, 1) };
    let (rsb, csb) = if bt { (1, k as isize) } else { (n as isize, 1) };
    // SAFETY: the slices hold m·k, k·n and m·n elements (asserted), addressed exactly by these
    // strides; c does not alias a or b (a `&mut` borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// The most f32 scores one head's `[s_q, s_kv]` matrix may hold on the CPU (2³², 16 GiB).
pub const MAX_CPU_SCORES: usize = 1 << 32;

/// A zeroed f32 matrix for one head's `[s_q, s_kv]` scores, allocated once per call and reused
/// for every head (the sequences' lengths are within the extents).
///
/// # Errors
/// [`Error::DimensionTooLarge`] past [`MAX_CPU_SCORES`]; [`Error::Unsupported`] where the
/// allocation fails (named in bytes), before anything is written.
fn scratch(p: &Attention) -> Result<Vec<f32>> {
    let n = p.s_q.saturating_mul(p.s_kv);
    if n > MAX_CPU_SCORES {
        let what = "s_q·s_kv, the f32 scores of one head on the CPU";
        return Err(Error::DimensionTooLarge { what, value: n, max: MAX_CPU_SCORES });
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Unsupported {
        backend: "CPU attention",
        what: format!("{} bytes for one head's f32 scores (s_q·s_kv = {n}) could not be allocated", n * 4),
    })?;
    v.resize(n, 0.0);
    Ok(v)
}

/// The problem's rules, `T` against its element type, the lengths against the problem.
fn check<T: Element>(p: &Attention, lens: Option<(&[i32], &[i32])>) -> Result<()> {
    p.validate()?;
    if T::DTYPE != p.dtype {
        return Err(Error::DTypeMismatch { operand: Which::AttnQ, expected: p.dtype, got: T::DTYPE });
    }
    match (p.var_len, lens) {
        (true, None) => Err(Error::AttentionShape {
            what: "a problem with per-sequence lengths was given none",
            detail: p.describe(),
        }),
        (false, Some(_)) => p.check_lengths(&[], &[]),
        (true, Some((q, kv))) => p.check_lengths(q, kv),
        (false, None) => Ok(()),
    }
}

/// Every buffer (named, with its tensor's layout and its length) at least as long as its tensor
/// needs.
fn check_lens(p: &Attention, mut bufs: impl Iterator<Item = (Which, AttnTensor, usize)>) -> Result<()> {
    bufs.try_for_each(|(operand, t, have)| Error::check_len(operand, have, p.required_elems(t), p.dtype.size_bytes()))
}

/// The statistics at least `b·h_q·s_q` long (f32).
fn check_stats(p: &Attention, have: usize) -> Result<()> {
    Error::check_len(Which::AttnStats, have, p.stats_elems(), 4)
}
