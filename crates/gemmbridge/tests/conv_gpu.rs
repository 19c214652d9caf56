//! GPU tests of the convolutions on cuDNN ([`GpuConv::forward`], the fused forward and
//! both backwards): small odd shapes with every feature (1×1, 3×3 stride 2, 7×7 stride 2
//! padding 3, dilation 2, groups, depthwise, batch 1 and 3), NHWC and NCHW, f32, tf32, f16
//! and bf16, against the float64 definitions (`gemmbridge::conv::reference`) within the
//! precision's band, outputs poisoned with NaN first; the measured search; the legacy API and
//! the unfused graph; element-aligned views; bad input named
//! before anything is written, the engine usable after; measured plans through the tactic
//! database (rebuilt bit for bit, a refused entry falling back).

mod common;

use std::sync::RwLock;

use common::{gpu, gpu_with, normal, poison, rng};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::conv::{reference, Conv2d, ConvActivation, ConvLayout};
use gemmbridge::cuda::tactics::{Choice, Library, ProblemKind, TacticDb};
use gemmbridge::cuda::{cudnn_version, ConvApi, ConvSearch, Gpu, GpuOptions};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error, Precision, Which};

/// The capture test takes this exclusively, the others share it: another thread's first
/// kernel launch or module load (CUDA's lazy loading synchronises the device) invalidates a
/// capture.
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// The test shapes (N, C, H, W, K, R, S) with their stride, padding, dilation and groups.
fn shapes(precision: Precision) -> Vec<Conv2d> {
    let c = |n, c, h, w, k, r, s| Conv2d::new([n, c, h, w], [k, r, s], precision);
    vec![
        c(3, 5, 9, 11, 7, 1, 1),
        c(1, 6, 13, 12, 5, 3, 3).with_stride(2, 2).with_pad(1, 1),
        c(3, 3, 17, 15, 8, 7, 7).with_stride(2, 2).with_pad(3, 3),
        c(1, 4, 12, 13, 6, 3, 3).with_dilation(2, 2).with_pad(2, 2),
        c(3, 8, 10, 9, 12, 3, 3).with_pad(1, 1).with_groups(4),
        c(1, 6, 11, 10, 6, 3, 3).with_pad(1, 1).with_groups(6),
    ]
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn down<T: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<f64> {
    wide(&gpu.stream().clone_dtoh(v).unwrap())
}

/// Every direction of `p` against float64, within the precision's band.
fn check_problem<T: Element + DeviceRepr>(gpu: &Gpu, p: &Conv2d, rng: &mut rand::rngs::StdRng) {
    let [lx, lw, ly] = p.lens();
    let (x, w, dy, b): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) =
        (normal(rng, lx), normal(rng, lw), normal(rng, ly), normal(rng, p.k));
    let s = gpu.stream();
    let (xd, wd, dyd, bd) =
        (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap(), s.clone_htod(&dy).unwrap(), s.clone_htod(&b).unwrap());
    let tol = p.precision.tolerance();
    let what = p.describe();
    let verdict = |name: &str, got: &[f64], want: &[f64]| {
        let e = rel_error(got, want);
        assert!(e <= tol, "{what} {name}: rel error {e:e} > {tol:e}");
    };
    let mut y = s.clone_htod(&poison::<T>(ly)).unwrap();
    gpu.conv().forward(p, &xd, &wd, &mut y).unwrap();
    let first = down(gpu, &y);
    verdict("forward", &first, &reference::forward(p, &wide(&x), &wide(&w)));
    // the same call again (captured into a graph on the second, replayed on the third): the
    // same result, bit for bit, into a re-poisoned output
    for call in [2, 3] {
        s.memcpy_htod(&poison::<T>(ly), &mut y).unwrap();
        gpu.conv().forward(p, &xd, &wd, &mut y).unwrap();
        let again = down(gpu, &y);
        assert!(again.iter().zip(&first).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: call {call} differs");
    }
    for act in [ConvActivation::Relu, ConvActivation::Identity] {
        let mut y = s.clone_htod(&poison::<T>(ly)).unwrap();
        let want = reference::forward_fused(p, &wide(&x), &wide(&w), &wide(&b), act == ConvActivation::Relu);
        for call in 1..=3 {
            s.memcpy_htod(&poison::<T>(ly), &mut y).unwrap();
            gpu.conv().fused(p, &xd, &wd, &bd, act, &mut y).unwrap();
            let dir = if act == ConvActivation::Relu { "fused" } else { "fused_identity" };
            let plan = gpu.plans().conv2d(p, dir);
            verdict(&format!("fused {act:?} call {call} (plan: {plan:?})"), &down(gpu, &y), &want);
        }
    }
    let mut dx = s.clone_htod(&poison::<T>(lx)).unwrap();
    gpu.conv().backward_data(p, &wd, &dyd, &mut dx).unwrap();
    verdict("backward data", &down(gpu, &dx), &reference::backward_data(p, &wide(&w), &wide(&dy)));
    let mut dw = s.clone_htod(&poison::<T>(lw)).unwrap();
    gpu.conv().backward_filter(p, &xd, &dyd, &mut dw).unwrap();
    verdict("backward filter", &down(gpu, &dw), &reference::backward_filter(p, &wide(&x), &wide(&dy)));
    eprintln!(
        "ok {what}: forward {:?}, backward data {:?}, backward filter {:?}",
        gpu.plans().conv2d(p, "forward"),
        gpu.plans().conv2d(p, "backward_data"),
        gpu.plans().conv2d(p, "backward_filter")
    );
}

fn every_shape<T: Element + DeviceRepr>(gpu: &Gpu, precision: Precision, rng: &mut rand::rngs::StdRng) {
    for layout in [ConvLayout::Nhwc, ConvLayout::Nchw] {
        for p in shapes(precision) {
            check_problem::<T>(gpu, &p.with_layout(layout), rng);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_direction_matches_float64() {
    let _shared = shared();
    let gpu = gpu();
    let mut rng = rng();
    every_shape::<f32>(&gpu, Precision::F32, &mut rng);
    every_shape::<f32>(&gpu, Precision::TF32, &mut rng);
    every_shape::<f16>(&gpu, Precision::F16, &mut rng);
    every_shape::<bf16>(&gpu, Precision::BF16, &mut rng);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn measured_search_matches_float64() {
    let _shared = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.conv_search = ConvSearch::Measured).unwrap();
    let mut rng = rng();
    for p in shapes(Precision::BF16).into_iter().take(3) {
        check_problem::<bf16>(&gpu, &p, &mut rng);
    }
    for p in shapes(Precision::F32).into_iter().take(2) {
        check_problem::<f32>(&gpu, &p.with_layout(ConvLayout::Nchw), &mut rng);
    }
}

/// The legacy API (the room's fallback) on every shape in two precisions, and the graph API's
/// fused forward run unfused (its convolution, then the bias add and activation).
#[test]
#[ignore = "needs a CUDA GPU"]
fn legacy_api_and_unfused_graph_match_float64() {
    let _shared = shared();
    let mut rng = rng();
    let gpu = gpu();
    gpu.update_options(|o| o.conv_api = ConvApi::Legacy).unwrap();
    every_shape::<f16>(&gpu, Precision::F16, &mut rng);
    every_shape::<f32>(&gpu, Precision::F32, &mut rng);
    let gpu = self::gpu();
    gpu.update_options(|o| o.conv_fusion = false).unwrap();
    for p in shapes(Precision::BF16).into_iter().take(4) {
        check_problem::<bf16>(&gpu, &p, &mut rng);
        let plan = gpu.plans().conv2d(&p, "fused");
        assert!(plan.as_deref().is_some_and(|d| d.contains("unfused")), "fusion off runs unfused: {plan:?}");
    }
}

/// Buffers aligned to their element only (a view one element in): the graph API plans for
/// that alignment (cuDNN's BYTE_ALIGNMENT), apart from the aligned plan of the same problem.
#[test]
#[ignore = "needs a CUDA GPU"]
fn element_aligned_views_match_float64() {
    let _shared = shared();
    let gpu = gpu();
    let s = gpu.stream();
    let mut rng = rng();
    let p = Conv2d::new([2, 8, 9, 9], [16, 3, 3], Precision::F16).with_pad(1, 1);
    let [lx, lw, ly] = p.lens();
    let (x, w): (Vec<f16>, Vec<f16>) = (normal(&mut rng, lx + 1), normal(&mut rng, lw + 1));
    let (xd, wd) = (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap());
    for offset in [0usize, 1] {
        let want = reference::forward(&p, &wide(&x[offset..offset + lx]), &wide(&w[offset..offset + lw]));
        let mut y = s.clone_htod(&poison::<f16>(ly + 1)).unwrap();
        {
            let (xv, wv) = (xd.slice(offset..offset + lx), wd.slice(offset..offset + lw));
            let mut yv = y.slice_mut(offset..offset + ly);
            gpu.conv().forward(&p, &xv, &wv, &mut yv).unwrap();
        }
        let got = down(&gpu, &y);
        let e = rel_error(&got[offset..offset + ly], &want);
        assert!(e <= p.precision.tolerance(), "offset {offset}: rel error {e:e}");
        eprintln!("offset {offset}: {:?}", gpu.plans().conv2d(&p, "forward"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_named_and_nothing_is_written() {
    let _shared = shared();
    let gpu = gpu();
    let s = gpu.stream();
    let p = Conv2d::new([2, 4, 6, 6], [8, 3, 3], Precision::F16).with_pad(1, 1);
    let [lx, lw, ly] = p.lens();
    let x = s.clone_htod(&vec![f16::ONE; lx]).unwrap();
    let w = s.clone_htod(&vec![f16::ONE; lw]).unwrap();
    let b = s.clone_htod(&vec![f16::ONE; p.k]).unwrap();
    let mut y = s.clone_htod(&poison::<f16>(ly)).unwrap();
    let untouched = |y: &CudaSlice<f16>| s.clone_dtoh(y).unwrap().iter().all(|v| v.is_nan());
    // the problem itself
    let e = gpu.conv().forward(&p.with_groups(3), &x, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::ConvShape { what: "channels are not a multiple of the groups", .. }), "{e}");
    let e = gpu.conv().forward(&Conv2d { r: 9, ..p.with_pad(0, 0) }, &x, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::ConvShape { .. }), "{e}");
    let e = gpu.conv().forward(&p.with_precision(Precision::F16_F32OUT), &x, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // buffers: dtype, lengths
    let e = gpu.conv().forward(&p.with_precision(Precision::BF16), &x, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
    let short = s.clone_htod(&vec![f16::ONE; lx - 1]).unwrap();
    let e = gpu.conv().forward(&p, &short, &w, &mut y).unwrap_err();
    assert!(
        matches!(e, Error::BufferTooSmall { operand: Which::ConvX, needed_elems, .. } if needed_elems == lx),
        "{e}"
    );
    let e = gpu.conv().fused(&p, &x, &w, &s.clone_htod(&vec![f16::ONE; 7]).unwrap(), ConvActivation::Relu, &mut y);
    assert!(matches!(e, Err(Error::BufferTooSmall { operand: Which::Bias, .. })), "{e:?}");
    let mut short_y = s.clone_htod(&poison::<f16>(ly - 1)).unwrap();
    let e = gpu.conv().forward(&p, &x, &w, &mut short_y).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::ConvY, .. }), "{e}");
    let mut short_dw = s.clone_htod(&poison::<f16>(lw - 1)).unwrap();
    let e = gpu.conv().backward_filter(&p, &x, &y, &mut short_dw).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::ConvW, .. }), "{e}");
    // a misaligned view: one element in
    let e = gpu.conv().forward(&p, &x.slice(1..), &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { .. } | Error::Misaligned { .. }), "{e}");
    assert!(untouched(&y), "a refused call wrote its output");
    assert!(untouched(&short_dw), "a refused call wrote its output");
    // still usable
    gpu.conv().fused(&p, &x, &w, &b, ConvActivation::Relu, &mut y).unwrap();
    let got = s.clone_dtoh(&y).unwrap();
    // every output sees at most 3·3·4 ones plus the bias: interior points 37, corners 17
    assert!(got.iter().all(|v| (17.0..=37.0).contains(&v.to_f64())), "{:?}", &got[..8]);
}

/// Before its plan exists a convolution inside a capture is a named error; after
/// [`GpuConv::prewarm`], a fused forward and a backward-data call captured into one graph and
/// launched give the eager results bit for bit. cudarc's event tracking is off on this context,
/// as capturing cudarc buffers needs (see the FP8 capture test).
#[test]
#[ignore = "needs a CUDA GPU"]
fn prewarmed_convolutions_are_capturable() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let s = gpu.stream().clone();
    let mut rng = rng();
    let p = Conv2d::new([2, 8, 9, 9], [16, 3, 3], Precision::F16).with_pad(1, 1);
    let [lx, lw, ly] = p.lens();
    let (x, w, b): (Vec<f16>, Vec<f16>, Vec<f16>) = (normal(&mut rng, lx), normal(&mut rng, lw), normal(&mut rng, p.k));
    let (xd, wd, bd) = (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap(), s.clone_htod(&b).unwrap());
    let mut y = s.clone_htod(&poison::<f16>(ly)).unwrap();
    s.begin_capture(mode).unwrap();
    let e = gpu.conv().forward(&p, &xd, &wd, &mut y).unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");

    gpu.conv().prewarm(&[p]).unwrap();
    let relu = ConvActivation::Relu;
    let (mut ye, mut dxe) = (s.clone_htod(&poison::<f16>(ly)).unwrap(), s.clone_htod(&poison::<f16>(lx)).unwrap());
    gpu.conv().fused(&p, &xd, &wd, &bd, relu, &mut ye).unwrap();
    gpu.conv().backward_data(&p, &wd, &ye, &mut dxe).unwrap();
    let (want_y, want_dx) = (s.clone_dtoh(&ye).unwrap(), s.clone_dtoh(&dxe).unwrap());

    let (mut yc, mut dxc) = (s.clone_htod(&poison::<f16>(ly)).unwrap(), s.clone_htod(&poison::<f16>(lx)).unwrap());
    s.synchronize().unwrap();
    s.begin_capture(mode).unwrap();
    let r1 = gpu.conv().fused(&p, &xd, &wd, &bd, relu, &mut yc);
    let r2 = gpu.conv().backward_data(&p, &wd, &yc, &mut dxc);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r1.unwrap();
    r2.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&s.clone_dtoh(&yc).unwrap()), bits(&want_y), "captured fused forward");
    assert_eq!(bits(&s.clone_dtoh(&dxc).unwrap()), bits(&want_dx), "captured backward data");
}

