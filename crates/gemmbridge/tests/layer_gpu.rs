//! GPU tests of the decoder layer: attention's backward into one fused dQKV buffer
//! ([`GpuAttention::backward_packed`]) against float64 with the buffer's unused columns left
//! alone; the GPU layer's construction (every plan made) and order rules; a whole training
//! step against the float64 layer (outputs poisoned by a step on NaN inputs first), in bf16
//! and f16, with gradient accumulation, and with FP8 forward projections; a step captured into
//! one CUDA graph replays the eager step's bits.

mod common;

use std::sync::RwLock;

use common::layer::{check, check_step, fp8_is_what_ran, reference, weights, wide, BAND, FP8_BAND};
use common::{gpu, normal, rng};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use gemmbridge::attention::{reference as attn_reference, Attention, AttnMask, AttnTensor, HeadLayout};
use gemmbridge::cuda::layer::{to_host, GpuDecoderLayer, WeightGrad};
use gemmbridge::cuda::{AttnSaved, Gpu};
use gemmbridge::fp8::Scaling;
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer::reference::{Grads, Weights};
use gemmbridge::layer::{DecoderLayer, LayerOptions, LayerWeight, RopeStyle, Tokens};
use gemmbridge::train::GradMode;
use gemmbridge::{DType, Element, Error, Which};

/// The capture test takes this exclusively, the others share it (another thread's first launch
/// or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// The elements of tensor `t` of `buf`, in logical order.
fn gather(p: &Attention, t: AttnTensor, buf: &[f64]) -> Vec<f64> {
    p.elements(t).map(|i| buf[p.index(t, i)]).collect()
}

/// GQA 4/2 heads of 64, b 2, s 37, packed q, k, v with 16 spare columns per row: forward on
/// the views, backward into one poisoned dQKV; every gradient within the band of float64,
/// the spare columns still NaN.
#[test]
#[ignore = "needs a CUDA GPU"]
fn packed_gradients_match_float64_and_leave_the_rest() {
    let _shared = shared();
    let gpu = gpu();
    let s = gpu.stream();
    let mut r = rng();
    let (b, sq, hq, hkv, d) = (2, 37, 4, 2, 64);
    let width = (hq + 2 * hkv) * d;
    let row = width + 16;
    let packed = HeadLayout { batch: sq * row, head: d, seq: row };
    let mut p = Attention::new(b, (hq, hkv), (sq, sq), d, DType::BF16).with_mask(AttnMask::Causal);
    p.layouts[..3].copy_from_slice(&[packed; 3]);
    let offsets = [0, hq * d, (hq + hkv) * d];
    let qkv: Vec<bf16> = normal(&mut r, b * sq * row);
    let d_o: Vec<bf16> = normal(&mut r, p.required_elems(AttnTensor::O));
    let q64 = wide(&qkv);
    let view = |i: usize, t| &q64[offsets[i]..offsets[i] + p.required_elems(t)];
    let (qv, kv, vv) = (view(0, AttnTensor::Q), view(1, AttnTensor::K), view(2, AttnTensor::V));
    let f = attn_reference::forward(&p, qv, kv, vv, None);
    let g = attn_reference::backward(&p, (qv, kv, vv), &f.o, &wide(&d_o), &f.lse, None);
    let dqkv_host = vec![bf16::NAN; qkv.len()];
    let (dqkv_in, ddo) = (s.clone_htod(&qkv).unwrap(), s.clone_htod(&d_o).unwrap());
    let mut o: CudaSlice<bf16> = s.alloc_zeros(p.required_elems(AttnTensor::O)).unwrap();
    let mut lse: CudaSlice<f32> = s.alloc_zeros(p.stats_elems()).unwrap();
    let mut dqkv = s.clone_htod(&dqkv_host).unwrap();
    let views = offsets.map(|off| dqkv_in.slice(off..));
    gpu.attention().forward(&p, [&views[0], &views[1], &views[2]], &mut o, Some(&mut lse), None).unwrap();
    let saved = AttnSaved { q: &views[0], k: &views[1], v: &views[2], o: &o, d_o: &ddo, stats: &lse };
    gpu.attention().backward_packed(&p, saved, &mut dqkv, offsets, None).unwrap();
    let got = wide(&s.clone_dtoh(&dqkv).unwrap());
    for (i, (t, want)) in
        [(AttnTensor::Q, &g.dq), (AttnTensor::K, &g.dk), (AttnTensor::V, &g.dv)].into_iter().enumerate()
    {
        check(&format!("d{}", t.name()), &gather(&p, t, &got[offsets[i]..]), &gather(&p, t, want), BAND);
    }
    for tok in 0..b * sq {
        assert!(
            got[tok * row + width..(tok + 1) * row].iter().all(|v| v.is_nan()),
            "spare columns of row {tok} written"
        );
    }
    // overlapping views are refused by name, nothing written
    let saved = AttnSaved { q: &views[0], k: &views[1], v: &views[2], o: &o, d_o: &ddo, stats: &lse };
    let e = gpu.attention().backward_packed(&p, saved, &mut dqkv, [0, d, 2 * d], None).unwrap_err();
    assert!(matches!(e, Error::AttentionShape { .. }), "{e}");
}

