//! `sdpa_varlen`'s checks, run on the CPU (`cpu_sdpa_varlen.rs`) and on a GPU
//! (`gpu/sdpa_varlen.rs`): the float64 definition over packed sequences, the cases, and the
//! comparisons of the forward, the gradients and the errors.
#![allow(dead_code)] // each test file uses its own subset

use candle_core::{DType, Device, Result, Tensor, Var};
use gemmbridge_candle::{sdpa_varlen, sdpa_varlen_candle, sdpa_varlen_served, Causal, CuSeqlens, Served};
use rand::rngs::StdRng;

use crate::common::{assert_close, band, f64s, random, rel_err};

/// `o` and the gradients of `Σ o ∘ do`, in float64, packed as the tensors are.
pub struct Grads {
    pub o: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// Whether query `i` sees key `j` in a sequence of `lq` queries and `lkv` keys.
fn visible(mask: Causal, i: usize, j: usize, lq: usize, lkv: usize) -> bool {
    match mask {
        Causal::None => true,
        Causal::TopLeft => j <= i,
        Causal::BottomRight => j as i64 <= i as i64 + lkv as i64 - lq as i64,
    }
}

/// The definition over packed sequences: `q[total_q, hq, d]`, `k`, `v[total_kv, hkv, d]`,
/// `d_o` (as q) in row-major order; sequence `n` is rows `cu_q[n]..cu_q[n+1]` of q and
/// `cu_kv[n]..cu_kv[n+1]` of k and v. Per query row: `P = softmax(s)` over its visible keys,
/// `o = P·v`, `dP = do·vᵀ`, `dS = P ∘ (dP − Σ P·dP)`, `dq = scale·dS·k`, `dk += scale·dSᵀ·q`,
/// `dv += Pᵀ·do` (summed over every row and query head that reads a key).
pub fn varlen_grads(
    [q, k, v, d_o]: [&[f64]; 4],
    [cu_q, cu_kv]: [&[u32]; 2],
    (hq, hkv, d): (usize, usize, usize),
    mask: Causal,
    scale: f64,
) -> Grads {
    let mut g = Grads { o: vec![0.0; q.len()], dq: vec![0.0; q.len()], dk: vec![0.0; k.len()], dv: vec![0.0; v.len()] };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for n in 0..cu_q.len() - 1 {
        let (q0, kv0) = (cu_q[n] as usize, cu_kv[n] as usize);
        let (lq, lkv) = (cu_q[n + 1] as usize - q0, cu_kv[n + 1] as usize - kv0);
        for (h, i) in (0..hq).flat_map(|h| (0..lq).map(move |i| (h, i))) {
            let at = ((q0 + i) * hq + h) * d;
            let row = |j: usize| ((kv0 + j) * hkv + h / (hq / hkv)) * d;
            let keys: Vec<usize> = (0..lkv).filter(|&j| visible(mask, i, j, lq, lkv)).collect();
            let s: Vec<f64> = keys.iter().map(|&j| scale * dot(&q[at..at + d], &k[row(j)..row(j) + d])).collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
            let p: Vec<f64> = s.iter().map(|x| (x - max).exp() / z).collect();
            let dp: Vec<f64> = keys.iter().map(|&j| dot(&d_o[at..at + d], &v[row(j)..row(j) + d])).collect();
            let mean: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
            for (t, &j) in keys.iter().enumerate() {
                let ds = p[t] * (dp[t] - mean);
                for e in 0..d {
                    g.o[at + e] += p[t] * v[row(j) + e];
                    g.dq[at + e] += scale * ds * k[row(j) + e];
                    g.dk[row(j) + e] += scale * ds * q[at + e];
                    g.dv[row(j) + e] += p[t] * d_o[at + e];
                }
            }
        }
    }
    g
}

/// `[0, l₀, l₀ + l₁, …]`.
pub fn cumulative(lens: &[u32]) -> Vec<u32> {
    let mut cu = vec![0];
    for l in lens {
        cu.push(cu[cu.len() - 1] + l);
    }
    cu
}

/// One case: per-sequence lengths, heads, head dimension, mask, scale, and bounds above the
/// longest sequences where given.
#[derive(Clone, Debug)]
pub struct Case {
    pub lens_q: Vec<u32>,
    pub lens_kv: Vec<u32>,
    pub heads: (usize, usize),
    pub d: usize,
    pub mask: Causal,
    pub scale: Option<f32>,
    pub max: Option<(usize, usize)>,
}

impl Case {
    /// `(max_seqlen_q, max_seqlen_kv)`: the bounds given, else the longest sequences.
    pub fn max(&self) -> (usize, usize) {
        let longest = |l: &[u32]| l.iter().copied().max().unwrap_or(0) as usize;
        self.max.unwrap_or((longest(&self.lens_q), longest(&self.lens_kv)))
    }
}

/// Uneven batches with empty and one-row sequences, grouped (6/2), multi-query (4/1, 8/1)
/// and multi-head (2/2) heads, `d` 32, 64 and 128, every mask, `len_q` above and below
/// `len_kv`, a given scale and bounds above the longest sequence.
pub fn cases() -> Vec<Case> {
    let c = |lens_q: &[u32], lens_kv: &[u32], heads, d, mask, scale, max| Case {
        lens_q: lens_q.to_vec(),
        lens_kv: lens_kv.to_vec(),
        heads,
        d,
        mask,
        scale,
        max,
    };
    let selfs: &[u32] = &[5, 0, 17, 1, 33];
    vec![
        c(selfs, selfs, (6, 2), 64, Causal::TopLeft, None, None),
        c(selfs, selfs, (4, 1), 128, Causal::BottomRight, None, None),
        c(selfs, selfs, (2, 2), 64, Causal::None, None, Some((40, 48))),
        c(&[3, 9, 1, 0], &[7, 9, 20, 4], (2, 2), 64, Causal::BottomRight, Some(0.3), Some((40, 40))),
        c(&[9, 4, 12], &[5, 4, 1], (4, 2), 64, Causal::TopLeft, None, None),
        c(&[1, 1, 1], &[30, 2, 17], (8, 1), 64, Causal::None, None, None),
        c(&[0, 6, 0], &[0, 6, 3], (2, 1), 32, Causal::TopLeft, None, Some((10, 12))),
    ]
}

/// A random packed input `[rows, h, d]` as a variable.
fn input(rng: &mut StdRng, rows: u32, h: usize, d: usize, dtype: DType, dev: &Device) -> Result<Var> {
    Var::from_tensor(&random(rng, &[rows as usize, h, d], dtype, dev)?)
}

/// `case` at `dtype` on `dev`, the cumulative lengths given as host values or as `u32`
/// tensors on `dev`: served by gemmbridge, `o` and the gradients of `Σ o ∘ dy` (candle's
/// autograd) against float64 and beside candle's autograd through `sdpa_varlen_candle`.
pub fn check_case(rng: &mut StdRng, case: &Case, dtype: DType, dev: &Device, host: bool) -> Result<()> {
    let ((hq, hkv), d, what) = (case.heads, case.d, format!("{case:?} {dtype:?} host {host} on {dev:?}"));
    let (cu_q, cu_kv) = (cumulative(&case.lens_q), cumulative(&case.lens_kv));
    let (tq, tkv) = (cu_q[cu_q.len() - 1], cu_kv[cu_kv.len() - 1]);
    let (q, k, v) = (
        input(rng, tq, hq, d, dtype, dev)?,
        input(rng, tkv, hkv, d, dtype, dev)?,
        input(rng, tkv, hkv, d, dtype, dev)?,
    );
    let dy = random(rng, &[tq as usize, hq, d], dtype, dev)?;
    let scale = case.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let vals = [f64s(&q)?, f64s(&k)?, f64s(&v)?, f64s(&dy)?];
    let want = varlen_grads([&vals[0], &vals[1], &vals[2], &vals[3]], [&cu_q, &cu_kv], (hq, hkv, d), case.mask, scale);
    let tensors = (Tensor::new(cu_q.as_slice(), dev)?, Tensor::new(cu_kv.as_slice(), dev)?);
    let lens = |host| -> (CuSeqlens, CuSeqlens) {
        if host {
            ((&cu_q).into(), (&cu_kv).into())
        } else {
            ((&tensors.0).into(), (&tensors.1).into())
        }
    };
    let ((sq, skv), (mq, mkv)) = (lens(host), case.max());
    let (o, served) = sdpa_varlen_served(&q, &k, &v, sq, skv, mq, mkv, case.mask, case.scale)?;
    assert_eq!(served, Served::Gemmbridge, "{what}");
    assert_eq!((o.dims(), o.dtype()), (&[tq as usize, hq, d][..], dtype), "{what}");
    assert_close(&format!("o {what}"), &o, &want.o, dtype)?;
    let ours = o.mul(&dy)?.sum_all()?.backward()?;
    let (sq, skv) = lens(host);
    let theirs = sdpa_varlen_candle(&q, &k, &v, sq, skv, mq, mkv, case.mask, case.scale)?;
    assert_close(&format!("o through sdpa_varlen_candle {what}"), &theirs, &want.o, dtype)?;
    let theirs = theirs.mul(&dy)?.sum_all()?.backward()?;
    for (name, x, want) in [("dq", &q, &want.dq), ("dk", &k, &want.dk), ("dv", &v, &want.dv)] {
        let (got, candle) = (ours.get(x).expect("a gradient"), theirs.get(x).expect("a gradient"));
        assert_eq!((got.dims(), got.dtype()), (x.dims(), dtype), "{name} {what}");
        assert_close(&format!("{name} {what}"), got, want, dtype)?;
        assert_close(&format!("{name} through sdpa_varlen_candle {what}"), candle, want, dtype)?;
        let e = rel_err(&f64s(got)?, &f64s(candle)?);
        assert!(e <= band(dtype), "{name} {what}: {e:e} from candle's autograd through sdpa_varlen_candle");
    }
    Ok(())
}

/// Host lengths and the same lengths as a tensor give the same output, to the bit, and only
/// k tracking a gradient gives only `dk` (against float64).
pub fn check_host_and_tensor_lengths(rng: &mut StdRng, dtype: DType, dev: &Device) -> Result<()> {
    let (hq, hkv, d, lens) = (4, 2, 64, [7u32, 0, 12, 1]);
    let cu = cumulative(&lens);
    let t = cu[lens.len()];
    let q = random(rng, &[t as usize, hq, d], dtype, dev)?;
    let k = input(rng, t, hkv, d, dtype, dev)?;
    let v = random(rng, &[t as usize, hkv, d], dtype, dev)?;
    let cu_t = Tensor::new(cu.as_slice(), dev)?;
    let a = sdpa_varlen(&q, &k, &v, &cu, &cu, 12, 12, Causal::TopLeft, None)?;
    let b = sdpa_varlen(&q, &k, &v, &cu_t, &cu_t, 12, 12, Causal::TopLeft, None)?;
    assert_eq!(f64s(&a)?, f64s(&b)?, "host and tensor lengths {dtype:?} on {dev:?}");
    let ones = vec![1.0; t as usize * hq * d];
    let vals = [f64s(&q)?, f64s(&k)?, f64s(&v)?];
    let want = varlen_grads([&vals[0], &vals[1], &vals[2], &ones], [&cu, &cu], (hq, hkv, d), Causal::TopLeft, 0.125);
    let grads = a.sum_all()?.backward()?;
    assert_close(&format!("dk of a sum {dtype:?} on {dev:?}"), grads.get(&k).expect("dk"), &want.dk, dtype)?;
    assert!(grads.get(&q).is_none() && grads.get(&v).is_none(), "q and v track no gradient");
    Ok(())
}

/// Which path each input takes, each against float64: a strided q (a view into a fused
/// projection) is copied first; f32 and a head dimension of 12 fall back to candle; on the
/// CPU, an empty batch gives `[0, h_q, d]`.
pub fn check_paths(rng: &mut StdRng, dev: &Device) -> Result<()> {
    let (hq, hkv, lens) = (4, 2, [9u32, 1, 14]);
    let cu = cumulative(&lens);
    let t = cu[lens.len()] as usize;
    for (dtype, d, strided, path) in [
        (DType::BF16, 64, true, Served::AfterCopy),
        (DType::F32, 64, false, Served::Candle),
        (DType::BF16, 12, false, Served::Candle),
        (DType::F16, 16, false, Served::Gemmbridge),
    ] {
        let fused = Var::from_tensor(&random(rng, &[t, hq + 2 * hkv, d], dtype, dev)?)?;
        let q = if strided { fused.narrow(1, 0, hq)? } else { fused.narrow(1, 0, hq)?.contiguous()? };
        let (k, v) = (fused.narrow(1, hq, hkv)?.contiguous()?, fused.narrow(1, hq + hkv, hkv)?.contiguous()?);
        let dy = random(rng, &[t, hq, d], dtype, dev)?;
        let vals = [f64s(&q)?, f64s(&k)?, f64s(&v)?, f64s(&dy)?];
        let want =
            varlen_grads([&vals[0], &vals[1], &vals[2], &vals[3]], [&cu, &cu], (hq, hkv, d), Causal::BottomRight, 0.2);
        let (o, served) = sdpa_varlen_served(&q, &k, &v, &cu, &cu, 14, 14, Causal::BottomRight, Some(0.2))?;
        let what = format!("{dtype:?} d {d} strided {strided} on {dev:?}");
        assert_eq!(served, path, "{what}");
        assert_close(&format!("o {what}"), &o, &want.o, dtype)?;
        let grads = o.mul(&dy)?.sum_all()?.backward()?;
        let dqkv = grads.get(&fused).expect("d fused");
        assert_close(&format!("dq {what}"), &dqkv.narrow(1, 0, hq)?, &want.dq, dtype)?;
        assert_close(&format!("dk {what}"), &dqkv.narrow(1, hq, hkv)?, &want.dk, dtype)?;
        assert_close(&format!("dv {what}"), &dqkv.narrow(1, hq + hkv, hkv)?, &want.dv, dtype)?;
    }
    if !dev.is_cpu() {
        return Ok(()); // empty tensors: on the CPU only (candle allocates 0 bytes on CUDA for them)
    }
    for cu in [vec![0u32], vec![0, 0, 0]] {
        let empty = Tensor::zeros((0, hq, 64), DType::BF16, dev)?;
        let kv = Tensor::zeros((0, hkv, 64), DType::BF16, dev)?;
        let (o, served) = sdpa_varlen_served(&empty, &kv, &kv, &cu, &cu, 0, 0, Causal::TopLeft, None)?;
        assert_eq!((o.dims(), served), (&[0, hq, 64][..], Served::Candle), "empty batch {cu:?}");
    }
    Ok(())
}

/// Every bad input is a named error, on the served dtypes and on the fallback's (f32), through
/// `sdpa_varlen` and `sdpa_varlen_candle` alike, the lengths given on the host and as tensors.
pub fn check_bad_inputs(dev: &Device) -> Result<()> {
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let t = |rows: usize, h: usize| Tensor::zeros((rows, h, 64), dtype, dev);
        let (q, kv) = (t(5, 4)?, t(5, 2)?);
        let ok: &[u32] = &[0, 2, 5];
        // (what, q, k, cu_q, cu_kv, max, mask, scale, expected message)
        type Bad<'a> = (&'a str, Tensor, Tensor, &'a [u32], &'a [u32], usize, Causal, Option<f32>, &'a str);
        let bad: Vec<Bad> = vec![
            (
                "not from 0",
                q.clone(),
                kv.clone(),
                &[1, 2, 5],
                ok,
                5,
                Causal::None,
                None,
                "seqlens_q starts at 1, not 0",
            ),
            (
                "decreasing",
                q.clone(),
                kv.clone(),
                ok,
                &[0, 4, 2, 5],
                5,
                Causal::None,
                None,
                "seqlens_kv decreases at 2",
            ),
            (
                "short",
                q.clone(),
                kv.clone(),
                &[0, 2, 4],
                ok,
                5,
                Causal::None,
                None,
                "ends at 4, not at the tensor's 5 rows",
            ),
            ("b + 1", q.clone(), kv.clone(), ok, &[0, 5], 5, Causal::None, None, "not the same b + 1"),
            ("empty", q.clone(), kv.clone(), &[], ok, 5, Causal::None, None, "seqlens_q is empty"),
            ("max", q.clone(), kv.clone(), ok, ok, 2, Causal::None, None, "more than max_seqlen_q = 2"),
            ("heads", t(5, 3)?, kv.clone(), ok, ok, 5, Causal::None, None, "3 query heads are not a multiple of 2"),
            (
                "no keys",
                q.clone(),
                kv.clone(),
                ok,
                &[0, 0, 5],
                5,
                Causal::None,
                None,
                "sequence 0 has 2 query rows and no keys",
            ),
            (
                "bottom right",
                q.clone(),
                kv.clone(),
                ok,
                &[0, 3, 5],
                5,
                Causal::BottomRight,
                None,
                "bottom-right causal mask",
            ),
            ("nan scale", q.clone(), kv.clone(), ok, ok, 5, Causal::None, Some(f32::NAN), "not finite and positive"),
            ("zero scale", q.clone(), kv.clone(), ok, ok, 5, Causal::None, Some(0.0), "not finite and positive"),
            (
                "inf scale",
                q.clone(),
                kv.clone(),
                ok,
                ok,
                5,
                Causal::None,
                Some(f32::INFINITY),
                "not finite and positive",
            ),
            ("2-D q", q.flatten(1, 2)?, kv.clone(), ok, ok, 5, Causal::None, None, "are not [total_q, h_q, d]"),
            ("d", q.clone(), t(5, 2)?.narrow(2, 0, 32)?, ok, ok, 5, Causal::None, None, "disagree"),
        ];
        for (what, q, k, cu_q, cu_kv, max, mask, scale, msg) in bad {
            // lengths as tensors on `dev` (an empty one on the CPU: lengths may live anywhere)
            let on = |cu: &[u32]| Tensor::new(cu, if cu.is_empty() { &Device::Cpu } else { dev });
            let (tq, tkv) = (on(cu_q)?, on(cu_kv)?);
            let errors = [
                sdpa_varlen(&q, &k, &k, cu_q, cu_kv, max, max, mask, scale).map(|_| ()),
                sdpa_varlen(&q, &k, &k, &tq, &tkv, max, max, mask, scale).map(|_| ()),
                sdpa_varlen_candle(&q, &k, &k, cu_q, cu_kv, max, max, mask, scale).map(|_| ()),
            ];
            for e in errors {
                let e = e.expect_err(what).to_string();
                assert!(e.contains("sdpa_varlen: ") && e.contains(msg), "{what} {dtype:?}: {e}");
            }
        }
        let other = if dtype == DType::F16 { DType::BF16 } else { DType::F16 };
        let e = sdpa_varlen(&q, &kv.to_dtype(other)?, &kv, ok, ok, 5, 5, Causal::None, None).expect_err("dtypes");
        assert!(e.to_string().contains("sdpa_varlen: q, k, v are"), "{e}");
        let i64s = Tensor::new(&[0i64, 2, 5], dev)?;
        let e = sdpa_varlen(&q, &kv, &kv, &i64s, ok, 5, 5, Causal::None, None).expect_err("i64 lengths");
        assert!(e.to_string().contains("seqlens_q is a I64 tensor"), "{e}");
    }
    Ok(())
}
