//! GPU tests of a transformer layer's elementwise operations ([`Gpu::rope`], [`Gpu::swiglu`],
//! [`Gpu::swiglu_backward`]) on gemmbridge's own kernels: bit for bit the CPU backend's
//! results (the same f32 arithmetic, `gemmbridge::layer_ops::arith`) on odd shapes, f32, f16
//! and bf16, the 8-wide and the scalar instances (the same data at an aligned address and one
//! element past it); in place: value heads, partial-rotary tails and NaN-poisoned row padding
//! unchanged bit for bit; within the band of the float64 definitions; device positions out of
//! range giving NaN; bad input named before anything is written, the engine usable after; a
//! captured graph replaying the same bits.

mod common;

use std::sync::RwLock;

use common::{gpu, rng};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use gemmbridge::cpu;
use gemmbridge::cuda::Gpu;
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer_ops::{
    reference, GluLayout, Llama3Scaling, Positions, Rope, RopeDirection, RopeStyle, RopeTables, SwiGlu,
};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error, Which};
use rand::rngs::StdRng;
use rand::Rng;

/// The capture test takes this exclusively, the others share it (another thread's first
/// launch or module load invalidates a capture).
static CAPTURE: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

/// The relative band against float64 of each element type.
fn band<T: Element>() -> f64 {
    if T::DTYPE == gemmbridge::DType::F32 {
        1e-5
    } else {
        1e-2
    }
}

/// The same bits, or both NaN (a NaN's payload may differ between the two sides).
fn same_bits<T: Element>(a: &[T], b: &[T]) -> Option<usize> {
    let (x, y): (Vec<f64>, Vec<f64>) = a.iter().zip(b).map(|(p, q)| (p.to_f64(), q.to_f64())).unzip();
    (0..a.len()).find(|&i| !(x[i].to_bits() == y[i].to_bits() || x[i].is_nan() && y[i].is_nan()))
}

fn random<T: Element>(rng: &mut StdRng, n: usize, range: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.random_range(-range..range))).collect()
}

fn down<T: DeviceRepr + Clone + Default>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<T> {
    gpu.stream().clone_dtoh(v).unwrap()
}

/// A RoPE call's angle inputs on the host: the positions given (if any) and the tables (if the
/// problem has them).
struct Angles {
    given: Option<Vec<i32>>,
    start: usize,
    tables: Option<(Vec<f32>, Vec<f32>)>,
}

fn angles(op: &Rope, rng: &mut StdRng, given: bool) -> Angles {
    let limit = op.position_limit().min(70_000) as i32;
    let tables = (op.table_elems() > 0)
        .then(|| (0..op.table_elems()).map(|k| ((k as f32 * 0.011).cos(), (k as f32 * 0.013).sin())).unzip());
    let start = rng.random_range(0..(limit as usize - op.seq).min(5000));
    let given = given.then(|| (0..op.tokens()).map(|_| rng.random_range(0..limit)).collect());
    Angles { given, start, tables }
}