/// The check size of `bench/layer_peer.py --check`: d 320, heads 5/1 of 64, ffn 864, b 2, s 37.
fn check_size(dtype: DType) -> (DecoderLayer, Tokens) {
    (DecoderLayer::new(320, (5, 1), 64, 864, dtype), Tokens { b: 2, s: 37 })
}

/// A host vector on the device.
fn up<T: DeviceRepr>(gpu: &Gpu, v: &[T]) -> CudaSlice<T> {
    gpu.stream().clone_htod(v).unwrap()
}

/// The layer's output, input gradient and weight gradients as f64.
fn results<T: Element + DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, layer: &GpuDecoderLayer<T>) -> (Vec<f64>, Grads) {
    let y = to_host(gpu, layer.output()).unwrap();
    (y, Grads { dx: to_host(gpu, layer.input_grad()).unwrap(), dw: layer.grads_to_host(gpu).unwrap() })
}

/// One training step on `x`, `dy` after a step on NaN inputs (every output poisoned: an
/// element the real step leaves unwritten stays NaN and fails the check).
fn poisoned_step<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    layer: &mut GpuDecoderLayer<T>,
    (x, dy): (&CudaSlice<T>, &CudaSlice<T>),
) -> (Vec<f64>, Grads) {
    let nan = up(gpu, &vec![T::from_f64(f64::NAN); x.len()]);
    layer.forward(gpu, &nan, true).unwrap();
    layer.backward(gpu, &nan, &nan).unwrap();
    let (y, g) = results(gpu, layer);
    assert!(y.iter().chain(&g.dx).all(|v| v.is_nan()), "the poisoning step wrote numbers");
    layer.forward(gpu, x, true).unwrap();
    layer.backward(gpu, x, dy).unwrap();
    results(gpu, layer)
}

/// Construction plans every call; a backward before a training forward (or after an inference
/// forward) is refused; short inputs and a dtype other than the layer's are refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_layer_is_built_and_keeps_its_order_rules() {
    let _shared = shared();
    let gpu = gpu();
    let (l, t) = check_size(DType::BF16);
    let mut r = rng();
    let w = weights::<bf16>(&l, &mut r);
    let mut layer = GpuDecoderLayer::<bf16>::new(&gpu, l, t, &w).unwrap();
    eprintln!("the norms' weight gradients are {:?}", layer.norm_grad_type());
    let n = t.count() * l.d_model;
    let x = up(&gpu, &normal::<bf16>(&mut r, n));
    let e = layer.backward(&gpu, &x, &x).unwrap_err();
    assert!(matches!(e, Error::TrainingOrder { .. }), "{e}");
    layer.forward(&gpu, &x, false).unwrap();
    let e = layer.backward(&gpu, &x, &x).unwrap_err();
    assert!(matches!(e, Error::TrainingOrder { .. }), "after an inference forward: {e}");
    let short = up(&gpu, &normal::<bf16>(&mut r, n - 1));
    let e = layer.forward(&gpu, &short, true).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    layer.forward(&gpu, &x, true).unwrap();
    let e = layer.backward(&gpu, &x, &short).unwrap_err();
    assert!(matches!(e, Error::DecoderShape { .. }), "{e}");
    let e = GpuDecoderLayer::<f16>::new(&gpu, l, t, &w).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Decoder("element type T"), .. }), "{e}");
    let opts = LayerOptions { fp8_forward: Some(Scaling::Block128x128) };
    let e = GpuDecoderLayer::<bf16>::with_options(&gpu, (l, t), &w, opts).unwrap_err();
    assert!(matches!(e, Error::Fp8 { .. }), "{e}");
}

