//! GPU tests of the append into a paged KV cache ([`GpuPaged::append`], gemmbridge's own
//! kernel `paged.cu`): the whole containers bit for bit [`cpu::paged_append`]'s (a copy) after
//! prefills and decode steps, bf16 and f16, page sizes 16 and 64, GQA shapes, sources read in
//! place from a fused QKV buffer, the 16-byte and the scalar instances (the same data at an
//! aligned address and one element past it); host, device and checked device tables; bad
//! tables and buffers named before anything is written, the engine usable after; device
//! entries out of range skipped, never written outside; a captured graph replaying the same
//! bits.
//!
//! These tests were written without a GPU and have not run yet.

mod common;

use std::sync::RwLock;

use common::{gpu, rng};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::cpu;
use gemmbridge::cuda::{Gpu, PageIndex};
use gemmbridge::half::{bf16, f16};
use gemmbridge::paged::{HostIndex, PagedAppend, PagedCache};
use gemmbridge::{DType, Element, Error, Which};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// The capture test takes this exclusively, the others share it (another thread's first
/// launch or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// The cache's element types, compared by their bits.
trait Half: Element + DeviceRepr + Copy + Default {
    fn bits(self) -> u16;
}
impl Half for bf16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
}
impl Half for f16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

/// The first element whose bits differ, if any.
fn first_difference<T: Half>(a: &[T], b: &[T]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len()).find(|&i| a[i].bits() != b[i].bits())
}

fn random<T: Half>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.random_range(-4.0..4.0))).collect()
}

fn down<T: DeviceRepr + Clone + Default>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<T> {
    gpu.stream().clone_dtoh(v).unwrap()
}

/// A cache of `batch` sequences that will hold up to `most` positions each: every sequence's
/// pages distinct and shuffled over a container with 3 spare pages; unused entries point at
/// random pages.
fn layout(
    rng: &mut StdRng,
    (page_size, hkv, d): (usize, usize, usize),
    dtype: DType,
    batch: usize,
    most: usize,
) -> (PagedCache, Vec<i32>) {
    let width = most.div_ceil(page_size);
    let pages = batch * width + 3;
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(rng);
    let tables = (0..batch * width).map(|i| order[i]).collect();
    (PagedCache::new(pages, page_size, (hkv, d), dtype, (batch, width)), tables)
}

/// One append's sources: a fused QKV buffer `[b, seq, (h_q + 2·h_kv)·d]` (`shift` elements of
/// padding in front), whose key and value heads the append reads in place, `ld` its row.
struct Sources<T> {
    qkv: Vec<T>,
    k_at: usize,
    v_at: usize,
    ld: usize,
}

fn sources<T: Half>(rng: &mut StdRng, op: &PagedAppend, h_q: usize, shift: usize) -> Sources<T> {
    let c = &op.cache;
    let ld = (h_q + 2 * c.heads_kv) * c.head_dim + usize::from(shift > 0);
    let qkv = random(rng, shift + op.tokens() * ld);
    Sources { qkv, k_at: shift + h_q * c.head_dim, v_at: shift + (h_q + c.heads_kv) * c.head_dim, ld }
}

/// One append on the GPU (host index) and on the CPU from the same containers; the whole
/// containers compared bit for bit. Returns the CPU's containers (the next step's start).
fn append_case<T: Half>(
    gpu: &Gpu,
    op: &PagedAppend,
    src: &Sources<T>,
    containers: (&[T], &[T]),
    index: &HostIndex,
) -> (Vec<T>, Vec<T>) {
    let s = gpu.stream();
    let op = op.with_ld(src.ld);
    let (mut kc, mut vc) = (containers.0.to_vec(), containers.1.to_vec());
    let (k_src, v_src) = (&src.qkv[src.k_at..], &src.qkv[src.v_at..]);
    cpu::paged_append(&op, (k_src, v_src), (&mut kc, &mut vc), index).unwrap();
    let qkv = s.clone_htod(&src.qkv).unwrap();
    let (mut gk, mut gv) = (s.clone_htod(containers.0).unwrap(), s.clone_htod(containers.1).unwrap());
    let (kv, vv) = (qkv.slice(src.k_at..), qkv.slice(src.v_at..));
    gpu.paged().append(&op, (&kv, &vv), (&mut gk, &mut gv), PageIndex::host(*index)).unwrap();
    let what = format!("{} (sources at {}, {})", op.describe(), src.k_at, src.v_at);
    assert_eq!(first_difference(&down(gpu, &gk), &kc), None, "k cache: {what}");
    assert_eq!(first_difference(&down(gpu, &gv), &vc), None, "v cache: {what}");
    (kc, vc)
}

