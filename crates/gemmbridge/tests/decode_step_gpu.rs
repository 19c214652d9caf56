//! GPU tests of the layer's decode step over a paged KV cache ([`GpuDecodeStep`]): two
//! consecutive steps against the float64 decode step (`gemmbridge::layer::decode_reference`)
//! within 1e-2, the output poisoned by a step on NaN inputs first, the second step reading the
//! keys and values the first appended, and the appended rows themselves; slots past every
//! length hold large keys and values, so a read past a length shows; a captured step replayed
//! over several steps gives the eager steps' bits; bad input named, nothing written.
//!
//! These tests were written without a GPU and have not run yet.

mod common;

use std::sync::RwLock;

use common::layer::{weights, wide, BAND};
use common::{gpu, normal, poison, rng};
use cudarc::driver::CudaSlice;
use gemmbridge::cuda::layer::{to_host, GpuDecodeStep};
use gemmbridge::cuda::Gpu;
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer::reference::Weights;
use gemmbridge::layer::{decode_reference, DecodeStep, DecoderLayer, RopeStyle};
use gemmbridge::paged::PagedCache;
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Error};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// The capture test takes this exclusively, the others share it (another thread's first
/// launch or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// A small layer of odd widths: d 72, GQA 4/2 heads of 64, ffn 88.
fn layer() -> DecoderLayer {
    DecoderLayer::new(72, (4, 2), 64, 88, DType::BF16).with_rope(10_000.0, RopeStyle::RotateHalf)
}

/// A batch over a paged cache: the step, its tables (each sequence's pages distinct and
/// shuffled, entries past them random), the held lengths, and the host containers: every slot
/// holding large keys (8) and values (100) but the held positions', which are random.
struct Batch {
    step: DecodeStep,
    tables: Vec<i32>,
    held: Vec<i32>,
    k: Vec<f64>,
    v: Vec<f64>,
}

/// `held` positions per sequence, pages for `steps` more and the position after them (the
/// lengths are advanced after the last step too).
fn batch(r: &mut StdRng, l: &DecoderLayer, held: &[i32], steps: usize) -> Batch {
    let ps = 16;
    let most = *held.iter().max().unwrap() as usize + steps + 1;
    let needed: Vec<usize> = held.iter().map(|&h| (h as usize + steps + 1).div_ceil(ps)).collect();
    let pages = needed.iter().sum::<usize>() + 3;
    let cache = PagedCache::new(pages, ps, (l.heads_kv, l.head_dim), l.dtype, (held.len(), 1)).for_max_len(most);
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(r);
    let mut tables = vec![0i32; cache.table_elems()];
    let mut next = order.iter().copied();
    for (n, &need) in needed.iter().enumerate() {
        for j in 0..cache.table_width {
            let page = if j < need { next.next().unwrap() } else { order[(n + j) % pages] };
            tables[n * cache.table_width + j] = page;
        }
    }
    let (mut k, mut v) = (vec![8.0; cache.container_elems()], vec![100.0; cache.container_elems()]);
    for (n, &h) in held.iter().enumerate() {
        for p in 0..h as usize {
            let (page, slot) = cache.locate(&tables, n, p);
            let at = cache.index(page, 0, slot, 0);
            for hk in 0..l.heads_kv {
                let (kr, vr) = (normal::<bf16>(r, l.head_dim), normal::<bf16>(r, l.head_dim));
                let at = at + hk * ps * l.head_dim;
                k[at..at + l.head_dim].copy_from_slice(&wide(&kr));
                v[at..at + l.head_dim].copy_from_slice(&wide(&vr));
            }
        }
    }
    Batch { step: DecodeStep::new(*l, cache), tables, held: held.to_vec(), k, v }
}

/// The GPU step of `b` with `w`, its containers holding `b`'s, its index `b`'s.
fn gpu_step(gpu: &Gpu, b: &Batch, w: &Weights) -> GpuDecodeStep<bf16> {
    let mut st = GpuDecodeStep::<bf16>::new(gpu, b.step, w).unwrap();
    let s = gpu.stream();
    let host: [Vec<bf16>; 2] = [&b.k, &b.v].map(|c| c.iter().map(|&x| bf16::from_f64(x)).collect());
    let (kc, vc) = st.caches_mut();
    s.memcpy_htod(&host[0], kc).unwrap();
    s.memcpy_htod(&host[1], vc).unwrap();
    st.set_index(gpu, &b.tables, &b.held).unwrap();
    st
}

