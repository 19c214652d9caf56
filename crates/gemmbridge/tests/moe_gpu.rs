//! A mixture-of-experts layer with the routing on the device ([`gemmbridge::moe`]): the router
//! (top-k and the stable sort by expert) bit for bit against its CPU twin, the expert products
//! over device group starts on cuDNN's MoE grouped matmul against float64 per expert with
//! outputs poisoned first, the combine (token order and through `pos`) and its backward bit for
//! bit, the row gather, a captured step replayed with new routing and data, and bad input
//! refused before anything is written. The products need cuDNN 9.18 or later (PyTorch's
//! `nvidia/cudnn/lib` first on `LD_LIBRARY_PATH`); on an older cuDNN the tests check that they
//! are refused by name.

mod common;

use common::{gpu, normal, poison, rng};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::cuda::{Gpu, MoeCombineGrads, MoeRouting};
use gemmbridge::grouped::GroupedOp;
use gemmbridge::half::{bf16, f16};
use gemmbridge::moe::{reference, MoeCombine, MoeGemm, MoeRouter};
use gemmbridge::reference::rel_error;
use gemmbridge::{DType, Element, Error, Precision, Which};
use rand::rngs::StdRng;

fn moe_available() -> bool {
    gemmbridge::cuda::cudnn_version().is_some_and(|v| v >= 91800)
}

fn wide<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn up<T: DeviceRepr>(gpu: &Gpu, v: &[T]) -> CudaSlice<T> {
    gpu.stream().clone_htod(v).unwrap()
}

fn down<T: DeviceRepr + Default + Clone>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<T> {
    gpu.stream().clone_dtoh(v).unwrap()
}

/// Logits with ties (every fourth token's first eight experts equal) and one NaN.
fn logits<T: Element>(rng: &mut StdRng, s: usize, e: usize) -> Vec<T> {
    let mut v: Vec<T> = normal(rng, s * e);
    for t in (0..s).step_by(4) {
        for j in 0..e.min(8) {
            v[t * e + j] = v[t * e];
        }
    }
    v[e + 1] = T::from_f64(f64::NAN);
    v
}

/// The router's outputs on the device equal `reference::route` bit for bit.
fn check_route<T: Element + DeviceRepr>(gpu: &Gpu, r: &MoeRouter, l: &[T]) -> reference::Routing {
    let mut out = MoeRouting::new(gpu, r).unwrap();
    gpu.moe().route(&up(gpu, l), &mut out).unwrap();
    let want = reference::route(r, &l.iter().map(|x| x.to_f64() as f32).collect::<Vec<_>>());
    assert_eq!(down(gpu, out.ids()), want.ids, "ids {r:?}");
    let w = down(gpu, out.weights());
    // bit for bit, a NaN (a token with a NaN logit among its choices) for a NaN
    let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    assert!(w.iter().zip(&want.weights).all(|(a, b)| same(a, b)), "weights {r:?}");
    assert_eq!(down(gpu, out.starts()), want.starts, "starts {r:?}");
    assert_eq!(down(gpu, out.index()), want.index, "index {r:?}");
    assert_eq!(down(gpu, out.ks()), want.ks, "ks {r:?}");
    assert_eq!(down(gpu, out.slots()), want.slots, "slots {r:?}");
    assert_eq!(down(gpu, out.pos()), want.pos, "pos {r:?}");
    want
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_router_equals_its_cpu_twin_bit_for_bit() {
    let (gpu, mut rng) = (gpu(), rng());
    for (s, e, k) in [(1000, 128, 8), (37, 8, 2), (4097, 64, 6), (5, 3, 3), (3000, 256, 1)] {
        check_route::<bf16>(
            &gpu,
            &MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::BF16 },
            &logits(&mut rng, s, e),
        );
        check_route::<f32>(
            &gpu,
            &MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::F32 },
            &logits(&mut rng, s, e),
        );
    }
}

