//! The decode step's rules and its float64 reference against the layer's causal forward: a
//! prefill written into a paged cache, then two decode steps, give the forward's last two
//! tokens.

use rand::seq::SliceRandom;

use super::reference::forward;
use super::tests::{normal, rng, weights};
use super::*;
use crate::error::Error;
use crate::paged::PagedCache;
use crate::reference::rel_error;

/// A small odd layer whose head dimension a paged cache takes (a multiple of 8).
fn layer() -> DecoderLayer {
    DecoderLayer::new(24, (4, 2), 8, 40, DType::BF16).with_rope(10_000.0, RopeStyle::RotateHalf)
}

/// A step over `lens.len()` sequences whose tables hold `most` positions, 5 spare pages.
fn step(l: &DecoderLayer, lens: &[usize], most: usize) -> DecodeStep {
    let pages = lens.iter().map(|&s| s.div_ceil(16)).sum::<usize>() + 5;
    let cache = PagedCache::new(pages, 16, (l.heads_kv, l.head_dim), l.dtype, (lens.len(), 1)).for_max_len(most);
    DecodeStep::new(*l, cache)
}

#[test]
fn prefill_then_two_decode_steps_give_the_causal_forward() {
    let (mut r, _) = rng();
    let l = layer();
    let lens = [18usize, 3, 33];
    let st = step(&l, &lens, 33);
    let c = st.cache;
    let w = weights(&l, &mut r);
    // each sequence's pages distinct and shuffled; entries past them point at page 0
    let mut order: Vec<i32> = (0..c.pages as i32).collect();
    order.shuffle(&mut r);
    let mut tables = vec![0i32; c.table_elems()];
    let mut next = order.into_iter();
    for (n, &s) in lens.iter().enumerate() {
        for j in 0..s.div_ceil(16) {
            tables[n * c.table_width + j] = next.next().unwrap();
        }
    }
    let (d, width) = (l.d_model, l.qkv_width());
    let xs: Vec<Vec<f64>> = lens.iter().map(|&s| normal(&mut r, s * d, 1.0)).collect();
    let full: Vec<_> = lens.iter().zip(&xs).map(|(&s, x)| forward(&l, Tokens { b: 1, s }, &w, x).unwrap()).collect();
    // the prefill: every position but the last two, from the forward's k and v after RoPE
    let (mut k, mut v) = (vec![0.0; c.container_elems()], vec![0.0; c.container_elems()]);
    let mut held: Vec<i32> = lens.iter().map(|&s| s as i32 - 2).collect();
    let [_, ok, ov] = l.qkv_offsets();
    for (n, f) in full.iter().enumerate() {
        for p in 0..held[n] as usize {
            let (page, slot) = c.locate(&tables, n, p);
            for h in 0..l.heads_kv {
                let (at, row) = (c.index(page, h, slot, 0), p * width + h * l.head_dim);
                k[at..at + l.head_dim].copy_from_slice(&f.qkv[ok + row..][..l.head_dim]);
                v[at..at + l.head_dim].copy_from_slice(&f.qkv[ov + row..][..l.head_dim]);
            }
        }
    }
    for round in 0..2 {
        let row = |n: usize, of: &[f64]| of[held[n] as usize * d..][..d].to_vec();
        let x: Vec<f64> = (0..lens.len()).flat_map(|n| row(n, &xs[n])).collect();
        let want: Vec<f64> = (0..lens.len()).flat_map(|n| row(n, &full[n].y)).collect();
        let y = decode_reference(&st, &w, &x, (&mut k, &mut v), (&tables, &held)).unwrap();
        // the paged attention's scale is f32 (1/√8 rounded, a relative 1e-8), the forward's f64
        let err = rel_error(&y, &want);
        assert!(err < 1e-7, "step {round} held {held:?}: {err:e}");
        held.iter_mut().for_each(|p| *p += 1);
    }
}

