//! The grouped GEMM on the GPU ([`Gpu::grouped_gemm`]) against the float64 reference
//! (`grouped::reference`): every product (forward with and without a bias, backward data,
//! backward weight) at ragged group sizes (0, 1, 7, 129, 4096 rows), every precision, outputs
//! poisoned with NaN first, on every way of running it (one strided batch for equal groups, a
//! pool of streams, in order); a pooled call captured into a CUDA graph replays the eager
//! result bit for bit; and bad input refused before anything is written.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::align::candidates_at;
use gemmbridge::grouped::streams::{candidates, GroupedBackend};
use gemmbridge::grouped::{reference, GroupedOp, GroupedProblem};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error, Precision, Which};
use rand::rngs::StdRng;

/// The ragged group sizes of every test.
const SIZES: [usize; 6] = [0, 1, 7, 129, 4096, 0];

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Equal groups (one strided batch).
const EQUAL: [usize; 3] = [65, 65, 65];

/// Whether the loaded cuDNN has the MoE grouped matmul (9.18 or later; PyTorch's
/// `nvidia/cudnn/lib` first on `LD_LIBRARY_PATH`).
fn cudnn_moe() -> bool {
    gemmbridge::cuda::cudnn_version().is_some_and(|v| v >= 91800)
}

/// The ways that apply to `p` on cudarc's allocations (256-byte aligned bases: only the rows
/// decide whether cuBLAS's grouped call takes the pointers).
fn ways(p: &GroupedProblem) -> Vec<GroupedBackend> {
    candidates_at(p, [0; 3], cudnn_moe())
}

/// One product against float64 on every backend that applies (forced), then as the engine
/// chooses: ‖out − ref‖/‖ref‖ within the precision's band, for the whole output and for each
/// group's part of it (so that a wrong small group is not hidden by a large one). The largest
/// error.
fn check<T: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, rng: &mut StdRng) -> f64 {
    let mut worst = 0f64;
    for backend in ways(p).into_iter().map(Some).chain([None]) {
        gpu.update_options(|o| o.grouped_backend = backend).unwrap();
        worst = worst.max(check_one::<T>(gpu, p, rng));
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    worst
}

fn check_one<T: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, rng: &mut StdRng) -> f64 {
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<T>, Vec<T>) = (normal(rng, la), normal(rng, lb));
    let bias: Option<Vec<T>> = p.has_bias().then(|| normal(rng, p.groups() * p.n()));
    let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
    let dbias = bias.as_ref().map(|v| s.clone_htod(v).unwrap());
    let mut dc = s.clone_htod(&poison::<T>(lc)).unwrap();
    gpu.grouped_gemm(p, &da, &db, &mut dc, dbias.as_ref().map(|v| v as &dyn DevicePtr<T>))
        .unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    let got = wide(&s.clone_dtoh(&dc).unwrap());
    let mut want = vec![f64::NAN; lc];
    reference::run(p, &wide(&a), &wide(&b), bias.as_ref().map(|v| wide(v)).as_deref(), &mut want);
    let tol = p.precision().tolerance();
    let how = gpu.plans().grouped_backend(p).unwrap();
    let mut e = rel_error(&got, &want);
    assert!(e <= tol, "{} on {how:?}: rel error {e:e} > {tol:e}", p.describe());
    for g in 0..p.groups() {
        let (start, [rows, cols]) = p.tn_output(g);
        let part = start..start + rows * cols;
        let eg = rel_error(&got[part.clone()], &want[part]);
        assert!(eg <= tol, "{} on {how:?}: group {g} ({rows}×{cols}) rel error {eg:e} > {tol:e}", p.describe());
        e = e.max(eg);
    }
    e
}

