//! The decoder layer on the CPU backend ([`CpuDecoderLayer`]) against the float64 layer
//! ([`gemmbridge::layer::reference`]) on the same rounded inputs, at a small odd size: the
//! output, the input gradient and every weight gradient within the f16/bf16 band (1e-2);
//! outputs poisoned with NaN by a step on NaN inputs first, so an element a step leaves
//! unwritten shows. With FP8 forward projections, against the float64 layer whose forward
//! projections take the same recipe's rounded operands. Gradient accumulation and the order
//! rule.

mod common;

use common::layer::{check, check_step, fp8_is_what_ran, reference, weights, wide, BAND, FP8_BAND};
use common::{normal, rng};
use gemmbridge::fp8::Scaling;
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer::cpu::CpuDecoderLayer;
use gemmbridge::layer::reference::Grads;
use gemmbridge::layer::{DecoderLayer, LayerOptions, LayerWeight, RopeStyle, Tokens};
use gemmbridge::train::GradMode;
use gemmbridge::{DType, Element, Error};

/// d 72, 3 query heads over 1 of 24, ffn 104, b 2, s 19: odd wherever a size may be.
fn size(dtype: DType) -> (DecoderLayer, Tokens) {
    (DecoderLayer::new(72, (3, 1), 24, 104, dtype), Tokens { b: 2, s: 19 })
}

/// Poisons every output with a step on NaN inputs, then runs a step and checks it.
fn step_matches_float64<T: Element>(dtype: DType, rope: RopeStyle, fp8: Option<Scaling>) {
    let (l, t) = size(dtype);
    let l = l.with_rope(10_000.0, rope);
    let mut r = rng();
    let w = weights::<T>(&l, &mut r);
    let n = t.count() * l.d_model;
    let (x, dy): (Vec<T>, Vec<T>) = (normal(&mut r, n), normal(&mut r, n));
    let inputs = (&wide(&x)[..], &wide(&dy)[..]);
    let want = reference::<T>((&l, t), &w, inputs, fp8);
    let mut layer = CpuDecoderLayer::<T>::with_options((l, t), &w, LayerOptions { fp8_forward: fp8 }).unwrap();
    let nan = vec![T::from_f64(f64::NAN); n];
    layer.forward(&nan, true).unwrap();
    layer.backward(&nan, &nan).unwrap();
    assert!(layer.output().iter().all(|v| v.to_f64().is_nan()), "the poisoning step wrote numbers");
    layer.forward(&x, true).unwrap();
    layer.backward(&x, &dy).unwrap();
    eprintln!("{dtype} {} fp8 {fp8:?}", rope.name());
    let got = Grads { dx: wide(layer.input_grad()), dw: layer.grads() };
    let y = wide(layer.output());
    match fp8 {
        None => check_step(&y, &got, &want, BAND),
        Some(_) => {
            check_step(&y, &got, &want, FP8_BAND);
            fp8_is_what_ran(&y, &want.0, &reference::<T>((&l, t), &w, inputs, None).0);
        }
    }
}

#[test]
fn the_cpu_layer_matches_float64_in_bf16() {
    step_matches_float64::<bf16>(DType::BF16, RopeStyle::RotateHalf, None);
}

#[test]
fn the_cpu_layer_matches_float64_in_f16_with_interleaved_rope() {
    step_matches_float64::<f16>(DType::F16, RopeStyle::Interleaved, None);
}

#[test]
fn the_cpu_layer_with_fp8_projections_matches_its_float64_emulation() {
    for scaling in [Scaling::Row, Scaling::Tensor] {
        step_matches_float64::<bf16>(DType::BF16, RopeStyle::RotateHalf, Some(scaling));
    }
    let (l, t) = size(DType::BF16);
    let w = weights::<bf16>(&l, &mut rng());
    let e = CpuDecoderLayer::<bf16>::with_options((l, t), &w, LayerOptions { fp8_forward: Some(Scaling::Block1x128) })
        .unwrap_err();
    assert!(matches!(e, Error::Fp8 { .. }), "{e}");
}

