//! The FP8 grouped forward on the GPU ([`Gpu::grouped_quantize`], [`Gpu::grouped_fp8_gemm`])
//! against the CPU emulation (`grouped::fp8`: each group quantised on its own, float64 on the
//! dequantised values): every recipe cuBLASLt offers, ragged group sizes (0, 1, 7, 129, 4096
//! rows), bf16, f16 and f32 outputs poisoned with NaN first. Two bands per case: against the
//! emulation's own result (the FP8 GEMM's band), and against the float64 product of the
//! unquantised operands no worse than 1.5× the emulation's error. The pool of streams and the
//! in-order way give the same bits; bad input is refused before anything is written.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::{Fp8Options, Gpu};
use gemmbridge::fp8::{Fp8Format, Scaling};
use gemmbridge::grouped::streams::GroupedBackend;
use gemmbridge::grouped::{fp8 as emulation, reference, GroupedOp, GroupedOperand, GroupedProblem};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error, Precision, Which};
use rand::rngs::StdRng;

/// The ragged group sizes of every test.
const SIZES: [usize; 6] = [0, 1, 7, 129, 4096, 0];

/// The (x, w) scalings cuBLASLt pairs (`gemmbridge::fp8`'s table).
const RECIPES: [(Scaling, Scaling); 5] = [
    (Scaling::Tensor, Scaling::Tensor),
    (Scaling::Row, Scaling::Row),
    (Scaling::Block1x128, Scaling::Block128x128),
    (Scaling::Block1x128, Scaling::Block1x128),
    (Scaling::Block128x128, Scaling::Block1x128),
];

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// What one case gives: the output and the inputs' values.
struct Run {
    got: Vec<f64>,
    x: Vec<f32>,
    w: Vec<f32>,
    bias: Option<Vec<f64>>,
}

/// Quantises random bf16 x and w per group and runs the FP8 grouped forward into a poisoned
/// `y` of `O`.
fn run<O: Element + DeviceRepr>(gpu: &Gpu, p: &GroupedProblem, recipe: (Scaling, Scaling), rng: &mut StdRng) -> Run {
    let s = gpu.stream();
    let [lx, lw, ly] = p.lens();
    let (x, w): (Vec<bf16>, Vec<bf16>) = (normal(rng, lx), normal(rng, lw));
    let bias: Option<Vec<O>> = p.has_bias().then(|| normal(rng, p.groups() * p.n()));
    let (dx, dw) = (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap());
    let dbias = bias.as_ref().map(|v| s.clone_htod(v).unwrap());
    let qx = gpu.grouped_quantize(p, GroupedOperand::X, &dx, Fp8Format::E4M3, recipe.0).unwrap();
    let qw: Vec<_> = gpu
        .grouped_quantize(p, GroupedOperand::W, &dw, Fp8Format::E4M3, recipe.1)
        .unwrap()
        .into_iter()
        .map(|t| t.expect("every expert has a w"))
        .collect();
    let mut y = s.clone_htod(&poison::<O>(ly)).unwrap();
    let b = dbias.as_ref().map(|v| v as &dyn DevicePtr<O>);
    gpu.grouped_fp8_gemm(p, &qx, &qw, &mut y, b, Fp8Options::default())
        .unwrap_or_else(|e| panic!("{} {recipe:?}: {e}", p.describe()));
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect();
    Run { got: wide(&s.clone_dtoh(&y).unwrap()), x: f(&x), w: f(&w), bias: bias.map(|v| wide(&v)) }
}

