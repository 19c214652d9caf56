//! GPU tests of attention on cuDNN ([`GpuAttention::forward`], [`GpuAttention::backward`]):
//! small odd shapes (s = 1, 7, 129; d = 64, 128, 256; h_q/h_kv = 8/8, 8/2, 8/1; no mask, causal,
//! bottom-right causal; per-sequence lengths shorter than the tensors; BSHD, BHSD and a packed
//! QKV projection), bf16 and f16, against the float64 definitions
//! (`gemmbridge::attention::reference`) within 1e-2 per output tensor, outputs poisoned with
//! NaN first; bad input named before anything is written, the engine usable after; planned
//! calls captured into a CUDA graph.

mod common;

use std::sync::RwLock;

use common::{gpu, normal, poison, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::attention::{reference, Attention, AttnMask, AttnTensor, HeadLayout};
use gemmbridge::cuda::{AttnSaved, Gpu, SeqLens};
use gemmbridge::half::{bf16, f16};
use gemmbridge::{DType, Element, Error, Which};
use rand::rngs::StdRng;

/// The band for f16/bf16 attention outputs: ‖out − ref‖/‖ref‖ per tensor.
const BAND: f64 = 1e-2;

/// The capture test takes this exclusively, the others share it (another thread's first launch
/// or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// One test problem and its per-sequence lengths.
struct Case {
    p: Attention,
    lens: Option<(Vec<i32>, Vec<i32>)>,
    /// q, k, v as views of one packed `[b, s, 3, h, d]` projection output.
    packed: bool,
}

fn case(b: usize, h: (usize, usize), s: (usize, usize), d: usize, dtype: DType, mask: AttnMask) -> Case {
    Case { p: Attention::new(b, h, s, d, dtype).with_mask(mask), lens: None, packed: false }
}

fn cases(dtype: DType) -> Vec<Case> {
    use AttnMask::{Causal, CausalBottomRight as BottomRight, None as Full};
    let mut v = vec![
        case(2, (8, 8), (7, 7), 64, dtype, Full),
        case(2, (8, 2), (129, 129), 128, dtype, Causal),
        case(1, (8, 1), (1, 129), 64, dtype, BottomRight),
        case(2, (8, 2), (7, 129), 128, dtype, BottomRight),
        case(1, (8, 1), (129, 7), 64, dtype, Causal),
        case(1, (2, 2), (129, 129), 256, dtype, Full),
    ];
    v[1].p = v[1].p.bhsd();
    let mut varlen = case(3, (8, 2), (129, 129), 64, dtype, Causal);
    varlen.p = varlen.p.with_var_len(true);
    varlen.lens = Some((vec![129, 70, 1], vec![129, 100, 7]));
    v.push(varlen);
    let mut decode = case(3, (8, 1), (1, 129), 128, dtype, BottomRight);
    decode.p = decode.p.with_var_len(true);
    decode.lens = Some((vec![1, 1, 1], vec![129, 64, 3]));
    v.push(decode);
    let mut br = case(2, (8, 8), (7, 129), 64, dtype, BottomRight);
    br.p = br.p.with_var_len(true);
    br.lens = Some((vec![7, 3], vec![129, 60]));
    v.push(br);
    let mut packed = case(2, (8, 8), (129, 129), 64, dtype, Causal);
    let l = HeadLayout::packed_qkv(129, 8, 64);
    for t in [AttnTensor::Q, AttnTensor::K, AttnTensor::V] {
        packed.p = packed.p.with_layout(t, l);
    }
    packed.packed = true;
    v.push(packed);
    v
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn down<T: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<f64> {
    wide(&gpu.stream().clone_dtoh(v).unwrap())
}

/// The host inputs of one case: q, k, v (one packed buffer and offsets when packed) and `do`.
struct Inputs<T> {
    qkv: [Vec<T>; 3],
    /// The packed buffer and each view's start, when the case is packed.
    packed: Option<(Vec<T>, [usize; 3])>,
    d_o: Vec<T>,
}

fn inputs<T: Element>(c: &Case, rng: &mut StdRng) -> Inputs<T> {
    let p = &c.p;
    let d_o = normal(rng, p.required_elems(AttnTensor::O));
    if c.packed {
        let all: Vec<T> = normal(rng, p.b * p.s_q * 3 * p.h_q * p.d);
        let offs = [0, 1, 2].map(|w| HeadLayout::packed_qkv_offset(w, p.h_q, p.d));
        let view = |w: usize, t| all[offs[w]..offs[w] + p.required_elems(t)].to_vec();
        let qkv = [view(0, AttnTensor::Q), view(1, AttnTensor::K), view(2, AttnTensor::V)];
        return Inputs { qkv, packed: Some((all, offs)), d_o };
    }
    let qkv = [AttnTensor::Q, AttnTensor::K, AttnTensor::V].map(|t| normal(rng, p.required_elems(t)));
    Inputs { qkv, packed: None, d_o }
}

/// Forward (with statistics) and backward of one case against float64.
fn check_case<T: Element + DeviceRepr>(gpu: &Gpu, c: &Case, rng: &mut StdRng) {
    let (p, s) = (&c.p, gpu.stream());
    let what = p.describe();
    let lens_ref = c.lens.as_ref().map(|(q, kv)| (q.as_slice(), kv.as_slice()));
    let seq = lens_ref.map(|(q, kv)| SeqLens::host(q, kv));
    let inp = inputs::<T>(c, rng);
    let dev: Vec<CudaSlice<T>> = inp.qkv.iter().map(|x| s.clone_htod(x).unwrap()).collect();
    let packed = inp.packed.as_ref().map(|(all, _)| s.clone_htod(all).unwrap());
    let views = inp.packed.as_ref().map(|(_, offs)| offs.map(|o| packed.as_ref().unwrap().slice(o..)));
    let (qd, kd, vd): (&dyn DevicePtr<T>, &dyn DevicePtr<T>, &dyn DevicePtr<T>) = match &views {
        Some([q, k, v]) => (q, k, v),
        None => (&dev[0], &dev[1], &dev[2]),
    };
    let mut o = s.clone_htod(&poison::<T>(p.required_elems(AttnTensor::O))).unwrap();
    let mut lse = s.clone_htod(&vec![f32::NAN; p.stats_elems()]).unwrap();
    gpu.attention().forward(p, [qd, kd, vd], &mut o, Some(&mut lse), seq).unwrap();
    let [q64, k64, v64] = [wide(&inp.qkv[0]), wide(&inp.qkv[1]), wide(&inp.qkv[2])];
    let want = reference::forward(p, &q64, &k64, &v64, lens_ref);
    let (o_got, lse_got) = (down(gpu, &o), wide(&s.clone_dtoh(&lse).unwrap()));
    let e = reference::rel_error_rows(p, AttnTensor::O, &o_got, &want.o, lens_ref);
    assert!(e <= BAND, "{what} forward o: rel error {e:e} > {BAND:e}");
    let e = reference::rel_error_stats(p, &lse_got, &want.lse, lens_ref);
    assert!(e <= BAND, "{what} forward lse: rel error {e:e} > {BAND:e}");
    assert!(gpu.plans().attention(p, "forward").is_some());

    // the backward from the GPU's own o and statistics, judged against float64 on the same
    let d_o = s.clone_htod(&inp.d_o).unwrap();
    let mut grads: Vec<CudaSlice<T>> = [AttnTensor::Q, AttnTensor::K, AttnTensor::V]
        .iter()
        .map(|&t| s.clone_htod(&poison::<T>(p.required_elems(t))).unwrap())
        .collect();
    let [dq, dk, dv] = &mut grads[..] else { unreachable!() };
    let saved = AttnSaved { q: qd, k: kd, v: vd, o: &o, d_o: &d_o, stats: &lse };
    gpu.attention().backward(p, saved, dq, dk, dv, seq).unwrap();
    let want = reference::backward(p, (&q64, &k64, &v64), &o_got, &wide(&inp.d_o), &lse_got, lens_ref);
    for (t, got, want) in
        [(AttnTensor::Q, &*dq, &want.dq), (AttnTensor::K, &*dk, &want.dk), (AttnTensor::V, &*dv, &want.dv)]
    {
        let e = reference::rel_error_rows(p, t, &down(gpu, got), want, lens_ref);
        assert!(e <= BAND, "{what} backward d{}: rel error {e:e} > {BAND:e}", t.name());
    }
    eprintln!(
        "{what}: forward {:?}, backward {:?}",
        gpu.plans().attention(p, "forward"),
        gpu.plans().attention(p, "backward")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_and_backward_match_float64_bf16() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    for c in cases(DType::BF16) {
        check_case::<bf16>(&gpu, &c, &mut rng);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_and_backward_match_float64_f16() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    for c in cases(DType::F16) {
        check_case::<f16>(&gpu, &c, &mut rng);
    }
}

/// Every bad input is a named error before anything is written (the output keeps its
/// poison), and the engine runs a good call afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let p = Attention::new(2, (8, 2), (7, 129), 64, DType::BF16);
    let up = |t: AttnTensor, rng: &mut StdRng| s.clone_htod(&normal::<bf16>(rng, p.required_elems(t))).unwrap();
    let (q, k, v) = (up(AttnTensor::Q, &mut rng), up(AttnTensor::K, &mut rng), up(AttnTensor::V, &mut rng));
    let n_o = p.required_elems(AttnTensor::O);
    let mut o = s.clone_htod(&poison::<bf16>(n_o)).unwrap();
    let untouched = |o: &CudaSlice<bf16>| s.clone_dtoh(o).unwrap().iter().all(|x| x.is_nan());
    let shape = |e: Error| match e {
        Error::AttentionShape { what, .. } => what,
        other => panic!("{other:?}"),
    };
    // lengths without var_len, var_len without lengths, lengths out of range
    let (lq, lkv) = ([7, 7], [129, 130]);
    let e = gpu.attention().forward(&p, [&q, &k, &v], &mut o, None, Some(SeqLens::host(&lq, &lkv))).unwrap_err();
    assert_eq!(shape(e), "lengths given to a problem without per-sequence lengths");
    let vp = p.with_var_len(true);
    let e = gpu.attention().forward(&vp, [&q, &k, &v], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "a problem with per-sequence lengths was given none");
    let e = gpu.attention().forward(&vp, [&q, &k, &v], &mut o, None, Some(SeqLens::host(&lq, &lkv))).unwrap_err();
    assert_eq!(shape(e), "a sequence length is outside 1 to the tensor's extent");
    // the bottom-right causal mask with fewer keys than queries
    let br = Attention::new(1, (8, 8), (9, 7), 64, DType::BF16).with_mask(AttnMask::CausalBottomRight);
    let e = gpu.attention().forward(&br, [&q, &k, &v], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "the bottom-right causal mask leaves query rows without keys");
    // a problem rule
    let e = gpu.attention().forward(&Attention { d: 60, ..p }, [&q, &k, &v], &mut o, None, None).unwrap_err();
    assert_eq!(shape(e), "the head dimension is not a multiple of 8 up to 256");
    // dtype, size, alignment
    let e = gpu.attention().forward(&Attention { dtype: DType::F16, ..p }, [&q, &k, &v], &mut o, None, None);
    assert!(matches!(e, Err(Error::DTypeMismatch { .. })), "{e:?}");
    let short = s.clone_htod(&normal::<bf16>(&mut rng, p.required_elems(AttnTensor::K) - 1)).unwrap();
    let e = gpu.attention().forward(&p, [&q, &short, &v], &mut o, None, None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnK, .. }), "{e:?}");
    let mut lse = s.alloc_zeros::<f32>(p.stats_elems() - 1).unwrap();
    let e = gpu.attention().forward(&p, [&q, &k, &v], &mut o, Some(&mut lse), None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::AttnStats, .. }), "{e:?}");
    let big = s.clone_htod(&normal::<bf16>(&mut rng, p.required_elems(AttnTensor::Q) + 1)).unwrap();
    let e = gpu.attention().forward(&p, [&big.slice(1..), &k, &v], &mut o, None, None).unwrap_err();
    assert!(matches!(e, Error::Misaligned { operand: Which::AttnQ, align: 16, .. }), "{e:?}");
    // an output over an input: o aliases q's memory (a second handle, forgotten after)
    // SAFETY: the alias is only passed as the output of a call that is refused before launch,
    // and forgotten (never freed twice).
    let mut alias = unsafe { s.upgrade_device_ptr::<bf16>(q.device_ptr(s).0, n_o) };
    let e = gpu.attention().forward(&p, [&q, &k, &v], &mut alias, None, None).unwrap_err();
    let _ = alias.leak();
    assert!(matches!(e, Error::OutputOverlapsInput { output: Which::AttnO, input: Which::AttnQ, .. }), "{e:?}");
    assert!(untouched(&o), "a refused call wrote the output");
    // the engine runs a good call afterwards
    gpu.attention().forward(&p, [&q, &k, &v], &mut o, None, None).unwrap();
    assert!(s.clone_dtoh(&o).unwrap().iter().all(|x| x.is_finite()));
}