/// Runs `p` on the device with host group `starts`, the output poisoned, and returns the
/// worst per-expert error against float64.
fn check_product<T: Element + DeviceRepr + Default + Clone>(
    gpu: &Gpu,
    p: &MoeGemm,
    starts: &[i32],
    rng: &mut StdRng,
) -> Result<f64, Error> {
    let [li, lw, lo] = p.lens();
    let (input, w): (Vec<T>, Vec<T>) = (normal(rng, li), normal(rng, lw));
    let mut out = up(gpu, &poison::<T>(lo));
    gpu.moe().gemm(p, &up(gpu, starts), &up(gpu, &input), &up(gpu, &w), &mut out)?;
    let got = wide(&down(gpu, &out));
    let want = reference::moe_gemm(p, &wide(&input), &wide(&w), starts);
    let width = p.width().1;
    let mut worst = 0.0f64;
    let ends: Vec<usize> = starts.iter().skip(1).map(|&s| s as usize).chain([p.rows()]).collect();
    for (e, (&s0, &e1)) in starts.iter().zip(&ends).enumerate() {
        let (a, b) = (s0 as usize * width, e1 * width);
        if a == b {
            continue;
        }
        let err = rel_error(&got[a..b], &want[a..b]);
        assert!(err <= 1e-2, "{} expert {e}: {err:.2e}", p.describe());
        worst = worst.max(err);
    }
    Ok(worst)
}

/// The products over device group starts (what a MoE layer runs: x gathered into expert order
/// by [`GpuMoe::gather`], the outputs read back through `pos` by the combine), experts 1 and
/// 4 without rows: the forward against float64 per expert; the backward data, which cuDNN 9.19
/// has no engine for on Hopper, either against float64 or refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn products_on_device_starts_match_float64_per_expert() {
    let (gpu, mut rng) = (gpu(), rng());
    // 6 experts, 23 tokens, top 2: 46 routed rows; experts 1 and 4 get none
    let router = MoeRouter { tokens: 23, experts: 6, top_k: 2, dtype: DType::F32 };
    let mut l: Vec<f32> = normal(&mut rng, 23 * 6);
    for t in 0..23 {
        l[t * 6 + 1] -= 100.0;
        l[t * 6 + 4] -= 100.0;
    }
    let routing = reference::route(&router, &l);
    assert_eq!(routing.sizes()[1] + routing.sizes()[4], 0);
    for precision in [Precision::BF16, Precision::F16] {
        for op in [GroupedOp::Forward, GroupedOp::BackwardData] {
            let p = MoeGemm::new(op, 6, 46, (72, 40), precision).unwrap();
            if !moe_available() {
                let e = check_unsupported(&gpu, &p);
                eprintln!("cuDNN {:?}: {e}", gemmbridge::cuda::cudnn_version());
                return;
            }
            let err = match precision {
                Precision::F16 => check_product::<f16>(&gpu, &p, &routing.starts, &mut rng),
                _ => check_product::<bf16>(&gpu, &p, &routing.starts, &mut rng),
            };
            match err {
                Ok(err) => eprintln!("{}: worst expert {err:.2e}", p.describe()),
                Err(e @ Error::Unsupported { .. }) if op == GroupedOp::BackwardData => {
                    assert!(e.to_string().contains("no engine"), "{e}");
                    eprintln!("{}: {e}", p.describe());
                }
                Err(e) => panic!("{}: {e}", p.describe()),
            }
        }
    }
    // starts out of order on the device are clamped, not followed out of the buffers: the
    // product runs the clamped starts (5, 5, 8: expert 1 has rows 5..8; rows 0..5 precede them)
    let p = MoeGemm::new(GroupedOp::Forward, 3, 8, (16, 8), Precision::BF16).unwrap();
    let (x, w) = (up(&gpu, &normal::<bf16>(&mut rng, 64)), up(&gpu, &normal::<bf16>(&mut rng, 384)));
    let mut y = up(&gpu, &poison::<bf16>(128));
    gpu.moe().gemm(&p, &up(&gpu, &[5i32, -3, 900]), &x, &w, &mut y).unwrap();
    let clamped = reference::moe_gemm(&p, &wide(&down(&gpu, &x)), &wide(&down(&gpu, &w)), &[5, 5, 8]);
    let got = wide(&down(&gpu, &y));
    assert!(rel_error(&got[5 * 16..], &clamped[5 * 16..]) < 1e-2, "the clamped starts' expert 1");
}