#[test]
fn a_cache_unlike_the_layer_and_bad_tables_are_named() {
    let l = layer();
    let st = step(&l, &[20, 5], 20);
    st.validate().unwrap();
    assert_eq!(st.tokens(), Tokens { b: 2, s: 1 });
    assert_eq!(st.append().ld, l.qkv_width());
    assert_eq!(st.attention().heads_q, 4);
    for other in [
        DecodeStep::new(l, PagedCache { heads_kv: 1, ..st.cache }),
        DecodeStep::new(l, PagedCache { head_dim: 16, ..st.cache }),
        DecodeStep::new(l, PagedCache { dtype: DType::F16, ..st.cache }),
    ] {
        let e = other.validate().unwrap_err();
        assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    }
    let e = DecodeStep::new(l, PagedCache { page_size: 24, ..st.cache }).validate().unwrap_err();
    assert!(matches!(e, Error::PagedCache { .. }), "{e}");
    // tables [2 × 2] over 8 pages: capacity 32 positions per sequence
    let tables = [0, 1, 2, 3];
    st.check_index(&tables, &[31, 0]).unwrap();
    let e = st.check_index(&tables, &[32, 0]).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a length is past its table's pages", .. }), "{e}");
    let e = st.check_index(&[0, 1, 0, 3], &[3, 5]).unwrap_err();
    assert!(e.to_string().contains("write one page"), "{e}");
    // sequence 1 writes page 1 (its position 16) where sequence 0 holds its positions 0..16;
    // and a row naming one page twice among its live entries
    let e = st.check_index(&[1, 2, 0, 1], &[16, 16]).unwrap_err();
    assert!(
        matches!(e, Error::PagedCache { what: "a page written here holds live positions of another sequence", .. }),
        "{e}"
    );
    let e = st.check_index(&[4, 4, 0, 1], &[16, 3]).unwrap_err();
    assert!(e.to_string().contains("table[0, 0] = table[0, 1] = 4"), "{e}");
    let e = st.check_index(&[0, 1, 2, 8], &[3, 5]).unwrap_err();
    assert!(e.to_string().contains("table[1, 1] = 8"), "{e}");
    let e = st.check_index(&tables, &[3]).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "there is not one length per sequence", .. }), "{e}");
}

#[test]
fn the_bytes_are_the_weights_and_the_held_keys_and_values() {
    let l = DecoderLayer::llama3_8b();
    let cache = PagedCache::new(64 * 256, 16, (8, 128), DType::BF16, (64, 256));
    let st = DecodeStep::new(l, cache);
    st.validate().unwrap();
    // 6144·4096 + 4096·4096 + 28672·4096 + 4096·14336 + 2·4096 elements of 2 bytes
    let weights = (6144 + 4096 + 28672 + 14336) as f64 * 4096.0 + 8192.0;
    assert_eq!(st.weight_bytes(), 2.0 * weights);
    // 64 sequences × 4096 keys and values of 8 heads × 128
    assert_eq!(st.kv_bytes(&[4096; 64]), 2.0 * 64.0 * 4096.0 * 1024.0 * 2.0);
    assert_eq!(st.bytes(&[4096; 64]), st.weight_bytes() + st.kv_bytes(&[4096; 64]));
    assert!((st.bytes(&[4096; 64]) / 1e9 - 1.51).abs() < 0.01, "{}", st.bytes(&[4096; 64]));
}

/// The weights' byte count of a layer whose weights pass usize is a number, not an overflow.
#[test]
fn weight_bytes_of_a_huge_layer_do_not_overflow() {
    let layer = DecoderLayer::new(usize::MAX, (1, 1), 8, 1, DType::BF16);
    let step = DecodeStep::new(layer, PagedCache::new(1, 16, (1, 8), DType::BF16, (1, 1)));
    assert!(step.validate().is_err());
    assert!(step.weight_bytes().is_finite() && step.weight_bytes() > 1e19);
}