/// One RoPE call on the GPU at element offset `shift` of a buffer holding `x` there, and on
/// the CPU; the whole buffers compared bit for bit (so the untouched elements too), the
/// rotated elements against float64. Returns the GPU's buffer.
fn rope_case<T: Element + DeviceRepr>(gpu: &Gpu, op: &Rope, dir: RopeDirection, a: &Angles, x: &[T]) -> Vec<T> {
    let s = gpu.stream();
    let mut got = Vec::new();
    for shift in [0usize, 1] {
        let mut host = vec![T::from_f64(f64::NAN); shift];
        host.extend_from_slice(x);
        let mut d = s.clone_htod(&host).unwrap();
        let pos = a.given.as_ref().map(|g| s.clone_htod(g).unwrap());
        let tabs = a.tables.as_ref().map(|(c, sn)| (s.clone_htod(c).unwrap(), s.clone_htod(sn).unwrap()));
        let positions = match &pos {
            Some(p) => Positions::Given(p as &dyn DevicePtr<i32>),
            None => Positions::Contiguous { start: a.start },
        };
        let t =
            tabs.as_ref().map(|(c, sn)| RopeTables { cos: c as &dyn DevicePtr<f32>, sin: sn as &dyn DevicePtr<f32> });
        gpu.rope(op, dir, &mut d.slice_mut(shift..), positions, t).unwrap();
        got.push(down(gpu, &d)[shift..].to_vec());
    }
    let mut want = x.to_vec();
    let positions = match &a.given {
        Some(g) => Positions::Given(&g[..]),
        None => Positions::Contiguous { start: a.start },
    };
    let t = a.tables.as_ref().map(|(c, sn)| RopeTables { cos: &c[..], sin: &sn[..] });
    cpu::rope(op, dir, &mut want, positions, t).unwrap();
    for (g, path) in got.iter().zip(["aligned", "one element off"]) {
        if let Some(i) = same_bits(g, &want) {
            panic!("{} {dir:?} {path}: element {i} is {:?}, the CPU's {:?}", op.describe(), g[i], want[i]);
        }
    }
    let wide: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let r = reference::rope(op, dir, &wide, &positions, t.as_ref());
    let rotated: Vec<usize> = (0..x.len()).filter(|&i| r[i].to_bits() != wide[i].to_bits()).collect();
    // in place: value heads, partial-rotary tails and the NaN row padding keep their bits
    let kept: Vec<usize> = (0..x.len()).filter(|&i| r[i].to_bits() == wide[i].to_bits()).collect();
    let (kg, kx): (Vec<T>, Vec<T>) = kept.iter().map(|&i| (got[0][i], x[i])).unzip();
    assert_eq!(
        same_bits(&kg, &kx),
        None,
        "{} {dir:?}: an element outside q and k's rotated part changed",
        op.describe()
    );
    let gw: Vec<f64> = rotated.iter().map(|&i| got[0][i].to_f64()).collect();
    let rw: Vec<f64> = rotated.iter().map(|&i| r[i]).collect();
    let err = rel_error(&gw, &rw);
    assert!(err <= band::<T>(), "{} {dir:?}: rel error {err:e} against float64", op.describe());
    got.swap_remove(0)
}

/// `x` for a problem: random rotated and value elements, NaN in the row padding.
fn qkv_values<T: Element>(op: &Rope, rng: &mut StdRng) -> Vec<T> {
    let mut x: Vec<T> = random(rng, op.qkv_elems(), 3.0);
    for (i, v) in x.iter_mut().enumerate() {
        if i % op.ld >= op.width() {
            *v = T::from_f64(f64::NAN);
        }
    }
    x
}

/// The shapes of the spec (b 1..3; s 1, 7, 129; GQA 8/1 and 32/8; d 64 and 128), each with
/// one of the styles, rotary dimensions (full, half, 24), angle sources (θ, θ with LLaMA 3's
/// scaling, tables), position kinds, directions and row paddings (none, 8, 5 elements) in
/// turn.
fn rope_cases() -> Vec<(Rope, bool, RopeDirection)> {
    let mut out = Vec::new();
    let mut k = 0usize;
    for (b, s) in [(1, 1), (2, 7), (3, 129), (1, 129)] {
        for heads in [(8, 1), (32, 8)] {
            for d in [64, 128] {
                let style = if k.is_multiple_of(2) { RopeStyle::RotateHalf } else { RopeStyle::Interleaved };
                let rotary = [d, d / 2, 24, d][k % 4];
                let op = Rope::new(b, s, heads, d).with_style(style).with_rotary_dim(rotary);
                let op = match k % 3 {
                    0 => op,
                    1 => op.with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1)),
                    _ => op.with_tables(4096),
                };
                let op = op.with_ld(op.width() + [0, 8, 5][(k / 2) % 3]);
                let dir = if k % 5 < 3 { RopeDirection::Forward } else { RopeDirection::Backward };
                out.push((op, (k / 3).is_multiple_of(2), dir));
                k += 1;
            }
        }
    }
    out
}

fn rope_all<T: Element + DeviceRepr>(gpu: &Gpu, rng: &mut StdRng) {
    for (op, given, dir) in rope_cases() {
        let a = angles(&op, rng, given);
        rope_case::<T>(gpu, &op, dir, &a, &qkv_values(&op, rng));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_gives_the_cpu_bits_in_place() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    rope_all::<bf16>(&gpu, &mut rng);
    rope_all::<f16>(&gpu, &mut rng);
    rope_all::<f32>(&gpu, &mut rng);
}

/// The backward of the forward gives the input back within the band (LLaMA 3 8B's heads).
#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_backward_undoes_the_forward() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let op = Rope::new(2, 129, (32, 8), 128).with_theta(500_000.0, None);
    let a = angles(&op, &mut rng, true);
    let x: Vec<bf16> = qkv_values(&op, &mut rng);
    let y = rope_case(&gpu, &op, RopeDirection::Forward, &a, &x);
    let back = rope_case(&gpu, &op, RopeDirection::Backward, &a, &y);
    let (w, g): (Vec<f64>, Vec<f64>) =
        x.iter().zip(&back).filter(|(p, _)| !p.to_f64().is_nan()).map(|(p, q)| (p.to_f64(), q.to_f64())).unzip();
    let err = rel_error(&g, &w);
    assert!(err <= 1e-2, "forward then backward: rel error {err:e}");
}

