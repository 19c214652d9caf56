//! [`PagedKvCache`] on one device: what the CPU tests (`cpu_paged.rs`) and the GPU tests
//! (`gpu.rs`) share. Sequences of uneven lengths spread over pages; the append checked bit for
//! bit against its sources, decode attention against float64, RoPE at the sequences' positions
//! bit for bit against the adapter's `rope`.

use candle_core::{DType, Device, Result, Tensor};
use gemmbridge_candle::PagedKvCache;
use rand::rngs::StdRng;

use crate::common::{f64s, random, rel_err};

/// Heads `(h_q, h_kv)`, head dimension, page size.
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const PS: usize = 16;

/// The cache's `[2, pages, h_kv, page_size, d]` container of layer `l` on the host.
fn containers(cache: &PagedKvCache, l: usize) -> Result<Vec<f64>> {
    f64s(cache.containers(l)?)
}

/// Each sequence's `(k, v)` rows `[len, h_kv, d]` read back through its pages in order: the
/// pages are found from where its first row's bits lie (the test writes distinct values).
fn written(all: &[f64], pages_of: &[usize], len: usize) -> (Vec<f64>, Vec<f64>) {
    let page = HKV * PS * D;
    let half = all.len() / 2;
    let mut out = (Vec::new(), Vec::new());
    for p in 0..len {
        let pg = pages_of[p / PS];
        for h in 0..HKV {
            let at = pg * page + (h * PS + p % PS) * D;
            out.0.extend_from_slice(&all[at..at + D]);
            out.1.extend_from_slice(&all[half + at..half + at + D]);
        }
    }
    out
}

/// Prefill rows `[5, 2, 19]` of three sequences (the third across two pages), then one decode
/// step of each; every row read back equals its source bits, nothing else written, and decode
/// attention for 4 query heads over every sequence within `band` of float64.
pub fn append_and_attend(rng: &mut StdRng, dev: &Device, dtype: DType, band: f64) -> Result<()> {
    let mut cache = PagedKvCache::new(2, (HKV, D), dtype, (8, PS), dev)?;
    let ids: Vec<usize> = (0..3).map(|_| cache.add_sequence()).collect();
    let rows = [5usize, 2, 19];
    let s = 19;
    let (k, v) = (random(rng, &[3, s, HKV, D], dtype, dev)?, random(rng, &[3, s, HKV, D], dtype, dev)?);
    cache.begin(&ids, &rows, s)?;
    cache.append(1, &k, &v)?;
    assert!(containers(&cache, 0)?.iter().all(|&x| x == 0.0), "layer 1's append wrote layer 0");
    cache.append(0, &k, &v)?;
    cache.commit()?;
    let (k1, v1) = (random(rng, &[3, 1, HKV, D], dtype, dev)?, random(rng, &[3, 1, HKV, D], dtype, dev)?);
    cache.begin(&ids, &[1, 1, 1], 1)?;
    cache.append(0, &k1, &v1)?;
    cache.append(1, &k1, &v1)?;
    let q = random(rng, &[3, HQ, D], dtype, dev)?;
    let o = cache.attend(1, &q, None)?;
    cache.commit()?;
    let all = containers(&cache, 1)?;
    // pages are taken from the pool in order: 0 | 1 | 2, 3 as the sequences grew
    let pages: [&[usize]; 3] = [&[0], &[1], &[2, 3]];
    let (q64, o64) = (f64s(&q)?, f64s(&o)?);
    for n in 0..3 {
        let len = rows[n] + 1;
        let (kw, vw) = written(&all, pages[n], len);
        let want = |t: &Tensor, t1: &Tensor| -> Result<Vec<f64>> {
            let old = t.narrow(0, n, 1)?.narrow(1, 0, rows[n])?;
            f64s(&Tensor::cat(&[&old, &t1.narrow(0, n, 1)?], 1)?)
        };
        assert_eq!(kw, want(&k, &k1)?, "sequence {n}: keys not the sources' bits");
        assert_eq!(vw, want(&v, &v1)?, "sequence {n}: values not the sources' bits");
        let want = attention_f64(&q64[n * HQ * D..(n + 1) * HQ * D], &kw, &vw, len);
        let e = rel_err(&o64[n * HQ * D..(n + 1) * HQ * D], &want);
        println!("{dtype:?} sequence {n} ({len} positions): decode attention {e:.2e}");
        assert!(e <= band, "sequence {n}: decode attention {e:e} above {band:e}");
    }
    assert_eq!((cache.len(0)?, cache.len(1)?, cache.len(2)?), (6, 3, 20));
    Ok(())
}