/// A first call inside a capture and host lengths inside a capture are named errors; a planned
/// call with device lengths, captured into a graph and launched, gives the eager result bit for
/// bit. cudarc's event tracking is off on this context, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn planned_attention_is_capturable() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let p = Attention::new(2, (8, 2), (129, 129), 64, DType::F16).with_mask(AttnMask::Causal).with_var_len(true);
    let up = |t: AttnTensor, rng: &mut StdRng| s.clone_htod(&normal::<f16>(rng, p.required_elems(t))).unwrap();
    let (q, k, v) = (up(AttnTensor::Q, &mut rng), up(AttnTensor::K, &mut rng), up(AttnTensor::V, &mut rng));
    let n_o = p.required_elems(AttnTensor::O);
    let (hq, hkv) = ([100i32, 129], [129i32, 50]);
    let (lq, lkv) = (s.clone_htod(&hq).unwrap(), s.clone_htod(&hkv).unwrap());
    // SAFETY: the lengths are in range (1..=129).
    let dev = unsafe { SeqLens::device(&lq, &lkv) };
    let mut oc = s.clone_htod(&poison::<f16>(n_o)).unwrap();
    s.begin_capture(mode).unwrap();
    let e = gpu.attention().forward(&p, [&q, &k, &v], &mut oc, None, Some(dev)).unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");

    let mut oe = s.clone_htod(&poison::<f16>(n_o)).unwrap();
    gpu.attention().forward(&p, [&q, &k, &v], &mut oe, None, Some(dev)).unwrap();
    let want = s.clone_dtoh(&oe).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(mode).unwrap();
    let host = gpu.attention().forward(&p, [&q, &k, &v], &mut oc, None, Some(SeqLens::host(&hq, &hkv)));
    let r = gpu.attention().forward(&p, [&q, &k, &v], &mut oc, None, Some(dev));
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(host, Err(Error::NotCapturable { .. })), "{host:?}");
    r.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    let got = s.clone_dtoh(&oc).unwrap();
    // compare the defined rows (q rows within each sequence's length)
    for (n, &len) in hq.iter().enumerate() {
        for h in 0..p.h_q {
            for i in 0..len as usize {
                for e in 0..p.d {
                    let at = p.index(AttnTensor::O, [n, h, i, e]);
                    assert_eq!(got[at].to_bits(), want[at].to_bits(), "captured forward at {n} {h} {i} {e}");
                }
            }
        }
    }
}