/// Device positions outside the tables make their tokens' rotated elements NaN, and nothing
/// else changes: the tables are not read out of bounds.
#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_device_positions_out_of_range_give_nan() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let op = Rope::new(1, 4, (8, 1), 64).with_tables(10);
    let (c, sn): (Vec<f32>, Vec<f32>) = (vec![0.5; op.table_elems()], vec![0.25; op.table_elems()]);
    let x: Vec<bf16> = qkv_values(&op, &mut rng);
    let mut d = s.clone_htod(&x).unwrap();
    let pos = s.clone_htod(&[3i32, -1, 10, 9]).unwrap();
    let (cd, sd) = (s.clone_htod(&c).unwrap(), s.clone_htod(&sn).unwrap());
    let t = RopeTables { cos: &cd as &dyn DevicePtr<f32>, sin: &sd as &dyn DevicePtr<f32> };
    gpu.rope(&op, RopeDirection::Forward, &mut d, Positions::Given(&pos), Some(t)).unwrap();
    let got = down(&gpu, &d);
    let rotated = 9 * 64;
    for t in 0..4 {
        let row = &got[t * op.ld..(t + 1) * op.ld];
        let bad = t == 1 || t == 2;
        assert!(row[..rotated].iter().all(|v| v.to_f64().is_nan() == bad), "token {t}");
        assert_eq!(same_bits(&row[rotated..], &x[t * op.ld + rotated..(t + 1) * op.ld]), None, "v of token {t}");
    }
}

/// Every bad call is a named error before anything is written; the engine runs a good call
/// after them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_layer_calls_are_named_and_write_nothing() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    let s = gpu.stream();
    let op = Rope::new(2, 7, (8, 1), 64);
    let x: Vec<bf16> = qkv_values(&op, &mut rng);
    let mut d = s.clone_htod(&x).unwrap();
    let pos = s.clone_htod(&vec![0i32; op.tokens() - 1]).unwrap();
    let tab = s.clone_htod(&vec![0f32; 5 * 32]).unwrap();
    let fw = RopeDirection::Forward;
    let at0 = Positions::Contiguous { start: 0 };
    let layer_op = |e: Error| matches!(e, Error::LayerOp { .. });
    assert!(layer_op(gpu.rope(&op.with_rotary_dim(33), fw, &mut d, at0, None).unwrap_err()));
    assert!(layer_op(gpu.rope(&op.with_rotary_dim(66), fw, &mut d, at0, None).unwrap_err()));
    assert!(layer_op(gpu.rope(&op.with_ld(639), fw, &mut d, at0, None).unwrap_err()));
    assert!(layer_op(gpu.rope(&op, fw, &mut d, Positions::Contiguous { start: (1 << 24) - 6 }, None).unwrap_err()));
    let e = gpu.rope(&Rope::new(3, 7, (8, 1), 64), fw, &mut d, at0, None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::LayerOp("qkv"), .. }), "{e}");
    let e = gpu.rope(&op, fw, &mut d, Positions::Given(&pos), None).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::LayerOp("positions"), .. }), "{e}");
    let tables = || Some(RopeTables { cos: &tab as &dyn DevicePtr<f32>, sin: &tab as &dyn DevicePtr<f32> });
    let e = gpu.rope(&op.with_tables(7), fw, &mut d, at0, tables()).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::LayerOp("cos table"), .. }), "{e}");
    assert!(layer_op(gpu.rope(&op.with_tables(5), fw, &mut d, at0, None).unwrap_err()), "tables missing");
    assert!(layer_op(gpu.rope(&op.with_tables(5), fw, &mut d, at0, tables()).unwrap_err()), "positions 0..7 past 5");
    assert!(layer_op(gpu.rope(&op, fw, &mut d, at0, tables()).unwrap_err()), "tables for θ");
    // positions inside qkv (a second handle on qkv's memory, forgotten after): the rotation
    // would write what it reads
    // SAFETY: the alias is only read by a call that is refused before launch, and forgotten
    // (never freed twice).
    let alias = unsafe { s.upgrade_device_ptr::<i32>(d.device_ptr(s).0, op.tokens()) };
    let e = gpu.rope(&op, fw, &mut d, Positions::Given(&alias), None).unwrap_err();
    let _ = alias.leak();
    assert!(
        matches!(
            e,
            Error::OutputOverlapsInput { output: Which::LayerOp("qkv"), input: Which::LayerOp("positions"), .. }
        ),
        "{e}"
    );
    assert_eq!(same_bits(&down(&gpu, &d), &x), None, "a refused call wrote");
    // SwiGLU
    let g = SwiGlu::new(7, 24, GluLayout::Halves);
    let gu = s.clone_htod(&random::<bf16>(&mut rng, g.in_elems(), 3.0)).unwrap();
    let mut y = s.clone_htod(&vec![bf16::NAN; g.out_elems()]).unwrap();
    assert!(layer_op(gpu.swiglu(&g.with_ld(47, 24), &gu, &mut y).unwrap_err()));
    let e = gpu.swiglu(&SwiGlu::new(8, 24, GluLayout::Halves), &gu, &mut y).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::LayerOp("gate/up"), .. }), "{e}");
    let mut dgu = s.clone_htod(&vec![bf16::NAN; g.in_elems()]).unwrap();
    let short = s.clone_htod(&vec![bf16::ZERO; g.out_elems() - 1]).unwrap();
    let e = gpu.swiglu_backward(&g, &short, &gu, &mut dgu).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { operand: Which::LayerOp("dy"), .. }), "{e}");
    // SAFETY: as above, the alias (dgu over gu) only reaches a refused call and is forgotten.
    let mut alias = unsafe { s.upgrade_device_ptr::<bf16>(gu.device_ptr(s).0, g.in_elems()) };
    let e = gpu.swiglu_backward(&g, &y, &gu, &mut alias).unwrap_err();
    let _ = alias.leak();
    assert!(matches!(e, Error::OutputOverlapsInput { input: Which::LayerOp("gate/up"), .. }), "{e}");
    assert!(down(&gpu, &y).iter().chain(&down(&gpu, &dgu)).all(|v| v.is_nan()), "a refused call wrote");
    // the engine is usable
    gpu.swiglu(&g, &gu, &mut y).unwrap();
    gpu.rope(&op, fw, &mut d, at0, None).unwrap();
    assert!(down(&gpu, &y).iter().all(|v| v.is_finite()));
}