/// The directions the tactic-database test runs (`Plans::conv2d`'s names).
const DIRECTIONS: [&str; 3] = ["forward", "fused", "backward_data"];

/// One problem's host inputs: x, w, the bias, dy.
struct Inputs {
    x: Vec<f16>,
    w: Vec<f16>,
    b: Vec<f16>,
    dy: Vec<f16>,
}

/// The forward, the fused bias + ReLU forward and the backward data of `p` on fresh buffers of
/// `gpu` (outputs poisoned first): each output's bits, in [`DIRECTIONS`]' order.
fn outputs(gpu: &Gpu, p: &Conv2d, i: &Inputs) -> Vec<Vec<u16>> {
    let s = gpu.stream();
    let up = |v: &[f16]| s.clone_htod(v).unwrap();
    let (x, w, b, dy) = (up(&i.x), up(&i.w), up(&i.b), up(&i.dy));
    let [lx, _, ly] = p.lens();
    let (mut y, mut yf, mut dx) = (up(&poison(ly)), up(&poison(ly)), up(&poison(lx)));
    gpu.conv().forward(p, &x, &w, &mut y).unwrap();
    gpu.conv().fused(p, &x, &w, &b, ConvActivation::Relu, &mut yf).unwrap();
    gpu.conv().backward_data(p, &w, &dy, &mut dx).unwrap();
    [y, yf, dx].iter().map(|v| s.clone_dtoh(v).unwrap().iter().map(|e| e.to_bits()).collect()).collect()
}

