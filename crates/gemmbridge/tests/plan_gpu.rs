//! GPU tests of plans the caller holds ([`GemmPlan`]): a plan's runs against float64 and bit
//! for bit against the eager call on the same operands — with an epilogue, a separate C, by
//! address, from two threads; the eager semantics it keeps (k = 0, α = 0, an empty problem);
//! bad input named before anything is enqueued, the engine usable after; and runs captured
//! into CUDA graphs: a cuBLASLt plan after the eager plan cache dropped the same problem's
//! plan, and a cuBLAS plan.

mod common;

use std::sync::RwLock;

use common::{cases, check, gpu, gpu_with, normal, operands, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use gemmbridge::cuda::{Extras, GemmPlan, Gpu, GpuOptions, Padding, RawBuffer, RawOperands, Scale, Served};
use gemmbridge::half::bf16;
use gemmbridge::{Element, Epilogue, Error, GemmProblem, Precision, Which};

/// Held for writing by the capture test (a capture in flight must not see another thread's
/// first kernel launch), for reading by the others.
static CAPTURE: RwLock<()> = RwLock::new(());

/// Every case of `shapes`: the plan's run against float64 (C poisoned where β = 0, padding
/// untouched), then the eager call on the same operands, bit for bit the plan's result (the
/// eager call without aligned copies, which a plan never makes, so that both run the same
/// cuBLASLt plan).
fn runs_as_the_eager_call<T: Element + DeviceRepr>(precision: Precision) {
    let _shared = CAPTURE.read().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut rng) = (gpu_with(GpuOptions::default().padding(Padding::off())), rng());
    let s = gpu.stream().clone();
    for case in cases(&[(37, 48, 72), (64, 64, 64)]) {
        let p = case.problem(precision);
        let plan = GemmPlan::new(&gpu, &p).unwrap();
        // cuBLASLt, or cuBLAS where its heuristic has no algorithm: the eager call's library
        // either way, compared bit for bit below
        assert!(plan.library().is_some(), "{}", p.describe());
        for beta in [0.0, 0.5] {
            let ops = operands::<T, T>(&mut rng, &p, 1.0, beta);
            let (a, b) = (s.clone_htod(&ops.a).unwrap(), s.clone_htod(&ops.b).unwrap());
            let mut c = s.clone_htod(&ops.c).unwrap();
            plan.run(&gpu, Scale::new(1.0, beta as f32), &a, &b, &mut c, Extras::default()).unwrap();
            let planned = s.clone_dtoh(&c).unwrap();
            check("plan.run", &p, &ops.c, &planned, &ops.reference);
            let mut eager = s.clone_htod(&ops.c).unwrap();
            gpu.gemm(&p, 1.0, &a, &b, beta as f32, &mut eager).unwrap();
            assert_eq!(bits(&s.clone_dtoh(&eager).unwrap()), bits(&planned), "{} β {beta}", p.describe());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_plans_run_as_the_eager_call() {
    runs_as_the_eager_call::<f32>(Precision::F32);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_plans_run_as_the_eager_call() {
    runs_as_the_eager_call::<bf16>(Precision::BF16);
}

/// k = 0 is planned on cuBLAS and gives β·C; α = 0 on a cuBLASLt plan never reads A and B
/// (NaN there does not leak); an empty problem launches nothing.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_eager_fallbacks_keep_blas_semantics() {
    let _shared = CAPTURE.read().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream().clone();
    let k0 = GemmProblem::linear(16, 24, 0, Precision::F32).unwrap();
    let plan = GemmPlan::new(&gpu, &k0).unwrap();
    assert_eq!(plan.library(), Some(Served::Blas));
    let c0: Vec<f32> = normal(&mut rng, 16 * 24);
    let mut c = s.clone_htod(&c0).unwrap();
    let empty: CudaSlice<f32> = s.alloc_zeros(1).unwrap();
    plan.run(&gpu, Scale::new(1.0, 0.5), &empty, &empty, &mut c, Extras::default()).unwrap();
    let got = s.clone_dtoh(&c).unwrap();
    assert!(got.iter().zip(&c0).all(|(g, w)| *g == 0.5 * w), "k = 0 gives β·C");

    let p = GemmProblem::linear(32, 32, 32, Precision::F32).unwrap();
    let plan = GemmPlan::new(&gpu, &p).unwrap();
    let nan = s.clone_htod(&poison::<f32>(32 * 32)).unwrap();
    let c1: Vec<f32> = normal(&mut rng, 32 * 32);
    let mut c = s.clone_htod(&c1).unwrap();
    plan.run(&gpu, Scale::new(0.0, 2.0), &nan, &nan, &mut c, Extras::default()).unwrap();
    let got = s.clone_dtoh(&c).unwrap();
    assert!(got.iter().zip(&c1).all(|(g, w)| *g == 2.0 * w), "α = 0 reads neither A nor B");

    let none = GemmProblem::linear(0, 8, 8, Precision::F32).unwrap();
    let plan = GemmPlan::new(&gpu, &none).unwrap();
    assert_eq!(plan.library(), None);
    let mut untouched = s.clone_htod(&[7.0f32]).unwrap();
    plan.run(&gpu, Scale::PRODUCT, &empty, &empty, &mut untouched, Extras::default()).unwrap();
    assert_eq!(s.clone_dtoh(&untouched).unwrap(), [7.0]);
}

/// Each bad input is named before anything is enqueued (C keeps its poison), and the plan and
/// the engine run correctly afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_the_plan_still_runs() {
    let _shared = CAPTURE.read().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream().clone();
    let p = GemmProblem::linear(64, 64, 64, Precision::F32).unwrap();
    for bad in [0, 3, 512] {
        match GemmPlan::aligned_to(&gpu, &p, bad) {
            Err(Error::OutOfRange { what: "plan alignment", value, .. }) => assert_eq!(value, bad as u64),
            r => panic!("alignment {bad}: {r:?}"),
        }
    }
    let plan = GemmPlan::new(&gpu, &p).unwrap();
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    let (a, b) = (s.clone_htod(&ops.a).unwrap(), s.clone_htod(&ops.b).unwrap());
    let mut c = s.clone_htod(&ops.c).unwrap();
    let other = Gpu::new(0).unwrap();
    let foreign = plan.run(&other, Scale::PRODUCT, &a, &b, &mut c, Extras::default());
    assert!(matches!(foreign, Err(Error::ForeignPlan { plan: "GemmPlan" })), "{foreign:?}");
    // a view 4 floats (16 bytes) in: off the plan's 256 bytes
    let wide_a = s.clone_htod(&[vec![0.0f32; 4], ops.a.clone()].concat()).unwrap();
    let off = plan.run(&gpu, Scale::PRODUCT, &wide_a.slice(4..), &b, &mut c, Extras::default());
    assert!(matches!(off, Err(Error::Misaligned { operand: Which::A, align: 256, .. })), "{off:?}");
    let short = plan.run(&gpu, Scale::PRODUCT, &a.slice(1..), &b, &mut c, Extras::default());
    assert!(matches!(short, Err(Error::BufferTooSmall { .. })), "{short:?}");
    assert!(s.clone_dtoh(&c).unwrap().iter().all(|x| x.is_nan()), "nothing was written");
    // a plan for 16-byte alignment takes the view
    let plan16 = GemmPlan::aligned_to(&gpu, &p, 16).unwrap();
    plan16.run(&gpu, Scale::PRODUCT, &wide_a.slice(4..), &b, &mut c, Extras::default()).unwrap();
    check("plan aligned to 16", &p, &ops.c, &s.clone_dtoh(&c).unwrap(), &ops.reference);
    let mut again = s.clone_htod(&ops.c).unwrap();
    plan.run(&gpu, Scale::PRODUCT, &a, &b, &mut again, Extras::default()).unwrap();
    check("after the errors", &p, &ops.c, &s.clone_dtoh(&again).unwrap(), &ops.reference);
}

/// With an eager plan cache of one plan, another problem's eager call drops this problem's
/// cached plan; the held plan still runs inside a capture (nothing built or allocated) and
/// the replayed graph gives the eager result bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_held_plan_is_capturable_after_the_cache_dropped_its_problem() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let gpu = gpu_with(GpuOptions::default().plan_cache_capacity(1));
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let (p, q) = (
        GemmProblem::linear(96, 80, 64, Precision::BF16).unwrap(),
        GemmProblem::linear(8, 8, 8, Precision::BF16).unwrap(),
    );
    let plan = GemmPlan::new(&gpu, &p).unwrap();
    let ops = operands::<bf16, bf16>(&mut rng, &p, 1.0, 0.0);
    let (a, b) = (s.clone_htod(&ops.a).unwrap(), s.clone_htod(&ops.b).unwrap());
    let mut eager = s.clone_htod(&ops.c).unwrap();
    gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut eager).unwrap();
    let small = s.alloc_zeros::<bf16>(64).unwrap();
    let mut small_c = s.alloc_zeros::<bf16>(64).unwrap();
    gpu.gemm(&q, 1.0, &small, &small, 0.0, &mut small_c).unwrap(); // drops p's cached plan
    let mut c = s.clone_htod(&ops.c).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(mode).unwrap();
    let dropped = gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c);
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(dropped, Err(Error::NotCapturable { .. })), "the eager plan was dropped: {dropped:?}");
    s.begin_capture(mode).unwrap();
    let r = plan.run(&gpu, Scale::PRODUCT, &a, &b, &mut c, Extras::default());
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    assert_eq!(bits(&s.clone_dtoh(&c).unwrap()), bits(&s.clone_dtoh(&eager).unwrap()));
}