/// One query row per head over `len` keys `[len, h_kv, d]`, GQA, scale 1/√d, in float64.
fn attention_f64(q: &[f64], k: &[f64], v: &[f64], len: usize) -> Vec<f64> {
    let scale = 1.0 / (D as f64).sqrt();
    let mut o = vec![0.0; HQ * D];
    for h in 0..HQ {
        let hk = h / (HQ / HKV);
        let s: Vec<f64> =
            (0..len).map(|p| (0..D).map(|e| q[h * D + e] * k[(p * HKV + hk) * D + e]).sum::<f64>() * scale).collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        for e in 0..D {
            o[h * D + e] = (0..len).map(|p| w[p] * v[(p * HKV + hk) * D + e]).sum::<f64>() / sum;
        }
    }
    o
}

/// RoPE on a fused QKV projection at the step's positions (sequences holding 0 and 7
/// positions, 3 new rows each, the first only 2 of them real) equals the adapter's `rope` on
/// each sequence's query and key heads with the tables narrowed to its positions, bit for bit;
/// the value heads are untouched.
pub fn rope_at_positions(rng: &mut StdRng, dev: &Device, dtype: DType) -> Result<()> {
    let mut cache = PagedKvCache::new(1, (HKV, D), dtype, (4, PS), dev)?;
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    cache.begin(&[b], &[7], 7)?;
    let rows = Tensor::zeros((1, 7, HKV, D), dtype, dev)?;
    cache.append(0, &rows, &rows)?;
    cache.commit()?;
    let max_pos = 32;
    let angles = Tensor::arange(0f32, (max_pos * D / 2) as f32, dev)?.reshape((max_pos, D / 2))?;
    // the tables rounded to the dtype and widened back (as the LLaMA model keeps them), so that
    // `rope`'s own widening gives the same f32 values
    let round = |t: Tensor| t.to_dtype(dtype)?.to_dtype(DType::F32);
    let (cos, sin) = (round((angles.clone() * 0.013)?.cos()?)?, round((angles * 0.013)?.sin()?)?);
    let w = (HQ + 2 * HKV) * D;
    let qkv = random(rng, &[2, 3, w], dtype, dev)?;
    let before = qkv.copy()?;
    cache.begin(&[a, b], &[2, 3], 3)?;
    cache.rope_qkv(&qkv, HQ, (&cos, &sin))?;
    cache.cancel();
    for (n, held, real) in [(0usize, 0usize, 2usize), (1, 7, 3)] {
        let heads = |t: &Tensor, from: usize, h: usize| -> Result<Tensor> {
            t.narrow(0, n, 1)?
                .narrow(1, 0, real)?
                .reshape((1, real, HQ + 2 * HKV, D))?
                .narrow(2, from, h)?
                .transpose(1, 2)
        };
        let (c, s) = (cos.narrow(0, held, real)?, sin.narrow(0, held, real)?);
        for (from, h) in [(0, HQ), (HQ, HKV)] {
            let want = gemmbridge_candle::rope(&heads(&before, from, h)?, &c, &s)?;
            assert_eq!(f64s(&heads(&qkv, from, h)?)?, f64s(&want)?, "sequence {n}, heads from {from}: not rope's bits");
        }
        let v = |t: &Tensor| f64s(&heads(t, HQ + HKV, HKV)?);
        assert_eq!(v(&qkv)?, v(&before)?, "sequence {n}: value heads changed");
    }
    Ok(())
}