/// Each output of [`outputs`] against float64, within the precision's band.
fn check_outputs(p: &Conv2d, i: &Inputs, got: &[Vec<u16>], what: &str) {
    let (x, w, b, dy) = (wide(&i.x), wide(&i.w), wide(&i.b), wide(&i.dy));
    let want = [
        reference::forward(p, &x, &w),
        reference::forward_fused(p, &x, &w, &b, true),
        reference::backward_data(p, &w, &dy),
    ];
    for ((d, got), want) in DIRECTIONS.iter().zip(got).zip(want) {
        let got: Vec<f64> = got.iter().map(|&bits| f16::from_bits(bits).to_f64()).collect();
        let e = rel_error(&got, &want);
        assert!(e <= p.precision.tolerance(), "{what} {d}: rel error {e:e}");
    }
}

/// The engine (graph API: "engine N") or the algorithm and math type (legacy API) a plan
/// report names.
fn plan_id(plan: &str) -> String {
    match plan.strip_prefix("graph API engine ") {
        Some(rest) => format!("engine {}", rest.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("")),
        None => plan.split_whitespace().take(4).collect::<Vec<_>>().join(" "),
    }
}

/// A measured search's plans, exported as tactics, saved and loaded, run in a fresh `Gpu`
/// without a search: the same engine (or legacy algorithm), the same output bit for bit, for
/// both cuDNN APIs. Entries cuDNN refuses (an engine index that does not exist, an algorithm
/// value outside its enum) fall back to planning without the database, with no error.
#[test]
#[ignore = "needs a CUDA GPU"]
fn measured_plans_round_trip_through_the_tactic_database() {
    let _shared = shared();
    let mut rng = rng();
    let p = Conv2d::new([2, 16, 10, 9], [24, 3, 3], Precision::F16).with_pad(1, 1);
    let [lx, lw, ly] = p.lens();
    let inputs =
        Inputs { x: normal(&mut rng, lx), w: normal(&mut rng, lw), b: normal(&mut rng, p.k), dy: normal(&mut rng, ly) };
    for api in [ConvApi::Graph, ConvApi::Legacy] {
        let tuned = gpu_with(GpuOptions::default().conv_api(api).conv_search(ConvSearch::Measured));
        let want = outputs(&tuned, &p, &inputs);
        check_outputs(&p, &inputs, &want, &format!("{api:?} measured"));
        // the tuned plans repeat their own bits (else equality below would prove nothing)
        assert!(outputs(&tuned, &p, &inputs) == want, "{api:?}: the measured plans are not deterministic");
        let identity = tuned.info().unwrap().tactic_identity();
        assert!(identity.cudnn.is_some() && identity.cudnn == cudnn_version(), "{identity:?}");
        let mut db = TacticDb::new(identity.clone());
        for d in DIRECTIONS {
            let (sig, t) = tuned
                .plans()
                .conv2d_tactic(&p, d)
                .unwrap_or_else(|| panic!("{api:?} {d}: no tactic after a measured search"));
            let api_part = if api == ConvApi::Graph { " graph al" } else { " legacy alany" };
            assert!(sig.starts_with("conv2d ") && sig.contains(api_part), "{sig}");
            assert_eq!((t.library, t.kind, Some(t.version)), (Library::Cudnn, ProblemKind::Conv2d, identity.cudnn));
            assert!(t.tuned_ms > 0.0 && t.heuristic_ms > 0.0, "{sig}: {t:?}");
            match api {
                // the graph API's search timed the heuristic's choice among the candidates
                ConvApi::Graph => assert!(t.tuned_ms <= t.heuristic_ms, "{sig}: {t:?}"),
                _ => assert!(matches!(t.choice, Choice::CudnnAlgo { .. }), "{sig}: {t:?}"),
            }
            eprintln!("{sig}: {t:?}");
            db.entries.insert(sig, t);
        }
        assert_eq!(tuned.plans().conv2d_tactics().len(), DIRECTIONS.len(), "{:?}", tuned.plans().conv2d_tactics());
        if api == ConvApi::Graph {
            // cuDNN's tensor-core engines all carry tile/stage knobs: a database that stores none
            // rebuilds other (on the H200, up to 7.7× slower) configurations of the same engine
            let with_knobs = db
                .entries
                .values()
                .filter(|t| matches!(&t.choice, Choice::CudnnEngine { knobs, .. } if !knobs.is_empty()));
            assert!(with_knobs.count() > 0, "no graph-API tactic recorded a knob: {:?}", db.entries);
        }

        // through a file, as `gemmbridge tune` writes it and `bench --db` reads it
        let path = std::env::temp_dir().join(format!("gemmbridge-conv-tactics-{}-{api:?}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        db.save(&path).unwrap();
        let (loaded, warnings) = TacticDb::load(&path, &identity);
        let _ = std::fs::remove_file(&path);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(loaded.entries, db.entries);
        let fresh = gpu_with(GpuOptions::default().conv_api(api));
        fresh.plans().load_tactics(&loaded);
        let got = outputs(&fresh, &p, &inputs);
        for (i, d) in DIRECTIONS.iter().enumerate() {
            let (a, b) = (tuned.plans().conv2d(&p, d).unwrap(), fresh.plans().conv2d(&p, d).unwrap());
            eprintln!("{api:?} {d}: measured {a}; from the database {b}");
            assert!(b.contains("tactic database"), "{api:?} {d}: not the database's plan: {b}");
            assert_eq!(plan_id(&a), plan_id(&b), "{api:?} {d}");
            assert!(got[i] == want[i], "{api:?} {d}: the database's plan gives other bits");
            assert_eq!(
                fresh.plans().conv2d_tactic(&p, d),
                None,
                "{api:?} {d}: a plan from the database is no measurement"
            );
        }

        refused_entries_fall_back(api, &p, &inputs, &loaded);
    }
}

/// Entries cuDNN refuses (an engine index that does not exist, an algorithm value outside its
/// enum) are planned as without the database (the heuristic here), with no error.
fn refused_entries_fall_back(api: ConvApi, p: &Conv2d, inputs: &Inputs, loaded: &TacticDb) {
    let mut bad = loaded.clone();
    for t in bad.entries.values_mut() {
        match &mut t.choice {
            Choice::CudnnEngine { engine, .. } => *engine = 1 << 40,
            Choice::CudnnAlgo { algo, .. } => *algo = 1000,
            other => panic!("not a convolution choice: {other:?}"),
        }
    }
    let fallback = gpu_with(GpuOptions::default().conv_api(api));
    fallback.plans().load_tactics(&bad);
    let got = outputs(&fallback, p, inputs);
    check_outputs(p, inputs, &got, &format!("{api:?} after a refused entry"));
    for d in DIRECTIONS {
        let plan = fallback.plans().conv2d(p, d).unwrap();
        assert!(!plan.contains("tactic database"), "{api:?} {d}: {plan}");
    }
}