/// A whole training step at the check size against the float64 layer on the same rounded
/// inputs: y, dx and every weight gradient within the f16/bf16 band, in bf16 (rotate-half
/// RoPE) and f16 (interleaved).
#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_step_matches_float64() {
    let _shared = shared();
    let gpu: Gpu = gpu();
    fn one<T: Element + DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, dtype: DType, rope: RopeStyle) {
        let (l, t) = check_size(dtype);
        let l = l.with_rope(500_000.0, rope);
        let mut r = rng();
        let w: Weights = weights::<T>(&l, &mut r);
        let n = t.count() * l.d_model;
        let (x, dy): (Vec<T>, Vec<T>) = (normal(&mut r, n), normal(&mut r, n));
        let want = reference::<T>((&l, t), &w, (&wide(&x), &wide(&dy)), None);
        let mut layer = GpuDecoderLayer::<T>::new(gpu, l, t, &w).unwrap();
        let (y, got) = poisoned_step(gpu, &mut layer, (&up(gpu, &x), &up(gpu, &dy)));
        eprintln!("{dtype} {}, norm gradients {:?}", rope.name(), layer.norm_grad_type());
        check_step(&y, &got, &want, BAND);
    }
    one::<bf16>(&gpu, DType::BF16, RopeStyle::RotateHalf);
    one::<f16>(&gpu, DType::F16, RopeStyle::Interleaved);
}

/// Two backwards under [`GradMode::Accumulate`] give twice one backward's weight gradients
/// (the norms' added with `axpy` from a scratch buffer).
#[test]
#[ignore = "needs a CUDA GPU"]
fn accumulated_gradients_add_up() {
    let _shared = shared();
    let gpu = gpu();
    let (l, t) = check_size(DType::BF16);
    let mut r = rng();
    let w = weights::<bf16>(&l, &mut r);
    let n = t.count() * l.d_model;
    let (x, dy) = (up(&gpu, &normal::<bf16>(&mut r, n)), up(&gpu, &normal::<bf16>(&mut r, n)));
    let mut layer = GpuDecoderLayer::<bf16>::new(&gpu, l, t, &w).unwrap();
    let (_, once) = poisoned_step(&gpu, &mut layer, (&x, &dy));
    layer.set_grad_mode(GradMode::Accumulate);
    layer.forward(&gpu, &x, true).unwrap();
    layer.backward(&gpu, &x, &dy).unwrap();
    let twice = layer.grads_to_host(&gpu).unwrap();
    for which in LayerWeight::ALL {
        let doubled: Vec<f64> = once.dw.get(which).iter().map(|v| 2.0 * v).collect();
        check(&format!("accumulated d_{}", which.name()), twice.get(which), &doubled, BAND);
    }
    match layer.weight_grad(LayerWeight::Norm1) {
        WeightGrad::F32(v) => assert_eq!(v.len(), l.d_model),
        WeightGrad::Io(v) => assert_eq!(v.len(), l.d_model),
    }
}

/// With FP8 forward projections (row-wise and tensor-wise), a step against the float64 layer
/// whose projections take the same recipe's rounded operands, within FP8's band, and closer to
/// it than to the unquantised layer; or, on a GPU without FP8, refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_forward_matches_its_float64_emulation() {
    let _shared = shared();
    let gpu = gpu();
    let (l, t) = check_size(DType::BF16);
    for scaling in [Scaling::Row, Scaling::Tensor] {
        let mut r = rng();
        let w = weights::<bf16>(&l, &mut r);
        let n = t.count() * l.d_model;
        let (x, dy): (Vec<bf16>, Vec<bf16>) = (normal(&mut r, n), normal(&mut r, n));
        let opts = LayerOptions { fp8_forward: Some(scaling) };
        let mut layer = match GpuDecoderLayer::<bf16>::with_options(&gpu, (l, t), &w, opts) {
            Err(Error::Fp8 { rule, detail }) => {
                eprintln!("{scaling:?}: refused by name: {rule:?}: {detail}");
                continue;
            }
            other => other.unwrap(),
        };
        assert_eq!(layer.fp8_forward(), Some(scaling));
        let inputs = (&wide(&x)[..], &wide(&dy)[..]);
        let want = reference::<bf16>((&l, t), &w, inputs, Some(scaling));
        let (y, got) = poisoned_step(&gpu, &mut layer, (&up(&gpu, &x), &up(&gpu, &dy)));
        eprintln!("FP8 {scaling:?}");
        check_step(&y, &got, &want, FP8_BAND);
        fp8_is_what_ran(&y, &want.0, &reference::<bf16>((&l, t), &w, inputs, None).0);
    }
}

