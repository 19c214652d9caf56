//! The FP8 grouped products on the GPU ([`GpuFp8::grouped_quantize`], [`GpuFp8::grouped_gemm`]):
//! the forward and both backward products against the CPU emulation (`grouped::fp8`: each
//! group quantised on its own in its TN form, float64 on the dequantised values), every recipe
//! cuBLASLt offers, ragged group sizes (0, 1, 7, 129, 4096 rows), bf16, f16 and f32 outputs
//! poisoned with NaN first. Two bands per case: against the emulation's own result (the FP8
//! GEMM's band), and against the float64 product of the unquantised operands no worse than
//! 1.5× the emulation's error. The pool of streams and the in-order way give the same bits; a
//! backward weight's empty groups get zeros (β = 0) or keep their value (β = 1); bad input is
//! refused before anything is written.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::{Fp8Options, Fp8Tensor, Gpu};
use gemmbridge::fp8::{Fp8Format, Scaling};
use gemmbridge::grouped::streams::GroupedBackend;
use gemmbridge::grouped::{fp8 as emulation, reference, GroupedOp, GroupedOperand, GroupedProblem};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error, Precision, Which};
use rand::rngs::StdRng;

/// Held shared by every test here and alone by the replay test (see there).
static CAPTURE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// The ragged group sizes of every test.
const SIZES: [usize; 6] = [0, 1, 7, 129, 4096, 0];

/// The three products.
const OPS: [GroupedOp; 3] = [GroupedOp::Forward, GroupedOp::BackwardData, GroupedOp::BackwardWeight];

/// The (x, w) scalings cuBLASLt pairs.
const RECIPES: [(Scaling, Scaling); 5] = gemmbridge::fp8::SCALING_PAIRS;

type Groups = Vec<Option<Fp8Tensor>>;

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Both operands of `p` quantised per group from the buffers `a` and `b`, E4M3.
fn quantize(
    gpu: &Gpu,
    p: &GroupedProblem,
    (a, b): (&CudaSlice<bf16>, &CudaSlice<bf16>),
    r: (Scaling, Scaling),
) -> (Groups, Groups) {
    let q = |operand, src, scaling| gpu.fp8().grouped_quantize(p, operand, src, Fp8Format::E4M3, scaling).unwrap();
    (q(GroupedOperand::A, a, r.0), q(GroupedOperand::B, b, r.1))
}

/// Random bf16 operands of `p` on the GPU, quantised per group as `quantize` does.
fn random_quantized(gpu: &Gpu, p: &GroupedProblem, r: (Scaling, Scaling), rng: &mut StdRng) -> (Groups, Groups) {
    let (s, [la, lb, _]) = (gpu.stream(), p.lens());
    let da = s.clone_htod(&normal::<bf16>(rng, la)).unwrap();
    let db = s.clone_htod(&normal::<bf16>(rng, lb)).unwrap();
    quantize(gpu, p, (&da, &db), r)
}

/// The end of the last group's output in `c` (elements): what the product writes.
fn written(p: &GroupedProblem) -> usize {
    (0..p.groups()).map(|e| p.tn_output(e)).map(|(start, [r, c])| start + r * c).max().unwrap()
}

/// What one case gives: the output and the inputs' values.
struct Run {
    got: Vec<f64>,
    a: Vec<f32>,
    b: Vec<f32>,
    bias: Option<Vec<f64>>,
}

/// Quantises random bf16 operands per group and runs the FP8 grouped product into a poisoned
/// `c` of `O`.
fn run<O: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, recipe: (Scaling, Scaling), rng: &mut StdRng) -> Run {
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let (a, b): (Vec<bf16>, Vec<bf16>) = (normal(rng, la), normal(rng, lb));
    let bias: Option<Vec<O>> = p.has_bias().then(|| normal(rng, p.groups() * p.n()));
    let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
    let dbias = bias.as_ref().map(|v| s.clone_htod(v).unwrap());
    let (qa, qb) = quantize(gpu, p, (&da, &db), recipe);
    let mut c = s.clone_htod(&poison::<O>(lc)).unwrap();
    let bv = dbias.as_ref().map(|v| v as &dyn DevicePtr<O>);
    gpu.fp8()
        .grouped_gemm(p, &qa, &qb, &mut c, bv, Fp8Options::default())
        .unwrap_or_else(|e| panic!("{} {recipe:?}: {e}", p.describe()));
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect();
    Run { got: wide(&s.clone_dtoh(&c).unwrap()), a: f(&a), b: f(&b), bias: bias.map(|v| wide(&v)) }
}