fn all_products<T: Element + DeviceRepr>(precisions: &[Precision]) {
    let (gpu, mut rng) = (gpu(), rng());
    // three lanes for four groups with rows: one lane runs two
    gpu.update_options(|o| o.grouped_streams = 3).unwrap();
    for &precision in precisions {
        // (96, 64): aligned slices; (33, 17): every group's slice starts off 16 bytes; (33, 64)
        // and (64, 33): one operand's rows off 16 bytes and the other's on them (cuBLAS's
        // grouped call is then no way: grouped::align)
        for (n, k) in [(96, 64), (33, 17), (33, 64), (64, 33)] {
            for (op, sizes) in [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight]
                .into_iter()
                .flat_map(|op| [(op, &SIZES[..]), (op, &EQUAL[..])])
            {
                let p = GroupedProblem::new(op, sizes, n, k, precision).unwrap();
                let e = check::<T>(&gpu, &p, &mut rng);
                eprintln!("{}: rel error {e:.2e} (worst of {:?} and the choice)", p.describe(), ways(&p));
            }
            let p = GroupedProblem::new(GroupedOp::Forward, &SIZES, n, k, precision).unwrap().with_bias().unwrap();
            check::<T>(&gpu, &p, &mut rng);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_f32_and_tf32() {
    all_products::<f32>(&[Precision::F32, Precision::TF32]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_f16() {
    all_products::<f16>(&[Precision::F16]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_matches_float64_bf16() {
    all_products::<bf16>(&[Precision::BF16]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 16, 8, Precision::BF16).unwrap();
    let [la, lb, lc] = p.lens();
    let up = |len: usize, rng: &mut StdRng| s.clone_htod(&normal::<bf16>(rng, len)).unwrap();
    let (a, b) = (up(la, &mut rng), up(lb, &mut rng));
    let untouched = |c: &CudaSlice<bf16>| s.clone_dtoh(c).unwrap().iter().all(|x| x.is_nan());
    // an output one element short
    let mut short = s.clone_htod(&poison::<bf16>(lc - 1)).unwrap();
    match gpu.grouped_gemm(&p, &a, &b, &mut short, None) {
        Err(Error::BufferTooSmall { operand: Which::Grouped("y"), needed_elems, .. }) => assert_eq!(needed_elems, lc),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&short));
    // a bias the problem does not have, and none where it has one
    let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    let bias = up(3 * 16, &mut rng);
    assert!(matches!(gpu.grouped_gemm(&p, &a, &b, &mut c, Some(&bias)), Err(Error::EpilogueOperand { .. })));
    let pb = p.clone().with_bias().unwrap();
    assert!(matches!(gpu.grouped_gemm(&pb, &a, &b, &mut c, None), Err(Error::EpilogueOperand { .. })));
    // buffers of another element type than the precision's
    let p16 = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 16, 8, Precision::F16).unwrap();
    match gpu.grouped_gemm(&p16, &a, &b, &mut c, None) {
        Err(Error::DTypeMismatch { expected, .. }) => assert_eq!(expected, gemmbridge::DType::F16),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&c));
    // a bias shorter than E·N
    let short_bias = up(3 * 16 - 1, &mut rng);
    match gpu.grouped_gemm(&pb, &a, &b, &mut c, Some(&short_bias)) {
        Err(Error::BufferTooSmall { operand: Which::Bias, needed_elems, .. }) => assert_eq!(needed_elems, 48),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&c));
    // a forced strided batch for groups of different sizes
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::StridedBatch)).unwrap();
    match gpu.grouped_gemm(&p, &a, &b, &mut c, None) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("StridedBatch"), "{what}"),
        other => panic!("{other:?}"),
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    assert!(untouched(&c));
    // cuBLAS's grouped call forced on rows off 16 bytes (N = 17 bf16: 34-byte rows of y):
    // refused by name; chosen by the rule, it becomes the pool
    let odd = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 17, 8, Precision::BF16).unwrap();
    assert!(candidates(&odd, cudnn_moe()).contains(&GroupedBackend::GroupedBatched));
    let mut c_odd = s.clone_htod(&poison::<bf16>(odd.lens()[2])).unwrap();
    let b_odd = up(odd.lens()[1], &mut rng);
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::GroupedBatched)).unwrap();
    match gpu.grouped_gemm(&odd, &a, &b_odd, &mut c_odd, None) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("34 bytes"), "{what}"),
        other => panic!("{other:?}"),
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    assert!(untouched(&c_odd));
    gpu.grouped_gemm(&odd, &a, &b_odd, &mut c_odd, None).unwrap();
    assert!(!untouched(&c_odd));
    assert!(matches!(gpu.update_options(|o| o.grouped_streams = 0), Err(Error::OutOfRange { .. })));
    assert!(matches!(gpu.update_options(|o| o.grouped_streams = 17), Err(Error::OutOfRange { .. })));
    // the engine is usable afterwards
    let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    assert!(!untouched(&c));
}

/// Skewed groups (one of 2100 rows beside empty and tiny ones) on cuDNN's MoE grouped matmul
/// where the loaded cuDNN has it (a forward), checked with every other way against float64
/// (per group); without it, and for a backward data, the way is refused by name when forced.
#[test]
#[ignore = "needs a CUDA GPU"]
fn skewed_groups_on_cudnns_moe_operation() {
    let (gpu, mut rng) = (gpu(), rng());
    for (op, precision) in [(GroupedOp::Forward, Precision::BF16), (GroupedOp::BackwardData, Precision::F16)] {
        let p = GroupedProblem::new(op, &[1, 0, 7, 2100, 129], 512, 1024, precision).unwrap();
        let forward = op == GroupedOp::Forward;
        assert_eq!(ways(&p).contains(&GroupedBackend::Cudnn), cudnn_moe() && forward, "{:?}", ways(&p));
        if !cudnn_moe() || !forward {
            gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::Cudnn)).unwrap();
            let e = gpu.plans().grouped_backend(&p).unwrap_err().to_string();
            gpu.update_options(|o| o.grouped_backend = None).unwrap();
            assert!(e.contains(if forward { "9.18" } else { "backward data" }), "{e}");
            eprintln!("cuDNN {:?} has no MoE grouped matmul: {e}", gemmbridge::cuda::cudnn_version());
            continue;
        }
        let e = match precision {
            Precision::F16 => check::<f16>(&gpu, &p, &mut rng),
            _ => check::<bf16>(&gpu, &p, &mut rng),
        };
        eprintln!("{}: rel error {e:.2e} (worst of {:?} and the choice)", p.describe(), ways(&p));
    }
}