/// SwiGLU forward and backward of one problem, at an aligned address and one element past it,
/// against the CPU's bits (whole buffers, padding poisoned) and float64 (finite elements).
fn swiglu_case<T: Element + DeviceRepr>(gpu: &Gpu, op: &SwiGlu, rng: &mut StdRng) {
    let s = gpu.stream();
    let mut gu: Vec<T> = random(rng, op.in_elems(), 12.0);
    for (i, special) in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 95.0, -95.0].iter().enumerate() {
        if let Some(v) = gu.get_mut(i * 3) {
            *v = T::from_f64(*special);
        }
    }
    let dy: Vec<T> = random(rng, op.out_elems(), 2.0);
    let (mut y, mut dgu) = (vec![T::from_f64(f64::NAN); op.out_elems()], vec![T::from_f64(f64::NAN); op.in_elems()]);
    cpu::swiglu(op, &gu, &mut y).unwrap();
    cpu::swiglu_backward(op, &dy, &gu, &mut dgu).unwrap();
    for shift in [0usize, 1] {
        let up = |v: &[T], fill: bool| {
            let mut h = vec![T::from_f64(f64::NAN); shift];
            h.extend(v.iter().map(|&x| if fill { T::from_f64(f64::NAN) } else { x }));
            s.clone_htod(&h).unwrap()
        };
        let (gud, dyd) = (up(&gu, false), up(&dy, false));
        let (mut yd, mut dgud) = (up(&y, true), up(&dgu, true));
        gpu.swiglu(op, &gud.slice(shift..), &mut yd.slice_mut(shift..)).unwrap();
        gpu.swiglu_backward(op, &dyd.slice(shift..), &gud.slice(shift..), &mut dgud.slice_mut(shift..)).unwrap();
        for (what, got, want) in [("y", down(gpu, &yd), &y), ("dgu", down(gpu, &dgud), &dgu)] {
            if let Some(i) = same_bits(&got[shift..], want) {
                panic!(
                    "{} {what} shift {shift}: element {i} is {:?}, the CPU's {:?}",
                    op.describe(),
                    got[shift + i],
                    want[i]
                );
            }
        }
    }
    let wide = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let finite = |v: &[f64], w: &[f64]| -> (Vec<f64>, Vec<f64>) {
        v.iter().zip(w).filter(|(_, b)| b.is_finite()).map(|(a, b)| (*a, *b)).unzip()
    };
    let ry = reference::swiglu(op, &wide(&gu));
    let gy: Vec<f64> = (0..op.rows * op.f).map(|k| y[(k / op.f) * op.ld_out + k % op.f].to_f64()).collect();
    let (rdg, rdu) = reference::swiglu_backward(op, &wide(&dy), &wide(&gu));
    let pick = |gate: bool| -> Vec<f64> {
        (0..op.rows * op.f)
            .map(|k| {
                let (g, u) = op.gate_up_index(k / op.f, k % op.f);
                dgu[if gate { g } else { u }].to_f64()
            })
            .collect()
    };
    for (what, got, want) in [("y", gy, ry), ("dg", pick(true), rdg), ("du", pick(false), rdu)] {
        let (a, b) = finite(&got, &want);
        let err = rel_error(&a, &b);
        assert!(err <= band::<T>(), "{} {what}: rel error {err:e} against float64", op.describe());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_gives_the_cpu_bits() {
    let _shared = shared();
    let (gpu, mut rng) = (gpu(), rng());
    for (rows, f) in [(1, 11008), (7, 14336), (7, 1001), (1, 24)] {
        for layout in [GluLayout::Halves, GluLayout::Interleaved] {
            let op = SwiGlu::new(rows, f, layout);
            swiglu_case::<bf16>(&gpu, &op, &mut rng);
            swiglu_case::<f16>(&gpu, &op.with_ld(2 * f + 8, f + 3), &mut rng);
            swiglu_case::<f32>(&gpu, &op, &mut rng);
        }
    }
    // LLaMA-sized rows, one layout each
    swiglu_case::<bf16>(&gpu, &SwiGlu::new(4099, 14336, GluLayout::Halves), &mut rng);
    swiglu_case::<bf16>(&gpu, &SwiGlu::new(4099, 11008, GluLayout::Interleaved), &mut rng);
    swiglu_case::<f16>(&gpu, &SwiGlu::new(4099, 1001, GluLayout::Halves), &mut rng);
}

/// RoPE (device positions), SwiGLU and its backward captured into one graph and launched give
/// the eager calls' bits. cudarc's event tracking is off, as capturing cudarc buffers needs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn captured_layer_calls_replay_the_same_bits() {
    let _exclusive = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let gpu = gpu();
    // SAFETY: every buffer of this test is used on the Gpu's stream only, in order.
    unsafe { gpu.context().disable_event_tracking() };
    let (s, mut rng) = (gpu.stream().clone(), rng());
    let op = Rope::new(2, 33, (32, 8), 128).with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1));
    let g = SwiGlu::new(66, 1024, GluLayout::Halves);
    let x: Vec<bf16> = qkv_values(&op, &mut rng);
    let pos = s.clone_htod(&(0..op.tokens() as i32).map(|p| p * 7).collect::<Vec<_>>()).unwrap();
    let gu = s.clone_htod(&random::<bf16>(&mut rng, g.in_elems(), 6.0)).unwrap();
    let dy = s.clone_htod(&random::<bf16>(&mut rng, g.out_elems(), 2.0)).unwrap();
    let run = |qkv: &mut CudaSlice<bf16>, y: &mut CudaSlice<bf16>, dgu: &mut CudaSlice<bf16>| {
        gpu.rope(&op, RopeDirection::Forward, qkv, Positions::Given(&pos), None)?;
        gpu.swiglu(&g, &gu, y)?;
        gpu.swiglu_backward(&g, &dy, &gu, dgu)
    };
    let fresh = || {
        (s.clone_htod(&x).unwrap(), s.alloc_zeros::<bf16>(g.out_elems()).unwrap(), s.alloc_zeros(g.in_elems()).unwrap())
    };
    let (mut qe, mut ye, mut de) = fresh();
    run(&mut qe, &mut ye, &mut de).unwrap(); // eager, and the kernels compiled
    let (mut qc, mut yc, mut dc) = fresh();
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let r = run(&mut qc, &mut yc, &mut dc);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap();
    assert_eq!(same_bits(&down(&gpu, &qc), &x), None, "the capture ran the rotation");
    graph.unwrap().expect("a graph").launch().unwrap();
    for (what, a, b) in [("qkv", &qc, &qe), ("y", &yc, &ye), ("dgu", &dc, &de)] {
        assert_eq!(same_bits(&down(&gpu, a), &down(&gpu, b)), None, "captured {what}");
    }
}