/// One case against both bands.
fn check<O: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, recipe: (Scaling, Scaling), rng: &mut StdRng) {
    let r = run::<O>(gpu, p, recipe, rng);
    let lc = p.lens()[2];
    let (mut emulated, mut exact) = (vec![f64::NAN; lc], vec![f64::NAN; lc]);
    let formats = ((Fp8Format::E4M3, recipe.0), (Fp8Format::E4M3, recipe.1));
    emulation::run(p, (&r.a, &r.b), r.bias.as_deref(), formats, &mut emulated).unwrap();
    let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    reference::run(p, &to64(&r.a), &to64(&r.b), r.bias.as_deref(), &mut exact);
    // rows past the last group are not written
    let used = written(p);
    assert!(r.got[used..].iter().all(|v| v.is_nan()), "{}: rows past the groups were written", p.describe());
    let (got, emulated, exact) = (&r.got[..used], &emulated[..used], &exact[..used]);
    let vs_emulation = rel_error(got, emulated);
    let (vs_exact, recipe_error) = (rel_error(got, exact), rel_error(emulated, exact));
    let band = if O::DTYPE == DType::F32 { 1e-3 } else { 1e-2 };
    let what = format!("{} {:?} {recipe:?}", p.describe(), O::DTYPE);
    eprintln!(
        "{what}: {vs_emulation:.2e} against the emulation; {vs_exact:.3e} against float64 (recipe {recipe_error:.3e})"
    );
    assert!(vs_emulation <= band, "{what}: {vs_emulation:e} against the emulation > {band:e}");
    assert!(vs_exact <= 1.5 * recipe_error, "{what}: {vs_exact:e} > 1.5 × the recipe's {recipe_error:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_product_and_recipe_matches_the_emulation_at_ragged_sizes() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    gpu.update_options(|o| o.grouped_streams = 3).unwrap();
    for op in OPS {
        for recipe in RECIPES {
            let p = GroupedProblem::new(op, &SIZES, 256, 384, Precision::BF16).unwrap();
            check::<bf16>(&gpu, &p, recipe, &mut rng);
            // N off 8 elements (outputs staged), K off 16, inner dimensions off 16; rows past
            // the groups
            let p = GroupedProblem::from_offsets(op, &[3, 3, 70, 201], 205, 36, 200, Precision::F16);
            check::<f16>(&gpu, &p.unwrap(), recipe, &mut rng);
        }
        let p = GroupedProblem::new(op, &SIZES, 256, 384, Precision::F32).unwrap();
        check::<f32>(&gpu, &p, (Scaling::Row, Scaling::Row), &mut rng);
    }
    // a bias per group (16-bit outputs take one)
    let p = GroupedProblem::new(GroupedOp::Forward, &SIZES, 256, 384, Precision::BF16).unwrap().with_bias().unwrap();
    for recipe in RECIPES {
        check::<bf16>(&gpu, &p, recipe, &mut rng);
    }
}

/// The pool of streams and the in-order way run the same plans: the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_pool_and_in_order_give_the_same_bits() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    for op in OPS {
        let p = GroupedProblem::new(op, &[40, 0, 300, 7, 129, 64], 128, 256, Precision::BF16).unwrap();
        let lc = p.lens()[2];
        let (qa, qb) = random_quantized(&gpu, &p, (Scaling::Row, Scaling::Row), &mut rng);
        let mut outs = Vec::new();
        // in order (a pool of one stream), the pool, the rule
        for (backend, streams) in
            [(Some(GroupedBackend::StreamPool), 1), (Some(GroupedBackend::StreamPool), 4), (None, 4)]
        {
            gpu.update_options(|o| {
                o.grouped_backend = backend;
                o.grouped_streams = streams;
            })
            .unwrap();
            let mut c = s.clone_htod(&poison::<bf16>(lc)).unwrap();
            gpu.fp8().grouped_gemm(&p, &qa, &qb, &mut c, None, Fp8Options::default()).unwrap();
            outs.push(s.clone_dtoh(&c).unwrap());
        }
        assert!(outs[0][..written(&p)].iter().all(|v| v.is_finite()), "{op:?}");
        for o in &outs[1..] {
            assert!(
                o.iter().zip(&outs[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{op:?}: pool and in order differ"
            );
        }
    }
}

/// A repeated call on the same buffers is captured once and replayed as one graph (the
/// zeroing of a backward weight's empty group with it): every call gives the first call's bits,
/// into an output poisoned before each. Row scales on aligned shapes (on the pool and in
/// order), and 1×128 · 128×128 blocks with N = 36 f16 outputs (each group's output staged
/// through scratch the graph allocates and frees itself).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_repeated_call_replays_the_first_calls_bits() {
    // another test thread's first launch of a kernel invalidates a capture in flight
    let _alone = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    let (gpu, mut rng) = (gpu(), rng());
    for op in OPS {
        let p = GroupedProblem::new(op, &[40, 0, 300, 7, 129], 128, 256, Precision::BF16).unwrap();
        // on the pool, and in order (on the capture stream, with its own workspace)
        for streams in [4, 1] {
            gpu.update_options(|o| o.grouped_streams = streams).unwrap();
            replays::<bf16>(&gpu, &p, (Scaling::Row, Scaling::Row), &mut rng);
        }
        let p = GroupedProblem::new(op, &[40, 0, 300, 7, 129], 36, 256, Precision::F16).unwrap();
        replays::<f16>(&gpu, &p, (Scaling::Block1x128, Scaling::Block128x128), &mut rng);
    }
}

