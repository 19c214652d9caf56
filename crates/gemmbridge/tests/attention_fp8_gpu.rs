//! GPU tests of FP8 attention ([`GpuAttention::quantize`], [`GpuAttention::forward_fp8`]):
//! q, k, v quantised on the GPU, cuDNN's FP8 graph, judged against the float64 attention of the
//! unquantised inputs — no worse than 1.5× the CPU emulation's own error (the same recipe:
//! E4M3 q, k, v with tensor-wise scales, P in E4M3 with the scale 448;
//! `gemmbridge::attention::fp8`) — outputs poisoned with NaN first; the statistics against the
//! emulation's; bad input named before anything runs. The FP8 backward
//! ([`GpuAttention::backward_fp8`]) likewise: each gradient against the float64 backward of
//! the unquantised inputs, no worse than 1.5× the emulation's own error
//! (`gemmbridge::attention::fp8::backward`), and what cuDNN's FP8 backward does not offer named
//! before anything is written.

mod common;

use common::{gpu, normal, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::attention::{fp8, reference, Attention, AttnMask, AttnTensor};
use gemmbridge::cuda::{AttnSavedFp8, Fp8Tensor, Gpu, SeqLens};
use gemmbridge::fp8::{fp8_to_f32, Fp8Format, Scaling, Source};
use gemmbridge::half::{bf16, f16};
use gemmbridge::{DType, Element, Error};
use rand::rngs::StdRng;

/// P's scale in cuDNN's FP8 graph (gemmbridge's fixed choice: E4M3's largest value).
const P_SCALE: f32 = 448.0;

struct Case {
    p: Attention,
    lens: Option<(Vec<i32>, Vec<i32>)>,
}

fn cases(dtype: DType) -> Vec<Case> {
    let c = |b, h, s, d, mask| Case { p: Attention::new(b, h, s, d, dtype).with_mask(mask), lens: None };
    let mut v = vec![
        c(2, (8, 8), (129, 129), 128, AttnMask::Causal),
        c(2, (8, 2), (257, 257), 128, AttnMask::None),
        c(2, (4, 4), (200, 200), 64, AttnMask::Causal),
    ];
    v[1].p = v[1].p.bhsd();
    let mut varlen = c(3, (8, 2), (256, 256), 128, AttnMask::Causal);
    varlen.p = varlen.p.with_var_len(true);
    varlen.lens = Some((vec![256, 100, 7], vec![256, 180, 7]));
    v.push(varlen);
    v
}

/// Fills an FP8 tensor's data with 0x7F, E4M3's NaN.
fn poison_fp8(gpu: &Gpu, t: &Fp8Tensor) {
    let s = gpu.stream();
    let (ptr, _guard) = t.data().device_ptr(s);
    s.synchronize().unwrap();
    // SAFETY: the tensor's own allocation of data().len() bytes, idle after the synchronisation.
    unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0x7f, t.data().len()) }.unwrap();
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// The GPU's FP8 forward of one case against float64, within 1.5× the emulation's error.
fn check_case<T: Element + DeviceRepr>(gpu: &Gpu, c: &Case, rng: &mut StdRng) {
    let (p, s) = (&c.p, gpu.stream());
    let what = p.describe();
    let lens = c.lens.as_ref().map(|(q, kv)| (q.as_slice(), kv.as_slice()));
    let host: Vec<Vec<T>> =
        [AttnTensor::Q, AttnTensor::K, AttnTensor::V].iter().map(|&t| normal(rng, p.required_elems(t))).collect();
    let dev: Vec<CudaSlice<T>> = host.iter().map(|x| s.clone_htod(x).unwrap()).collect();
    let [q8, k8, v8] = [AttnTensor::Q, AttnTensor::K, AttnTensor::V]
        .map(|t| gpu.attention().quantize(p, t, &dev[t as usize]).unwrap_or_else(|e| panic!("{what}: {e}")));
    let mut o = gpu.attention().fp8_output(p).unwrap();
    // poison: 0x7F is NaN in E4M3
    poison_fp8(gpu, &o);
    let mut lse = s.clone_htod(&vec![f32::NAN; p.stats_elems()]).unwrap();
    let seq = lens.map(|(q, kv)| SeqLens::host(q, kv));
    gpu.attention()
        .forward_fp8(p, [&q8, &k8, &v8], &mut o, Some(&mut lse), seq)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (q64, k64, v64) = (wide(&host[0]), wide(&host[1]), wide(&host[2]));
    let exact = reference::forward(p, &q64, &k64, &v64, lens);
    // the recipe: q, k, v and P in E4M3, o stored in E4M3 with twice v's scale
    let v_scale = fp8::quantize_tensor(p, AttnTensor::V, &v64).1;
    let o_scale = s.clone_dtoh(o.scales()).unwrap()[0];
    assert_eq!(o_scale, 2.0 * v_scale, "{what}: o's scale is twice v's");
    let mut emulated = fp8::forward(p, &q64, &k64, &v64, lens, Some(P_SCALE));
    emulated.o = fp8::round_output(p, &emulated.o, o_scale);
    let bytes = s.clone_dtoh(o.data()).unwrap();
    let got: Vec<f64> = (0..p.required_elems(AttnTensor::O))
        .map(|i| fp8_to_f32(bytes[i], Fp8Format::E4M3) as f64 * o_scale as f64)
        .collect();
    let e_gpu = reference::rel_error_rows(p, AttnTensor::O, &got, &exact.o, lens);
    let e_emu = reference::rel_error_rows(p, AttnTensor::O, &emulated.o, &exact.o, lens);
    eprintln!(
        "{what}: o error {e_gpu:.3e}, emulation {e_emu:.3e} (ratio {:.2}); plan {:?}",
        e_gpu / e_emu,
        gpu.plans().attention(p, "forward_fp8")
    );
    assert!(e_gpu <= 1.5 * e_emu, "{what}: FP8 o error {e_gpu:e} > 1.5 × the emulation's {e_emu:e}");
    // the statistics come from the dequantised q and k: the emulation's, up to f32 rounding
    let lse_got = wide(&s.clone_dtoh(&lse).unwrap());
    let e = reference::rel_error_stats(p, &lse_got, &emulated.lse, lens);
    assert!(e <= 1e-3, "{what}: lse error {e:e} against the emulation's");
}

