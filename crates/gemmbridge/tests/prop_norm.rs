//! Property tests of the RMSNorm problem ([`RmsNorm`]: rows, features, epsilon, per-tensor
//! leading dimensions, element and gradient types) and the CPU backend's forward and backward
//! on every problem small enough to run: nothing panics or overflows, a valid problem's spans
//! fit 32-bit indexing, buffers too small are refused, and finite inputs give finite outputs.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::cpu::{self, DwSlice};
use gemmbridge::norm::{GradType, NormTensor, RmsNorm, MAX_ELEMS};
use gemmbridge::Element;
use proptest::prelude::*;
use shared::{config, dtype, scalar, size, RUN_ELEMS, RUN_WORK};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=6, size()]
}

prop_compose! {
    fn problem()(rows in dim(), features in dim(), eps in prop_oneof![Just(1e-5f32), scalar()], dtype in dtype(),
                 f32_dw in any::<bool>(), lds in prop::collection::vec(prop::option::of(prop_oneof![0usize..=3, size()]), 6)) -> RmsNorm {
        let mut p = RmsNorm::new(rows, features, eps, dtype);
        if f32_dw {
            p = p.with_dw(GradType::F32);
        }
        for (t, ld) in NormTensor::ALL.into_iter().zip(lds) {
            if let Some(extra) = ld {
                p = p.with_ld(t, features.saturating_add(extra));
            }
        }
        p
    }
}

fn small(p: &RmsNorm) -> bool {
    NormTensor::ALL.iter().all(|&t| p.required_elems(t) <= RUN_ELEMS) && p.rows.saturating_mul(p.features) <= RUN_WORK
}

fn run<T: Element>(p: &RmsNorm, seed: u64) {
    let e = |t| p.required_elems(t);
    let x: Vec<T> = shared::buf(e(NormTensor::X), seed);
    let w: Vec<T> = shared::buf(p.features, seed + 1);
    let mut y: Vec<T> = shared::buf(e(NormTensor::Y), seed + 2);
    let mut inv = vec![0f32; p.rows];
    cpu::rms_norm_forward(p, &x, &w, &mut y, Some(&mut inv)).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    assert!(shared::finite(&y) && inv.iter().all(|v| v.is_finite()), "{}", p.describe());
    let gathered = p.gather(NormTensor::Y, &y).unwrap();
    assert_eq!(gathered.len(), p.rows * p.features);
    let dy: Vec<T> = shared::buf(e(NormTensor::Dy), seed + 3);
    let mut dx: Vec<T> = shared::buf(e(NormTensor::Dx), seed + 4);
    let (mut dw_io, mut dw_f32) = (vec![T::from_f32(0.0); p.features], vec![0f32; p.features]);
    let dw = match p.dw {
        GradType::Io => DwSlice::Io(&mut dw_io),
        GradType::F32 => DwSlice::F32(&mut dw_f32),
    };
    cpu::rms_norm_backward(p, &x, &w, &inv, &dy, &mut dx, dw).unwrap_or_else(|e| panic!("{}: {e}", p.describe()));
    assert!(shared::finite(&dx) && shared::finite(&dw_io) && dw_f32.iter().all(|v| v.is_finite()), "{}", p.describe());
}

#[test]
fn problems_run() {
    let n = shared::runnable(problem(), |p| p.validate().is_ok() && small(p));
    assert!(n >= 10, "{n} of 1000 problems run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn rms_norm_problem(p in problem(), seed in any::<u64>()) {
        let _ = (p.describe(), p.forward_bytes(true), p.backward_bytes(), p.dw_dtype());
        for t in NormTensor::ALL {
            let _ = (p.required_elems(t), p.strided(t), p.ld(t));
        }
        // no buffers at all: refused, nothing allocated
        with_elem!(p.dtype, T => {
            let mut y: Vec<T> = Vec::new();
            prop_assert!(cpu::rms_norm_forward::<T>(&p, &[], &[], &mut y, None).is_err());
        });
        if p.validate().is_err() {
            return Ok(());
        }
        for t in NormTensor::ALL {
            prop_assert!(p.required_elems(t) <= MAX_ELEMS);
            prop_assert!(p.index(t, p.rows - 1, p.features - 1) < p.required_elems(t));
        }
        prop_assert!(p.forward_bytes(true).is_finite() && p.backward_bytes().is_finite());
        if small(&p) {
            with_elem!(p.dtype, T => { run::<T>(&p, seed) });
        }
    }
}