/// A pooled grouped call is captured with the pool's work (forked and joined by events) once
/// the pool exists: the graph's result is the eager call's, bit for bit; before any pooled call
/// with that many streams, the capture is refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_pooled_call_is_captured_with_its_streams() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (gpu, mut rng) = (gpu(), rng());
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let s = gpu.stream().clone();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let p = GroupedProblem::new(GroupedOp::Forward, &[40, 0, 300, 7, 129, 64], 96, 64, Precision::BF16).unwrap();
    // small unequal groups would go to cuBLAS's grouped call (not capturable): force the pool
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::StreamPool)).unwrap();
    assert_eq!(gpu.plans().grouped_backend(&p).unwrap(), GroupedBackend::StreamPool);
    let [la, lb, lc] = p.lens();
    let (a, b) =
        (s.clone_htod(&normal::<bf16>(&mut rng, la)).unwrap(), s.clone_htod(&normal::<bf16>(&mut rng, lb)).unwrap());
    let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    // no lanes yet: refused inside the capture
    s.begin_capture(mode).unwrap();
    let e = gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");
    // eager, then captured
    let mut eager = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    gpu.grouped_gemm(&p, &a, &b, &mut eager, None).unwrap();
    let want = s.clone_dtoh(&eager).unwrap();
    s.begin_capture(mode).unwrap();
    let r = gpu.grouped_gemm(&p, &a, &b, &mut c, None);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    let got = s.clone_dtoh(&c).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate().take(p.row_start(p.groups()) * p.n()) {
        assert_eq!(g.to_bits(), w.to_bits(), "captured grouped forward at element {i}");
    }
    // cuBLAS's grouped call copies its pointer arrays from the host: refused in a capture
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::GroupedBatched)).unwrap();
    s.begin_capture(mode).unwrap();
    let e = gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");
}

/// PyTorch-style offsets on the device come back to the host for
/// `GroupedProblem::from_offsets`, and give the same result as the host sizes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_offsets_give_the_host_sizes_problem() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream().clone();
    let sizes = [5usize, 0, 130, 1];
    let offs: Vec<i32> = sizes
        .iter()
        .scan(0i32, |end, &m| {
            *end += m as i32;
            Some(*end)
        })
        .collect();
    let doffs = s.clone_htod(&offs).unwrap();
    let back: Vec<i32> = s.clone_dtoh(&doffs).unwrap();
    assert_eq!(back, offs);
    let p = GroupedProblem::from_offsets(GroupedOp::Forward, &back, 136, 48, 32, Precision::F16).unwrap();
    assert_eq!(p.sizes(), sizes);
    check::<f16>(&gpu, &p, &mut rng);
}

/// A pooled call repeated on the same buffers is replayed from one graph of the whole call
/// (from the second call on): its result is the first call's, bit for bit, and it reads the
/// buffers when it runs (new data in the same buffers gives the new product).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_repeated_pooled_call_replays_with_the_direct_result() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream().clone();
    let p = GroupedProblem::new(GroupedOp::BackwardWeight, &[40, 0, 300, 7, 129], 96, 64, Precision::F16).unwrap();
    let [la, lb, lc] = p.lens();
    let a = s.clone_htod(&normal::<f16>(&mut rng, la)).unwrap();
    let mut b = s.clone_htod(&normal::<f16>(&mut rng, lb)).unwrap();
    let mut c = s.clone_htod(&poison::<f16>(lc)).unwrap();
    gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    let first = s.clone_dtoh(&c).unwrap();
    // the groups' own small calls may have graphs already; the whole call adds one
    let before = gpu.plans().graphs();
    for call in 2..=4 {
        s.memcpy_htod(&poison::<f16>(lc), &mut c).unwrap();
        gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
        let again = s.clone_dtoh(&c).unwrap();
        assert!(first.iter().zip(&again).all(|(x, y)| x.to_bits() == y.to_bits()), "call {call} differs");
    }
    assert_eq!(gpu.plans().graphs(), before + 1, "one graph of the whole call");
    // new data in b: the replayed graph reads it
    let hb: Vec<f16> = normal(&mut rng, lb);
    s.memcpy_htod(&hb, &mut b).unwrap();
    s.memcpy_htod(&poison::<f16>(lc), &mut c).unwrap();
    gpu.grouped_gemm(&p, &a, &b, &mut c, None).unwrap();
    let got = wide(&s.clone_dtoh(&c).unwrap());
    let mut want = vec![f64::NAN; lc];
    reference::run(&p, &wide(&s.clone_dtoh(&a).unwrap()), &wide(&hb), None, &mut want);
    let e = rel_error(&got, &want);
    assert!(e <= 1e-2, "replayed with new data: rel error {e:e}");
}