/// Three sequences holding 0, 17 and 40 positions (pages partly filled; the first attends to
/// its new token alone): a step on NaN inputs poisons y, then two steps on fresh tokens, each
/// against the float64 step on the same containers; after the first, the appended keys and
/// values match the reference's; the second reads them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn two_decode_steps_match_float64_and_read_what_they_appended() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    let l = layer();
    let mut b = batch(&mut r, &l, &[0, 17, 40], 2);
    let w = weights::<bf16>(&l, &mut r);
    let mut st = gpu_step(&gpu, &b, &w);
    let (s, n) = (gpu.stream(), 3 * l.d_model);
    let mut x: CudaSlice<bf16> = s.clone_htod(&poison::<bf16>(n)).unwrap();
    st.run(&gpu, &x).unwrap();
    assert!(to_host(&gpu, st.output()).unwrap().iter().all(|v| v.is_nan()), "the poisoning step");
    for round in 0..2 {
        let xs: Vec<bf16> = normal(&mut r, n);
        s.memcpy_htod(&xs, &mut x).unwrap();
        st.run(&gpu, &x).unwrap();
        let y = to_host(&gpu, st.output()).unwrap();
        let want = decode_reference(&b.step, &w, &wide(&xs), (&mut b.k, &mut b.v), (&b.tables, &b.held)).unwrap();
        let err = rel_error(&y, &want);
        assert!(err < BAND, "step {round} held {:?}: y {err:e}", b.held);
        // the appended rows: every slot at a held position, both containers
        let (kc, vc) = st.caches();
        let (kg, vg) = (to_host(&gpu, kc).unwrap(), to_host(&gpu, vc).unwrap());
        let c = b.step.cache;
        let mut rows = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for (i, &h) in b.held.iter().enumerate() {
            let (page, slot) = c.locate(&b.tables, i, h as usize);
            for hk in 0..l.heads_kv {
                let at = c.index(page, hk, slot, 0);
                for (dst, src) in rows.iter_mut().zip([&kg, &b.k, &vg, &b.v]) {
                    dst.extend_from_slice(&src[at..at + l.head_dim]);
                }
            }
        }
        assert!(rel_error(&rows[0], &rows[1]) < BAND, "step {round}: appended k");
        assert!(rel_error(&rows[2], &rows[3]) < BAND, "step {round}: appended v");
        st.advance(&gpu).unwrap();
        b.held.iter_mut().for_each(|h| *h += 1);
        assert_eq!(st.index().1, &b.held[..]);
    }
}

/// One step captured into a graph (nothing runs while capturing), then replayed over three
/// steps with new tokens and advancing lengths: each replay gives the eager step's bits (the
/// same plans on the same buffers) and the containers end alike; the index cannot be written
/// inside a capture. cudarc's event tracking is off, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_step_replays_the_eager_steps_bits() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut r) = (gpu(), rng());
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let l = layer();
    let b = batch(&mut r, &l, &[5, 31, 16, 1], 3);
    let w = weights::<bf16>(&l, &mut r);
    let s = gpu.stream();
    let tokens: Vec<Vec<bf16>> = (0..3).map(|_| normal(&mut r, 4 * l.d_model)).collect();
    let mut x: CudaSlice<bf16> = s.clone_htod(&tokens[0]).unwrap();
    let mut eager = gpu_step(&gpu, &b, &w);
    let mut want = Vec::new();
    for t in &tokens {
        s.memcpy_htod(t, &mut x).unwrap();
        eager.run(&gpu, &x).unwrap();
        want.push(s.clone_dtoh(eager.output()).unwrap());
        eager.advance(&gpu).unwrap();
    }
    let mut st = gpu_step(&gpu, &b, &w);
    let graph = st.capture(&gpu, &x).unwrap();
    assert!(to_host(&gpu, st.output()).unwrap().iter().all(|v| *v == 0.0), "nothing ran while capturing");
    for (i, t) in tokens.iter().enumerate() {
        s.memcpy_htod(t, &mut x).unwrap();
        graph.launch().unwrap();
        let got = s.clone_dtoh(st.output()).unwrap();
        let same = got.iter().zip(&want[i]).all(|(a, e)| a.to_bits() == e.to_bits());
        assert!(same, "replay {i}: not the eager step's bits");
        st.advance(&gpu).unwrap();
    }
    for (a, e) in [(st.caches().0, eager.caches().0), (st.caches().1, eager.caches().1)] {
        let (a, e) = (s.clone_dtoh(a).unwrap(), s.clone_dtoh(e).unwrap());
        assert!(a.iter().zip(&e).all(|(x, y)| x.to_bits() == y.to_bits()), "the containers after the replays");
    }
}

/// Bad steps and bad indexes are named before anything is written, the step usable after.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_steps_and_indexes_are_named() {
    let _shared = shared();
    let (gpu, mut r) = (gpu(), rng());
    let l = layer();
    let b = batch(&mut r, &l, &[3, 20], 1);
    let w = weights::<bf16>(&l, &mut r);
    let e = GpuDecodeStep::<f16>::new(&gpu, b.step, &w).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
    let other = DecodeStep::new(l, PagedCache { heads_kv: 1, ..b.step.cache });
    let e = GpuDecodeStep::<bf16>::new(&gpu, other, &w).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    let mut st = gpu_step(&gpu, &b, &w);
    let cap = b.step.cache.max_len() as i32;
    let e = st.set_index(&gpu, &b.tables, &[cap, 0]).unwrap_err();
    assert!(matches!(e, Error::PagedCache { .. }), "{e}");
    let mut clash = b.tables.clone();
    clash[b.step.cache.table_width] = clash[0];
    let e = st.set_index(&gpu, &clash, &[3, 3]).unwrap_err();
    assert!(e.to_string().contains("write one page"), "{e}");
    assert_eq!(st.index(), (&b.tables[..], &b.held[..]), "the index is unchanged");
    let short: CudaSlice<bf16> = gpu.stream().alloc_zeros(l.d_model).unwrap();
    let e = st.run(&gpu, &short).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    let x: CudaSlice<bf16> = gpu.stream().clone_htod(&normal::<bf16>(&mut r, 2 * l.d_model)).unwrap();
    st.run(&gpu, &x).unwrap();
    assert!(to_host(&gpu, st.output()).unwrap().iter().all(|v| v.is_finite()), "the step after the refusals");
}