/// Every element's value as float64 bits (exact for each element type), for bit-for-bit
/// comparisons.
fn bits<T: Element>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

/// A plan with an epilogue that reads a bias and writes an aux (the descriptor's pointers are
/// set at every run), with a separate read-only C, and through the raw path: each bit for bit
/// the eager call on the same buffers; then one plan run from two threads at once, each
/// thread with its own bias and output, each bit for bit its eager result.
#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_a_separate_c_raw_runs_and_threads_match_the_eager_call() {
    let _shared = CAPTURE.read().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut rng) = (gpu_with(GpuOptions::default().padding(Padding::off())), rng());
    let s = gpu.stream().clone();
    let p = GemmProblem::linear(64, 96, 80, Precision::BF16).unwrap().with_epilogue(Epilogue::GeluAuxBias).unwrap();
    let plan = GemmPlan::new(&gpu, &p).unwrap();
    assert_eq!(plan.library(), Some(Served::Lt));
    let up = |v: Vec<bf16>| s.clone_htod(&v).unwrap();
    let (a, b) = (up(normal(&mut rng, 64 * 80)), up(normal(&mut rng, 96 * 80)));
    let (bias, c_in) = (up(normal(&mut rng, 96)), up(normal(&mut rng, 64 * 96)));
    let aux_len = p.aux().required_elems(1).unwrap();
    let run = |planned: bool, bias: &CudaSlice<bf16>| -> (Vec<u64>, Vec<u64>) {
        let (mut c, mut aux) = (up(poison(64 * 96)), up(poison(aux_len)));
        let ex = Extras { c_in: Some(&c_in), bias: Some(bias), aux_out: Some(&mut aux), ..Extras::default() };
        let scale = Scale::new(1.0, 0.5);
        if planned {
            plan.run(&gpu, scale, &a, &b, &mut c, ex).unwrap();
        } else {
            gpu.gemm_fused(&p, scale, &a, &b, &mut c, ex).unwrap();
        }
        (bits(&s.clone_dtoh(&c).unwrap()), bits(&s.clone_dtoh(&aux).unwrap()))
    };
    let want = run(false, &bias);
    assert!(want.0.iter().all(|&x| !f64::from_bits(x).is_nan()), "the eager result is finite");
    assert_eq!(run(true, &bias), want, "plan.run");

    // the raw path: the same buffers by address
    let (mut c, mut aux) = (up(poison(64 * 96)), up(poison(aux_len)));
    let raw = |v: u64, n: usize| RawBuffer { address: v, len_bytes: 2 * n };
    let addr = |v: &CudaSlice<bf16>| v.device_ptr(&s).0;
    let ops = RawOperands::new(raw(addr(&a), 64 * 80), raw(addr(&b), 96 * 80), raw(c.device_ptr_mut(&s).0, 64 * 96))
        .with_c_in(raw(addr(&c_in), 64 * 96))
        .with_bias(raw(addr(&bias), 96))
        .with_aux(raw(aux.device_ptr_mut(&s).0, aux_len));
    // SAFETY: live buffers of this context, used on the Gpu's stream only.
    unsafe { plan.run_raw(&gpu, Scale::new(1.0, 0.5), ops, s.cu_stream()) }.unwrap();
    assert_eq!((bits(&s.clone_dtoh(&c).unwrap()), bits(&s.clone_dtoh(&aux).unwrap())), want, "plan.run_raw");

    // two threads, one plan, a bias each
    let other_bias = up(normal(&mut rng, 96));
    let want_other = run(false, &other_bias);
    std::thread::scope(|t| {
        let one = t.spawn(|| (0..20).map(|_| run(true, &bias)).collect::<Vec<_>>());
        let two = t.spawn(|| (0..20).map(|_| run(true, &other_bias)).collect::<Vec<_>>());
        assert!(one.join().unwrap().iter().all(|r| *r == want), "thread one");
        assert!(two.join().unwrap().iter().all(|r| *r == want_other), "thread two");
    });
}

/// A plan on cuBLAS (`Backend::Blas`) is captured into a graph with nothing made inside the
/// capture, and the replay gives the eager result bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cublas_plan_is_capturable() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let gpu = gpu_with(GpuOptions::default().backend(gemmbridge::cuda::Backend::Blas));
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let p = GemmProblem::linear(48, 40, 56, Precision::F32).unwrap();
    let plan = GemmPlan::new(&gpu, &p).unwrap();
    assert_eq!(plan.library(), Some(Served::Blas));
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    let (a, b) = (s.clone_htod(&ops.a).unwrap(), s.clone_htod(&ops.b).unwrap());
    let mut eager = s.clone_htod(&ops.c).unwrap();
    gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut eager).unwrap();
    let mut c = s.clone_htod(&ops.c).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let r = plan.run(&gpu, Scale::PRODUCT, &a, &b, &mut c, Extras::default());
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    let got = s.clone_dtoh(&c).unwrap();
    check("captured cuBLAS plan", &p, &ops.c, &got, &ops.reference);
    assert_eq!(bits(&got), bits(&s.clone_dtoh(&eager).unwrap()));
}
