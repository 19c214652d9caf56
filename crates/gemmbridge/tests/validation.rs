//! Validation that needs no GPU: overflow, α = 0, empty problems, epilogue operands.

use gemmbridge::validate::{check_c_in, check_epilogue, BufferDesc};
use gemmbridge::{cpu, DType, Epilogue, Error, GemmProblem, MatrixLayout, Operand, Precision, Which, MAX_DIM};

#[test]
fn huge_sizes_are_named_errors_not_overflow_panics() {
    for (m, n, k) in [(usize::MAX, 2, 2), (2, usize::MAX / 2 + 1, 4), (MAX_DIM, MAX_DIM, MAX_DIM)] {
        let e = GemmProblem::matmul(m, n, k, Precision::F32).unwrap_err();
        assert!(matches!(e, Error::DimensionTooLarge { .. }), "{m} {n} {k}: {e}");
    }
    let l = MatrixLayout::row_major(3, 4).with_ld(usize::MAX);
    let e = GemmProblem::new(
        Operand::n(l),
        Operand::n(MatrixLayout::row_major(4, 2)),
        MatrixLayout::row_major(3, 2),
        1,
        Precision::F32,
    )
    .unwrap_err();
    assert!(matches!(e, Error::DimensionTooLarge { what: "leading dimension of A", .. }), "{e}");
    let e = GemmProblem::new(
        Operand::n(MatrixLayout::row_major(3, 5).with_batch_stride(i64::MAX as usize)),
        Operand::n(MatrixLayout::row_major(5, 2)),
        MatrixLayout::row_major(3, 2),
        2,
        Precision::F32,
    )
    .unwrap_err();
    // past usize: the batch stride is named, with the most it may be for this batch
    assert!(
        matches!(e, Error::DimensionTooLarge { what: "batch stride of A (the extent overflows)", value, max }
            if value == i64::MAX as usize && max < value),
        "{e}"
    );
    assert!(!e.to_string().contains("32-bit"), "{e}");
    // within usize but past isize::MAX bytes: the extent itself
    let e = GemmProblem::new(
        Operand::n(MatrixLayout::row_major(3, 5).with_batch_stride(1 << 61)),
        Operand::n(MatrixLayout::row_major(5, 2)),
        MatrixLayout::row_major(3, 2),
        2,
        Precision::F32,
    )
    .unwrap_err();
    assert!(matches!(e, Error::DimensionTooLarge { what: "extent of A in bytes", .. }), "{e}");
}

#[test]
fn with_ld_keeps_an_explicit_batch_stride() {
    assert_eq!(MatrixLayout::row_major(2, 3).with_batch_stride(0).with_ld(5).batch_stride, 0);
    assert_eq!(MatrixLayout::row_major(2, 3).with_ld(5).batch_stride, 10);
    assert_eq!(MatrixLayout::row_major(2, 3).with_batch_stride(99).with_ld(5).batch_stride, 99);
}

#[test]
fn alpha_zero_does_not_read_a_or_b() {
    let p = GemmProblem::matmul(2, 2, 2, Precision::F32).unwrap();
    let a = [f32::INFINITY; 4];
    let b = [f32::NAN; 4];
    let mut c = [1.0f32, 2.0, 3.0, 4.0];
    cpu::gemm(&p, 0.0, &a, &b, 0.5, &mut c).unwrap();
    assert_eq!(c, [0.5, 1.0, 1.5, 2.0]);
    let mut c = [f32::NAN; 4];
    cpu::gemm(&p, 0.0, &a, &b, 0.0, &mut c).unwrap();
    assert_eq!(c, [0.0; 4]);
}

#[test]
fn empty_problems_take_empty_slices() {
    let p = GemmProblem::matmul(0, 4, 5, Precision::F32).unwrap();
    cpu::gemm::<f32, f32>(&p, 1.0, &[], &[], 0.0, &mut []).unwrap();
    let e = cpu::gemm::<f32, gemmbridge::half::f16>(&p, 1.0, &[], &[], 0.0, &mut []).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::C, .. }), "{e}");
}

fn desc(address: u64, len_bytes: usize, dtype: DType) -> BufferDesc {
    BufferDesc { address, len_bytes, dtype }
}

#[test]
fn epilogue_operands_are_checked() {
    // linear 4×6×5 bf16: x 20 elems, w 30, out 24
    let p = GemmProblem::linear(4, 6, 5, Precision::BF16).unwrap();
    let abc = [desc(0x1000, 40, DType::BF16), desc(0x2000, 60, DType::BF16), desc(0x3000, 48, DType::BF16)];
    let bias = p.with_epilogue(Epilogue::Bias).unwrap();
    let e = check_epilogue(&bias, abc, None, None).unwrap_err();
    assert_eq!(
        e,
        Error::EpilogueOperand { epilogue: Epilogue::Bias, operand: "bias", problem: "is required but missing" }
    );
    check_epilogue(&bias, abc, Some(desc(0x4000, 12, DType::BF16)), None).unwrap();
    let e = check_epilogue(&bias, abc, Some(desc(0x4000, 10, DType::BF16)), None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Bias, needed_elems: 6, .. }), "{e}");
    let e = check_epilogue(&bias, abc, Some(desc(0x4000, 12, DType::F32)), None).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Bias, .. }), "{e}");
    let e = check_epilogue(&p, abc, Some(desc(0x4000, 12, DType::BF16)), None).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { problem: "was given but is not used", .. }), "{e}");
    // aux: default ld is n rounded up to 8 → 8, so 3·8 + 6 = 30 elements
    let aux = p.with_epilogue(Epilogue::GeluAux).unwrap();
    assert_eq!(aux.aux().ld, 8);
    check_epilogue(&aux, abc, None, Some(desc(0x5000, 60, DType::BF16))).unwrap();
    let e = check_epilogue(&aux, abc, None, Some(desc(0x5000, 58, DType::BF16))).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Aux, needed_elems: 30, .. }), "{e}");
    // a written aux overlapping an input
    let e = check_epilogue(&aux, abc, None, Some(desc(0x2000 + 8, 60, DType::BF16))).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::Aux, input: Which::B, .. }), "{e}");
    // bias gradient of A has m elements
    let g = p.with_epilogue(Epilogue::BiasGradA).unwrap();
    assert_eq!(g.vector_len(), 4);
    check_epilogue(&g, abc, Some(desc(0x4000, 8, DType::BF16)), None).unwrap();
}

