//! The general form of a grouped GEMM on the GPU ([`Gpu::gemm_group`], [`Gpu::gemm_group_raw`]:
//! a list of GEMMs, each its own shapes, layouts and buffers) against the float64 reference of
//! each GEMM alone, on every way that applies (forced) and as the engine chooses, outputs
//! poisoned with NaN first; the raw forms (the list's and the grouped product's) give the typed
//! forms' bits; bad members are named by their place in the list, with nothing written.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::{Gpu, GroupMember, RawBuffer, RawOperands};
use gemmbridge::grouped::list::candidates;
use gemmbridge::grouped::streams::GroupedBackend;
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::half::bf16;
use gemmbridge::reference::{gemm_epilogue_rowmajor, rel_error};
use gemmbridge::{DType, Element, Epilogue, Error, GemmProblem, MatrixLayout, Operand, Precision, Which};
use rand::rngs::StdRng;

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// A list of unlike GEMMs in `precision`: a linear layer, a transposed-A product (a weight
/// gradient's shape), a plain matmul with a bias, an empty GEMM, a large one and a tiny one.
fn list(precision: Precision, bias: bool) -> Vec<GemmProblem> {
    let dw = GemmProblem::new(
        Operand::t(MatrixLayout::row_major(129, 48)),
        Operand::n(MatrixLayout::row_major(129, 40)),
        MatrixLayout::row_major(48, 40),
        1,
        precision,
    )
    .unwrap();
    let with_bias = GemmProblem::linear(70, 96, 64, precision).unwrap();
    let with_bias = if bias { with_bias.with_epilogue(Epilogue::Bias).unwrap() } else { with_bias };
    vec![
        GemmProblem::linear(64, 96, 128, precision).unwrap(),
        dw,
        with_bias,
        GemmProblem::linear(0, 96, 128, precision).unwrap(),
        GemmProblem::matmul(1024, 1536, 1024, precision).unwrap(),
        GemmProblem::matmul(1, 8, 16, precision).unwrap(),
    ]
}

/// The host inputs of one member and its device buffers.
struct Member<T: DeviceRepr> {
    a: Vec<T>,
    b: Vec<T>,
    bias: Option<Vec<T>>,
    dev: [CudaSlice<T>; 3],
    dbias: Option<CudaSlice<T>>,
}

fn members<T: Element + DeviceRepr>(gpu: &Gpu, problems: &[GemmProblem], rng: &mut StdRng) -> Vec<Member<T>> {
    let s = gpu.stream();
    problems
        .iter()
        .map(|p| {
            let len = |l: MatrixLayout| l.required_elems(p.batch()).unwrap().max(1);
            let (a, b): (Vec<T>, Vec<T>) = (normal(rng, len(p.a().layout)), normal(rng, len(p.b().layout)));
            let bias: Option<Vec<T>> = (p.epilogue() == Epilogue::Bias).then(|| normal(rng, p.n()));
            let c = poison::<T>(len(p.c()));
            let dev = [s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c).unwrap()];
            let dbias = bias.as_ref().map(|v| s.clone_htod(v).unwrap());
            Member { a, b, bias, dev, dbias }
        })
        .collect()
}

/// Runs the list through [`Gpu::gemm_group`]; each member's C read back.
fn run<T: Element + DeviceRepr>(
    gpu: &Gpu,
    problems: &[GemmProblem],
    ms: &mut [Member<T>],
) -> Result<Vec<Vec<T>>, Error> {
    let mut group: Vec<GroupMember<'_, T>> = problems
        .iter()
        .zip(ms.iter_mut())
        .map(|(p, m)| {
            let [a, b, c] = &mut m.dev;
            let bias = m.dbias.as_ref().map(|v| v as &dyn DevicePtr<T>);
            GroupMember { problem: *p, a: &*a, b: &*b, c, bias }
        })
        .collect();
    gpu.gemm_group(&mut group)?;
    drop(group);
    Ok(ms.iter().map(|m| gpu.stream().clone_dtoh(&m.dev[2]).unwrap()).collect())
}

