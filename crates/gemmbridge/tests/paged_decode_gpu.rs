//! GPU tests of decode attention over a paged KV cache on cuDNN ([`GpuPaged::decode`]):
//! against the float64 paged reference (`gemmbridge::paged::reference::decode`) within 1e-2
//! (‖o − ref‖/‖ref‖), outputs poisoned with NaN first, at lengths 1, 7, 129 and 4095 (pages
//! partly filled), GQA 8/1 and 32/8, d 64 and 128, page sizes 16 and 64, bf16 and f16, host and
//! device tables; the slots past each sequence's length hold large keys and values, so a read
//! past a length shows; bad input named before anything is written, the engine usable after;
//! a captured decode replayed after the lengths and tables change on the device.
//!
//! These tests were written without a GPU and have not run yet.

mod common;

use std::sync::RwLock;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::cuda::{Gpu, PageIndex};
use gemmbridge::half::{bf16, f16};
use gemmbridge::paged::{reference, HostIndex, PagedCache, PagedDecode};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error, Which};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// A case's shape: page size, query heads, key/value heads, head dimension.
type Shape = (usize, usize, usize, usize);

/// The band for f16/bf16 outputs: ‖o − ref‖/‖ref‖.
const BAND: f64 = 1e-2;

/// The capture test takes this exclusively, the others share it (another thread's first
/// launch or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// A batch's cache and its host data: the tables, the lengths, q and the containers.
struct Batch<T> {
    op: PagedDecode,
    tables: Vec<i32>,
    lens: Vec<i32>,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
}

/// A batch whose sequences hold `lens` positions: each sequence's pages distinct and shuffled
/// over a container with 3 spare pages, the table width bucketed for the longest, entries past
/// a sequence's pages pointing at random pages; random q, k and v, with the slots of a
/// sequence's last page past its length set to large keys (8) and values (100).
fn batch<T: Element>(
    rng: &mut StdRng,
    (page_size, hq, hkv, d): (usize, usize, usize, usize),
    lens: &[i32],
) -> Batch<T> {
    let most = *lens.iter().max().unwrap() as usize;
    let needed: Vec<usize> = lens.iter().map(|&l| (l as usize).div_ceil(page_size)).collect();
    let pages = needed.iter().sum::<usize>() + 3;
    let c = PagedCache::new(pages, page_size, (hkv, d), T::DTYPE, (lens.len(), 1)).for_max_len(most);
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(rng);
    let mut tables = vec![0i32; c.table_elems()];
    let mut next = order.into_iter();
    for (n, &count) in needed.iter().enumerate() {
        for j in 0..c.table_width {
            let page = if j < count { next.next().unwrap() } else { rng.random_range(0..pages as i32) };
            tables[n * c.table_width + j] = page;
        }
    }
    let op = PagedDecode::new(c, hq);
    let (q, mut k, mut v) =
        (normal(rng, op.query_elems()), normal::<T>(rng, c.container_elems()), normal::<T>(rng, c.container_elems()));
    for (n, &len) in lens.iter().enumerate() {
        for p in len as usize..needed[n] * page_size {
            let (page, slot) = c.locate(&tables, n, p);
            for h in 0..hkv {
                let at = c.index(page, h, slot, 0);
                k[at..at + d].fill(T::from_f64(8.0));
                v[at..at + d].fill(T::from_f64(100.0));
            }
        }
    }
    Batch { op, tables, lens: lens.to_vec(), q, k, v }
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

impl<T: Element> Batch<T> {
    /// The float64 reference output.
    fn reference(&self) -> Vec<f64> {
        reference::decode(&self.op, &wide(&self.q), (&wide(&self.k), &wide(&self.v)), &self.tables, &self.lens)
    }
}

/// The batch's inputs on the device, and an output poisoned with NaN.
struct OnDevice<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
    tables: CudaSlice<i32>,
    lens: CudaSlice<i32>,
}

fn upload<T: Element + DeviceRepr>(gpu: &Gpu, b: &Batch<T>) -> OnDevice<T> {
    let s = gpu.stream();
    OnDevice {
        q: s.clone_htod(&b.q).unwrap(),
        k: s.clone_htod(&b.k).unwrap(),
        v: s.clone_htod(&b.v).unwrap(),
        o: s.clone_htod(&poison::<T>(b.op.query_elems())).unwrap(),
        tables: s.clone_htod(&b.tables).unwrap(),
        lens: s.clone_htod(&b.lens).unwrap(),
    }
}