/// A prefill of a random part of each sequence, then three decode steps, each on the GPU and the
/// CPU, at an aligned source (the 16-byte instance) and one element past it (scalar).
fn prefill_then_decode<T: Half>(gpu: &Gpu, rng: &mut StdRng, shape: (usize, usize, usize), h_q: usize) {
    let (batch, seq) = (5, 37);
    let (c, tables) = layout(rng, shape, T::DTYPE, batch, seq + 3);
    for shift in [0, 1] {
        let (mut kc, mut vc): (Vec<T>, Vec<T>) = (random(rng, c.container_elems()), random(rng, c.container_elems()));
        let pre = PagedAppend::prefill(c, seq);
        let mut lens = vec![0i32; batch];
        let counts: Vec<i32> = (0..batch).map(|n| if n == 0 { 0 } else { rng.random_range(1..=seq as i32) }).collect();
        let index = HostIndex { tables: &tables, lens: &lens, new_lens: Some(&counts) };
        (kc, vc) = append_case(gpu, &pre, &sources(rng, &pre, h_q, shift), (&kc, &vc), &index);
        lens.iter_mut().zip(&counts).for_each(|(l, c)| *l += c);
        for _ in 0..3 {
            let step = PagedAppend::decode(c);
            let index = HostIndex { tables: &tables, lens: &lens, new_lens: None };
            (kc, vc) = append_case(gpu, &step, &sources(rng, &step, h_q, shift), (&kc, &vc), &index);
            lens.iter_mut().for_each(|l| *l += 1);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn appends_equal_the_cpu_bit_for_bit() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    prefill_then_decode::<bf16>(&gpu, &mut rng, (16, 8, 128), 32);
    prefill_then_decode::<bf16>(&gpu, &mut rng, (64, 1, 64), 8);
    prefill_then_decode::<f16>(&gpu, &mut rng, (16, 1, 128), 8);
    prefill_then_decode::<f16>(&gpu, &mut rng, (64, 8, 64), 32);
}

/// Device tables and lengths (unchecked and checked) give the host path's bits; an entry past
/// the container in unchecked device tables skips that sequence's rows (nothing written
/// outside the containers, the others appended as the CPU appends them).
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_tables_give_the_same_bits_and_bad_entries_write_nothing() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let (c, mut tables) = layout(&mut rng, (16, 8, 128), DType::BF16, 4, 40);
    let op = PagedAppend::decode(c);
    let lens = vec![3, 16, 31, 0];
    let (k, v): (Vec<bf16>, Vec<bf16>) = (random(&mut rng, op.source_elems()), random(&mut rng, op.source_elems()));
    let start: Vec<bf16> = random(&mut rng, c.container_elems());
    let (dk, dv) = (s.clone_htod(&k).unwrap(), s.clone_htod(&v).unwrap());
    let dlens = s.clone_htod(&lens).unwrap();
    for checked in [false, true] {
        let (mut kc, mut vc) = (start.clone(), start.clone());
        let index = HostIndex { tables: &tables, lens: &lens, new_lens: None };
        cpu::paged_append(&op, (&k, &v), (&mut kc, &mut vc), &index).unwrap();
        let dtables = s.clone_htod(&tables).unwrap();
        let (mut gk, mut gv) = (s.clone_htod(&start).unwrap(), s.clone_htod(&start).unwrap());
        // SAFETY: the tables and lengths meet check_index (the CPU call above accepted them).
        let at = if checked {
            PageIndex::device_checked(&dtables, &dlens, None)
        } else {
            unsafe { PageIndex::device(&dtables, &dlens, None) }
        };
        gpu.paged().append(&op, (&dk, &dv), (&mut gk, &mut gv), at).unwrap();
        assert_eq!(first_difference(&down(&gpu, &gk), &kc), None, "k cache, checked {checked}");
        assert_eq!(first_difference(&down(&gpu, &gv), &vc), None, "v cache, checked {checked}");
    }
    // sequence 2 (length 31: page entry 1) points past the container
    tables[2 * c.table_width + 1] = c.pages as i32 + 5;
    let dtables = s.clone_htod(&tables).unwrap();
    let (mut gk, mut gv) = (s.clone_htod(&start).unwrap(), s.clone_htod(&start).unwrap());
    let e = gpu
        .paged()
        .append(&op, (&dk, &dv), (&mut gk, &mut gv), PageIndex::device_checked(&dtables, &dlens, None))
        .unwrap_err();
    assert!(matches!(e, Error::PagedCache { what: "a page-table entry is past the container", .. }), "{e}");
    assert_eq!(first_difference(&down(&gpu, &gk), &start), None, "a refused call wrote");
    // SAFETY: deliberately broken: the kernel must skip the row whose page is out of range.
    gpu.paged()
        .append(&op, (&dk, &dv), (&mut gk, &mut gv), unsafe { PageIndex::device(&dtables, &dlens, None) })
        .unwrap();
    let (mut kc, mut vc) = (start.clone(), start.clone());
    let skip = [1, 1, 0, 1];
    let fixed: Vec<i32> = tables.iter().map(|&t| t.min(c.pages as i32 - 1)).collect();
    let index = HostIndex { tables: &fixed, lens: &lens, new_lens: Some(&skip) };
    cpu::paged_append(&op, (&k, &v), (&mut kc, &mut vc), &index).unwrap();
    assert_eq!(first_difference(&down(&gpu, &gk), &kc), None, "k cache with a bad entry");
    assert_eq!(first_difference(&down(&gpu, &gv), &vc), None, "v cache with a bad entry");
}

/// Bad problems, host tables and buffers are named before anything is written; the engine is
/// usable afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_appends_are_named_and_write_nothing() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let (c, tables) = layout(&mut rng, (16, 2, 64), DType::BF16, 2, 64);
    let op = PagedAppend::prefill(c, 20);
    let (k, v) = (
        s.clone_htod(&random::<bf16>(&mut rng, op.source_elems())).unwrap(),
        s.clone_htod(&random::<bf16>(&mut rng, op.source_elems())).unwrap(),
    );
    let start: Vec<bf16> = random(&mut rng, c.container_elems() + 1);
    let (mut kc, mut vc) = (s.clone_htod(&start).unwrap(), s.clone_htod(&start).unwrap());
    let rule = |e: Error| match e {
        Error::PagedCache { what, .. } => what,
        other => panic!("not a PagedCache error: {other}"),
    };
    let mut call =
        |index: HostIndex| gpu.paged().append(&op, (&k, &v), (&mut kc, &mut vc), PageIndex::host(index)).unwrap_err();
    let mut bad = tables.clone();
    bad[3] = c.pages as i32;
    assert_eq!(
        rule(call(HostIndex { tables: &bad, lens: &[0, 0], new_lens: None })),
        "a page-table entry is past the container"
    );
    bad[3] = -1;
    assert_eq!(rule(call(HostIndex { tables: &bad, lens: &[0, 0], new_lens: None })), "a page-table entry is negative");
    assert_eq!(
        rule(call(HostIndex { tables: &tables, lens: &[45, 0], new_lens: None })),
        "a length is past its table's pages"
    );
    let new_too_many = [21, 0];
    assert!(
        rule(call(HostIndex { tables: &tables, lens: &[0, 0], new_lens: Some(&new_too_many) })).contains("more rows")
    );
    let mut twice = tables.clone();
    twice[c.table_width] = tables[0]; // sequence 1's first page is sequence 0's first
    assert!(rule(call(HostIndex { tables: &twice, lens: &[0, 0], new_lens: None })).contains("write one page"));
    let good = HostIndex { tables: &tables, lens: &[0, 0], new_lens: None };
    // buffers: a short source, a misaligned container, a short device table, the element type
    let short = s.clone_htod(&vec![bf16::ZERO; op.source_elems() - 1]).unwrap();
    let e = gpu.paged().append(&op, (&short, &v), (&mut kc, &mut vc), PageIndex::host(good)).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("new k"), .. }), "{e}");
    let mut off = kc.slice_mut(1..);
    let e = gpu.paged().append(&op, (&k, &v), (&mut off, &mut vc), PageIndex::host(good)).unwrap_err();
    assert!(matches!(e, Error::Misaligned { operand: Which::Paged("k cache"), align: 16, .. }), "{e}");
    let (dt, dl) = (s.clone_htod(&tables[1..]).unwrap(), s.clone_htod(&[0i32, 0]).unwrap());
    // SAFETY: refused before launch (the table is short).
    let e = gpu
        .paged()
        .append(&op, (&k, &v), (&mut kc, &mut vc), unsafe { PageIndex::device(&dt, &dl, None) })
        .unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Paged("page table"), .. }), "{e}");
    let (kh, mut ch): (CudaSlice<f16>, CudaSlice<f16>) =
        (s.alloc_zeros(op.source_elems()).unwrap(), s.alloc_zeros(c.container_elems()).unwrap());
    let mut ch2: CudaSlice<f16> = s.alloc_zeros(c.container_elems()).unwrap();
    let e = gpu.paged().append(&op, (&kh, &kh), (&mut ch, &mut ch2), PageIndex::host(good)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { expected: DType::BF16, got: DType::F16, .. }), "{e}");
    assert_eq!(first_difference(&down(&gpu, &kc), &start), None, "a refused call wrote k");
    assert_eq!(first_difference(&down(&gpu, &vc), &start), None, "a refused call wrote v");
    // the engine is usable
    gpu.paged().append(&op, (&k, &v), (&mut kc, &mut vc), PageIndex::host(good)).unwrap();
    assert!(first_difference(&down(&gpu, &kc), &start).is_some(), "the good call wrote nothing");
}