/// Calls `p` until its graph is cached (at most 8 calls: a capture can still be invalidated by
/// another process's kernel load), then twice more; every call's bits are the first's.
fn replays<O: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, recipe: (Scaling, Scaling), rng: &mut StdRng) {
    let (s, lc) = (gpu.stream(), p.lens()[2]);
    let (qa, qb) = random_quantized(gpu, p, recipe, rng);
    let mut c = s.clone_htod(&poison::<O>(lc)).unwrap();
    let call = |c: &mut CudaSlice<O>| {
        s.memcpy_htod(&poison::<O>(lc), c).unwrap();
        gpu.fp8().grouped_gemm(p, &qa, &qb, c, None, Fp8Options::default()).unwrap();
        s.clone_dtoh(c).unwrap()
    };
    let first = call(&mut c);
    let before = gpu.plans().graphs();
    let what = format!("{} {recipe:?}", p.describe());
    let mut runs = Vec::new();
    while gpu.plans().graphs() == before && runs.len() < 8 {
        runs.push(call(&mut c));
    }
    assert_eq!(gpu.plans().graphs(), before + 1, "{what}: one graph of the whole call");
    runs.extend([call(&mut c), call(&mut c)]);
    assert!(first[..written(p)].iter().all(|v| v.to_f64().is_finite()), "{what}");
    for (i, r) in runs.iter().enumerate() {
        let same = r.iter().zip(&first).all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits());
        assert!(same, "{what}: call {} differs", i + 1);
    }
}

