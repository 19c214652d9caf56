//! The CPU backend against the f64 reference, every precision, plus BLAS edge semantics and
//! "nothing written on error".

mod common;

use common::{cases, check, operands, poison, rng, Case};
use gemmbridge::half::{bf16, f16};
use gemmbridge::{cpu, Element, Error, GemmProblem, MatrixLayout, Op, Operand, Precision, Which};

fn run_all<TI: Element, TO: Element>(precision: Precision) {
    let mut rng = rng();
    for case in cases(&[(1, 1, 1), (7, 33, 5), (33, 7, 1), (17, 9, 33), (1, 40, 64)]) {
        for (alpha, beta) in [(1.0f32, 0.0f32), (-0.5, 2.0)] {
            let p = case.problem(precision);
            let ops = operands::<TI, TO>(&mut rng, &p, alpha as f64, beta as f64);
            let mut c = ops.c.clone();
            cpu::gemm(&p, alpha, &ops.a, &ops.b, beta, &mut c).unwrap();
            check(&format!("cpu {precision} α={alpha} β={beta}"), &p, &ops.c, &c, &ops.reference);
        }
    }
}

/// `D = α·A·B + β·C_in` with C_in apart from D: C_in untouched, D as the in-place call's C,
/// D's padding untouched.
fn run_c_in<TI: Element, TO: Element>(precision: Precision) {
    let mut rng = rng();
    for case in cases(&[(7, 33, 5), (17, 9, 33)]) {
        for (alpha, beta) in [(1.0f32, 1.0f32), (1.0, 0.5), (-0.5, 0.0)] {
            let p = case.problem(precision);
            let ops = operands::<TI, TO>(&mut rng, &p, alpha as f64, beta as f64);
            let before = poison::<TO>(ops.c.len());
            let mut d = before.clone();
            cpu::gemm_c_in(&p, (alpha, beta), &ops.a, &ops.b, &ops.c, &mut d).unwrap();
            check(&format!("cpu c_in {precision} α={alpha} β={beta}"), &p, &before, &d, &ops.reference);
        }
    }
}

#[test]
fn a_separate_c_is_read_and_left_alone() {
    run_c_in::<f32, f32>(Precision::F32);
    run_c_in::<bf16, bf16>(Precision::BF16);
    let p = GemmProblem::matmul(2, 2, 2, Precision::F32).unwrap();
    let (a, b, c_in) = ([1.0f32; 4], [1.0f32; 4], [1.0f32; 3]);
    let mut d = [f32::NAN; 4];
    let e = cpu::gemm_c_in(&p, (1.0, 1.0), &a, &b, &c_in, &mut d).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::CIn, .. }), "{e}");
    assert!(d.iter().all(|v| v.is_nan()), "written on error");
}

#[test]
fn f32_matches_reference() {
    run_all::<f32, f32>(Precision::F32);
}

#[test]
fn tf32_matches_reference() {
    run_all::<f32, f32>(Precision::TF32);
}

#[test]
fn f16_matches_reference() {
    run_all::<f16, f16>(Precision::F16);
    run_all::<f16, f32>(Precision::F16_F32OUT);
}

#[test]
fn bf16_matches_reference() {
    run_all::<bf16, bf16>(Precision::BF16);
    run_all::<bf16, f32>(Precision::BF16_F32OUT);
}

#[test]
fn beta_zero_never_reads_c() {
    let p = GemmProblem::matmul(5, 6, 7, Precision::F32).unwrap();
    let mut rng = rng();
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    assert!(ops.c.iter().all(|v| v.is_nan()));
    let mut c = ops.c.clone();
    cpu::gemm(&p, 1.0, &ops.a, &ops.b, 0.0, &mut c).unwrap();
    assert!(c.iter().all(|v| v.is_finite()));
    check("β=0", &p, &ops.c, &c, &ops.reference);
}