/// Decode steps with device tables and lengths captured into a graph, replayed after the
/// lengths are advanced on the device, give the eager calls' bits; host tables inside a
/// capture are refused by name. cudarc's event tracking is off, as capturing cudarc buffers
/// needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_append_replays_the_same_bits() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let (c, tables) = layout(&mut rng, (16, 8, 128), DType::BF16, 8, 64);
    let op = PagedAppend::decode(c);
    let start: Vec<bf16> = random(&mut rng, c.container_elems());
    let steps: Vec<(Vec<bf16>, Vec<bf16>)> =
        (0..2).map(|_| (random(&mut rng, op.source_elems()), random(&mut rng, op.source_elems()))).collect();
    let lens0: Vec<i32> = (0..8).map(|n| 7 * n).collect();
    let (dt, mut dl) = (s.clone_htod(&tables).unwrap(), s.clone_htod(&lens0).unwrap());
    let (mut dk, mut dv) = (s.clone_htod(&steps[0].0).unwrap(), s.clone_htod(&steps[0].1).unwrap());
    let (mut gk, mut gv) = (s.clone_htod(&start).unwrap(), s.clone_htod(&start).unwrap());
    // eager first call: compiles the kernel
    let (mut ek, mut ev) = (s.clone_htod(&start).unwrap(), s.clone_htod(&start).unwrap());
    // SAFETY (here and in the capture): the tables and lengths meet check_index (distinct pages,
    // lengths within the tables).
    gpu.paged().append(&op, (&dk, &dv), (&mut ek, &mut ev), unsafe { PageIndex::device(&dt, &dl, None) }).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let r = gpu.paged().append(&op, (&dk, &dv), (&mut gk, &mut gv), unsafe { PageIndex::device(&dt, &dl, None) });
    let refused = gpu.paged().append(
        &op,
        (&dk, &dv),
        (&mut gk, &mut gv),
        PageIndex::host(HostIndex { tables: &tables, lens: &lens0, new_lens: None }),
    );
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    assert!(matches!(refused, Err(Error::NotCapturable { .. })), "{refused:?}");
    let graph = graph.unwrap().expect("a graph");
    let (mut kc, mut vc) = (start.clone(), start.clone());
    let mut lens = lens0.clone();
    for (k, v) in &steps {
        s.memcpy_htod(k, &mut dk).unwrap();
        s.memcpy_htod(v, &mut dv).unwrap();
        s.memcpy_htod(&lens, &mut dl).unwrap();
        graph.launch().unwrap();
        let index = HostIndex { tables: &tables, lens: &lens, new_lens: None };
        cpu::paged_append(&op, (k, v), (&mut kc, &mut vc), &index).unwrap();
        lens.iter_mut().for_each(|l| *l += 1);
    }
    assert_eq!(first_difference(&down(&gpu, &gk), &kc), None, "captured k cache");
    assert_eq!(first_difference(&down(&gpu, &gv), &vc), None, "captured v cache");
}