fn check_unsupported(gpu: &Gpu, p: &MoeGemm) -> String {
    let [li, lw, lo] = p.lens();
    let (i, w) = (up(gpu, &vec![bf16::ZERO; li]), up(gpu, &vec![bf16::ZERO; lw]));
    let mut o = up(gpu, &poison::<bf16>(lo));
    let st = up(gpu, &vec![0i32; p.experts()]);
    let e = gpu.moe().gemm(p, &st, &i, &w, &mut o).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("9.18"), "{e}");
    assert!(down(gpu, &o).iter().all(|v| v.is_nan()), "written");
    e.to_string()
}

/// The captured steps' sizes `[S, E, k, H, F]`, router, up-projection and combine, on a Gpu with
/// cudarc's event tracking off (a capture refuses cudarc's waits on events recorded before it).
fn capture_setup() -> (Gpu, [usize; 5], MoeRouter, MoeGemm, MoeCombine) {
    let gpu = gpu();
    // SAFETY: every buffer of the capturing tests is used on the Gpu's stream only, in order
    unsafe { gpu.context().disable_event_tracking() };
    let [s, e, k, h, f] = [200, 8, 2, 64, 96];
    let router = MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::BF16 };
    let up_p = MoeGemm::new(GroupedOp::Forward, e, s * k, (f, h), Precision::BF16).unwrap();
    (gpu, [s, e, k, h, f], router, up_p, MoeCombine { tokens: s, top_k: k, n: h, dtype: DType::BF16 })
}

/// One MoE forward (router, x gathered into expert order, up- and down-projection over the
/// device group starts, the combine through pos) captured once into a CUDA graph, then
/// replayed after new logits and tokens were written in place: each replay gives the new
/// routing's float64 result. cudarc's event tracking is off, as for any capture of cudarc
/// buffers.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_step_replays_with_new_routing() {
    if !moe_available() {
        eprintln!("cuDNN {:?} has no MoE grouped matmul: nothing to capture", gemmbridge::cuda::cudnn_version());
        return;
    }
    let (gpu, [s, e, k, h, f], router, up_p, comb) = capture_setup();
    let (mut rng, r) = (rng(), s * k);
    let down_p = MoeGemm::new(GroupedOp::Forward, e, r, (h, f), Precision::BF16).unwrap();
    let mut routing = MoeRouting::new(&gpu, &router).unwrap();
    let mut d_l = up(&gpu, &logits::<bf16>(&mut rng, s, e));
    let mut d_x = up(&gpu, &normal::<bf16>(&mut rng, s * h));
    let (w1, w2) = (up(&gpu, &normal::<bf16>(&mut rng, e * f * h)), up(&gpu, &normal::<bf16>(&mut rng, e * h * f)));
    let (mut xs, mut mid, mut o, mut y) = (
        up(&gpu, &poison::<bf16>(r * h)),
        up(&gpu, &poison::<bf16>(r * f)),
        up(&gpu, &poison::<bf16>(r * h)),
        up(&gpu, &poison::<bf16>(s * h)),
    );
    let mut step = |routing: &mut MoeRouting, l: &CudaSlice<bf16>, x: &CudaSlice<bf16>| -> Result<(), Error> {
        gpu.moe().route(l, routing)?;
        gpu.moe().gather(routing.index(), h, x, &mut xs)?;
        gpu.moe().gemm(&up_p, routing.starts(), &xs, &w1, &mut mid)?;
        gpu.moe().gemm(&down_p, routing.starts(), &mid, &w2, &mut o)?;
        gpu.moe().combine(&comb, (&o, Some(routing.pos())), Some(routing.weights()), &mut y)
    };
    step(&mut routing, &d_l, &d_x).unwrap(); // plans and kernels made
    let st = gpu.stream().clone();
    st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let captured = step(&mut routing, &d_l, &d_x);
    let graph = st.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    captured.unwrap();
    let (w1h, w2h) = (wide(&down(&gpu, &w1)), wide(&down(&gpu, &w2)));
    for trial in 0..3 {
        let l: Vec<bf16> = logits(&mut rng, s, e);
        let x: Vec<bf16> = normal(&mut rng, s * h);
        st.memcpy_htod(&l, &mut d_l).unwrap();
        st.memcpy_htod(&x, &mut d_x).unwrap();
        st.memcpy_htod(&poison::<bf16>(s * h), &mut y).unwrap();
        graph.launch().unwrap();
        let got = wide(&down(&gpu, &y));
        // float64 of the new routing: gathered rows, up, down (each stored in bf16), combine
        let rt = reference::route(&router, &l.iter().map(|v| v.to_f64() as f32).collect::<Vec<_>>());
        let xs: Vec<f64> = rt
            .index
            .iter()
            .flat_map(|&t| x[t as usize * h..(t as usize + 1) * h].to_vec())
            .map(|v| v.to_f64())
            .collect();
        let bf = |v: Vec<f64>| v.into_iter().map(|x| bf16::from_f64(x).to_f64()).collect::<Vec<_>>();
        let m1 = bf(reference::moe_gemm(&up_p, &xs, &w1h, &rt.starts));
        let o2 = bf(reference::moe_gemm(&down_p, &m1, &w2h, &rt.starts));
        let mut want = vec![0.0f64; s * h];
        for q in 0..r {
            let p = rt.pos[q] as usize;
            for c in 0..h {
                want[(q / k) * h + c] += rt.weights[q] as f64 * o2[p * h + c];
            }
        }
        let err = rel_error(&got, &want);
        eprintln!("replay {trial}: {err:.2e}");
        assert!(err <= 1e-2, "replay {trial}: {err:.2e}");
    }
}