/// One case against both bands; the two errors (against the emulation, against float64).
fn check<O: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &GroupedProblem,
    recipe: (Scaling, Scaling),
    rng: &mut StdRng,
) -> (f64, f64) {
    let r = run::<O>(gpu, p, recipe, rng);
    let ly = p.lens()[2];
    let (mut emulated, mut exact) = (vec![f64::NAN; ly], vec![f64::NAN; ly]);
    emulation::forward(p, (&r.x, &r.w), r.bias.as_deref(), recipe, &mut emulated).unwrap();
    let (xw, ww): (Vec<f64>, Vec<f64>) =
        (r.x.iter().map(|&v| v as f64).collect(), r.w.iter().map(|&v| v as f64).collect());
    reference::run(p, &xw, &ww, r.bias.as_deref(), &mut exact);
    // rows past the last group are not written
    let used = p.row_start(p.groups()) * p.n();
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
    (vs_emulation, vs_exact)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_recipe_matches_the_emulation_at_ragged_sizes() {
    let (gpu, mut rng) = (gpu(), rng());
    gpu.set_grouped_streams(3).unwrap();
    for recipe in RECIPES {
        let p = GroupedProblem::new(GroupedOp::Forward, &SIZES, 256, 384, Precision::BF16).unwrap();
        check::<bf16>(&gpu, &p, recipe, &mut rng);
        let p = GroupedProblem::new(GroupedOp::Forward, &SIZES, 256, 384, Precision::F32).unwrap();
        check::<f32>(&gpu, &p, recipe, &mut rng);
        // N off 8 elements (every group's rows staged), K off 16; rows past the groups
        let p = GroupedProblem::from_offsets(GroupedOp::Forward, &[3, 3, 70, 201], 205, 36, 200, Precision::F16);
        check::<f16>(&gpu, &p.unwrap(), recipe, &mut rng);
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
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::Forward, &[40, 0, 300, 7, 129, 64], 128, 256, Precision::BF16).unwrap();
    let [lx, lw, ly] = p.lens();
    let dx = s.clone_htod(&normal::<bf16>(&mut rng, lx)).unwrap();
    let dw = s.clone_htod(&normal::<bf16>(&mut rng, lw)).unwrap();
    let qx = gpu.grouped_quantize(&p, GroupedOperand::X, &dx, Fp8Format::E4M3, Scaling::Row).unwrap();
    let qw: Vec<_> = gpu
        .grouped_quantize(&p, GroupedOperand::W, &dw, Fp8Format::E4M3, Scaling::Row)
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    let mut outs = Vec::new();
    for backend in [Some(GroupedBackend::InOrder), Some(GroupedBackend::StreamPool), None] {
        gpu.set_grouped_backend(backend);
        let mut y = s.clone_htod(&poison::<bf16>(ly)).unwrap();
        gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y, None, Fp8Options::default()).unwrap();
        outs.push(s.clone_dtoh(&y).unwrap());
    }
    gpu.set_grouped_backend(None);
    assert!(outs[0].iter().all(|v| v.is_finite()));
    for o in &outs[1..] {
        assert!(o.iter().zip(&outs[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "pool and in order differ");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = GroupedProblem::new(GroupedOp::Forward, &[3, 0, 5], 32, 64, Precision::BF16).unwrap();
    let [lx, lw, ly] = p.lens();
    let dx = s.clone_htod(&normal::<bf16>(&mut rng, lx)).unwrap();
    let dw = s.clone_htod(&normal::<bf16>(&mut rng, lw)).unwrap();
    let quant = |op, src: &CudaSlice<bf16>| gpu.grouped_quantize(&p, op, src, Fp8Format::E4M3, Scaling::Tensor);
    let qx = quant(GroupedOperand::X, &dx).unwrap();
    assert!(qx[1].is_none() && qx[0].is_some() && qx[2].is_some());
    let qw: Vec<_> = quant(GroupedOperand::W, &dw).unwrap().into_iter().flatten().collect();
    let untouched = |y: &CudaSlice<bf16>| s.clone_dtoh(y).unwrap().iter().all(|v| v.is_nan());
    let mut y = s.clone_htod(&poison::<bf16>(ly)).unwrap();
    let opts = Fp8Options::default();
    // a source shorter than the problem's x
    let short = s.clone_htod(&normal::<bf16>(&mut rng, lx - 1)).unwrap();
    match gpu.grouped_quantize(&p, GroupedOperand::X, &short, Fp8Format::E4M3, Scaling::Tensor) {
        Err(Error::BufferTooSmall { operand: Which::Source, needed_elems, .. }) => assert_eq!(needed_elems, lx),
        other => panic!("{other:?}"),
    }
    // too few operands; a group's x of other rows (group 2's given as group 0's)
    let e = gpu.grouped_fp8_gemm(&p, &qx[..2], &qw, &mut y, None, opts).unwrap_err();
    assert!(matches!(e, Error::GroupedShape { .. }), "{e}");
    let swapped = gpu.grouped_quantize(&p, GroupedOperand::X, &dx, Fp8Format::E4M3, Scaling::Tensor).unwrap();
    let swapped: Vec<_> = swapped.into_iter().rev().collect();
    match gpu.grouped_fp8_gemm(&p, &swapped, &qw, &mut y, None, opts) {
        Err(Error::GroupedShape { what, detail }) => {
            assert!(what.contains("x"), "{what}");
            assert!(detail.contains("x[0] is [5, 64]") && detail.contains("m[0] = 3"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // an output of another type than the problem's; one element short
    let mut y16 = s.clone_htod(&poison::<f16>(ly)).unwrap();
    let e = gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y16, None, opts).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::C, .. }), "{e}");
    let mut short_y = s.clone_htod(&poison::<bf16>(ly - 1)).unwrap();
    match gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut short_y, None, opts) {
        Err(Error::BufferTooSmall { operand: Which::C, needed_elems, .. }) => assert_eq!(needed_elems, ly),
        other => panic!("{other:?}"),
    }
    assert!(untouched(&short_y));
    // a bias the problem does not have
    let bias = s.clone_htod(&normal::<bf16>(&mut rng, 3 * 32)).unwrap();
    let e = gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y, Some(&bias), opts).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { .. }), "{e}");
    // a backward product; a forced way FP8 groups do not take
    let back = GroupedProblem::new(GroupedOp::BackwardData, &[3, 0, 5], 32, 64, Precision::BF16).unwrap();
    let e = gpu.grouped_fp8_gemm(&back, &qx, &qw, &mut y, None, opts).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    let e = gpu.grouped_quantize(&back, GroupedOperand::X, &dx, Fp8Format::E4M3, Scaling::Tensor).unwrap_err();
    assert!(matches!(e, Error::GroupedShape { .. }), "{e}");
    gpu.set_grouped_backend(Some(GroupedBackend::GroupedBatched));
    match gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y, None, opts) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("GroupedBatched"), "{what}"),
        other => panic!("{other:?}"),
    }
    gpu.set_grouped_backend(None);
    // an FP8 rule broken in a group: fast accumulation with block scales
    let bx = gpu.grouped_quantize(&p, GroupedOperand::X, &dx, Fp8Format::E4M3, Scaling::Block1x128).unwrap();
    let bw: Vec<_> = gpu
        .grouped_quantize(&p, GroupedOperand::W, &dw, Fp8Format::E4M3, Scaling::Block128x128)
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    let fast = Fp8Options { fast_accum: true, ..opts };
    let e = gpu.grouped_fp8_gemm(&p, &bx, &bw, &mut y, None, fast).unwrap_err();
    assert!(matches!(e, Error::Fp8 { .. }), "{e}");
    assert!(untouched(&y));
    // the engine is usable afterwards
    gpu.grouped_fp8_gemm(&p, &qx, &qw, &mut y, None, opts).unwrap();
    let got = s.clone_dtoh(&y).unwrap();
    assert!(got.iter().all(|v| v.is_finite()));
}
