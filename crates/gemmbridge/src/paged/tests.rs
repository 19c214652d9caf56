//! The cache's rules, the bucketing, the append on the CPU (named errors with nothing written; a
//! prefill and decode steps that put every row where the tables say, read back through them),
//! and the float64 paged decode attention against the contiguous reference and against a
//! direct walk over the pages.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;
use crate::attention::reference as attn_ref;
use crate::cpu;
use crate::dtype::DType;
use crate::error::{Error, Which};
use half::bf16;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn rule(r: Result<()>) -> &'static str {
    match r {
        Err(Error::PagedCache { what, .. }) => what,
        other => panic!("not a PagedCache error: {other:?}"),
    }
}

fn cache(pages: usize, page_size: usize, hkv: usize, d: usize, (b, w): (usize, usize)) -> PagedCache {
    PagedCache::new(pages, page_size, (hkv, d), DType::BF16, (b, w))
}

/// Pages for sequences that will hold `lens` positions: every sequence's own pages, shuffled
/// over a container with `spare` pages more; unused table entries point at random pages
/// (never written, so they may repeat). Returns the cache and its table.
fn layout(rng: &mut StdRng, c: PagedCache, lens: &[usize], spare: usize) -> (PagedCache, Vec<i32>) {
    let need: Vec<usize> = lens.iter().map(|&l| l.div_ceil(c.page_size)).collect();
    let pages = need.iter().sum::<usize>() + spare;
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(rng);
    let width = c.table_width;
    let mut tables = vec![0; lens.len() * width];
    let mut next = order.into_iter();
    for (n, &k) in need.iter().enumerate() {
        for j in 0..width {
            tables[n * width + j] = if j < k { next.next().unwrap() } else { rng.random_range(0..pages as i32) };
        }
    }
    (PagedCache { pages, batch: lens.len(), ..c }, tables)
}

/// `n` values in (−2, 2), from a xorshift stream seeded by `rng` (the sequences hold millions of
/// values, and `rng`'s ranges are slow in an unoptimised test build).
fn values(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let mut x: u64 = rng.random::<u64>() | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bf16::from_f32((x >> 40) as f32 / (1u64 << 22) as f32 - 2.0)
        })
        .collect()
}

#[test]
fn cache_rules_are_named_errors() {
    let ok = cache(64, 16, 8, 128, (4, 8));
    ok.validate().unwrap();
    assert_eq!((ok.container_elems(), ok.table_elems(), ok.max_len()), (64 * 8 * 16 * 128, 32, 128));
    assert_eq!(ok.index(3, 2, 5, 7), ((3 * 8 + 2) * 16 + 5) * 128 + 7);
    assert_eq!(rule(PagedCache { dtype: DType::F32, ..ok }.validate()), "the element type is not f16 or bf16");
    for p in [0, 8, 24, 48, 512] {
        assert_eq!(
            rule(PagedCache { page_size: p, ..ok }.validate()),
            "the page size is not a power of two from 16 to 256"
        );
    }
    for p in [16, 32, 64, 128, 256] {
        PagedCache { page_size: p, ..ok }.validate().unwrap();
    }
    for (h, d) in [(0, 128), (8, 0), (8, 60), (8, 264)] {
        assert!(rule(cache(64, 16, h, d, (4, 8)).validate()).contains("head dimension"));
    }
    assert_eq!(rule(cache(0, 16, 8, 128, (4, 8)).validate()), "a count is zero");
    assert_eq!(rule(ok.with_tables(0, 8).validate()), "a count is zero");
    assert_eq!(rule(ok.with_tables(4, 0).validate()), "a count is zero");
    assert_eq!(rule(ok.with_tables(1 << 16, 1 << 16).validate()), "a count is above 2³¹ − 1");
    assert_eq!(rule(ok.with_tables(1, 1 << 27).validate()), "a count is above 2³¹ − 1"); // capacity 2²⁷·16 = 2³¹
    assert_eq!(rule(cache(1 << 31, 16, 8, 128, (1, 1)).validate()), "a count is above 2³¹ − 1");
    assert_eq!(rule(cache(i32::MAX as usize, 256, 1 << 20, 256, (1, 1)).validate()), "a container's bytes overflow");
    // the message names the values
    let e = PagedCache { page_size: 24, ..ok }.validate().unwrap_err().to_string();
    assert!(e.contains("page_size = 24") && e.contains("pages64×24"), "{e}");
}

