//! GPU tests: run on a CUDA machine with `--include-ignored` (see README.md, "Quick start").
//! Every result is checked against the f64 reference with the precision's band, on fresh
//! random inputs, with C poisoned (NaN) first and its padding checked untouched.

mod common;

use common::{cases, check, gpu, gpu_with, normal, operands, poison, rng, Case};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cuda::{Backend, Gpu, GpuOptions, Padding, RawBuffer, RawOperands, Scale};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error, GemmProblem, MatrixLayout, Op, Precision, Which};
use rand::Rng;

fn upload<T: DeviceRepr>(gpu: &Gpu, v: &[T]) -> CudaSlice<T> {
    gpu.stream().clone_htod(v).expect("upload")
}

fn download<T: DeviceRepr + Default + Clone>(gpu: &Gpu, s: &CudaSlice<T>) -> Vec<T> {
    gpu.stream().clone_dtoh(s).expect("download")
}

/// Sizes 1, 7, 33, 255 and 3537 in every position, kept small enough for the f64 reference.
const SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (7, 7, 7),
    (33, 33, 33),
    (1, 255, 33),
    (255, 1, 7),
    (7, 33, 255),
    (255, 255, 33),
    (3537, 7, 33),
    (7, 3537, 33),
    (33, 7, 3537),
];

/// Padding settings that run every misaligned call on aligned copies, whatever its size.
fn pad_always() -> Padding {
    Padding::default().with_min_macs(0, 0, 0)
}