/// Two backwards under accumulation give twice one backward's weight gradients; a backward
/// needs a training forward on the same input; a wrong dtype or length is refused by name.
#[test]
fn accumulation_order_and_bad_input() {
    let (l, t) = size(DType::BF16);
    let mut r = rng();
    let w = weights::<bf16>(&l, &mut r);
    let n = t.count() * l.d_model;
    let (x, dy): (Vec<bf16>, Vec<bf16>) = (normal(&mut r, n), normal(&mut r, n));
    let mut layer = CpuDecoderLayer::<bf16>::new(l, t, &w).unwrap();
    let e = layer.backward(&x, &dy).unwrap_err();
    assert!(matches!(e, Error::TrainingOrder { .. }), "{e}");
    layer.forward(&x, false).unwrap();
    let e = layer.backward(&x, &dy).unwrap_err();
    assert!(matches!(e, Error::TrainingOrder { .. }), "an inference forward: {e}");
    layer.forward(&x, true).unwrap();
    // an equal copy of x is not the x the forward ran on: the message says what is compared
    let e = layer.backward(&x.clone(), &dy).unwrap_err().to_string();
    assert!(e.contains("address and length, not its values") && e.contains("train = true"), "{e}");
    layer.backward(&x, &dy).unwrap();
    let once = layer.grads();
    layer.set_grad_mode(GradMode::Accumulate);
    layer.forward(&x, true).unwrap();
    layer.backward(&x, &dy).unwrap();
    let twice = layer.grads();
    for which in LayerWeight::ALL {
        let doubled: Vec<f64> = once.get(which).iter().map(|v| 2.0 * v).collect();
        check(&format!("accumulated d_{}", which.name()), twice.get(which), &doubled, BAND);
    }
    let e = layer.forward(&x[..n - 1], true).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    // a longer x buffer: the step reads its first T·d elements, and the backward on the same
    // buffer follows it
    let mut longer = x.clone();
    longer.push(bf16::ZERO);
    layer.forward(&longer, true).unwrap();
    layer.backward(&longer, &dy).unwrap();
    let e = CpuDecoderLayer::<f16>::new(l, t, &w).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { expected: DType::BF16, got: DType::F16, .. }), "{e}");
    assert_eq!(e.to_string(), "decoder layer's element type T holds f16 elements but the problem needs bf16");
}

/// Sizes past what the host holds or the CPU attention takes are refused before anything is
/// allocated or computed.
#[test]
fn sizes_past_the_host_are_refused_up_front() {
    use gemmbridge::layer::reference::{Weights, MAX_HOST_WEIGHT_ELEMS};
    let huge = DecoderLayer::new(usize::MAX, (2, 1), 32, 96, DType::BF16);
    let e = Weights::from_fn(&huge, |_, _| 0.0).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    // validate accepts this one (its bytes fit isize); the host bound refuses it
    let wide = DecoderLayer::new(1 << 40, (2, 1), 32, 96, DType::BF16);
    wide.validate().unwrap();
    let e = Weights::from_fn(&wide, |_, _| 0.0).unwrap_err();
    assert!(matches!(e, Error::DimensionTooLarge { max: MAX_HOST_WEIGHT_ELEMS, .. }), "{e}");
    let (l, _) = size(DType::BF16);
    let w = weights::<bf16>(&l, &mut rng());
    let t0 = std::time::Instant::now();
    let Err(e) = CpuDecoderLayer::<bf16>::new(l, Tokens { b: 1, s: 100_000 }, &w) else {
        panic!("s = 100 000 accepted");
    };
    assert!(matches!(e, Error::DimensionTooLarge { value: 10_000_000_000, .. }), "{e}");
    assert!(t0.elapsed().as_secs_f64() < 1.0, "refused at construction, {:?}", t0.elapsed());
}