#[test]
fn epilogue_layout_errors() {
    let p = GemmProblem::linear(4, 6, 5, Precision::BF16).unwrap();
    let e = p.batched(2).unwrap().with_epilogue(Epilogue::BiasGradB).unwrap_err();
    assert_eq!(e, Error::EpilogueBatch { epilogue: Epilogue::BiasGradB, batch: 2 });
    let aux = p.with_epilogue(Epilogue::GeluAux).unwrap();
    for bad in [
        MatrixLayout::row_major(4, 6).with_ld(6),
        MatrixLayout::row_major(4, 5).with_ld(8),
        MatrixLayout::row_major(3, 6).with_ld(8),
    ] {
        let e = aux.with_aux_layout(bad).unwrap_err();
        assert!(matches!(e, Error::AuxLayout { .. }), "{bad:?}: {e}");
    }
    aux.with_aux_layout(MatrixLayout::row_major(4, 6).with_ld(16)).unwrap();
    let e = cpu::gemm::<gemmbridge::half::bf16, gemmbridge::half::bf16>(
        &p.with_epilogue(Epilogue::Relu).unwrap(),
        1.0,
        &[gemmbridge::half::bf16::ZERO; 20],
        &[gemmbridge::half::bf16::ZERO; 30],
        0.0,
        &mut [gemmbridge::half::bf16::ZERO; 24],
    )
    .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[test]
fn every_written_operand_is_checked_for_overlap() {
    let p = GemmProblem::linear(4, 6, 5, Precision::BF16).unwrap();
    let abc = [desc(0x1000, 40, DType::BF16), desc(0x2000, 60, DType::BF16), desc(0x3000, 48, DType::BF16)];
    // a bias read from inside C (which is written)
    let bias = p.with_epilogue(Epilogue::Bias).unwrap();
    let e = check_epilogue(&bias, abc, Some(desc(0x3000 + 4, 12, DType::BF16)), None).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::C, input: Which::Bias, .. }), "{e}");
    // a DGelu aux (read) overlapping C
    let dgelu = p.with_epilogue(Epilogue::DGelu).unwrap();
    let e = check_epilogue(&dgelu, abc, None, Some(desc(0x3000 - 16, 60, DType::BF16))).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::C, input: Which::Aux, .. }), "{e}");
    // a written aux on top of the bias it reads
    let both = p.with_epilogue(Epilogue::GeluAuxBias).unwrap();
    let e = check_epilogue(&both, abc, Some(desc(0x5000, 12, DType::BF16)), Some(desc(0x5000, 60, DType::BF16)))
        .unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::Aux, input: Which::Bias, .. }), "{e}");
    // addresses near the top of the address space do not overflow
    let top = [desc(u64::MAX - 1, 40, DType::BF16), desc(0x2000, 60, DType::BF16), desc(0x3000, 48, DType::BF16)];
    assert!(check_epilogue(&bias, top, Some(desc(0x4000, 12, DType::BF16)), None).is_ok());
}

#[test]
fn aux_layout_only_for_aux_epilogues_and_huge_n_is_an_error() {
    let p = GemmProblem::linear(4, 6, 5, Precision::BF16).unwrap();
    let e = p.with_aux_layout(MatrixLayout::row_major(4, 6).with_ld(8)).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { operand: "aux", .. }), "{e}");
    let e = GemmProblem::matmul(1, usize::MAX, 1, Precision::BF16).unwrap_err();
    assert!(matches!(e, Error::DimensionTooLarge { .. }), "{e}");
}

#[test]
fn a_separate_c_is_checked_against_every_written_operand() {
    // 4×6×5 bf16: A 20 elems (40 B), B 30 (60 B), C 24 (48 B)
    let p = GemmProblem::matmul(4, 6, 5, Precision::BF16).unwrap();
    let abc = [desc(0x1000, 40, DType::BF16), desc(0x2000, 60, DType::BF16), desc(0x3000, 48, DType::BF16)];
    check_c_in(&p, abc, desc(0x4000, 48, DType::BF16), None, None).unwrap();
    // C_in at D's address is the in-place call; reading A's bytes is harmless
    check_c_in(&p, abc, desc(0x3000, 48, DType::BF16), None, None).unwrap();
    check_c_in(&p, abc, desc(0x1000, 48, DType::BF16), None, None).unwrap();
    let e = check_c_in(&p, abc, desc(0x3010, 48, DType::BF16), None, None).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::C, input: Which::CIn, .. }), "{e}");
    let e = check_c_in(&p, abc, desc(0x4000, 46, DType::BF16), None, None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::CIn, needed_elems: 24, .. }), "{e}");
    let e = check_c_in(&p, abc, desc(0x4000, 48, DType::F16), None, None).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::CIn, .. }), "{e}");
    // a written aux may not overlap it either
    let aux = p.with_epilogue(Epilogue::GeluAux).unwrap();
    let e =
        check_c_in(&aux, abc, desc(0x5000, 48, DType::BF16), None, Some(desc(0x5000, 64, DType::BF16))).unwrap_err();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::Aux, input: Which::CIn, .. }), "{e}");
}