#[test]
fn host_tables_and_lengths_are_checked() {
    let c = cache(10, 16, 2, 64, (2, 3));
    c.check_tables(&[0, 1, 2, 9, 8, 7]).unwrap();
    assert_eq!(rule(c.check_tables(&[0, 1, 2, 9, 8])), "the page table does not have batch·table_width entries");
    assert_eq!(rule(c.check_tables(&[0, 1, 2, 9, 8, 7, 6])), "the page table does not have batch·table_width entries");
    assert_eq!(rule(c.check_tables(&[0, 1, -1, 9, 8, 7])), "a page-table entry is negative");
    let e = c.check_tables(&[0, 1, 2, 9, 10, 7]).unwrap_err();
    assert_eq!(rule(Err(e.clone())), "a page-table entry is past the container");
    assert!(e.to_string().contains("table[1, 1] = 10, pages = 10"), "{e}");
    let d = PagedDecode::new(c, 8);
    d.check_index(&[0; 6], &[1, 48]).unwrap();
    assert_eq!(rule(d.check_index(&[0; 6], &[1, 49])), "a length is past its table's pages");
    assert_eq!(rule(d.check_index(&[0; 6], &[0, 48])), "a length is below 1");
    assert_eq!(rule(d.check_index(&[0; 6], &[3])), "there is not one length per sequence");
    assert!(matches!(PagedDecode::new(c, 7).validate(), Err(Error::AttentionShape { .. })));
    assert_eq!(d.attention().s_kv, 48);
}

#[test]
fn the_table_width_is_bucketed_to_powers_of_two() {
    let w = |len| bucket_width(len, 16);
    assert_eq!([w(0), w(1), w(16), w(17), w(33), w(64), w(65)], [1, 1, 1, 2, 4, 4, 8]);
    assert_eq!((w(4095), w(4096), w(4097)), (256, 256, 512));
    assert_eq!(bucket_width(129, 64), 4);
    assert_eq!(bucket_width(usize::MAX, 16), 1 << 60);
    // a batch decoding from 1 to 8192 positions meets 10 plans (widths 1, 2, 4, …, 512)
    let plans: std::collections::BTreeSet<usize> = (1..=8192).map(w).collect();
    assert_eq!(plans.len(), 10);
    let c = cache(4096, 16, 8, 128, (64, 1)).for_max_len(300);
    assert_eq!((c.table_width, c.max_len()), (32, 512));
    assert!(c.max_len() >= 300);
}

/// Two poisoned containers of `c`.
fn poisoned(c: &PagedCache) -> (Vec<bf16>, Vec<bf16>) {
    (vec![bf16::NAN; c.container_elems()], vec![bf16::NAN; c.container_elems()])
}

