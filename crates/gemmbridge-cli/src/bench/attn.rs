//! The attention rows of `gemmbridge bench` (`--ops attn_fwd,attn_fwd_bwd`): the shapes of
//! `bench/attention.json` (the file `bench/attn_peer.py` reads too), BSHD tensors, timed as the
//! GEMM rows are. A row's m is s_q, n is s_kv, k is d, batch is b, its layout the shape's name
//! (heads, mask, lengths); its TFLOP/s counts 4·b·h_q·s_q·s_kv·d per forward (halved under a
//! causal mask; with per-sequence lengths, each sequence's own lengths) and 2.5× that for the
//! backward, as PyTorch's and FlashAttention's benchmarks do. Decoding shapes (one query row)
//! get no attn_fwd_bwd or attn_fwd_bwd_fp8 row. The FP8 rows (`attn_fwd_fp8`,
//! `attn_fwd_bwd_fp8`, `attn_fp8_cast`) have no peer: PyTorch offers no FP8 attention; they read
//! against the bf16/f16 rows of the same run. A row the FP8 backward does not take (on Hopper
//! every head dimension but 128, and any causal mask) is skipped, named.

use anyhow::bail;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use gemmbridge::attention::{Attention, AttnMask, AttnTensor};
use gemmbridge::cuda::{AttnSaved, AttnSavedFp8, Gpu, SeqLens};
use gemmbridge::fp8::Fp8Format;
use gemmbridge::{DType, Element, Precision};

use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The attention ops: the forward (with the statistics, as training runs it), the forward
/// followed by the backward; the FP8 forward on q, k, v quantised beforehand (the attention
/// call alone), the FP8 forward followed by the FP8 backward (E5M2 gradients; q, k, v and do
/// quantised beforehand, the two attention calls alone), and the quantisation of q, k and v
/// into E4M3 that the forward needs (the casts alone).
pub const OPS: [&str; 5] = ["attn_fwd", "attn_fwd_bwd", "attn_fwd_fp8", "attn_fwd_bwd_fp8", "attn_fp8_cast"];

/// The ops `tune` does not take: a cast has no plan; the FP8 backward's plans are not tuned.
pub const BENCH_ONLY: [&str; 2] = ["attn_fwd_bwd_fp8", "attn_fp8_cast"];

/// Whether `op` runs the backward (no row for decoding shapes, 3.5× the forward's operations).
fn with_backward(op: &str) -> bool {
    op == "attn_fwd_bwd" || op == "attn_fwd_bwd_fp8"
}

/// One shape of `bench/attention.json`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Shape {
    pub name: String,
    pub b: usize,
    pub h_q: usize,
    pub h_kv: usize,
    pub s_q: usize,
    pub s_kv: usize,
    pub d: usize,
    pub mask: String,
    #[serde(default)]
    pub lens_q: Option<Vec<i32>>,
    #[serde(default)]
    pub lens_kv: Option<Vec<i32>>,
}

impl Shape {
    /// The problem in `dtype`, BSHD.
    pub fn problem(&self, dtype: DType) -> anyhow::Result<Attention> {
        let mask = match self.mask.as_str() {
            "none" => AttnMask::None,
            "causal" => AttnMask::Causal,
            "bottom_right" => AttnMask::CausalBottomRight,
            other => bail!("bench/attention.json: unknown mask {other:?}"),
        };
        let p = Attention::new(self.b, (self.h_q, self.h_kv), (self.s_q, self.s_kv), self.d, dtype)
            .with_mask(mask)
            .with_var_len(self.lens_q.is_some());
        p.validate()?;
        if let (Some(q), Some(kv)) = (&self.lens_q, &self.lens_kv) {
            p.check_lengths(q, kv)?;
        }
        Ok(p)
    }

    /// Floating-point operations of the forward ([`Attention::forward_flops_with`] of the
    /// shape's lengths).
    pub fn forward_flops(&self, p: &Attention) -> f64 {
        let lens = self.lens_q.as_deref().zip(self.lens_kv.as_deref());
        p.forward_flops_with(lens)
    }
}

/// The shapes of `bench/attention.json`.
pub fn shapes() -> anyhow::Result<Vec<Shape>> {
    super::suite_shapes(include_str!("../../../../bench/attention.json"), "bench/attention.json")
}

/// `--attn-shapes` parsed: shape names of `bench/attention.json` (empty: every shape).
pub fn parse_shapes(list: &str) -> anyhow::Result<Vec<String>> {
    let known: Vec<String> = shapes()?.into_iter().map(|s| s.name).collect();
    let mut out = Vec::new();
    for n in crate::lists::entries("--attn-shapes", list)? {
        if !known.iter().any(|k| k == n) {
            bail!("--attn-shapes: unknown shape {n:?}; bench/attention.json has {}", known.join(", "));
        }
        out.push(n.to_string());
    }
    Ok(out)
}