/// Runs the batch with host (`device` false) or device tables; returns o.
fn decode<T: Element + DeviceRepr>(gpu: &Gpu, b: &Batch<T>, device: bool) -> Vec<f64> {
    let mut d = upload(gpu, b);
    let index = if device {
        // SAFETY: the batch's tables and lengths meet PagedDecode::check_index (built so).
        unsafe { PageIndex::device(&d.tables, &d.lens, None) }
    } else {
        PageIndex::host(HostIndex { tables: &b.tables, lens: &b.lens, new_lens: None })
    };
    gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, index).unwrap();
    wide(&gpu.stream().clone_dtoh(&d.o).unwrap())
}

fn check_cases<T: Element + DeviceRepr>() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let cases: [(Shape, &[i32], bool); 5] = [
        ((16, 8, 1, 128), &[1, 7, 129, 4095], false),
        ((64, 32, 8, 64), &[4095, 129, 7, 1], true),
        ((16, 32, 8, 128), &[7], true),
        ((64, 8, 1, 64), &[129, 1, 4095], false),
        ((16, 32, 8, 64), &[1, 1, 1, 1, 1, 1, 1, 129], true),
    ];
    for (shape, lens, device) in cases {
        let b = batch::<T>(&mut rng, shape, lens);
        let got = decode(&gpu, &b, device);
        let err = rel_error(&got, &b.reference());
        let what = format!("{} lens {lens:?} device tables {device}", b.op.describe());
        eprintln!("{what}: ‖o − ref‖/‖ref‖ = {err:.3e}");
        assert!(err < BAND, "{what}: ‖o − ref‖/‖ref‖ = {err:e} (band {BAND:e})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn paged_decode_bf16_matches_the_float64_reference() {
    check_cases::<bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn paged_decode_f16_matches_the_float64_reference() {
    check_cases::<f16>();
}

/// Every step of a growing batch inside one bucket runs on the plan of the first: the same
/// `op` (table width bucketed for the longest the bucket holds), lengths advanced by one per
/// step across a page boundary, each step against the reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn steps_inside_one_bucket_share_one_op() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let full = batch::<bf16>(&mut rng, (16, 8, 1, 64), &[64, 40, 17]);
    let mut plans = None;
    for step in 0..3 {
        let lens: Vec<i32> = [62, 14, 15].iter().map(|l| l + step).collect();
        let b = Batch { lens, ..batch_like(&full) };
        let err = rel_error(&decode(&gpu, &b, true), &b.reference());
        assert!(err < BAND, "step {step} lens {:?}: {err:e}", b.lens);
        let now = gpu.plans().attention_count();
        assert_eq!(*plans.get_or_insert(now), now, "step {step} built another plan");
    }
}

fn host<'a>(tables: &'a [i32], lens: &'a [i32]) -> PageIndex<'a> {
    PageIndex::host(HostIndex { tables, lens, new_lens: None })
}

fn batch_like<T: Clone>(b: &Batch<T>) -> Batch<T> {
    Batch { op: b.op, tables: b.tables.clone(), lens: b.lens.clone(), q: b.q.clone(), k: b.k.clone(), v: b.v.clone() }
}

/// Bad calls are refused by name before anything is written (o keeps its poison), and the
/// engine runs a good call afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_decodes_are_named_and_write_nothing() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let b = batch::<bf16>(&mut rng, (16, 8, 1, 64), &[7, 129]);
    let mut d = upload(&gpu, &b);
    let s = gpu.stream().clone();
    let good = host(&b.tables, &b.lens);
    let mut past = b.tables.clone();
    past[1] = b.op.cache.pages as i32;
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, host(&past, &b.lens)).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a page-table entry is past the container", .. }), "{e}");
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, host(&b.tables, &[7, 0])).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a length is below 1", .. }), "{e}");
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, host(&b.tables, &[7, 1 << 20])).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a length is past its table's pages", .. }), "{e}");
    let counts = [1, 1];
    let with_counts = PageIndex::host(HostIndex { tables: &b.tables, lens: &b.lens, new_lens: Some(&counts) });
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, with_counts).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a decode reads no new lengths", .. }), "{e}");
    let short = s.clone_htod(&b.q[1..]).unwrap();
    let e = gpu.paged().decode(&b.op, &short, (&d.k, &d.v), &mut d.o, good).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("q"), .. }), "{e}");
    let roomy = s.clone_htod(&[b.k.clone(), vec![bf16::ZERO; 8]].concat()).unwrap();
    let off = roomy.slice(1..);
    let e = gpu.paged().decode(&b.op, &d.q, (&off, &d.v), &mut d.o, good).unwrap_err();
    assert!(matches!(e, Error::Misaligned { operand: Which::Paged("k cache"), align: 16, .. }), "{e}");
    let short_v = s.clone_htod(&b.v[..b.v.len() - 8]).unwrap();
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &short_v), &mut d.o, good).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("v cache"), .. }), "{e}");
    let short_table = s.clone_htod(&b.tables[1..]).unwrap();
    // SAFETY: refused before launch (the table is short).
    let index = unsafe { PageIndex::device(&short_table, &d.lens, None) };
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, index).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("page table"), .. }), "{e}");
    let bad_lens = s.clone_htod(&[7i32, 0]).unwrap();
    let checked = PageIndex::device_checked(&d.tables, &bad_lens, None);
    let e = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, checked).unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a length is below 1", .. }), "{e}");
    let (qh, kh): (CudaSlice<f16>, CudaSlice<f16>) =
        (s.alloc_zeros(b.op.query_elems()).unwrap(), s.alloc_zeros(b.op.cache.container_elems()).unwrap());
    let mut oh: CudaSlice<f16> = s.alloc_zeros(b.op.query_elems()).unwrap();
    let e = gpu.paged().decode(&b.op, &qh, (&kh, &kh), &mut oh, good).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { expected: DType::BF16, got: DType::F16, .. }), "{e}");
    let after: Vec<bf16> = s.clone_dtoh(&d.o).unwrap();
    assert!(after.iter().all(|x| x.is_nan()), "a refused call wrote o");
    // the engine is usable
    gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, good).unwrap();
    let err = rel_error(&wide(&s.clone_dtoh(&d.o).unwrap()), &b.reference());
    assert!(err < BAND, "the good call after the refused ones: {err:e}");
}