/// Every way runs the same inputs (C poisoned again before each), against float64 references
/// computed once: the large member's reference dominates the test's time.
fn check_list<T: Element + DeviceRepr>(gpu: &Gpu, precision: Precision, bias: bool, rng: &mut StdRng) {
    let problems = list(precision, bias);
    let mut ms = members::<T>(gpu, &problems, rng);
    let wants: Vec<Vec<f64>> = problems
        .iter()
        .zip(&ms)
        .map(|(p, m)| {
            let mut want = vec![f64::NAN; m.dev[2].len()];
            let mut bias = m.bias.as_ref().map(|v| wide(v));
            gemm_epilogue_rowmajor(p, (1.0, 0.0), [&wide(&m.a), &wide(&m.b)], &mut want, bias.as_deref_mut(), None);
            want
        })
        .collect();
    for way in candidates(&problems).into_iter().map(Some).chain([None]) {
        gpu.update_options(|o| o.grouped_backend = way).unwrap();
        for m in ms.iter_mut() {
            let len = m.dev[2].len();
            gpu.stream().memcpy_htod(&poison::<T>(len), &mut m.dev[2]).unwrap();
        }
        let got = run(gpu, &problems, &mut ms).unwrap_or_else(|e| panic!("{precision} {way:?}: {e}"));
        for (i, ((p, c), want)) in problems.iter().zip(&got).zip(&wants).enumerate() {
            if p.is_empty() {
                assert!(c.iter().all(|v| v.to_f64().is_nan()), "{precision} {way:?}: the empty GEMM {i} wrote");
                continue;
            }
            let e = rel_error(&wide(c), want);
            assert!(e <= precision.tolerance(), "{precision} {way:?}: GEMM {i} rel error {e:e}");
        }
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_list_of_unlike_gemms_matches_each_gemm_alone_on_every_way() {
    let (gpu, mut rng) = (gpu(), rng());
    gpu.update_options(|o| o.grouped_streams = 3).unwrap();
    check_list::<bf16>(&gpu, Precision::BF16, false, &mut rng);
    check_list::<bf16>(&gpu, Precision::BF16, true, &mut rng);
    check_list::<f32>(&gpu, Precision::F32, false, &mut rng);
    check_list::<f32>(&gpu, Precision::TF32, true, &mut rng);
}

fn raw<T>(s: &CudaSlice<T>, gpu: &Gpu) -> RawBuffer {
    RawBuffer { address: s.device_ptr(gpu.stream()).0, len_bytes: s.len() * std::mem::size_of::<T>() }
}

/// The raw forms run the same launches as the typed ones: the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_raw_forms_give_the_typed_forms_bits() {
    let (gpu, mut rng) = (gpu(), rng());
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::StreamPool)).unwrap();
    let problems = list(Precision::BF16, true);
    let mut ms = members::<bf16>(&gpu, &problems, &mut rng);
    let typed = run(&gpu, &problems, &mut ms).unwrap();
    let s = gpu.stream();
    let fresh: Vec<CudaSlice<bf16>> = typed.iter().map(|c| s.clone_htod(&poison::<bf16>(c.len())).unwrap()).collect();
    let list: Vec<(GemmProblem, RawOperands)> = problems
        .iter()
        .zip(&ms)
        .zip(&fresh)
        .map(|((p, m), c)| {
            let ops = RawOperands::new(raw(&m.dev[0], &gpu), raw(&m.dev[1], &gpu), raw(c, &gpu));
            (*p, m.dbias.as_ref().map_or(ops, |v| ops.with_bias(raw(v, &gpu))))
        })
        .collect();
    // SAFETY: every buffer is a live allocation of this context used on its stream only.
    unsafe { gpu.gemm_group_raw(&list, s.cu_stream()) }.unwrap();
    for (i, (c, want)) in fresh.iter().zip(&typed).enumerate() {
        let got = s.clone_dtoh(c).unwrap();
        assert!(got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "GEMM {i}");
    }
    // the grouped product's raw form
    let p = GroupedProblem::new(GroupedOp::Forward, &[40, 0, 300, 7], 96, 64, Precision::BF16).unwrap();
    let [la, lb, lc] = p.lens();
    let (da, db) =
        (s.clone_htod(&normal::<bf16>(&mut rng, la)).unwrap(), s.clone_htod(&normal::<bf16>(&mut rng, lb)).unwrap());
    let mut typed = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    gpu.grouped_gemm(&p, &da, &db, &mut typed, None).unwrap();
    let by_address = s.clone_htod(&poison::<bf16>(lc)).unwrap();
    let bufs = [raw(&da, &gpu), raw(&db, &gpu), raw(&by_address, &gpu)];
    // SAFETY: as above.
    unsafe { gpu.grouped_gemm_raw(&p, bufs, None, s.cu_stream()) }.unwrap();
    let (want, got) = (s.clone_dtoh(&typed).unwrap(), s.clone_dtoh(&by_address).unwrap());
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "grouped_gemm_raw");
    let short = RawBuffer { len_bytes: bufs[2].len_bytes - 2, ..bufs[2] };
    // SAFETY: as above (refused before any launch).
    match unsafe { gpu.grouped_gemm_raw(&p, [bufs[0], bufs[1], short], None, s.cu_stream()) } {
        Err(Error::BufferTooSmall { operand: Which::Grouped("y"), needed_elems, .. }) => assert_eq!(needed_elems, lc),
        other => panic!("{other:?}"),
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_members_are_named_by_their_place_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let problems = list(Precision::BF16, true);
    let untouched =
        |ms: &[Member<bf16>]| ms.iter().all(|m| s.clone_dtoh(&m.dev[2]).unwrap().iter().all(|v| v.to_f64().is_nan()));
    let mut expect = |problems: &[GemmProblem], index: usize, what: &dyn Fn(&Error) -> bool| {
        let mut ms = members::<bf16>(&gpu, problems, &mut rng);
        match run(&gpu, problems, &mut ms) {
            Err(Error::GroupMember { index: i, error }) if i == index && what(&error) => {}
            other => panic!("member {index}: {other:?}"),
        }
        assert!(untouched(&ms), "member {index}: written before the error");
    };
    // a member of another precision than its buffers' type
    let mut wrong = problems.clone();
    wrong[1] = GemmProblem::linear(8, 8, 8, Precision::F16).unwrap();
    expect(&wrong, 1, &|e| matches!(e, Error::DTypeMismatch { expected: DType::F16, .. }));
    // an epilogue a grouped GEMM does not take
    let mut relu = problems.clone();
    relu[4] = relu[4].with_epilogue(Epilogue::Relu).unwrap();
    expect(&relu, 4, &|e| matches!(e, Error::Unsupported { .. }));
    // a buffer shorter than its member's problem (member 2's A one row short)
    let mut ms = members::<bf16>(&gpu, &problems, &mut rng);
    ms[2].dev[0] = s.clone_htod(&normal::<bf16>(&mut rng, 69 * 64)).unwrap();
    match run(&gpu, &problems, &mut ms) {
        Err(Error::GroupMember { index: 2, error }) => {
            assert!(matches!(*error, Error::BufferTooSmall { operand: Which::A, .. }))
        }
        other => panic!("{other:?}"),
    }
    assert!(untouched(&ms));
    // one member's output is another's input (by address)
    let ms = members::<bf16>(&gpu, &problems[..2], &mut rng);
    let list: Vec<(GemmProblem, RawOperands)> = vec![
        (problems[0], RawOperands::new(raw(&ms[0].dev[0], &gpu), raw(&ms[0].dev[1], &gpu), raw(&ms[1].dev[0], &gpu))),
        (problems[1], RawOperands::new(raw(&ms[1].dev[0], &gpu), raw(&ms[1].dev[1], &gpu), raw(&ms[1].dev[2], &gpu))),
    ];
    // SAFETY: live allocations of this context; refused before any launch.
    match unsafe { gpu.gemm_group_raw(&list, s.cu_stream()) } {
        Err(Error::GroupedShape { detail, .. }) => {
            assert!(detail.contains("GEMM 0's C") && detail.contains("GEMM 1's A"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    // a forced way the list does not take
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::StridedBatch)).unwrap();
    let mut ms = members::<bf16>(&gpu, &problems, &mut rng);
    assert!(matches!(run(&gpu, &problems, &mut ms), Err(Error::Unsupported { .. })));
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    // the engine is usable afterwards
    run(&gpu, &problems, &mut ms).unwrap();
}

/// A member whose pointer is off 16 bytes (its A one bf16 element into its buffer) keeps
/// cuBLAS's grouped call away: forced, it is refused by name with nothing written; chosen by
/// the rule, the list runs on the pool and matches float64.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_member_pointer_off_16_bytes_takes_the_pool() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let linear = |m| GemmProblem::linear(m, 64, 64, Precision::BF16).unwrap();
    // buffers for 8 rows each; member 1 runs 7 rows from one element into its A
    let ms = members::<bf16>(&gpu, &[linear(8); 3], &mut rng);
    let problems = [linear(8), linear(7), linear(8)];
    let list: Vec<(GemmProblem, RawOperands)> = problems
        .iter()
        .zip(&ms)
        .enumerate()
        .map(|(i, (p, m))| {
            let mut a = raw(&m.dev[0], &gpu);
            if i == 1 {
                // element-aligned, 2 bytes off 16
                a = RawBuffer { address: a.address + 2, len_bytes: a.len_bytes - 2 };
            }
            (*p, RawOperands::new(a, raw(&m.dev[1], &gpu), raw(&m.dev[2], &gpu)))
        })
        .collect();
    let untouched = || ms.iter().all(|m| s.clone_dtoh(&m.dev[2]).unwrap().iter().all(|v| v.to_f64().is_nan()));
    assert_eq!(gpu.plans().gemm_group_backend(&problems).unwrap(), GroupedBackend::GroupedBatched);
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::GroupedBatched)).unwrap();
    // SAFETY: every buffer is a live allocation of this context used on its stream only.
    match unsafe { gpu.gemm_group_raw(&list, s.cu_stream()) } {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("not 16-byte aligned"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(untouched());
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    // SAFETY: as above.
    unsafe { gpu.gemm_group_raw(&list, s.cu_stream()) }.unwrap();
    for (i, (p, m)) in problems.iter().zip(&ms).enumerate() {
        let a = if i == 1 { wide(&m.a)[1..].to_vec() } else { wide(&m.a) };
        let mut want = vec![f64::NAN; p.m() * p.n()];
        gemm_epilogue_rowmajor(p, (1.0, 0.0), [&a[..p.m() * p.k()], &wide(&m.b)], &mut want, None, None);
        let got = wide(&s.clone_dtoh(&m.dev[2]).unwrap());
        let e = rel_error(&got[..want.len()], &want);
        assert!(e <= Precision::BF16.tolerance(), "GEMM {i}: rel error {e:e}");
    }
}