/// Every output of a step as bits (y, dx, the weight gradients as f64 bit patterns).
fn bits<T: Element + DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, layer: &GpuDecoderLayer<T>) -> Vec<(String, Vec<u64>)> {
    let (y, g) = results(gpu, layer);
    let b = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut out = vec![("y".to_string(), b(&y)), ("dx".to_string(), b(&g.dx))];
    out.extend(LayerWeight::ALL.map(|w| (format!("d_{}", w.name()), b(g.dw.get(w)))));
    out
}

/// After a warm-up step, an inference forward and a training step (forward and backward) are
/// captured into CUDA graphs (nothing runs while capturing: the outputs stay NaN from a step on
/// NaN inputs) and replayed: every output equals the eager step's bit for bit, except those
/// downstream of attention's backward (dx, d_w_qkv, d_w_norm1: cuDNN's dq accumulation may
/// vary in order from run to run) and any two eager steps already disagree on, which are
/// compared within the band (whether their bits match is printed). In
/// bf16 and, where the GPU has FP8, with row-wise and tensor-wise FP8 forward projections (the
/// latter's amax scratch a stream-ordered allocation in the graph). cudarc's event tracking is
/// off on this context, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_step_replays_the_eager_bits() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let s = gpu.stream().clone();
    let (l, t) = check_size(DType::BF16);
    for fp8 in [None, Some(Scaling::Row), Some(Scaling::Tensor)] {
        let mut r = rng();
        let w = weights::<bf16>(&l, &mut r);
        let n = t.count() * l.d_model;
        let (x, dy) = (up(&gpu, &normal::<bf16>(&mut r, n)), up(&gpu, &normal::<bf16>(&mut r, n)));
        let nan = up(&gpu, &vec![bf16::NAN; n]);
        let mut layer = match GpuDecoderLayer::<bf16>::with_options(&gpu, (l, t), &w, LayerOptions { fp8_forward: fp8 })
        {
            Err(Error::Fp8 { rule, .. }) => {
                eprintln!("FP8 {fp8:?} refused by name ({rule:?}): not captured");
                continue;
            }
            other => other.unwrap(),
        };
        // the inference forward
        layer.forward(&gpu, &x, false).unwrap();
        let want = to_host(&gpu, layer.output()).unwrap();
        layer.forward(&gpu, &nan, false).unwrap();
        s.synchronize().unwrap();
        s.begin_capture(mode).unwrap();
        let captured = layer.forward(&gpu, &x, false);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        captured.unwrap();
        assert!(to_host(&gpu, layer.output()).unwrap().iter().all(|v| v.is_nan()), "capturing ran the forward");
        graph.unwrap().expect("a graph").launch().unwrap();
        let got = to_host(&gpu, layer.output()).unwrap();
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "FP8 {fp8:?}: captured forward's y");
        // the training step, eager twice
        let step = |layer: &mut GpuDecoderLayer<bf16>, x: &CudaSlice<bf16>, dy: &CudaSlice<bf16>| {
            layer.forward(&gpu, x, true)?;
            layer.backward(&gpu, x, dy)
        };
        step(&mut layer, &x, &dy).unwrap();
        let first = bits(&gpu, &layer);
        step(&mut layer, &x, &dy).unwrap();
        let second = bits(&gpu, &layer);
        step(&mut layer, &nan, &nan).unwrap();
        s.synchronize().unwrap();
        s.begin_capture(mode).unwrap();
        let captured = step(&mut layer, &x, &dy);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        captured.unwrap();
        assert!(to_host(&gpu, layer.input_grad()).unwrap().iter().all(|v| v.is_nan()), "capturing ran the step");
        graph.unwrap().expect("a graph").launch().unwrap();
        // downstream of attention's backward, whose dq accumulation may vary in order
        let after_attention = ["dx", "d_w_qkv", "d_w_norm1"];
        for ((name, got), ((_, a), (_, b))) in bits(&gpu, &layer).into_iter().zip(first.iter().zip(&second)) {
            let same = got == *a;
            if a == b && !after_attention.contains(&name.as_str()) {
                assert!(same, "FP8 {fp8:?}: captured {name} differs from the eager step's bits");
            } else {
                let f = |v: &[u64]| v.iter().map(|&x| f64::from_bits(x)).collect::<Vec<_>>();
                let eager = if a == b { "agree" } else { "differ" };
                eprintln!("FP8 {fp8:?}: {name}: two eager steps {eager}, captured bits equal: {same}");
                check(&format!("captured {name}"), &f(&got), &f(a), BAND);
            }
        }
    }
}