fn every_case<TI: Element + DeviceRepr, TO: Element + DeviceRepr>(
    precision: Precision,
    backend: Backend,
    padding: Padding,
) {
    let gpu = gpu_with(GpuOptions::default().backend(backend).padding(padding));
    assert_eq!((gpu.options().backend, gpu.options().padding), (backend, padding));
    let mut rng = rng();
    let mut worst = 0.0f64;
    let all = cases(&SHAPES);
    for (i, case) in all.iter().enumerate() {
        // β = 0 on NaN-filled C for most cases, β ≠ 0 on every fourth
        let (alpha, beta) = if i % 4 == 3 { (0.5f32, -1.25f32) } else { (1.0, 0.0) };
        let p = case.problem(precision);
        let ops = operands::<TI, TO>(&mut rng, &p, alpha as f64, beta as f64);
        let (a, b) = (upload(&gpu, &ops.a), upload(&gpu, &ops.b));
        let mut c = upload(&gpu, &ops.c);
        gpu.gemm(&p, alpha, &a, &b, beta, &mut c).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
        let got = download(&gpu, &c);
        worst = worst.max(check(
            &format!("gpu {backend:?} {precision} α={alpha} β={beta} padding {}", padding.min_macs(precision)),
            &p,
            &ops.c,
            &got,
            &ops.reference,
        ));
    }
    eprintln!(
        "{backend:?} {precision} (padding from {} MACs): {} cases, worst rel error {worst:e} (band {:e})",
        padding.min_macs(precision),
        all.len(),
        precision.tolerance()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_every_case_blas() {
    every_case::<f32, f32>(Precision::F32, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_every_case_lt() {
    every_case::<f32, f32>(Precision::F32, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tf32_every_case_blas() {
    every_case::<f32, f32>(Precision::TF32, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tf32_every_case_lt() {
    every_case::<f32, f32>(Precision::TF32, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16_every_case_blas() {
    every_case::<f16, f16>(Precision::F16, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16_every_case_lt() {
    every_case::<f16, f16>(Precision::F16, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16_f32out_every_case_blas() {
    every_case::<f16, f32>(Precision::F16_F32OUT, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16_f32out_every_case_lt() {
    every_case::<f16, f32>(Precision::F16_F32OUT, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_every_case_blas() {
    every_case::<bf16, bf16>(Precision::BF16, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_every_case_lt() {
    every_case::<bf16, bf16>(Precision::BF16, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_f32out_every_case_blas() {
    every_case::<bf16, f32>(Precision::BF16_F32OUT, Backend::Blas, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_f32out_every_case_lt() {
    every_case::<bf16, f32>(Precision::BF16_F32OUT, Backend::Lt, Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_case_padded() {
    // every misaligned case (odd K, N and M with op T, padded lds, β ≠ 0) on aligned copies
    every_case::<f32, f32>(Precision::F32, Backend::Auto, pad_always());
    every_case::<f32, f32>(Precision::TF32, Backend::Auto, pad_always());
    every_case::<f16, f16>(Precision::F16, Backend::Auto, pad_always());
    every_case::<f16, f32>(Precision::F16_F32OUT, Backend::Auto, pad_always());
    every_case::<bf16, bf16>(Precision::BF16, Backend::Auto, pad_always());
    every_case::<bf16, f32>(Precision::BF16_F32OUT, Backend::Auto, pad_always());
    every_case::<bf16, bf16>(Precision::BF16, Backend::Blas, pad_always());
}

/// Operands one element into their buffers (2 or 4 bytes off 16-byte alignment), odd K, a
/// contiguous batch, β ≠ 0: padded and direct both within the band of the f64 reference.
fn misaligned_bases<TI: Element + DeviceRepr, TO: Element + DeviceRepr>(precision: Precision) {
    let gpu = gpu();
    let mut rng = rng();
    for padding in [pad_always(), Padding::off()] {
        gpu.update_options(|o| o.padding = padding).unwrap();
        for (p, beta) in [
            (GemmProblem::linear(300, 200, 100, precision).unwrap(), 0.0f32),
            (GemmProblem::matmul(129, 65, 255, precision).unwrap(), 0.75),
            (GemmProblem::matmul(64, 48, 31, precision).unwrap().batched(3).unwrap(), -0.5),
        ] {
            let ops = operands::<TI, TO>(&mut rng, &p, 1.0, beta as f64);
            let shifted = |v: &[TI]| [&[TI::from_f64(0.0)][..], v].concat();
            let (a, b) = (upload(&gpu, &shifted(&ops.a)), upload(&gpu, &shifted(&ops.b)));
            let mut c = upload(&gpu, &[&[TO::from_f64(0.0)][..], &ops.c[..]].concat());
            {
                let (a1, b1) = (a.slice(1..), b.slice(1..));
                let mut c1 = c.slice_mut(1..);
                gpu.gemm(&p, 1.0, &a1, &b1, beta, &mut c1).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
            }
            let got = download(&gpu, &c);
            let what =
                format!("{precision} offset operands, padding from {} MACs, β={beta}", padding.min_macs(precision));
            check(&what, &p, &ops.c, &got[1..], &ops.reference);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn misaligned_base_addresses() {
    misaligned_bases::<f32, f32>(Precision::F32);
    misaligned_bases::<f32, f32>(Precision::TF32);
    misaligned_bases::<f16, f16>(Precision::F16);
    misaligned_bases::<bf16, bf16>(Precision::BF16);
    misaligned_bases::<bf16, f32>(Precision::BF16_F32OUT);
}

/// A large problem (3537³) checked on 4096 sampled output elements against f64 dot products.
fn large_sampled<TI: Element + DeviceRepr, TO: Element + DeviceRepr>(precision: Precision) {
    let gpu = gpu();
    let mut rng = rng();
    let n = 3537;
    for (op_a, op_b) in [(Op::N, Op::N), (Op::N, Op::T), (Op::T, Op::N), (Op::T, Op::T)] {
        let p = Case { m: n, n, k: n, op_a, op_b, pad: 0, batch: 1 }.problem(precision);
        let a: Vec<TI> = normal(&mut rng, n * n);
        let b: Vec<TI> = normal(&mut rng, n * n);
        let (da, db) = (upload(&gpu, &a), upload(&gpu, &b));
        let mut dc = upload(&gpu, &poison::<TO>(n * n));
        gpu.gemm(&p, 1.0, &da, &db, 0.0, &mut dc).unwrap();
        let c = download(&gpu, &dc);
        assert!(c.iter().all(|v| v.to_f64().is_finite()), "{precision} {op_a}{op_b}: NaN/inf in output");
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for _ in 0..4096 {
            let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
            let dot: f64 = (0..n).map(|l| a[p.a().offset(0, i, l)].to_f64() * b[p.b().offset(0, l, j)].to_f64()).sum();
            want.push(dot);
            got.push(c[i * n + j].to_f64());
        }
        let err = rel_error(&got, &want);
        eprintln!("{precision} {op_a}{op_b} 3537³: sampled rel error {err:e}");
        assert!(err <= precision.tolerance(), "{precision} {op_a}{op_b}: {err:e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn large_problems_sampled() {
    large_sampled::<f32, f32>(Precision::F32);
    large_sampled::<f32, f32>(Precision::TF32);
    large_sampled::<f16, f16>(Precision::F16);
    large_sampled::<bf16, bf16>(Precision::BF16);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn beta_zero_does_not_read_nan_c() {
    let gpu = gpu();
    let mut rng = rng();
    for precision in Precision::ALL {
        let p = GemmProblem::matmul(64, 48, 32, precision).unwrap();
        macro_rules! go {
            ($ti:ty, $to:ty) => {{
                let ops = operands::<$ti, $to>(&mut rng, &p, 1.0, 0.0);
                assert!(ops.c.iter().all(|v| v.to_f64().is_nan()));
                let (a, b) = (upload(&gpu, &ops.a), upload(&gpu, &ops.b));
                let mut c = upload(&gpu, &ops.c);
                gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
                let got = download(&gpu, &c);
                assert!(got.iter().all(|v| v.to_f64().is_finite()), "{precision}: NaN leaked from C");
                check("β=0", &p, &ops.c, &got, &ops.reference);
            }};
        }
        match (precision.input(), precision.output()) {
            (gemmbridge::DType::F32, _) => go!(f32, f32),
            (gemmbridge::DType::F16, gemmbridge::DType::F16) => go!(f16, f16),
            (gemmbridge::DType::F16, _) => go!(f16, f32),
            (gemmbridge::DType::BF16, gemmbridge::DType::BF16) => go!(bf16, bf16),
            _ => go!(bf16, f32),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn k_zero_gives_beta_c() {
    let gpu = gpu();
    let p = GemmProblem::matmul(5, 7, 0, Precision::F32).unwrap();
    let a = upload(&gpu, &[0.0f32; 1]);
    let b = upload(&gpu, &[0.0f32; 1]);
    let c0: Vec<f32> = (0..35).map(|i| i as f32 - 10.0).collect();
    let mut c = upload(&gpu, &c0);
    gpu.gemm(&p, 1.0, &a, &b, 2.0, &mut c).unwrap();
    assert_eq!(download(&gpu, &c), c0.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    let mut c = upload(&gpu, &poison::<f32>(35));
    gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
    assert_eq!(download(&gpu, &c), vec![0.0f32; 35]);
    // bf16 too
    let p = GemmProblem::matmul(5, 7, 0, Precision::BF16).unwrap();
    let (a, b) = (upload(&gpu, &[bf16::ZERO; 1]), upload(&gpu, &[bf16::ZERO; 1]));
    let mut c = upload(&gpu, &poison::<bf16>(35));
    gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
    assert!(download(&gpu, &c).iter().all(|v| v.to_f32() == 0.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn empty_problems_launch_nothing() {
    let gpu = gpu();
    let a = upload(&gpu, &[1.0f32; 20]);
    let b = upload(&gpu, &[1.0f32; 20]);
    let mut c = upload(&gpu, &[7.0f32; 20]);
    for p in [
        GemmProblem::matmul(0, 4, 5, Precision::F32).unwrap(),
        GemmProblem::matmul(4, 0, 5, Precision::F32).unwrap(),
        GemmProblem::matmul(4, 4, 5, Precision::F32).unwrap().batched(0).unwrap(),
    ] {
        gpu.gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
    }
    assert_eq!(download(&gpu, &c), vec![7.0f32; 20]);
}

/// The raw-address path on a stream the test creates itself: no cudarc types cross the API.
#[test]
#[ignore = "needs a CUDA GPU"]
fn raw_pointers_on_callers_stream() {
    let gpu = gpu();
    let mut rng = rng();
    let caller = gpu.context().new_stream().unwrap();
    let p = Case { m: 33, n: 65, k: 17, op_a: Op::T, op_b: Op::N, pad: 3, batch: 2 }.problem(Precision::BF16);
    let ops = operands::<bf16, bf16>(&mut rng, &p, 1.0, 0.0);
    let a = caller.clone_htod(&ops.a).unwrap();
    let b = caller.clone_htod(&ops.b).unwrap();
    let c = caller.clone_htod(&ops.c).unwrap();
    let raw = |s: &CudaSlice<bf16>| {
        let (addr, _guard) = s.device_ptr(&caller);
        RawBuffer { address: addr, len_bytes: s.len() * 2 }
    };
    let (ra, rb, rc) = (raw(&a), raw(&b), raw(&c));
    // SAFETY: the three buffers are live allocations of this context, sized by their layouts,
    // and are used only on `caller` until it is synchronised below.
    unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(ra, rb, rc), caller.cu_stream()) }.unwrap();
    caller.synchronize().unwrap();
    let got = caller.clone_dtoh(&c).unwrap();
    check("raw", &p, &ops.c, &got, &ops.reference);

    // bad input through the raw path: named errors, C untouched
    let before = caller.clone_dtoh(&c).unwrap();
    let short = RawBuffer { len_bytes: ra.len_bytes - 2, ..ra };
    let e =
        unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(short, rb, rc), caller.cu_stream()) }.unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::A, .. }), "{e}");
    let odd = RawBuffer { address: rb.address + 1, len_bytes: rb.len_bytes - 1 };
    let e = unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(ra, odd, rc), caller.cu_stream()) }.unwrap_err();
    assert!(matches!(e, Error::Misaligned { operand: Which::B, .. }), "{e}");
    let e = unsafe {
        gpu.gemm_raw(
            &p,
            Scale::PRODUCT,
            RawOperands::new(ra, rb, RawBuffer { address: ra.address, len_bytes: rc.len_bytes }),
            caller.cu_stream(),
        )
    }
    .unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { input: Which::A, .. }), "{e}");
    caller.synchronize().unwrap();
    let after = caller.clone_dtoh(&c).unwrap();
    assert_eq!(
        before.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        after.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn safe_path_rejects_short_buffers_before_launch() {
    let gpu = gpu();
    let p = GemmProblem::new(
        gemmbridge::Operand::n(MatrixLayout::row_major(8, 8)),
        gemmbridge::Operand::n(MatrixLayout::row_major(8, 8)),
        MatrixLayout::row_major(8, 8).with_ld(10),
        1,
        Precision::F32,
    )
    .unwrap();
    let a = upload(&gpu, &[1.0f32; 64]);
    let mut c = upload(&gpu, &[5.0f32; 77]); // needs 7·10 + 8 = 78
    let e = gpu.gemm(&p, 1.0, &a, &a, 0.0, &mut c).unwrap_err();
    assert_eq!(
        e,
        Error::BufferTooSmall { operand: Which::C, len_bytes: 308, needed_bytes: 312, needed_elems: 78, elem_bytes: 4 }
    );
    assert_eq!(download(&gpu, &c), vec![5.0f32; 77]);
}

/// α = 0: A and B are not read (inf and NaN there do not reach C), C = β·C, on every backend.
#[test]
#[ignore = "needs a CUDA GPU"]
fn alpha_zero_does_not_read_inputs() {
    let gpu = gpu();
    let p = GemmProblem::matmul(4, 4, 4, Precision::F32).unwrap();
    let a = upload(&gpu, &[f32::INFINITY; 16]);
    let b = upload(&gpu, &[f32::NAN; 16]);
    for backend in [Backend::Auto, Backend::Blas, Backend::Lt] {
        gpu.update_options(|o| o.backend = backend).unwrap();
        let mut c = upload(&gpu, &[2.0f32; 16]);
        gpu.gemm(&p, 0.0, &a, &b, 0.5, &mut c).unwrap();
        assert_eq!(download(&gpu, &c), vec![1.0f32; 16], "{backend:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn outputs_side_by_side_in_each_row() {
    // C stored [m, batch, n] (ld = batch·n, batch stride n), every backend, against the CPU
    // backend on the same inputs (both against the f64 reference by the CPU tests)
    let gpu = gpu();
    let mut rng = rng();
    let (m, n, k, batch) = (37, 24, 40, 3);
    let p = GemmProblem::new(
        gemmbridge::Operand::n(MatrixLayout::row_major(m, k)),
        gemmbridge::Operand::n(MatrixLayout::row_major(k, n)),
        MatrixLayout::row_major(m, n).with_ld(batch * n).with_batch_stride(n),
        batch,
        Precision::F32,
    )
    .unwrap();
    let a: Vec<f32> = normal(&mut rng, batch * m * k);
    let b: Vec<f32> = normal(&mut rng, batch * k * n);
    let mut want = vec![f32::NAN; m * batch * n];
    gemmbridge::cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut want).unwrap();
    for backend in [Backend::Auto, Backend::Lt, Backend::Blas] {
        gpu.update_options(|o| o.backend = backend).unwrap();
        let (da, db) = (upload(&gpu, &a), upload(&gpu, &b));
        let mut dc = upload(&gpu, &vec![f32::NAN; m * batch * n]);
        gpu.gemm(&p, 1.0, &da, &db, 0.0, &mut dc).unwrap();
        let got = download(&gpu, &dc);
        let e = rel_error(
            &got.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &want.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        );
        assert!(e <= 1e-5, "{backend:?}: {e:e}");
    }
}