/// A backward weight's empty group: zeros with β = 0, its `dw[e]` kept with β = 1, refused
/// (nothing written) for another β; the groups with rows accumulate with β = 1.
#[test]
#[ignore = "needs a CUDA GPU"]
fn empty_groups_of_the_backward_weight_are_zeros_or_kept() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::BackwardWeight, &[3, 0, 130], 32, 64, Precision::BF16).unwrap();
    let lc = p.lens()[2];
    let (qa, qb) = random_quantized(&gpu, &p, (Scaling::Tensor, Scaling::Tensor), &mut rng);
    let start = vec![bf16::from_f32(7.0); lc];
    let nk = 32 * 64;
    let with_beta = |beta: f32| {
        let mut c = s.clone_htod(&start).unwrap();
        let r = gpu.fp8().grouped_gemm(&p, &qa, &qb, &mut c, None, Fp8Options { beta, ..Default::default() });
        (r, wide(&s.clone_dtoh(&c).unwrap()))
    };
    let (r, zero) = with_beta(0.0);
    r.unwrap();
    assert!(zero[nk..2 * nk].iter().all(|&v| v == 0.0), "β = 0: the empty group's dw is not zeros");
    let (r, kept) = with_beta(1.0);
    r.unwrap();
    assert!(kept[nk..2 * nk].iter().all(|&v| v == 7.0), "β = 1: the empty group's dw changed");
    for i in (0..nk).chain(2 * nk..lc) {
        assert!(
            (kept[i] - 7.0 - zero[i]).abs() <= 0.02 * (1.0 + zero[i].abs()),
            "β = 1 at {i}: {} vs {}",
            kept[i],
            zero[i]
        );
    }
    match with_beta(0.5) {
        (Err(Error::Unsupported { what, .. }), c) => {
            assert!(what.contains("[1]"), "{what}");
            assert!(c.iter().all(|&v| v == 7.0), "written before the error");
        }
        (other, _) => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 32, 64, Precision::BF16).unwrap();
    let [lx, lw, ly] = p.lens();
    let dx = s.clone_htod(&normal::<bf16>(&mut rng, lx)).unwrap();
    let dw = s.clone_htod(&normal::<bf16>(&mut rng, lw)).unwrap();
    let (qx, qw) = quantize(&gpu, &p, (&dx, &dw), (Scaling::Tensor, Scaling::Tensor));
    assert!(qx[1].is_none() && qx[0].is_some() && qx[2].is_some());
    assert!(qw.iter().all(Option::is_some), "every expert has a w");
    let untouched = |y: &CudaSlice<bf16>| s.clone_dtoh(y).unwrap().iter().all(|v| v.is_nan());
    let mut y = s.clone_htod(&poison::<bf16>(ly)).unwrap();
    let opts = Fp8Options::default();
    // a source shorter than the problem's x
    let short = s.clone_htod(&normal::<bf16>(&mut rng, lx - 1)).unwrap();
    match gpu.fp8().grouped_quantize(&p, GroupedOperand::A, &short, Fp8Format::E4M3, Scaling::Tensor) {
        Err(Error::BufferTooSmall { operand: Which::Source, needed_elems, .. }) => assert_eq!(needed_elems, lx),
        other => panic!("{other:?}"),
    }
    // too few operands; a group's x of other rows (group 2's given as group 0's)
    let e = gpu.fp8().grouped_gemm(&p, &qx[..2], &qw, &mut y, None, opts).unwrap_err();
    assert!(matches!(e, Error::GroupedShape { .. }), "{e}");
    let swapped: Vec<_> =
        quantize(&gpu, &p, (&dx, &dw), (Scaling::Tensor, Scaling::Tensor)).0.into_iter().rev().collect();
    match gpu.fp8().grouped_gemm(&p, &swapped, &qw, &mut y, None, opts) {
        Err(Error::GroupedShape { what, detail }) => {
            assert!(what.contains("TN shape"), "{what}");
            assert!(detail.contains("x[0] is [5, 64]") && detail.contains("m[0] = 3"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // the forward's operands given to the backward data (dy_e is [m_e, N], w_eᵀ [K, N])
    let back = GroupedProblem::new(GroupedOp::BackwardData, &[3, 0, 5], 32, 64, Precision::BF16).unwrap();
    match gpu.fp8().grouped_gemm(&back, &qx, &qw, &mut y, None, opts) {
        Err(Error::GroupedShape { detail, .. }) => {
            assert!(detail.contains("dy[0] is [3, 64] where [3, 32]"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    // an output of another type than the problem's; one element short
    let mut y16 = s.clone_htod(&poison::<f16>(ly)).unwrap();
    let e = gpu.fp8().grouped_gemm(&p, &qx, &qw, &mut y16, None, opts).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Grouped("y"), .. }), "{e}");
    let mut short_y = s.clone_htod(&poison::<bf16>(ly - 1)).unwrap();
    match gpu.fp8().grouped_gemm(&p, &qx, &qw, &mut short_y, None, opts) {
        Err(Error::BufferTooSmall { operand: Which::Grouped("y"), needed_elems, .. }) => assert_eq!(needed_elems, ly),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&short_y));
    // a bias the problem does not have
    let bias = s.clone_htod(&normal::<bf16>(&mut rng, 3 * 32)).unwrap();
    let e = gpu.fp8().grouped_gemm(&p, &qx, &qw, &mut y, Some(&bias), opts).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { .. }), "{e}");
    // a forced way FP8 groups do not take
    gpu.update_options(|o| o.grouped_backend = Some(GroupedBackend::GroupedBatched)).unwrap();
    match gpu.fp8().grouped_gemm(&p, &qx, &qw, &mut y, None, opts) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("GroupedBatched"), "{what}"),
        other => panic!("{other:?}"),
    }
    gpu.update_options(|o| o.grouped_backend = None).unwrap();
    // an FP8 rule broken in a group: fast accumulation with block scales
    let (bx, bw) = quantize(&gpu, &p, (&dx, &dw), (Scaling::Block1x128, Scaling::Block128x128));
    let fast = Fp8Options { fast_accum: true, ..opts };
    let e = gpu.fp8().grouped_gemm(&p, &bx, &bw, &mut y, None, fast).unwrap_err();
    assert!(matches!(e, Error::Fp8 { .. }), "{e}");
    assert!(untouched(&y));
    // the engine is usable afterwards
    gpu.fp8().grouped_gemm(&p, &qx, &qw, &mut y, None, opts).unwrap();
    let got = s.clone_dtoh(&y).unwrap();
    assert!(got.iter().all(|v| v.is_finite()));
}