/// The tactic database's key of a BSHD problem's forward with statistics, as the tactics
/// module documents it.
fn forward_key(p: &Attention) -> String {
    let mask = match p.mask {
        AttnMask::None => "none",
        AttnMask::Causal => "causal",
        AttnMask::CausalBottomRight => "causal_bottom_right",
    };
    let lens = if p.var_len { "var_len" } else { "fixed" };
    let l = |t: AttnTensor| p.layout(t);
    let strides: Vec<String> = [("q", AttnTensor::Q), ("k", AttnTensor::K), ("v", AttnTensor::V), ("o", AttnTensor::O)]
        .iter()
        .map(|&(n, t)| format!("{n}{},{},{}", l(t).batch, l(t).head, l(t).seq))
        .collect();
    format!(
        "attention fwd_stats b{} hq{} hkv{} sq{} skv{} d{} {} {mask} {lens} scale{:?} {} al16",
        p.b,
        p.h_q,
        p.h_kv,
        p.s_q,
        p.s_kv,
        p.d,
        p.dtype,
        p.scale,
        strides.join(" ")
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn measured_search_and_tactic_entries_keep_results_within_the_band() {
    use gemmbridge::tactics::{Choice, Tactic, TacticDb};
    let _shared = shared();
    let mut rng = rng();
    let all = cases(DType::BF16);
    let (gqa, varlen) = (&all[1], &all[6]);
    // a measured search times every candidate on the call's own buffers; the call's results
    // are still the chosen plan's
    let searched = gpu();
    searched.update_options(|o| o.attention_search = true).unwrap();
    for c in [gqa, varlen] {
        check_case::<bf16>(&searched, c, &mut rng);
        let t = searched.plans().attention_tactic(&c.p, "forward");
        eprintln!("{}: measured search's tactic {t:?}", c.p.describe());
        if let Some((sig, t)) = t {
            assert_eq!(sig, forward_key(&c.p), "the documented key");
            assert!(t.tuned_ms < t.heuristic_ms, "{t:?}");
        }
    }
    // an entry cuDNN refuses (no such engine) is warned about and not used; an entry naming the
    // engine the search chose, without knob choices (cuDNN's defaults), is rebuilt and used
    let plan = searched.plans().attention(&varlen.p, "forward").expect("planned above");
    let engine: i64 = plan.split_whitespace().nth(1).and_then(|e| e.parse().ok()).expect("\"engine N …\"");
    let version = gemmbridge::cuda::cudnn_version().expect("cuDNN loaded");
    for (index, used) in [(999_999, false), (engine, true)] {
        let mut db = TacticDb::new(searched.info().unwrap().tactic_identity());
        let choice = Choice::CudnnEngine { engine: index, knobs: vec![], workspace: 0, unfused: false };
        db.entries.insert(forward_key(&varlen.p), Tactic::cudnn_attention(choice, version, 1.0, 1.0));
        let g = gpu();
        g.plans().load_tactics(&db);
        check_case::<bf16>(&g, varlen, &mut rng);
        let applied = g.plans().applied_tactics().contains(&forward_key(&varlen.p));
        assert_eq!(applied, used, "engine {index}: {:?}", g.plans().attention(&varlen.p, "forward"));
    }
}

/// Reads a raw little-endian file of `N`-byte values.
fn raw<const N: usize, V>(path: &std::path::Path, f: impl Fn([u8; N]) -> V) -> Vec<V> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(N).map(|c| f(c.try_into().expect("N bytes"))).collect()
}

/// Large shapes (s up to 3000, GQA, every mask) against PyTorch's math backend run in float64
/// from the same bf16 inputs: the test vectors `bench/attn_oracle.py DIR` writes on the GPU
/// machine (with PyTorch), found through `GEMMBRIDGE_ATTN_ORACLE=DIR`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn large_shapes_match_pytorch_math_backend() {
    let _shared = shared();
    let dir = std::env::var("GEMMBRIDGE_ATTN_ORACLE").unwrap_or_else(|_| {
        panic!(
            "GEMMBRIDGE_ATTN_ORACLE is not set: write the test vectors first with \
             `python3 bench/attn_oracle.py /tmp/attn_oracle` on the GPU machine (PyTorch), then run with \
             GEMMBRIDGE_ATTN_ORACLE=/tmp/attn_oracle"
        )
    });
    let mut cases: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(!cases.is_empty(), "{dir} holds no case: write it with bench/attn_oracle.py");
    let gpu = gpu();
    let s = gpu.stream();
    for c in cases {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(c.join("meta.json")).unwrap()).unwrap();
        let n = |k: &str| meta[k].as_u64().unwrap() as usize;
        let mask = match meta["mask"].as_str().unwrap() {
            "causal" => AttnMask::Causal,
            "bottom_right" => AttnMask::CausalBottomRight,
            _ => AttnMask::None,
        };
        let p =
            Attention::new(n("b"), (n("h_q"), n("h_kv")), (n("s_q"), n("s_kv")), n("d"), DType::BF16).with_mask(mask);
        let bf = |name: &str| raw(&c.join(format!("{name}.bf16")), |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b)));
        let f64s = |name: &str| raw(&c.join(format!("{name}.f64")), f64::from_le_bytes);
        let [q, k, v, d_o] = ["q", "k", "v", "do"].map(|x| s.clone_htod(&bf(x)).unwrap());
        let mut o = s.clone_htod(&poison::<bf16>(p.required_elems(AttnTensor::O))).unwrap();
        let mut lse = s.clone_htod(&vec![f32::NAN; p.stats_elems()]).unwrap();
        gpu.attention().forward(&p, [&q, &k, &v], &mut o, Some(&mut lse), None).unwrap();
        let mut grads: Vec<CudaSlice<bf16>> = [AttnTensor::Q, AttnTensor::K, AttnTensor::V]
            .iter()
            .map(|&t| s.clone_htod(&poison::<bf16>(p.required_elems(t))).unwrap())
            .collect();
        let [dq, dk, dv] = &mut grads[..] else { unreachable!() };
        let saved = AttnSaved { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, stats: &lse };
        gpu.attention().backward(&p, saved, dq, dk, dv, None).unwrap();
        let what = c.file_name().unwrap().to_string_lossy().to_string();
        let lse_got = wide(&s.clone_dtoh(&lse).unwrap());
        let e = reference::rel_error_stats(&p, &lse_got, &f64s("lse"), None);
        assert!(e <= BAND, "{what} lse: rel error {e:e}");
        for (name, t, got) in [
            ("o", AttnTensor::O, &o),
            ("dq", AttnTensor::Q, &*dq),
            ("dk", AttnTensor::K, &*dk),
            ("dv", AttnTensor::V, &*dv),
        ] {
            let e = reference::rel_error_rows(&p, t, &down(&gpu, got), &f64s(name), None);
            assert!(e <= BAND, "{what} {name}: rel error {e:e} > {BAND:e}");
            eprintln!("{what} {name}: rel error {e:.2e} against PyTorch's math backend (float64)");
        }
    }
}