/// Every row: per f16/bf16 dtype of `dtypes`, per shape (of `names`; every shape when empty),
/// per op; `each` is called with every row as it is made.
pub fn bench(
    gpu: &Gpu,
    (ops, names): (&[String], &[String]),
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
        for shape in shapes()?.into_iter().filter(|s| names.is_empty() || names.contains(&s.name)) {
            let p = shape.problem(precision.input())?;
            let new = match p.dtype {
                DType::F16 => shape_rows::<half::f16>(gpu, &shape, &p, name, ops, sampling)?,
                _ => shape_rows::<half::bf16>(gpu, &shape, &p, name, ops, sampling)?,
            };
            for row in new {
                each(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn shape_rows<T: Element + DeviceRepr>(
    gpu: &Gpu,
    shape: &Shape,
    p: &Attention,
    dtype: &str,
    ops: &[String],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let mut b = Buffers::<T>::new(gpu.stream(), shape, p)?;
    let mut rows = Vec::new();
    for op in ops {
        if with_backward(op) && p.s_q == 1 {
            // decoding runs no backward (and cuDNN's backward engines may refuse one query row)
            continue;
        }
        let timed = time_op(gpu, p, &mut b, op, sampling);
        // a problem the loaded cuDNN has no engine for (FP8 decoding, say) is reported and
        // skipped, not the end of the run
        let t = match timed {
            Err(e) if unsupported(&e) => {
                eprintln!("{op} {}: skipped: {e}", p.describe());
                continue;
            }
            other => other?,
        };
        tracing::info!(problem = %p.describe(), op = %op, forward = ?gpu.plans().attention(p, "forward"),
            backward = ?gpu.plans().attention(p, "backward"), fp8 = ?gpu.plans().attention(p, "forward_fp8"),
            fp8_backward = ?gpu.plans().attention(p, "backward_fp8"), "attention row");
        // the cast row's TFLOP/s is its forward's, so that its time reads against the forward's
        let flops = shape.forward_flops(p) * if with_backward(op) { 3.5 } else { 1.0 };
        rows.push(Row::timed(op, dtype, [p.s_q, p.s_kv, p.d, p.b], &t, flops, shape.name.clone()));
    }
    Ok(rows)
}

/// Whether `e` is the library's [`gemmbridge::Error::Unsupported`]: a row the loaded libraries
/// have no engine for, skipped rather than the end of the run (`bench` and `tune` alike).
pub fn unsupported(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<gemmbridge::Error>(), Some(gemmbridge::Error::Unsupported { .. }))
}

/// The device buffers of one problem: q, k, v, o, do, dq, dk, dv (random), the statistics and
/// the shape's lengths.
pub struct Buffers<T> {
    t: [CudaSlice<T>; 8],
    lse: CudaSlice<f32>,
    lens: Option<(CudaSlice<i32>, CudaSlice<i32>)>,
}

impl<T: Element + DeviceRepr> Buffers<T> {
    /// Made on `s`, and waited for.
    pub fn new(s: &Arc<CudaStream>, shape: &Shape, p: &Attention) -> anyhow::Result<Buffers<T>> {
        use AttnTensor::{K, O, Q, V};
        let up =
            |t: AttnTensor| -> anyhow::Result<CudaSlice<T>> { Ok(s.clone_htod(&normal::<T>(p.required_elems(t)))?) };
        let lens = match (&shape.lens_q, &shape.lens_kv) {
            (Some(q), Some(kv)) => Some((s.clone_htod(q)?, s.clone_htod(kv)?)),
            _ => None,
        };
        let b = Buffers {
            t: [up(Q)?, up(K)?, up(V)?, up(O)?, up(O)?, up(Q)?, up(K)?, up(V)?],
            lse: s.alloc_zeros(p.stats_elems())?,
            lens,
        };
        s.synchronize()?;
        Ok(b)
    }
}

/// One op of `bench`'s attention rows timed on the problem's buffers (made for `p` by
/// [`Buffers::new`]).
pub fn time_op<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &Attention,
    b: &mut Buffers<T>,
    op: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<timing::Timing> {
    let Buffers { t: [q, k, v, o, d_o, dq, dk, dv], lse, lens } = b;
    // SAFETY: the lengths were checked against the problem (Shape::problem).
    let seq = lens.as_ref().map(|(q, kv)| unsafe { SeqLens::device(q, kv) });
    match op {
        "attn_fwd" => timing::time_gpu(gpu, sampling, &mut || {
            gpu.attention().forward(p, [&*q, &*k, &*v], &mut *o, Some(&mut *lse), seq)
        }),
        "attn_fwd_bwd" => timing::time_gpu(gpu, sampling, &mut || {
            gpu.attention().forward(p, [&*q, &*k, &*v], &mut *o, Some(&mut *lse), seq)?;
            let saved = AttnSaved { q: &*q, k: &*k, v: &*v, o: &*o, d_o: &*d_o, stats: &*lse };
            gpu.attention().backward(p, saved, &mut *dq, &mut *dk, &mut *dv, seq)
        }),
        "attn_fwd_fp8" => {
            let [q8, k8, v8] = [(AttnTensor::Q, &*q), (AttnTensor::K, &*k), (AttnTensor::V, &*v)]
                .map(|(t, x)| gpu.attention().quantize(p, t, x));
            let (q8, k8, v8) = (q8?, k8?, v8?);
            let mut o8 = gpu.attention().fp8_output(p)?;
            timing::time_gpu(gpu, sampling, &mut || {
                gpu.attention().forward_fp8(p, [&q8, &k8, &v8], &mut o8, Some(&mut *lse), seq)
            })
        }
        "attn_fwd_bwd_fp8" => fwd_bwd_fp8(gpu, p, b, sampling),
        "attn_fp8_cast" => timing::time_gpu(gpu, sampling, &mut || {
            for (t, x) in [(AttnTensor::Q, &*q), (AttnTensor::K, &*k), (AttnTensor::V, &*v)] {
                gpu.attention().quantize(p, t, x)?;
            }
            Ok::<(), gemmbridge::Error>(())
        }),
        other => bail!("unknown attention op {other:?}"),
    }
}

/// The FP8 forward (with the statistics) and the FP8 backward with E5M2 gradients, timed
/// together; q, k, v (E4M3) and do (E5M2) are quantised, and o and the gradients allocated,
/// before the timing.
fn fwd_bwd_fp8<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &Attention,
    b: &mut Buffers<T>,
    sampling: timing::Sampling,
) -> anyhow::Result<timing::Timing> {
    let Buffers { t: [q, k, v, _, d_o, ..], lse, lens } = b;
    // SAFETY: the lengths were checked against the problem (Shape::problem).
    let seq = lens.as_ref().map(|(q, kv)| unsafe { SeqLens::device(q, kv) });
    let [q8, k8, v8] = [(AttnTensor::Q, &*q), (AttnTensor::K, &*k), (AttnTensor::V, &*v)]
        .map(|(t, x)| gpu.attention().quantize(p, t, x));
    let (q8, k8, v8) = (q8?, k8?, v8?);
    let do8 = gpu.attention().quantize_grad(p, &*d_o, Fp8Format::E5M2)?;
    let mut o8 = gpu.attention().fp8_output(p)?;
    let [mut dq, mut dk, mut dv] = gpu.attention().fp8_grads(p, Fp8Format::E5M2)?;
    timing::time_gpu(gpu, sampling, &mut || {
        gpu.attention().forward_fp8(p, [&q8, &k8, &v8], &mut o8, Some(&mut *lse), seq)?;
        let saved = AttnSavedFp8 { q: &q8, k: &k8, v: &v8, o: &o8, d_o: &do8, stats: &*lse };
        gpu.attention().backward_fp8(p, saved, [&mut dq, &mut dk, &mut dv], seq)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_names_its_shapes_and_they_are_valid_problems() {
        let shapes = shapes().unwrap();
        assert_eq!(shapes.len(), 8);
        for s in &shapes {
            let p = s.problem(DType::BF16).unwrap();
            assert!(s.forward_flops(&p) > 0.0, "{}", s.name);
        }
        assert!(parse_shapes("h24,nope").is_err());
        assert_eq!(parse_shapes(" h24 ").unwrap(), ["h24"]);
        assert!(parse_shapes("h24,").unwrap_err().to_string().contains("--attn-shapes \"h24,\" has an empty entry"));
        assert!(parse_shapes("").unwrap().is_empty(), "no names: every shape");
        let decode = shapes.iter().find(|s| s.name == "h32:8-decode").unwrap();
        assert_eq!((decode.s_q, decode.s_kv, decode.lens_kv.as_ref().unwrap().len()), (1, 4096, 16));
        // a causal full batch counts half of 4·b·h·s²·d
        let p = shapes[1].problem(DType::BF16).unwrap();
        assert_eq!(shapes[1].forward_flops(&p), 2.0 * 4.0 * 32.0 * 4096.0 * 4096.0 * 128.0);
    }
}