/// Bad calls: each a named error, nothing changed, the cache usable afterwards.
pub fn bad_calls(dev: &Device) -> Result<()> {
    let err = |r: Result<()>, needle: &str| {
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    };
    err(PagedKvCache::new(1, (2, 16), DType::F32, (4, 16), dev).map(|_| ()), "f16 or bf16, not F32");
    err(PagedKvCache::new(1, (2, 16), DType::BF16, (4, 24), dev).map(|_| ()), "page_size = 24");
    err(PagedKvCache::new(1, (2, 12), DType::BF16, (4, 16), dev).map(|_| ()), "d = 12");
    let mut cache = PagedKvCache::new(1, (HKV, D), DType::BF16, (2, PS), dev)?;
    let a = cache.add_sequence();
    let k = Tensor::zeros((1, 1, HKV, D), DType::BF16, dev)?;
    err(cache.append(0, &k, &k), "append without a step begun");
    err(cache.commit(), "commit without a step begun");
    err(cache.begin(&[a], &[40], 40), "sources of 40 rows per sequence pass the pool's 32 positions");
    let b = cache.add_sequence();
    err(cache.begin(&[a, b], &[20, 20], 20), "needs 4 more pages, 2 are free");
    err(cache.begin(&[a, a], &[1, 1], 1), "named twice");
    err(cache.begin(&[a], &[2], 1), "appends 2 rows from sources of 1 rows");
    err(cache.begin(&[7], &[1], 1), "7 is not a live sequence");
    assert_eq!(cache.free_pages(), 2, "a refused step took no page");
    err(cache.begin(&[a], &[1], 1 << 40), "sources of 1099511627776 rows per sequence pass the pool's 32 positions");
    cache.remove_sequence(b)?;
    cache.begin(&[a], &[1], 1)?;
    err(cache.begin(&[a], &[1], 1), "already begun");
    err(cache.append(0, &Tensor::zeros((1, 2, HKV, D), DType::BF16, dev)?, &k), "k_new is [1, 2, 2, 16]");
    err(cache.append(3, &k, &k), "layer 3 of 1");
    err(cache.attend(0, &Tensor::zeros((1, HQ, 8), DType::BF16, dev)?, None).map(|_| ()), "q is [1, 4, 8]");
    let q = Tensor::zeros((1, HQ, D), DType::BF16, dev)?;
    err(cache.attend(0, &q, Some(f32::NAN)).map(|_| ()), "scale = NaN");
    err(cache.remove_sequence(a), "in the step in progress");
    err(cache.attend(0, &q, None).map(|_| ()), "layer 0 has not appended the step's rows");
    err(cache.commit(), "commit before layers [0] appended");
    cache.append(0, &k, &k)?;
    cache.attend(0, &q, None)?;
    cache.commit()?;
    assert_eq!(cache.len(a)?, 1);
    err(cache.begin(&[a], &[usize::MAX], usize::MAX), "pass the pool's 32 positions");
    // a cancelled step gives its pages back; a shorter step after it runs
    cache.begin(&[a], &[20], 20)?;
    assert_eq!(cache.free_pages(), 0);
    cache.cancel();
    assert_eq!(cache.free_pages(), 1, "the cancelled step's page went back");
    cache.begin(&[a], &[1], 1)?;
    cache.append(0, &k, &k)?;
    cache.attend(0, &q, None)?;
    cache.commit()?;
    assert_eq!(cache.len(a)?, 2);
    let empty = cache.add_sequence();
    cache.begin(&[empty], &[0], 1)?;
    cache.append(0, &k, &k)?;
    err(cache.attend(0, &q, None).map(|_| ()), &format!("sequence {empty} holds no position"));
    cache.cancel();
    cache.remove_sequence(a)?;
    assert_eq!(cache.free_pages(), 2, "a removed sequence's page went back");
    err(cache.len(a).map(|_| ()), "is not a live sequence");
    Ok(())
}