/// A decode with device tables and lengths captured into a graph (after an eager call has
/// built the plan), replayed after new lengths and a new table are copied to the device, gives
/// each step's reference; host tables inside a capture are refused by name. cudarc's event
/// tracking is off, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_decode_replays_with_new_lengths_and_tables() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let b = batch::<bf16>(&mut rng, (16, 32, 8, 128), &[200, 33, 1, 120]);
    let mut d = upload(&gpu, &b);
    // SAFETY (here, in the capture and in the replays): the tables and lengths copied to the
    // device meet check_index (entries within the container, lengths within the tables).
    gpu.paged()
        .decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, unsafe { PageIndex::device(&d.tables, &d.lens, None) })
        .unwrap();
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let index = unsafe { PageIndex::device(&d.tables, &d.lens, None) };
    let r = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, index);
    let host = PageIndex::host(HostIndex { tables: &b.tables, lens: &b.lens, new_lens: None });
    let refused = gpu.paged().decode(&b.op, &d.q, (&d.k, &d.v), &mut d.o, host);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    assert!(matches!(refused, Err(Error::NotCapturable { .. })), "{refused:?}");
    let graph = graph.unwrap().expect("a graph");
    let mut step = batch_like(&b);
    for (i, lens) in [[200, 33, 1, 120], [7, 1, 129, 64], [1, 200, 16, 17]].iter().enumerate() {
        step.lens = lens.to_vec();
        // the second step swaps sequences 0 and 1's table rows
        if i == 1 {
            let w = b.op.cache.table_width;
            let (a, rest) = step.tables.split_at_mut(w);
            a.swap_with_slice(&mut rest[..w]);
        }
        s.memcpy_htod(&step.lens, &mut d.lens).unwrap();
        s.memcpy_htod(&step.tables, &mut d.tables).unwrap();
        s.memcpy_htod(&poison::<bf16>(b.op.query_elems()), &mut d.o).unwrap();
        graph.launch().unwrap();
        let err = rel_error(&wide(&s.clone_dtoh(&d.o).unwrap()), &step.reference());
        assert!(err < BAND, "replay {i} lens {lens:?}: {err:e}");
    }
}