#[test]
fn k_zero_scales_c_by_beta() {
    let p = GemmProblem::matmul(3, 4, 0, Precision::F32).unwrap();
    let a: [f32; 0] = [];
    let b: [f32; 0] = [];
    let mut c: Vec<f32> = (0..12).map(|i| i as f32 + 1.0).collect();
    cpu::gemm(&p, 1.0, &a, &b, 2.0, &mut c).unwrap();
    assert_eq!(c, (0..12).map(|i| 2.0 * (i as f32 + 1.0)).collect::<Vec<_>>());
    let mut c = poison::<f32>(12);
    cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
    assert_eq!(c, vec![0.0; 12]);
    let p = GemmProblem::matmul(3, 4, 0, Precision::BF16).unwrap();
    let mut c = poison::<bf16>(12);
    cpu::gemm::<bf16, bf16>(&p, 1.0, &[], &[], 0.0, &mut c).unwrap();
    assert!(c.iter().all(|v| v.to_f32() == 0.0));
}

/// α = 0 (or k = 0) with β = 1 leaves C bit for bit as it was, a signalling NaN included
/// (reference BLAS's quick return); with β = 2 C is scaled and A, B are still not read.
#[test]
fn alpha_zero_beta_one_leaves_c_untouched() {
    let signalling = f32::from_bits(0x7f80_0001);
    assert!(signalling.is_nan());
    let p = GemmProblem::matmul(2, 3, 4, Precision::F32).unwrap();
    let a = vec![f32::NAN; 8];
    let b = vec![f32::INFINITY; 12];
    let mut c: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
    c[3] = signalling;
    let before: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
    cpu::gemm(&p, 0.0, &a, &b, 1.0, &mut c).unwrap();
    assert_eq!(c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), before);
    let k0 = GemmProblem::matmul(2, 3, 0, Precision::F32).unwrap();
    cpu::gemm::<f32, f32>(&k0, 1.0, &[], &[], 1.0, &mut c).unwrap();
    assert_eq!(c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), before);
    c[3] = 1.0;
    cpu::gemm(&p, 0.0, &a, &b, 2.0, &mut c).unwrap();
    assert_eq!(c, vec![-5.0, -3.0, -1.0, 2.0, 3.0, 5.0]);
}

#[test]
fn empty_problems_are_no_ops() {
    for (m, n) in [(0, 4), (3, 0)] {
        let p = GemmProblem::matmul(m, n, 5, Precision::F32).unwrap();
        let a = vec![1.0f32; m * 5];
        let b = vec![1.0f32; 5 * n];
        let mut c = vec![7.0f32; 3];
        cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
        assert_eq!(c, vec![7.0; 3]);
    }
    let p = GemmProblem::matmul(2, 2, 2, Precision::F32).unwrap().batched(0).unwrap();
    let mut c = vec![7.0f32; 4];
    cpu::gemm::<f32, f32>(&p, 1.0, &[], &[], 0.0, &mut c).unwrap();
    assert_eq!(c, vec![7.0; 4]);
}

#[test]
fn broadcast_batch_stride_zero() {
    // the same weight for every batch entry
    let mut rng = rng();
    let p = GemmProblem::new(
        Operand::n(MatrixLayout::row_major(4, 6)),
        Operand::n(MatrixLayout::row_major(6, 5).with_batch_stride(0)),
        MatrixLayout::row_major(4, 5),
        3,
        Precision::F32,
    )
    .unwrap();
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    assert_eq!(ops.b.len(), 30);
    let mut c = ops.c.clone();
    cpu::gemm(&p, 1.0, &ops.a, &ops.b, 0.0, &mut c).unwrap();
    check("broadcast", &p, &ops.c, &c, &ops.reference);
}

#[test]
fn column_major_inputs_via_transposed_views() {
    // A given column-major [m, k] (ld = m), B column-major [k, n] (ld = k + 2)
    let (m, n, k) = (5, 4, 3);
    let mut rng = rng();
    let p = GemmProblem::new(
        Operand::col_major(m, k, m),
        Operand::col_major(k, n, k + 2),
        MatrixLayout::row_major(m, n),
        1,
        Precision::F32,
    )
    .unwrap();
    assert_eq!(p.a().op, Op::T);
    let ops = operands::<f32, f32>(&mut rng, &p, 1.0, 0.0);
    let mut c = ops.c.clone();
    cpu::gemm(&p, 1.0, &ops.a, &ops.b, 0.0, &mut c).unwrap();
    check("col-major", &p, &ops.c, &c, &ops.reference);
    // and the same numbers, written out by hand from the column-major definition
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k).map(|l| ops.a[l * m + i] as f64 * ops.b[j * (k + 2) + l] as f64).sum();
            assert!((c[i * n + j] as f64 - want).abs() < 1e-5, "({i},{j})");
        }
    }
}