#[test]
fn bad_appends_are_named_and_write_nothing() {
    let mut r = rng();
    let c = cache(8, 16, 2, 64, (2, 4));
    let op = PagedAppend::prefill(c, 20);
    let (k, v) = (values(&mut r, op.source_elems()), values(&mut r, op.source_elems()));
    let tables = [0, 1, 2, 3, 4, 5, 6, 7];
    let call = |index: HostIndex, op: &PagedAppend| {
        let (mut kc, mut vc) = poisoned(&op.cache);
        let e = cpu::paged_append(op, (&k, &v), (&mut kc, &mut vc), &index).unwrap_err();
        assert!(kc.iter().chain(&vc).all(|x| x.is_nan()), "written before {e}");
        e
    };
    let at = |lens: &'static [i32], new: Option<&'static [i32]>| HostIndex { tables: &tables, lens, new_lens: new };
    assert_eq!(rule(Err(call(at(&[45, 0], None), &op))), "a length is past its table's pages"); // 45 + 20 > 64
    assert_eq!(rule(Err(call(at(&[-1, 0], None), &op))), "a length is negative");
    assert_eq!(
        rule(Err(call(at(&[0, 0], Some(&[21, 0])), &op))),
        "a sequence appends a negative count or more rows than the sources hold"
    );
    assert_eq!(
        rule(Err(call(at(&[0, 0], Some(&[-1, 0])), &op))),
        "a sequence appends a negative count or more rows than the sources hold"
    );
    assert_eq!(rule(Err(call(at(&[0, 0], Some(&[1])), &op))), "there is not one length per sequence");
    // sequence 1's second page is sequence 0's first, and both are written
    let shared = [0, 1, 2, 3, 4, 0, 6, 7];
    let e = call(HostIndex { tables: &shared, lens: &[0, 10], new_lens: None }, &op);
    assert_eq!(rule(Err(e.clone())), "two sequences write one page in one append");
    assert!(e.to_string().contains("table[0, 0] = table[1, 1] = 0"), "{e}");
    // one sequence's two written entries on one page
    let twice = [5, 5, 2, 3, 4, 1, 6, 7];
    let e = call(HostIndex { tables: &twice, lens: &[10, 0], new_lens: None }, &op);
    assert_eq!(rule(Err(e.clone())), "a sequence's table row holds one page twice among its live entries");
    assert!(e.to_string().contains("table[0, 0] = table[0, 1] = 5, positions 0..16 and positions 16..30"), "{e}");
    // read-only sharing (a common prefix) is allowed: sequence 1 reads page 0, writes page 6
    let prefix = [0, 1, 2, 3, 0, 6, 2, 3];
    let (mut kc, mut vc) = poisoned(&c);
    let index = HostIndex { tables: &prefix, lens: &[30, 16], new_lens: Some(&[2, 3]) };
    cpu::paged_append(&op, (&k, &v), (&mut kc, &mut vc), &index).unwrap();
    // the table, the buffers, the element type, the problem
    assert_eq!(
        rule(Err(call(HostIndex { tables: &[0, 1, 8, 3, 4, 5, 6, 7], lens: &[0, 0], new_lens: None }, &op))),
        "a page-table entry is past the container"
    );
    let (mut kc, mut vc) = poisoned(&c);
    let e = cpu::paged_append(&op, (&k[1..], &v), (&mut kc, &mut vc), &at(&[0, 0], None)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("new k"), .. }), "{e}");
    let e = cpu::paged_append(&op, (&k, &v), (&mut kc, &mut vc[1..]), &at(&[0, 0], None)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("v cache"), .. }), "{e}");
    let f16op = PagedAppend { cache: PagedCache { dtype: DType::F16, ..c }, ..op };
    let e = cpu::paged_append(&f16op, (&k, &v), (&mut kc, &mut vc), &at(&[0, 0], None)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { expected: DType::F16, got: DType::BF16, .. }), "{e}");
    assert_eq!(rule(PagedAppend::prefill(c, 0).validate()), "the rows per sequence are not from 1 to 2³¹ − 1");
    assert_eq!(rule(op.with_ld(127).validate()), "the sources' leading dimension is less than a token's heads");
    assert!(kc.iter().chain(&vc).all(|x| x.is_nan()));
}

#[test]
fn an_append_into_a_page_another_sequence_holds_or_its_own_row_repeats_is_refused() {
    let mut r = rng();
    let op = PagedAppend::decode(cache(8, 16, 2, 8, (2, 4)));
    let (k, v) = (values(&mut r, op.source_elems()), values(&mut r, op.source_elems()));
    let call = |tables: &[i32], lens: &[i32], new_lens: Option<&[i32]>| {
        let (mut kc, mut vc) = poisoned(&op.cache);
        let r = cpu::paged_append(&op, (&k, &v), (&mut kc, &mut vc), &HostIndex { tables, lens, new_lens });
        assert!(r.is_err() || kc.iter().any(|x| !x.is_nan()), "accepted and wrote nothing");
        if r.is_err() {
            assert!(kc.iter().chain(&vc).all(|x| x.is_nan()), "written before {r:?}");
        }
        r
    };
    // sequence 0 (16 held) appends position 16 on page 0, slot 0; sequence 1 (20 held) holds its
    // positions 0..16 on page 0 and appends on page 3
    let tables = [5, 0, 0, 0, 0, 3, 0, 0];
    for new_lens in [None, Some(&[1, 0][..])] {
        let e = call(&tables, &[16, 20], new_lens).unwrap_err();
        assert_eq!(rule(Err(e.clone())), "a page written here holds live positions of another sequence");
        let text = e.to_string();
        assert!(
            text.contains("table[0, 1] = table[1, 0] = 0: sequence 0 writes it, sequence 1 holds positions 0..16"),
            "{text}"
        );
    }
    // sequence 1 appends nothing, holding 3 positions on page 0: still its live keys
    assert!(call(&tables, &[16, 3], Some(&[1, 0])).is_err());
    // sequence 1 holds nothing: its entries are not live, page 0 is sequence 0's to write
    call(&tables, &[16, 0], Some(&[1, 0])).unwrap();
    // one sequence: position 16 would land on page 5 slot 0, its own position 0
    let e = call(&[5, 5, 0, 0, 1, 2, 0, 0], &[16, 3], None).unwrap_err();
    assert_eq!(rule(Err(e)), "a sequence's table row holds one page twice among its live entries");
    // a row repeating a page it does not write is refused too (two positions on one slot)
    let e = call(&[5, 5, 6, 0, 1, 2, 0, 0], &[20, 3], Some(&[0, 1])).unwrap_err();
    assert_eq!(rule(Err(e)), "a sequence's table row holds one page twice among its live entries");
    // pages past the live entries may repeat and be anyone's (the table's padding)
    call(&[5, 6, 6, 6, 1, 2, 6, 6], &[16, 3], None).unwrap();
    // a full shared prefix page, read by both, each writing its own page: allowed
    call(&[4, 5, 0, 0, 4, 6, 0, 0], &[16, 16], None).unwrap();
}