/// The bottom-right causal mask: within the recipe's error where the loaded cuDNN has an FP8
/// engine for it (cuDNN 9.19 has, for more than one query row), else a named error
/// (`Error::Unsupported`, naming the cuDNN version) and nothing written.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_bottom_right_causal_runs_or_is_a_named_error() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = Attention::new(1, (8, 1), (64, 300), 128, DType::BF16).with_mask(AttnMask::CausalBottomRight);
    let up = |t: AttnTensor, rng: &mut StdRng| s.clone_htod(&normal::<bf16>(rng, p.required_elems(t))).unwrap();
    let x = [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| up(t, &mut rng));
    let [q8, k8, v8] =
        [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| gpu.attention().quantize(&p, t, &x[t as usize]).unwrap());
    let mut o = gpu.attention().fp8_output(&p).unwrap();
    poison_fp8(&gpu, &o);
    match gpu.attention().forward_fp8(&p, [&q8, &k8, &v8], &mut o, None, None) {
        Err(Error::Unsupported { what, .. }) => {
            assert!(what.contains("cuDNN"), "{what}");
            assert!(s.clone_dtoh(o.data()).unwrap().iter().all(|&b| b == 0x7f), "a refused call wrote o");
        }
        // a cuDNN that offers it: then it must be right (the other tests' check)
        Ok(()) => check_case::<bf16>(&gpu, &Case { p, lens: None }, &mut rng),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_forward_is_within_the_recipes_error_bf16() {
    let (gpu, mut rng) = (gpu(), rng());
    for c in cases(DType::BF16) {
        check_case::<bf16>(&gpu, &c, &mut rng);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_forward_is_within_the_recipes_error_f16() {
    let (gpu, mut rng) = (gpu(), rng());
    for c in cases(DType::F16) {
        check_case::<f16>(&gpu, &c, &mut rng);
    }
}

/// Inputs that are not E4M3 with one scale, a head dimension that is not a multiple of 16, a
/// packed (not dense) tensor to quantise and a short FP8 tensor are named errors; nothing is
/// written; a good call runs afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_bad_input_is_named_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = Attention::new(2, (8, 2), (64, 64), 128, DType::BF16);
    let up = |t: AttnTensor, rng: &mut StdRng| s.clone_htod(&normal::<bf16>(rng, p.required_elems(t))).unwrap();
    let (q, k, v) = (up(AttnTensor::Q, &mut rng), up(AttnTensor::K, &mut rng), up(AttnTensor::V, &mut rng));
    let [q8, k8, v8] = [(AttnTensor::Q, &q), (AttnTensor::K, &k), (AttnTensor::V, &v)]
        .map(|(t, x)| gpu.attention().quantize(&p, t, x).unwrap());
    let mut o = gpu.attention().fp8_output(&p).unwrap();
    poison_fp8(&gpu, &o);
    let shape = |e: Error| match e {
        Error::AttentionShape { what, .. } => what,
        other => panic!("{other:?}"),
    };
    let e5 =
        gpu.fp8().quantize(&q, p.b * p.s_q * p.h_q, p.d, Source::RowMajor, Fp8Format::E5M2, Scaling::Tensor).unwrap();
    let e = gpu.attention().forward_fp8(&p, [&e5, &k8, &v8], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "FP8 attention takes E4M3 tensors with one scale each");
    let rows =
        gpu.fp8().quantize(&q, p.b * p.s_q * p.h_q, p.d, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap();
    let e = gpu.attention().forward_fp8(&p, [&rows, &k8, &v8], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "FP8 attention takes E4M3 tensors with one scale each");
    let narrow = Attention::new(2, (8, 2), (64, 64), 24, DType::BF16);
    let e = gpu.attention().forward_fp8(&narrow, [&q8, &k8, &v8], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "an FP8 tensor's head dimension or stride is not a multiple of 16 elements (16 bytes)");
    let longer = Attention::new(2, (8, 2), (64, 128), 128, DType::BF16);
    let e = gpu.attention().forward_fp8(&longer, [&q8, &k8, &v8], &mut o, None, None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { .. }), "{e:?}");
    let packed = p.with_layout(AttnTensor::Q, gemmbridge::attention::HeadLayout::packed_qkv(64, 8, 128));
    let e = gpu.attention().quantize(&packed, AttnTensor::Q, &q).unwrap_err();
    assert_eq!(shape(e), "a tensor to quantise is not dense (its elements leave gaps)");
    // an output made for another problem
    let shorter = Attention::new(2, (8, 2), (32, 64), 128, DType::BF16);
    let mut other = gpu.attention().fp8_output(&shorter).unwrap();
    let e = gpu.attention().forward_fp8(&p, [&q8, &k8, &v8], &mut other, None, None).unwrap_err();
    assert_eq!(shape(e), "the FP8 output was not made for this problem (GpuAttention::fp8_output)");
    let n_o = p.required_elems(AttnTensor::O);
    assert!(s.clone_dtoh(o.data()).unwrap()[..n_o].iter().all(|&x| x == 0x7f), "a refused call wrote the output");
    gpu.attention().forward_fp8(&p, [&q8, &k8, &v8], &mut o, None, None).unwrap();
    assert!(s.clone_dtoh(o.data()).unwrap()[..n_o].iter().all(|&x| x & 0x7f != 0x7f), "NaN in o");
}

/// An FP8 tensor read back and dequantised: its first `n` elements (in the problem's strides)
/// times its one scale; the scale too.
fn dequantized(gpu: &Gpu, t: &Fp8Tensor, n: usize) -> (Vec<f64>, f32) {
    let s = gpu.stream();
    let scale = s.clone_dtoh(t.scales()).unwrap()[0];
    let bytes = s.clone_dtoh(t.data()).unwrap();
    (bytes[..n].iter().map(|&b| fp8_to_f32(b, t.format()) as f64 * scale as f64).collect(), scale)
}

/// The FP8 tensors of one backward: q, k, v (E4M3), o and the statistics from the FP8
/// forward, do quantised to `grad`; and the host inputs (float64).
struct Saved {
    qkv: [Fp8Tensor; 3],
    o: Fp8Tensor,
    d_o: Fp8Tensor,
    lse: CudaSlice<f32>,
    host: [Vec<f64>; 4],
}

fn saved(gpu: &Gpu, c: &Case, grad: Fp8Format, rng: &mut StdRng) -> Saved {
    let (p, s) = (&c.p, gpu.stream());
    let what = p.describe();
    let lens = c.lens.as_ref().map(|(q, kv)| SeqLens::host(q, kv));
    let ts = [AttnTensor::Q, AttnTensor::K, AttnTensor::V, AttnTensor::O];
    let host: Vec<Vec<bf16>> = ts.iter().map(|&t| normal(rng, p.required_elems(t))).collect();
    let dev: Vec<CudaSlice<bf16>> = host.iter().map(|x| s.clone_htod(x).unwrap()).collect();
    let qkv = [AttnTensor::Q, AttnTensor::K, AttnTensor::V]
        .map(|t| gpu.attention().quantize(p, t, &dev[t as usize]).unwrap_or_else(|e| panic!("{what}: {e}")));
    let mut o = gpu.attention().fp8_output(p).unwrap();
    let mut lse = s.clone_htod(&vec![f32::NAN; p.stats_elems()]).unwrap();
    let [q8, k8, v8] = &qkv;
    gpu.attention()
        .forward_fp8(p, [q8, k8, v8], &mut o, Some(&mut lse), lens)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let d_o = gpu.attention().quantize_grad(p, &dev[3], grad).unwrap_or_else(|e| panic!("{what}: {e}"));
    let host = [0, 1, 2, 3].map(|i| wide(&host[i]));
    Saved { qkv, o, d_o, lse, host }
}

/// The GPU's FP8 backward of one case against float64: the gradients over 1.5× the
/// emulation's error, named (empty: within); `Err` where cuDNN refuses the case (the
/// gradients then still poisoned).
fn check_backward(gpu: &Gpu, c: &Case, grad: Fp8Format, rng: &mut StdRng) -> Result<Vec<String>, Error> {
    let p = &c.p;
    let what = format!("{} {grad:?}", p.describe());
    let lens = c.lens.as_ref().map(|(q, kv)| (q.as_slice(), kv.as_slice()));
    let sv = saved(gpu, c, grad, rng);
    let mut grads = gpu.attention().fp8_grads(p, grad).unwrap();
    grads.iter().for_each(|g| poison_fp8(gpu, g));
    let [q8, k8, v8] = &sv.qkv;
    let saved = AttnSavedFp8 { q: q8, k: k8, v: v8, o: &sv.o, d_o: &sv.d_o, stats: &sv.lse };
    let [dq, dk, dv] = &mut grads;
    let ts = [AttnTensor::Q, AttnTensor::K, AttnTensor::V];
    if let Err(e) = gpu.attention().backward_fp8(p, saved, [dq, dk, dv], lens.map(|(q, kv)| SeqLens::host(q, kv))) {
        for (g, t) in grads.iter().zip(ts) {
            let n = p.required_elems(t);
            assert!(
                gpu.stream().clone_dtoh(g.data()).unwrap()[..n].iter().all(|&b| b == 0x7f),
                "{what}: refused, yet written"
            );
        }
        return Err(e);
    }
    let [q, k, v, d_o] = &sv.host;
    let f = reference::forward(p, q, k, v, lens);
    let exact = reference::backward(p, (q, k, v), &f.o, d_o, &f.lse, lens);
    let emulated = fp8::backward(p, (q, k, v), d_o, lens, grad);
    let want = [&exact.dq, &exact.dk, &exact.dv];
    let emu = [&emulated.grads.dq, &emulated.grads.dk, &emulated.grads.dv];
    let emu_scales = [emulated.scales.dq, emulated.scales.dk, emulated.scales.dv];
    let mut over = Vec::new();
    for (i, t) in ts.into_iter().enumerate() {
        let (got, scale) = dequantized(gpu, &grads[i], p.required_elems(t));
        assert!(got.iter().all(|x| x.is_finite()), "{what}: NaN or infinity in d{}", t.name());
        let rel = (scale / emu_scales[i] - 1.0).abs();
        assert!(rel <= 1e-6, "{what}: d{} scale {scale:e}, the emulation's {:e}", t.name(), emu_scales[i]);
        let e_gpu = reference::rel_error_rows(p, t, &got, want[i], lens);
        let e_emu = reference::rel_error_rows(p, t, emu[i], want[i], lens);
        eprintln!("{what}: d{} error {e_gpu:.3e}, emulation {e_emu:.3e} (ratio {:.2})", t.name(), e_gpu / e_emu);
        if e_gpu.is_nan() || e_gpu > 1.5 * e_emu {
            over.push(format!("{what}: FP8 d{} error {e_gpu:e} > 1.5 × the emulation's {e_emu:e}", t.name()));
        }
    }
    eprintln!("{what}: plan {:?}", gpu.plans().attention(p, "backward_fp8"));
    Ok(over)
}

/// The FP8 backward (d = 128, the one head dimension cuDNN offers it with on Hopper) at the
/// lengths it takes (multiples of 64), causal and not, grouped key/value heads, padded lengths
/// (7 to 128 within a batch of 128); E5M2 gradients. Other lengths and E4M3 gradients are
/// refused by name with nothing written.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_backward_is_within_the_recipes_error() {
    let (gpu, mut rng) = (gpu(), rng());
    let c = |b, h, s, mask| Case { p: Attention::new(b, h, s, 128, DType::BF16).with_mask(mask), lens: None };
    // query rows and keys multiples of 64 (the rest is refused, below); shorter sequences padded
    let mut varlen = c(3, (8, 2), (128, 128), AttnMask::Causal);
    varlen.p = varlen.p.with_var_len(true);
    varlen.lens = Some((vec![128, 60, 7], vec![128, 100, 7]));
    let cases = [
        (c(2, (8, 2), (128, 128), AttnMask::Causal), Fp8Format::E5M2),
        (c(2, (8, 2), (64, 64), AttnMask::None), Fp8Format::E5M2),
        (c(1, (8, 2), (64, 192), AttnMask::Causal), Fp8Format::E5M2),
        (c(2, (8, 8), (128, 128), AttnMask::None), Fp8Format::E5M2),
        (c(1, (8, 2), (192, 64), AttnMask::None), Fp8Format::E5M2),
    ];
    // every case runs before the verdict, so that one failure does not hide the others; on
    // Hopper a causal mask is refused by name (cuDNN's FP8 backward is slower than bf16's there)
    let hopper = gpu.info().unwrap().compute_capability.0 == 9;
    let mut over = Vec::new();
    for (case, grad) in &cases {
        match check_backward(&gpu, case, *grad, &mut rng) {
            Err(Error::Unsupported { what, .. }) if hopper && case.p.mask == AttnMask::Causal => {
                assert!(what.contains("causal mask on Hopper"), "{what}");
            }
            r => over.extend(r.unwrap_or_else(|e| panic!("{}: {e}", case.p.describe()))),
        }
    }
    match check_backward(&gpu, &varlen, Fp8Format::E5M2, &mut rng) {
        Ok(v) => over.extend(v),
        Err(Error::Unsupported { what, .. }) => eprintln!("padded lengths not offered: {what}"),
        Err(e) => panic!("{}: {e}", varlen.p.describe()),
    }
    // the padded batch unmasked too (Hopper refuses it causal)
    let mut open = c(3, (8, 2), (128, 128), AttnMask::None);
    (open.p, open.lens) = (open.p.with_var_len(true), varlen.lens.clone());
    match check_backward(&gpu, &open, Fp8Format::E5M2, &mut rng) {
        Ok(v) => over.extend(v),
        Err(Error::Unsupported { what, .. }) => eprintln!("padded lengths not offered: {what}"),
        Err(e) => panic!("{}: {e}", open.p.describe()),
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
    // refused by name, nothing written: query rows or keys not multiples of 64, E4M3 gradients
    for (case, grad, word) in [
        (c(2, (8, 2), (7, 7), AttnMask::None), Fp8Format::E5M2, "7 query rows and 7 keys"),
        (c(1, (8, 2), (100, 65), AttnMask::None), Fp8Format::E5M2, "100 query rows and 65 keys"),
        (c(2, (8, 2), (128, 129), AttnMask::Causal), Fp8Format::E5M2, "128 query rows and 129 keys"),
        (c(2, (8, 2), (128, 128), AttnMask::None), Fp8Format::E4M3, "E5M2"),
    ] {
        match check_backward(&gpu, &case, grad, &mut rng) {
            Err(Error::Unsupported { what, .. }) => assert!(what.contains(word), "{what}"),
            other => panic!("{}: {other:?}", case.p.describe()),
        }
    }
}

/// What cuDNN's FP8 backward does not offer on this GPU (on Hopper a head dimension other than
/// 128 and the bottom-right causal mask) and a short statistics buffer are named errors;
/// nothing is written; a good call runs afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_backward_refusals_are_named_and_nothing_is_written() {
    let (gpu, mut rng) = (gpu(), rng());
    let cc = gpu.info().unwrap().compute_capability;
    let c = Case { p: Attention::new(2, (8, 2), (64, 64), 128, DType::BF16), lens: None };
    let p = &c.p;
    let sv = saved(&gpu, &c, Fp8Format::E5M2, &mut rng);
    let mut grads = gpu.attention().fp8_grads(p, Fp8Format::E5M2).unwrap();
    grads.iter().for_each(|g| poison_fp8(&gpu, g));
    let [q8, k8, v8] = &sv.qkv;
    let saved = AttnSavedFp8 { q: q8, k: k8, v: v8, o: &sv.o, d_o: &sv.d_o, stats: &sv.lse };
    let mut run = |p: &Attention, saved: AttnSavedFp8| {
        let [dq, dk, dv] = &mut grads;
        gpu.attention().backward_fp8(p, saved, [dq, dk, dv], None)
    };
    let narrow = Attention::new(2, (8, 2), (64, 64), 64, DType::BF16);
    let bottom_right = p.with_mask(AttnMask::CausalBottomRight);
    for (q, offered) in [(&narrow, cc.0 != 9), (&bottom_right, cc.0 >= 10)] {
        match run(q, saved) {
            Err(Error::Unsupported { what, .. }) if !offered => {
                eprintln!("named: {what}");
                assert!(what.contains("FP8 attention backward"), "{what}");
            }
            other if offered => eprintln!("offered on {cc:?}: {other:?}"),
            other => panic!("{}: {other:?}", q.describe()),
        }
    }
    let short = gpu.stream().clone_htod(&vec![0.0f32; p.stats_elems() - 1]).unwrap();
    match run(p, AttnSavedFp8 { stats: &short, ..saved }) {
        Err(Error::BufferTooSmall { operand, .. }) => assert_eq!(operand, gemmbridge::Which::AttnStats),
        other => panic!("{other:?}"),
    }
    let ts = [AttnTensor::Q, AttnTensor::K, AttnTensor::V];
    let poisoned = |g: &Fp8Tensor, n: usize| gpu.stream().clone_dtoh(g.data()).unwrap()[..n].iter().all(|&b| b == 0x7f);
    for (g, t) in grads.iter().zip(ts) {
        assert!(poisoned(g, p.required_elems(t)), "a refused call wrote d{}", t.name());
    }
    let [dq, dk, dv] = &mut grads;
    gpu.attention().backward_fp8(p, saved, [dq, dk, dv], None).unwrap();
    for (g, t) in grads.iter().zip(ts) {
        let (x, _) = dequantized(&gpu, g, p.required_elems(t));
        assert!(x.iter().all(|v| v.is_finite()), "NaN in d{} after the refusals", t.name());
    }
}