#[test]
fn errors_leave_output_untouched() {
    let p = Case { m: 4, n: 5, k: 6, op_a: Op::N, op_b: Op::T, pad: 0, batch: 2 }.problem(Precision::F32);
    let need = |l: MatrixLayout| l.required_elems(2).unwrap();
    let a = vec![1.0f32; need(p.a().layout)];
    let b = vec![1.0f32; need(p.b().layout) - 1]; // one element short
    let mut c = vec![3.0f32; need(p.c())];
    let e = cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::B, .. }), "{e}");
    assert!(c.iter().all(|&v| v == 3.0));
    let q = GemmProblem::matmul(4, 5, 6, Precision::F16).unwrap();
    let mut c16 = vec![f16::from_f32(3.0); 20];
    let a = vec![1.0f32; 24];
    let e = cpu::gemm::<f32, f16>(&q, 1.0, &a, &a, 0.0, &mut c16).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::A, .. }), "{e}");
    assert!(c16.iter().all(|&v| v.to_f32() == 3.0));
}

#[test]
fn outputs_side_by_side_in_each_row() {
    // C stored [m, batch, n] (ld = batch·n, batch stride n): each product lands in its own
    // columns of every row, against the same products computed one at a time
    let (m, n, k, batch) = (3, 4, 5, 3);
    let p = GemmProblem::new(
        Operand::n(MatrixLayout::row_major(m, k)),
        Operand::n(MatrixLayout::row_major(k, n)),
        MatrixLayout::row_major(m, n).with_ld(batch * n).with_batch_stride(n),
        batch,
        Precision::F32,
    )
    .unwrap();
    let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..batch * k * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut c = vec![f32::NAN; m * batch * n];
    cpu::gemm(&p, 1.0, &a, &b, 0.0, &mut c).unwrap();
    let one = GemmProblem::matmul(m, n, k, Precision::F32).unwrap();
    for z in 0..batch {
        let mut want = vec![0.0f32; m * n];
        cpu::gemm(&one, 1.0, &a[z * m * k..][..m * k], &b[z * k * n..][..k * n], 0.0, &mut want).unwrap();
        for r in 0..m {
            assert_eq!(&c[r * batch * n + z * n..][..n], &want[r * n..][..n], "product {z}, row {r}");
        }
    }
}

/// The GPU tests' crash reporter (`common/crash.rs`): the child below, run as a subprocess of
/// this test executable, reports a fault and still ends with SIGSEGV; a SIGSEGV sent to it
/// (not a fault) is not swallowed either.
#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
#[test]
fn crash_reporter_reports_and_still_ends_the_process() {
    use std::os::unix::process::ExitStatusExt;
    for how in ["fault", "raise"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_reporter_child", "--include-ignored", "--nocapture"])
            .env("GEMMBRIDGE_CRASH_CHILD", how)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(11), "{how}: {:?}\n{err}", out.status);
        assert!(err.contains("=== crash reporter: SIGSEGV") && err.contains("=== end of crash report"), "{how}: {err}");
        assert!(err.contains("--- /proc/self/maps"), "{how}: {err}");
    }
}

#[test]
#[ignore = "a child process of crash_reporter_reports_and_still_ends_the_process"]
fn crash_reporter_child() {
    common::crash::install();
    match std::env::var("GEMMBRIDGE_CRASH_CHILD").as_deref() {
        Ok("fault") => {
            // SAFETY: deliberately not: address 16 is never mapped, and the fault is the test
            let v = unsafe { std::ptr::read_volatile(std::hint::black_box(16usize) as *const u64) };
            println!("{v}");
        }
        // SAFETY: raising a signal in this process.
        Ok("raise") => unsafe {
            libc::raise(libc::SIGSEGV);
        },
        _ => {}
    }
}