/// Each piece of the step captured alone into a CUDA graph (after a first call outside the
/// capture, event tracking off): the router, the gather, one product, the combine. Every
/// piece's capture must end in a graph; the message names the pieces whose capture failed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn each_piece_of_the_step_captures_alone() {
    let (gpu, [s, e, k, h, f], router, up_p, comb) = capture_setup();
    let (mut rng, r) = (rng(), s * k);
    let mut routing = MoeRouting::new(&gpu, &router).unwrap();
    let d_l = up(&gpu, &logits::<bf16>(&mut rng, s, e));
    let d_x = up(&gpu, &normal::<bf16>(&mut rng, s * h));
    let w1 = up(&gpu, &normal::<bf16>(&mut rng, e * f * h));
    let (mut xs, mut mid, mut y) =
        (up(&gpu, &poison::<bf16>(r * h)), up(&gpu, &poison::<bf16>(r * f)), up(&gpu, &poison::<bf16>(s * h)));
    let st = gpu.stream().clone();
    let mut failed = Vec::new();
    let mut piece = |name: &str, call: &mut dyn FnMut() -> Result<(), Error>| {
        if let Err(e) = call() {
            failed.push(format!("{name}: first call {e}"));
            return;
        }
        st.synchronize().unwrap();
        st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let inside = call();
        let ended = st.end_capture(CUgraphInstantiate_flags(0));
        eprintln!("{name}: call {inside:?}, end {:?}", ended.as_ref().map(|g| g.is_some()));
        match (inside, ended) {
            (Ok(()), Ok(Some(g))) => g.launch().and_then(|_| st.synchronize()).unwrap(),
            (i, en) => failed.push(format!("{name}: call {i:?}, end {:?}", en.map(|g| g.is_some()))),
        }
    };
    piece("route", &mut || gpu.moe().route(&d_l, &mut routing));
    let (index, starts, pos, wts) = (routing.index(), routing.starts(), routing.pos(), routing.weights());
    piece("gather", &mut || gpu.moe().gather(index, h, &d_x, &mut xs));
    if moe_available() {
        piece("product", &mut || gpu.moe().gemm(&up_p, starts, &xs, &w1, &mut mid));
    }
    piece("combine", &mut || gpu.moe().combine(&comb, (&xs, Some(pos)), Some(wts), &mut y));
    assert!(failed.is_empty(), "pieces whose capture failed: {failed:?}");
}