/// Per-sequence keys `[len, h_kv, d]` (one contiguous block per sequence), as f64.
type Seqs = Vec<Vec<bf16>>;

/// Appends the first `start[n]` rows of each sequence as one prefill (its rows `ld` apart in a
/// padded source, the counts per sequence), then the rest one decode step at a time (every
/// sequence that still has rows appends one; the others append none).
fn fill(c: &PagedCache, tables: &[i32], (ks, vs): (&Seqs, &Seqs), start: &[usize]) -> (Vec<bf16>, Vec<bf16>) {
    let (mut kc, mut vc) = poisoned(c);
    let row = c.heads_kv * c.head_dim;
    let seq = start.iter().copied().max().unwrap().max(1);
    let pre = PagedAppend::prefill(*c, seq).with_ld(row + 8);
    let source = |xs: &Seqs, upto: &dyn Fn(usize) -> usize, op: &PagedAppend, first: &dyn Fn(usize) -> usize| {
        let mut out = vec![bf16::NAN; op.source_elems()];
        for n in 0..c.batch {
            for i in 0..upto(n) {
                let at = op.source_index(n, i, 0, 0);
                out[at..at + row].copy_from_slice(&xs[n][(first(n) + i) * row..][..row]);
            }
        }
        out
    };
    let counts: Vec<i32> = start.iter().map(|&s| s as i32).collect();
    let (k, v) = (source(ks, &|n| start[n], &pre, &|_| 0), source(vs, &|n| start[n], &pre, &|_| 0));
    let zeros = vec![0; c.batch];
    cpu::paged_append(&pre, (&k, &v), (&mut kc, &mut vc), &HostIndex { tables, lens: &zeros, new_lens: Some(&counts) })
        .unwrap();
    let mut lens = counts;
    let total: Vec<usize> = ks.iter().map(|k| k.len() / row).collect();
    let step = PagedAppend::decode(*c);
    while (0..c.batch).any(|n| (lens[n] as usize) < total[n]) {
        let new: Vec<i32> = (0..c.batch).map(|n| i32::from((lens[n] as usize) < total[n])).collect();
        let at = |n: usize| lens[n] as usize;
        let (k, v) = (source(ks, &|n| new[n] as usize, &step, &at), source(vs, &|n| new[n] as usize, &step, &at));
        let index = HostIndex { tables, lens: &lens, new_lens: Some(&new) };
        cpu::paged_append(&step, (&k, &v), (&mut kc, &mut vc), &index).unwrap();
        lens.iter_mut().zip(&new).for_each(|(l, a)| *l += a);
    }
    (kc, vc)
}

