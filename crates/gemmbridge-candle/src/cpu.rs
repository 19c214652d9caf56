//! The CPU path: the plans of [`crate::plan`] run by gemmbridge's CPU backend on candle's
//! storage, read in place at the planned offsets and strides (the same description the CUDA
//! path hands to cuBLASLt and cuDNN).

use std::sync::OnceLock;

use candle_core::{Result, Tensor};
use gemmbridge::cpu::DwSlice;
use gemmbridge::{Element, Epilogue};

use crate::plan::{f32_out, LinearPlan, MatmulPlan, NormPlan};

/// A gemmbridge error as candle's.
pub(crate) fn wrap(e: gemmbridge::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// Runs `$body` with `$t` the element type of the CPU storages given (all of one dtype: f32,
/// f16 or bf16), the storages bound to slices of it; an error for any other dtype.
macro_rules! by_dtype {
    ($op:expr, [$($s:ident),+], |$t:ident| $body:expr) => {
        match ($($s,)+) {
            ($(candle_core::CpuStorage::F32($s),)+) => { type $t = f32; candle_core::CpuStorage::F32($body?) }
            ($(candle_core::CpuStorage::F16($s),)+) => { type $t = gemmbridge::half::f16; candle_core::CpuStorage::F16($body?) }
            ($(candle_core::CpuStorage::BF16($s),)+) => { type $t = gemmbridge::half::bf16; candle_core::CpuStorage::BF16($body?) }
            _ => candle_core::bail!("{}: f32, f16 or bf16 operands of one dtype expected", $op),
        }
    };
}
pub(crate) use by_dtype;

/// An output of `n` elements, NaN until written: an element the call leaves unwritten shows.
fn poisoned<T: Element>(n: usize) -> Vec<T> {
    vec![T::from_f32(f32::NAN); n]
}

/// `C = A·B` for the plan (β = 0).
pub(crate) fn matmul<T: Element>(plan: &MatmulPlan, a: &[T], b: &[T]) -> Result<Vec<T>> {
    let p = &plan.problem;
    let mut c = poisoned::<T>(p.batch() * p.m() * p.n());
    gemmbridge::cpu::gemm(p, 1.0, &a[plan.starts[0]..], &b[plan.starts[1]..], 0.0, &mut c).map_err(wrap)?;
    Ok(c)
}

/// `y = act(x·wᵀ + bias)`: the GEMM in f32 output, then the bias and the activation on the f32
/// value (GELU's tanh form evaluated in f64), rounded to `T` once — the arithmetic of
/// cuBLASLt's epilogue.
pub(crate) fn linear<T: Element>(plan: &LinearPlan, x: &[T], w: &[T], bias: Option<&[T]>) -> Result<Vec<T>> {
    let p = &plan.problem;
    let dtype = match T::DTYPE {
        gemmbridge::DType::F16 => candle_core::DType::F16,
        gemmbridge::DType::BF16 => candle_core::DType::BF16,
        _ => candle_core::DType::F32,
    };
    let Some(p32) = f32_out(p, dtype) else { candle_core::bail!("linear: no f32-output GEMM for {dtype:?}") };
    let (rows, n) = (p.m(), p.n());
    let mut acc = vec![0f32; rows * n];
    gemmbridge::cpu::gemm(&p32, 1.0, &x[plan.starts[0]..], &w[plan.starts[1]..], 0.0, &mut acc).map_err(wrap)?;
    let bias: Option<Vec<f32>> = bias.map(|b| b[plan.starts[2]..][..n].iter().map(|v| v.to_f32()).collect());
    let (relu, gelu) = match p.epilogue() {
        Epilogue::Relu | Epilogue::ReluBias => (true, false),
        Epilogue::Gelu | Epilogue::GeluBias => (false, true),
        _ => (false, false),
    };
    let y = acc
        .chunks(n)
        .flat_map(|row| row.iter().enumerate().map(|(j, &v)| (j, v)))
        .map(|(j, v)| {
            let v = v + bias.as_ref().map_or(0.0, |b| b[j]);
            let v = if relu { v.max(0.0) } else { v };
            let v = if gelu { gemmbridge::epilogue::gelu_tanh(f64::from(v)) as f32 } else { v };
            T::from_f32(v)
        })
        .collect();
    Ok(y)
}

/// RMSNorm's forward: `y` dense `[rows, c]`.
pub(crate) fn rms_norm<T: Element>(plan: &NormPlan, x: &[T], w: &[T]) -> Result<Vec<T>> {
    let p = &plan.problem;
    let mut y = poisoned::<T>(p.rows * p.features);
    gemmbridge::cpu::rms_norm_forward(p, &x[plan.starts[0]..], &w[plan.starts[1]..], &mut y, None).map_err(wrap)?;
    Ok(y)
}

/// RMSNorm's backward from a dense `dy[rows, c]` starting at `dy_start`: `[dx (rows·c) | dw
/// (c)]` in one buffer. The forward is run again for the inverse RMS of every row (the forward
/// keeps nothing).
pub(crate) fn rms_norm_backward<T: Element>(
    plan: &NormPlan,
    x: &[T],
    w: &[T],
    (dy, dy_start): (&[T], usize),
) -> Result<Vec<T>> {
    let p = &plan.problem;
    let (x, w, dy) = (&x[plan.starts[0]..], &w[plan.starts[1]..], &dy[dy_start..]);
    let (rows, c) = (p.rows, p.features);
    let mut inv_rms = vec![0f32; rows];
    let mut y = poisoned::<T>(rows * c);
    gemmbridge::cpu::rms_norm_forward(p, x, w, &mut y, Some(&mut inv_rms)).map_err(wrap)?;
    let mut out = poisoned::<T>(rows * c + c);
    let (dx, dw) = out.split_at_mut(rows * c);
    gemmbridge::cpu::rms_norm_backward(p, x, w, &inv_rms, dy, dx, DwSlice::Io(dw)).map_err(wrap)?;
    Ok(out)
}

/// Attention's forward for the problem `p` on `q`, `k`, `v` (each starting at its first
/// element, in `p`'s strides), with the per-sequence lengths `lens` of a padded
/// variable-length batch where given: `o` dense (`p.required_elems`), and with `stats` the
/// softmax statistics `lse[b, h_q, s_q]` too (f32, dense, natural log), what the backward
/// reads.
pub(crate) fn attention<T: Element>(
    p: &gemmbridge::attention::Attention,
    qkv: [&[T]; 3],
    lens: Option<(&[i32], &[i32])>,
    stats: bool,
) -> Result<(Vec<T>, Option<Vec<f32>>)> {
    let mut o = poisoned::<T>(p.required_elems(gemmbridge::attention::AttnTensor::O));
    let mut lse = stats.then(|| vec![f32::NAN; p.stats_elems()]);
    gemmbridge::cpu::attention_forward(p, qkv, &mut o, lse.as_deref_mut(), lens).map_err(wrap)?;
    Ok((o, lse))
}

/// Keeps an attention forward's statistics in `slot` for the backward, on the CPU path and the
/// CUDA path alike (the forward of one operation runs once).
pub(crate) fn keep(slot: &OnceLock<Tensor>, stats: Tensor) {
    // a slot already set cannot happen: candle runs an operation's forward once
    let _ = slot.set(stats);
}

// ---------------------------------------------------------------------------------------------
// sdpa's autograd: the backward
// ---------------------------------------------------------------------------------------------

/// Attention's backward for the problem `p`: from `q`, `k`, `v` (each starting at its first
/// element, in `p`'s strides), the forward's `o` and the output's gradient `d_o` (in o's
/// strides) and the statistics `lse`, the buffer `[dq | dk | dv]`, each part
/// `p.required_elems` long and in its tensor's strides (`dk`, `dv` summed over the query heads
/// that share a key/value head); `lens` as [`attention`]'s.
pub(crate) fn attention_backward<T: Element>(
    p: &gemmbridge::attention::Attention,
    [q, k, v, o, d_o]: [&[T]; 5],
    lse: &[f32],
    lens: Option<(&[i32], &[i32])>,
) -> Result<Vec<T>> {
    use gemmbridge::attention::AttnTensor;
    let (nq, nk) = (p.required_elems(AttnTensor::Q), p.required_elems(AttnTensor::K));
    let mut out = poisoned::<T>(nq + nk + p.required_elems(AttnTensor::V));
    let (dq, rest) = out.split_at_mut(nq);
    let (dk, dv) = rest.split_at_mut(nk);
    gemmbridge::cpu::attention_backward(p, [q, k, v, o, d_o], lse, [dq, dk, dv], lens).map_err(wrap)?;
    Ok(out)
}