/// The capacity layout on the device equals `reference::pad` bit for bit, at a capacity
/// above the largest group and at one below it (slots dropped); x gathered by the padded
/// index has zero pad rows; the combine through the padded pos and its backward (pad rows of
/// `do` zeroed, poisoned first) equal the CPU's bit for bit; a capacity of 0 is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_capacity_layout_equals_the_cpu_bit_for_bit() {
    let (gpu, mut rng) = (gpu(), rng());
    let (s, e, k, n) = (300, 16, 4, 96);
    let router = MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::F32 };
    let l: Vec<f32> = normal(&mut rng, s * e);
    let mut routing = MoeRouting::new(&gpu, &router).unwrap();
    gpu.moe().route(&up(&gpu, &l), &mut routing).unwrap();
    let rt = reference::route(&router, &l);
    let most = *rt.sizes().iter().max().unwrap();
    let x: Vec<bf16> = normal(&mut rng, s * n);
    let (d_x, c) = (up(&gpu, &x), MoeCombine { tokens: s, top_k: k, n, dtype: DType::BF16 });
    let w = up(&gpu, &rt.weights);
    for cap in [most + 5, most / 2] {
        routing.pad(&gpu, cap).unwrap();
        let p = reference::pad(&rt, cap);
        assert_eq!((routing.capacity(), routing.rows()), (Some(cap), e * cap));
        assert_eq!(down(&gpu, routing.index()), p.index, "index cap {cap}");
        assert_eq!(down(&gpu, routing.ks()), p.ks, "ks cap {cap}");
        assert_eq!(down(&gpu, routing.slots()), p.slots, "slots cap {cap}");
        assert_eq!(down(&gpu, routing.pos()), p.pos, "pos cap {cap}");
        let mut xs = up(&gpu, &poison::<bf16>(e * cap * n));
        gpu.moe().gather(routing.index(), n, &d_x, &mut xs).unwrap();
        let got = down(&gpu, &xs);
        for (row, &t) in p.index.iter().enumerate() {
            let want = if t < 0 { vec![bf16::ZERO; n] } else { x[t as usize * n..][..n].to_vec() };
            assert!(got[row * n..][..n].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "row {row}");
        }
        // the combine and its backward through the padded rows
        let o: Vec<bf16> = normal(&mut rng, e * cap * n);
        let of: Vec<f32> = o.iter().map(|v| v.to_f32()).collect();
        let d_o = up(&gpu, &o);
        let mut y = up(&gpu, &poison::<bf16>(s * n));
        gpu.moe().combine(&c, (&d_o, Some(routing.pos() as _)), Some(&w as _), &mut y).unwrap();
        let want = reference::combine(&c, (&of, Some(&p.pos)), Some(&rt.weights));
        let bits = |got: Vec<bf16>, want: &[f32]| {
            got.iter().zip(want).all(|(a, b)| a.to_bits() == bf16::from_f32(*b).to_bits())
        };
        assert!(bits(down(&gpu, &y), &want), "combine cap {cap}");
        let dy: Vec<bf16> = normal(&mut rng, s * n);
        let dyf: Vec<f32> = dy.iter().map(|v| v.to_f32()).collect();
        let (mut g_o, mut g_w, mut g_l) = (
            up(&gpu, &poison::<bf16>(e * cap * n)),
            up(&gpu, &vec![f32::NAN; s * k]),
            up(&gpu, &poison::<bf16>(s * e)),
        );
        let grads = MoeCombineGrads { d_o: &mut g_o, dw: &mut g_w, dlogits: &mut g_l };
        gpu.moe().combine_backward(&c, (&routing, true), (&up(&gpu, &dy), &d_o), grads).unwrap();
        let (w_o, w_w, w_l) = reference::combine_backward(&c, e, (&dyf, &of, Some(&p.pos)), (&rt.weights, &rt.ids));
        assert!(bits(down(&gpu, &g_o), &w_o), "do cap {cap} (pad rows zero)");
        assert!(down(&gpu, &g_w).iter().zip(&w_w).all(|(a, b)| a.to_bits() == b.to_bits()), "dw cap {cap}");
        assert!(bits(down(&gpu, &g_l), &w_l), "dlogits cap {cap}");
    }
    let err = routing.pad(&gpu, 0).unwrap_err();
    assert!(matches!(err, Error::GroupedShape { .. }), "{err}");
    // a new routing returns to the sorted layout
    gpu.moe().route(&up(&gpu, &l), &mut routing).unwrap();
    assert_eq!((routing.capacity(), routing.rows()), (None, s * k));
    assert_eq!(down(&gpu, routing.pos()), rt.pos);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_combine_its_backward_and_the_gather_equal_the_cpu_bit_for_bit() {
    let (gpu, mut rng) = (gpu(), rng());
    for (s, k, n, e) in [(37, 2, 200, 8), (300, 8, 768, 128), (5, 1, 3, 4)] {
        let router = MoeRouter { tokens: s, experts: e, top_k: k, dtype: DType::F32 };
        let l: Vec<f32> = normal(&mut rng, s * e);
        let mut routing = MoeRouting::new(&gpu, &router).unwrap();
        gpu.moe().route(&up(&gpu, &l), &mut routing).unwrap();
        let rt = reference::route(&router, &l);
        let c = MoeCombine { tokens: s, top_k: k, n, dtype: DType::BF16 };
        let o: Vec<bf16> = normal(&mut rng, s * k * n);
        let dy: Vec<bf16> = normal(&mut rng, s * n);
        let (d_o, d_dy) = (up(&gpu, &o), up(&gpu, &dy));
        let of: Vec<f32> = o.iter().map(|v| v.to_f32()).collect();
        let bits = |got: Vec<bf16>, want: &[f32]| {
            got.iter().zip(want).all(|(a, b)| a.to_bits() == bf16::from_f32(*b).to_bits())
        };
        // o in token order, and in expert order read through pos
        for sorted in [false, true] {
            let rows = sorted.then_some(&rt.pos[..]);
            for weighted in [true, false] {
                let mut y = up(&gpu, &poison::<bf16>(s * n));
                let d_rows = sorted.then_some(routing.pos() as _);
                gpu.moe().combine(&c, (&d_o, d_rows), weighted.then_some(routing.weights() as _), &mut y).unwrap();
                let want = reference::combine(&c, (&of, rows), weighted.then_some(&rt.weights[..]));
                assert!(bits(down(&gpu, &y), &want), "combine {s} {k} {n} sorted {sorted}");
            }
            let (mut g_o, mut g_w, mut g_l) = (
                up(&gpu, &poison::<bf16>(s * k * n)),
                up(&gpu, &vec![f32::NAN; s * k]),
                up(&gpu, &poison::<bf16>(s * e)),
            );
            let grads = MoeCombineGrads { d_o: &mut g_o, dw: &mut g_w, dlogits: &mut g_l };
            gpu.moe().combine_backward(&c, (&routing, sorted), (&d_dy, &d_o), grads).unwrap();
            let dyf: Vec<f32> = dy.iter().map(|v| v.to_f32()).collect();
            let (w_o, w_w, w_l) = reference::combine_backward(&c, e, (&dyf, &of, rows), (&rt.weights, &rt.ids));
            assert!(bits(down(&gpu, &g_o), &w_o), "do {s} {k} {n} sorted {sorted}");
            assert!(down(&gpu, &g_w).iter().zip(&w_w).all(|(a, b)| a.to_bits() == b.to_bits()), "dw {s} {k} {n}");
            assert!(bits(down(&gpu, &g_l), &w_l), "dlogits {s} {k} {n}");
        }
        // the gather of x's rows in expert order; a negative index writes zeros (a pad row),
        // one past the input is clamped to its last row
        let x: Vec<f16> = normal(&mut rng, s * n);
        let mut xs = up(&gpu, &poison::<f16>(s * k * n));
        gpu.moe().gather(routing.index(), n, &up(&gpu, &x), &mut xs).unwrap();
        let want: Vec<f16> = rt.index.iter().flat_map(|&t| x[t as usize * n..(t as usize + 1) * n].to_vec()).collect();
        assert!(down(&gpu, &xs).iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "gather {s}");
        let wild = up(&gpu, &[-5i32, s as i32 + 3]);
        let mut two = up(&gpu, &poison::<f16>(2 * n));
        gpu.moe().gather(&wild, n, &up(&gpu, &x), &mut two).unwrap();
        let got = down(&gpu, &two);
        assert!(got[..n].iter().all(|a| a.to_bits() == 0), "negative: zeros");
        assert!(got[n..].iter().zip(&x[(s - 1) * n..]).all(|(a, b)| a.to_bits() == b.to_bits()), "clamped high");
    }
}