fn widen(x: &[bf16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Random sequences of `lens` positions in a cache of `page_size`, `(h_q, h_kv)`, `d`: filled
/// by a prefill of part of each and decode steps for the rest.
struct Case {
    c: PagedCache,
    tables: Vec<i32>,
    lens: Vec<i32>,
    seqs: (Seqs, Seqs),
    containers: (Vec<bf16>, Vec<bf16>),
}

fn case(r: &mut StdRng, lens: &[usize], page_size: usize, hkv: usize, d: usize) -> Case {
    let longest = lens.iter().copied().max().unwrap();
    let base = cache(1, page_size, hkv, d, (lens.len(), 1)).for_max_len(longest);
    let (c, tables) = layout(r, base, lens, 3);
    let row = hkv * d;
    let ks: Seqs = lens.iter().map(|&l| values(r, l * row)).collect();
    let vs: Seqs = lens.iter().map(|&l| values(r, l * row)).collect();
    // the prefill takes a random part of each sequence (all of some, none of others)
    let start: Vec<usize> =
        lens.iter().map(|&l| if l > 40 { r.random_range(l - 40..=l) } else { r.random_range(0..=l) }).collect();
    let containers = fill(&c, &tables, (&ks, &vs), &start);
    Case { c, tables, lens: lens.iter().map(|&l| l as i32).collect(), seqs: (ks, vs), containers }
}

#[test]
fn appended_rows_read_back_through_the_tables_bit_for_bit() {
    let mut r = rng();
    for (lens, page_size) in [(&[1usize, 7, 16, 17, 129][..], 16), (&[5, 64, 65, 200][..], 64)] {
        let t = case(&mut r, lens, page_size, 2, 64);
        let (c, row) = (t.c, 2 * 64);
        for (xs, container) in [(&t.seqs.0, &t.containers.0), (&t.seqs.1, &t.containers.1)] {
            let got = reference::gather(&c, &widen(container), &t.tables, &t.lens);
            for (n, x) in xs.iter().enumerate() {
                for p in 0..lens[n] {
                    for h in 0..2 {
                        let at = ((n * 2 + h) * c.max_len() + p) * 64;
                        let want = widen(&x[p * row + h * 64..][..64]);
                        assert_eq!(got[at..at + 64], want[..], "sequence {n} position {p} head {h}");
                    }
                }
            }
            // nothing but the appended slots was written
            let written: usize = lens.iter().sum::<usize>() * row;
            assert_eq!(container.iter().filter(|v| !v.is_nan()).count(), written);
        }
    }
}

/// Paged decode attention by walking the pages directly (no gather, no attention reference):
/// per query head, the scores, their maximum, the weights and the weighted values in f64.
fn direct(p: &PagedDecode, q: &[f64], (k, v): (&[f64], &[f64]), tables: &[i32], lens: &[i32]) -> Vec<f64> {
    let c = &p.cache;
    let (d, group) = (c.head_dim, p.heads_q / c.heads_kv);
    let mut o = vec![0.0; p.query_elems()];
    for n in 0..c.batch {
        for hq in 0..p.heads_q {
            let qr = &q[(n * p.heads_q + hq) * d..][..d];
            let at = |pos: usize| {
                let (page, slot) = c.locate(tables, n, pos);
                c.index(page, hq / group, slot, 0)
            };
            let s: Vec<f64> = (0..lens[n] as usize)
                .map(|pos| p.scale as f64 * qr.iter().zip(&k[at(pos)..][..d]).map(|(a, b)| a * b).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for (pos, wi) in w.iter().enumerate() {
                for e in 0..d {
                    o[(n * p.heads_q + hq) * d + e] += wi / sum * v[at(pos) + e];
                }
            }
        }
    }
    o
}

#[test]
fn paged_decode_reference_equals_the_contiguous_one_and_a_walk_over_the_pages() {
    let mut r = rng();
    for (heads, page_size, d) in [((8, 1), 16, 64), ((32, 8), 64, 128)] {
        let t = case(&mut r, &[1, 7, 129, 4095], page_size, heads.1, d);
        let p = PagedDecode::new(t.c, heads.0);
        let q: Vec<f64> = (0..p.query_elems()).map(|_| r.random_range(-1.0..1.0)).collect();
        let (k, v) = (widen(&t.containers.0), widen(&t.containers.1));
        let got = reference::decode(&p, &q, (&k, &v), &t.tables, &t.lens);
        // the contiguous reference over the sequences as generated (not gathered)
        let a = p.attention();
        let contiguous = |xs: &Seqs| {
            let mut out = vec![0.0; a.required_elems(crate::attention::AttnTensor::K)];
            for (n, x) in xs.iter().enumerate() {
                for (i, val) in x.iter().enumerate() {
                    let (pos, h, e) = (i / (heads.1 * d), i / d % heads.1, i % d);
                    out[a.index(crate::attention::AttnTensor::K, [n, h, pos, e])] = val.to_f64();
                }
            }
            out
        };
        let ones = vec![1; t.c.batch];
        let want = attn_ref::forward(&a, &q, &contiguous(&t.seqs.0), &contiguous(&t.seqs.1), Some((&ones, &t.lens))).o;
        assert_eq!(got, want, "{}: paged against contiguous", t.c.describe());
        let walk = direct(&p, &q, (&k, &v), &t.tables, &t.lens);
        let err = crate::reference::rel_error(&got, &walk);
        assert!(err < 1e-12, "{}: against the walk over the pages, {err:e}", t.c.describe());
    }
}