/// Bad calls are refused by name before anything is written, and the engine works afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_calls_are_named_and_write_nothing() {
    let (gpu, mut rng) = (gpu(), rng());
    let router = MoeRouter { tokens: 10, experts: 4, top_k: 2, dtype: DType::BF16 };
    let mut routing = MoeRouting::new(&gpu, &router).unwrap();
    // logits of the wrong type and too short
    let e = gpu.moe().route(&up(&gpu, &[0.0f32; 40]), &mut routing).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { operand: Which::Grouped("logits"), .. }), "{e}");
    let e = gpu.moe().route(&up(&gpu, &[bf16::ZERO; 39]), &mut routing).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { .. }), "{e}");
    // an output too short; starts too short
    let p = MoeGemm::new(GroupedOp::Forward, 4, 20, (16, 8), Precision::BF16).unwrap();
    let [li, lw, lo] = p.lens();
    let (x, w) = (up(&gpu, &normal::<bf16>(&mut rng, li)), up(&gpu, &normal::<bf16>(&mut rng, lw)));
    let starts = up(&gpu, &[0i32, 5, 10, 15]);
    let mut short = up(&gpu, &poison::<bf16>(lo - 1));
    let e = gpu.moe().gemm(&p, &starts, &x, &w, &mut short).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { .. }), "{e}");
    let mut y = up(&gpu, &poison::<bf16>(lo));
    let e = gpu.moe().gemm(&p, &up(&gpu, &[0i32, 5, 10]), &x, &w, &mut y).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::Grouped("starts"), .. }), "{e}");
    assert!(down(&gpu, &y).iter().all(|v| v.is_nan()) && down(&gpu, &short).iter().all(|v| v.is_nan()));
    // wrong type for the product
    let xf = up(&gpu, &vec![f16::ZERO; li]);
    let (wf, mut yf) = (up(&gpu, &vec![f16::ZERO; lw]), up(&gpu, &poison::<f16>(lo)));
    let e = gpu.moe().gemm(&p, &starts, &xf, &wf, &mut yf).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
    // a combine over a different routing
    let c = MoeCombine { tokens: 9, top_k: 2, n: 8, dtype: DType::BF16 };
    let (dy, o) = (up(&gpu, &[bf16::ZERO; 9 * 8]), up(&gpu, &[bf16::ZERO; 18 * 8]));
    let (mut a, mut b, mut l) =
        (up(&gpu, &poison::<bf16>(18 * 8)), up(&gpu, &[0f32; 18]), up(&gpu, &poison::<bf16>(36)));
    let grads = MoeCombineGrads { d_o: &mut a, dw: &mut b, dlogits: &mut l };
    let e = gpu.moe().combine_backward(&c, (&routing, true), (&dy, &o), grads).unwrap_err();
    assert!(e.to_string().contains("the combine is not the routing's"), "{e}");
    // the engine works afterwards
    gpu.moe().route(&up(&gpu, &normal::<bf16>(&mut rng, 40)), &mut routing).unwrap();
    let starts = down(&gpu, routing.starts());
    assert_eq!(starts[0], 0);
}
