//! GPU tests of the cuBLASLt engine: every fused epilogue against the f64 reference of the
//! unfused computation, misaligned bias, graph capture and prewarm (autotuning:
//! `gpu_lt_tune.rs`).

mod common;
mod lt_common;

use common::{gpu, gpu_with, normal, poison, rng, Case};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, DevicePtrMut, DeviceRepr};
use gemmbridge::cuda::{
    Backend, Change, Extras, Gpu, GpuOptions, GraphReplay, Padding, RawBuffer, RawOperands, Reach, Scale,
};
use lt_common::{error_vs_reference, exclusive, raw, shared, wide, RawExtras};

use gemmbridge::epilogue::{AuxUse, VectorUse};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::{gemm_epilogue_rowmajor, rel_error};
use gemmbridge::{Element, Epilogue, Error, GemmProblem, MatrixLayout, Op, Precision};

/// Runs one epilogue case; returns the worst relative error over C and the epilogue's
/// outputs, or the library's error.
fn epilogue_case<TI: Element + DeviceRepr, TO: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &GemmProblem,
    misaligned_bias: bool,
) -> Result<f64, Error> {
    let mut rng = rng();
    let s = gpu.stream();
    let e = p.epilogue();
    let n_a = p.a().layout.required_elems(p.batch()).unwrap();
    let n_b = p.b().layout.required_elems(p.batch()).unwrap();
    let n_c = p.c().required_elems(p.batch()).unwrap();
    let n_aux = p.aux().required_elems(p.batch()).unwrap();
    let a: Vec<TI> = normal(&mut rng, n_a);
    let b: Vec<TI> = normal(&mut rng, n_b);
    let vec_in: Vec<TO> = normal(&mut rng, p.vector_len());
    let aux_in: Vec<TO> = normal(&mut rng, n_aux);
    // f64 reference on the rounded values
    let mut c_ref = vec![0.0; n_c];
    let mut vec_ref = wide(&vec_in);
    let mut aux_ref = wide(&aux_in);
    gemm_epilogue_rowmajor(
        p,
        (1.0, 0.0),
        [&wide(&a), &wide(&b)],
        &mut c_ref,
        (e.vector() != VectorUse::None).then_some(&mut vec_ref[..]),
        (e.aux() != AuxUse::None).then_some(&mut aux_ref[..]),
    );
    let da = s.clone_htod(&a).unwrap();
    let db = s.clone_htod(&b).unwrap();
    let mut dc = s.clone_htod(&poison::<TO>(n_c)).unwrap();
    // a bias one element into a larger buffer is 2 or 4 bytes off 16-byte alignment
    let off = usize::from(misaligned_bias);
    let mut vec_host = poison::<TO>(p.vector_len() + off);
    if e.vector() == VectorUse::ReadsBias {
        vec_host[off..].copy_from_slice(&vec_in);
    }
    let mut dv: CudaSlice<TO> = s.clone_htod(&vec_host).unwrap();
    let mut dx: CudaSlice<TO> =
        s.clone_htod(&if e.aux() == AuxUse::Reads { aux_in.clone() } else { poison::<TO>(n_aux) }).unwrap();
    {
        let view;
        let mut view_mut;
        let mut ex = Extras::default();
        match e.vector() {
            VectorUse::ReadsBias => {
                view = dv.slice(off..);
                ex.bias = Some(&view);
            }
            VectorUse::WritesGrad => {
                view_mut = dv.slice_mut(off..);
                ex.bias_grad = Some(&mut view_mut);
            }
            VectorUse::None => {}
        }
        match e.aux() {
            AuxUse::Reads => ex.aux_in = Some(&dx),
            AuxUse::Writes => ex.aux_out = Some(&mut dx),
            AuxUse::None => {}
        }
        gpu.gemm_fused(p, Scale::PRODUCT, &da, &db, &mut dc, ex)?;
    }
    let gather = |v: &[TO], l: MatrixLayout| wide(&l.gather(v, p.batch()));
    let c = s.clone_dtoh(&dc).unwrap();
    let mut err = rel_error(&gather(&c, p.c()), &p.c().gather(&c_ref, p.batch()));
    if e.vector() == VectorUse::WritesGrad {
        let v = s.clone_dtoh(&dv).unwrap();
        err = err.max(rel_error(&wide(&v[off..]), &vec_ref));
    }
    if e.aux() == AuxUse::Writes {
        let x = s.clone_dtoh(&dx).unwrap();
        err = err.max(rel_error(&gather(&x, p.aux()), &p.aux().gather(&aux_ref, p.batch())));
    }
    Ok(err)
}

fn all_epilogues<TI: Element + DeviceRepr, TO: Element + DeviceRepr>(
    precision: Precision,
    replay: GraphReplay,
    padding: Padding,
) {
    let (_shared, _exclusive) = if replay.enabled { (None, Some(exclusive())) } else { (Some(shared()), None) };
    let gpu = gpu_with(GpuOptions::default().graph_replay(replay).padding(padding));
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    let mut cases = 0;
    for e in Epilogue::ALL {
        for case in [
            Case { m: 64, n: 128, k: 256, op_a: Op::N, op_b: Op::T, pad: 0, batch: 1 }, // linear
            Case { m: 33, n: 72, k: 17, op_a: Op::N, op_b: Op::N, pad: 0, batch: 1 },   // matmul, odd m
            Case { m: 128, n: 64, k: 96, op_a: Op::T, op_b: Op::N, pad: 8, batch: 1 },  // dW-like, padded
            Case { m: 40, n: 48, k: 32, op_a: Op::N, op_b: Op::T, pad: 0, batch: 3 },   // batched
            Case { m: 96, n: 77, k: 45, op_a: Op::N, op_b: Op::T, pad: 0, batch: 1 },   // odd n and k
            Case { m: 24, n: 33, k: 21, op_a: Op::T, op_b: Op::N, pad: 0, batch: 1 },   // odd m, n, k
        ] {
            if case.batch > 1 && e.vector() == VectorUse::WritesGrad {
                continue; // rejected by design (EpilogueBatch), tested on the CPU
            }
            for misaligned in [false, true] {
                if misaligned && e.vector() == VectorUse::None {
                    continue;
                }
                let p = case.problem(precision).with_epilogue(e).unwrap();
                cases += 1;
                match epilogue_case::<TI, TO>(&gpu, &p, misaligned) {
                    Ok(err) if err <= precision.tolerance() => worst = worst.max(err),
                    Ok(err) => {
                        failures.push(format!("{e} misaligned={misaligned} {}: rel error {err:e}", p.describe()))
                    }
                    Err(err) => failures.push(format!("{e} misaligned={misaligned} {}: {err}", p.describe())),
                }
            }
        }
    }
    eprintln!("{precision}: {cases} epilogue cases, worst rel error {worst:e}, {} replay graphs", gpu.plans().graphs());
    if replay.enabled && replay.after_calls == 1 {
        // every case without a staged bias is served by a graph captured on its first call
        assert!(gpu.plans().graphs() > 0, "no replay graph in {cases} cases");
    }
    for f in &failures {
        eprintln!("{f}");
    }
    assert!(failures.is_empty(), "{} of {cases} failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_f32() {
    all_epilogues::<f32, f32>(Precision::F32, GraphReplay::off(), Padding::default());
}

/// The same cases, each served by a graph captured on its first call (graph replay).
#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_f32_replayed() {
    all_epilogues::<f32, f32>(Precision::F32, GraphReplay::default().with_after_calls(1), Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_f16() {
    all_epilogues::<f16, f16>(Precision::F16, GraphReplay::off(), Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_bf16() {
    all_epilogues::<bf16, bf16>(Precision::BF16, GraphReplay::off(), Padding::default());
}

/// The same cases, each served by a graph captured on its first call (graph replay).
#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_bf16_replayed() {
    all_epilogues::<bf16, bf16>(Precision::BF16, GraphReplay::default().with_after_calls(1), Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_bf16_f32out() {
    all_epilogues::<bf16, f32>(Precision::BF16_F32OUT, GraphReplay::off(), Padding::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_padded() {
    // every epilogue on aligned copies of the misaligned operands (odd n, k, m; padded lds)
    let always = Padding::default().with_min_macs(0, 0, 0);
    all_epilogues::<f32, f32>(Precision::F32, GraphReplay::off(), always);
    all_epilogues::<f16, f16>(Precision::F16, GraphReplay::off(), always);
    all_epilogues::<bf16, bf16>(Precision::BF16, GraphReplay::off(), always);
    all_epilogues::<bf16, f32>(Precision::BF16_F32OUT, GraphReplay::off(), always);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn blas_backend_refuses_epilogues() {
    let _lock = shared();
    let gpu = gpu();
    gpu.update_options(|o| o.backend = Backend::Blas).unwrap();
    let p = GemmProblem::linear(8, 8, 8, Precision::F32).unwrap().with_epilogue(Epilogue::Relu).unwrap();
    let s = gpu.stream();
    let a = s.clone_htod(&[1.0f32; 64]).unwrap();
    let mut c = s.clone_htod(&[0.0f32; 64]).unwrap();
    let e = gpu.gemm(&p, 1.0, &a, &a, 0.0, &mut c).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // a missing bias is named
    gpu.update_options(|o| o.backend = Backend::Auto).unwrap();
    let p = p.with_epilogue(Epilogue::Bias).unwrap();
    let e = gpu.gemm(&p, 1.0, &a, &a, 0.0, &mut c).unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { operand: "bias", .. }), "{e}");
    // an operand the epilogue writes cannot be passed read-only
    let grad = s.clone_htod(&[7.0f32; 8]).unwrap();
    let g = p.with_epilogue(Epilogue::BiasGradB).unwrap();
    let e = gpu
        .gemm_fused(&g, Scale::PRODUCT, &a, &a, &mut c, Extras { bias: Some(&grad), ..Extras::default() })
        .unwrap_err();
    assert!(matches!(e, Error::EpilogueOperand { operand: "bias", .. }), "{e}");
    assert_eq!(s.clone_dtoh(&grad).unwrap(), vec![7.0f32; 8]);
}

/// A bf16 GELU_BIAS linear m×n×k for the capture tests: host operands, their device
/// copies, C poisoned, and the raw buffers of a call on `s` (raw API: cudarc's event tracking
/// on the safe API's buffers does not work inside a capture).
struct GeluBiasCall {
    p: GemmProblem,
    a: Vec<bf16>,
    w: Vec<bf16>,
    bias: Vec<bf16>,
    /// A, W and the bias on the device, alive as long as the raw buffers are used.
    _device: [CudaSlice<bf16>; 3],
    dc: CudaSlice<bf16>,
    ra: RawBuffer,
    rw: RawBuffer,
    rc: RawBuffer,
    extras: RawExtras,
}

fn gelu_bias_call(s: &std::sync::Arc<cudarc::driver::CudaStream>, (m, n, k): (usize, usize, usize)) -> GeluBiasCall {
    let mut rng = rng();
    let p = GemmProblem::linear(m, n, k, Precision::BF16).unwrap().with_epilogue(Epilogue::GeluBias).unwrap();
    let a: Vec<bf16> = normal(&mut rng, m * k);
    let w: Vec<bf16> = normal(&mut rng, n * k);
    let bias: Vec<bf16> = normal(&mut rng, n);
    let (da, dw, dbias) = (s.clone_htod(&a).unwrap(), s.clone_htod(&w).unwrap(), s.clone_htod(&bias).unwrap());
    let mut dc = s.clone_htod(&poison::<bf16>(m * n)).unwrap();
    let (ra, rw, rb) = (raw(&da, s), raw(&dw, s), raw(&dbias, s));
    let rc = RawBuffer { address: dc.device_ptr_mut(s).0, len_bytes: m * n * 2 };
    let extras = RawExtras { bias: Some(rb), aux: None };
    GeluBiasCall { p, a, w, bias, _device: [da, dw, dbias], dc, ra, rw, rc, extras }
}

/// A call whose plan is not cached fails capture with a named error; once cached (here by
/// prewarm), 64 calls captured into one graph replay with the right result.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_capture_after_prewarm() {
    let _lock = exclusive();
    let gpu = gpu();
    let s = gpu.stream().clone();
    let call = gelu_bias_call(&s, (64, 96, 80));
    // thread-local: other tests run on other threads of this process meanwhile, and global
    // mode would forbid their allocations
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    // SAFETY: buffers of this context, alive for the whole test, used on `s` only.
    let e = unsafe {
        gpu.gemm_raw(
            &call.p,
            Scale::PRODUCT,
            RawOperands {
                a: call.ra,
                b: call.rw,
                c: call.rc,
                bias: call.extras.bias,
                aux: call.extras.aux,
                c_in: None,
            },
            s.cu_stream(),
        )
    }
    .unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");

    let err = prewarm_capture_replay(&gpu, call, 64);
    assert!(err <= 1e-2, "graph replay: {err:e}");
}

/// Prewarms `call`'s problem, captures `n` of its calls on the Gpu's stream (thread-local
/// mode), launches the graph, and returns C's error against the f64 reference.
fn prewarm_capture_replay(gpu: &Gpu, call: GeluBiasCall, n: usize) -> f64 {
    let GeluBiasCall { p, a, w, bias, dc, ra, rw, rc, extras, _device } = call;
    let s = gpu.stream();
    gpu.prewarm(&[p]).unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for _ in 0..n {
        // SAFETY: buffers of this context, alive until the end of this function, used on `s` only.
        unsafe {
            gpu.gemm_raw(
                &p,
                Scale::PRODUCT,
                RawOperands { a: ra, b: rw, c: rc, bias: extras.bias, aux: extras.aux, c_in: None },
                s.cu_stream(),
            )
        }
        .unwrap();
    }
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    graph.launch().unwrap();
    s.synchronize().unwrap();
    error_vs_reference(&p, 1.0, &s.clone_dtoh(&dc).unwrap(), (&a, &w), Some(&bias))
}

/// A misaligned call (odd n and k: A, W and C copied) on aligned copies is capturable after
/// prewarm too: the copies, the scratch from the stream-ordered pool and the GEMM all land in
/// the graph, and its replay gives the right result.
#[test]
#[ignore = "needs a CUDA GPU"]
fn padded_call_captures_after_prewarm() {
    let _lock = exclusive();
    let gpu = gpu();
    gpu.update_options(|o| o.padding = Padding::default().with_min_macs(0, 0, 0)).unwrap();
    let call = gelu_bias_call(gpu.stream(), (64, 95, 79));
    let err = prewarm_capture_replay(&gpu, call, 8);
    assert!(err <= 1e-2, "padded graph replay: {err:e}");
}

/// Graph replay (on by default) gives the direct call's result: it reads the operands' current
/// contents, honours a new α and a new output buffer (each a new graph), and is dropped when
/// switched off.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_matches_direct_calls() {
    let _lock = exclusive();
    let gpu = gpu();
    let mut rng = rng();
    let s = gpu.stream().clone();
    let (m, n, k) = (48, 80, 64);
    let p = GemmProblem::linear(m, n, k, Precision::F16).unwrap().with_epilogue(Epilogue::Bias).unwrap();
    let w: Vec<f16> = normal(&mut rng, n * k);
    let bias: Vec<f16> = normal(&mut rng, n);
    let (dw, dbias) = (s.clone_htod(&w).unwrap(), s.clone_htod(&bias).unwrap());
    let mut da = s.clone_htod(&normal::<f16>(&mut rng, m * k)).unwrap();
    let mut outs = [s.alloc_zeros::<f16>(m * n).unwrap(), s.alloc_zeros::<f16>(m * n).unwrap()];
    assert!(gpu.options().graph_replay.enabled, "replay is on by default");
    // (alpha, output buffer, graphs expected after the call)
    let calls =
        [(1.0, 0, 0), (1.0, 0, 1), (1.0, 0, 1), (1.0, 0, 1), (0.5, 0, 1), (0.5, 0, 2), (0.5, 1, 2), (0.5, 1, 3)];
    for (i, &(alpha, o, graphs)) in calls.iter().enumerate() {
        let a: Vec<f16> = normal(&mut rng, m * k); // new contents, same address
        s.memcpy_htod(&a, &mut da).unwrap();
        s.memcpy_htod(&poison::<f16>(m * n), &mut outs[o]).unwrap();
        let ex = Extras { bias: Some(&dbias), ..Extras::default() };
        gpu.gemm_fused(&p, Scale::new(alpha, 0.0), &da, &dw, &mut outs[o], ex).unwrap();
        let err = error_vs_reference(&p, alpha as f64, &s.clone_dtoh(&outs[o]).unwrap(), (&a, &w), Some(&bias));
        assert!(err <= 1e-2, "call {i} (alpha {alpha}, output {o}): rel error {err:e}");
        assert_eq!(gpu.plans().graphs(), graphs, "graphs after call {i}");
    }
    // turning replay off drops the three graphs and says so
    let applied = gpu.update_options(|o| o.graph_replay = GraphReplay::off()).unwrap();
    assert_eq!(applied.changes, [Change { setting: "graph_replay", reach: Reach::GraphsDropped(3) }]);
    assert_eq!(gpu.plans().graphs(), 0);
    for _ in 0..3 {
        gpu.gemm_fused(&p, Scale::PRODUCT, &da, &dw, &mut outs[0], Extras { bias: Some(&dbias), ..Extras::default() })
            .unwrap();
    }
    assert_eq!(gpu.plans().graphs(), 0, "replay off caches nothing");
}

/// A call whose graph is cached is captured as a direct call when the caller's stream is being
/// captured (a graph is never launched into a capture), and the caller's graph is right. Raw
/// API: cudarc's event tracking on the safe API's buffers does not work inside a capture.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_steps_aside_during_capture() {
    let _lock = exclusive();
    let gpu = gpu();
    let s = gpu.stream().clone();
    // `_device` is bound (not `..`): the device buffers live to the end of the test
    let GeluBiasCall { p, a, w, bias, mut dc, ra, rw, rc, extras, _device } = gelu_bias_call(&s, (64, 96, 80));
    // SAFETY: buffers of this context, alive for the whole test, used on `s` only.
    let call = || unsafe {
        gpu.gemm_raw(
            &p,
            Scale::PRODUCT,
            RawOperands { a: ra, b: rw, c: rc, bias: extras.bias, aux: extras.aux, c_in: None },
            s.cu_stream(),
        )
    };
    call().unwrap();
    call().unwrap();
    assert_eq!(gpu.plans().graphs(), 1);
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let captured = (0..3).try_for_each(|_| call());
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    captured.unwrap();
    let graph = graph.unwrap().expect("a graph");
    s.memcpy_htod(&poison::<bf16>(64 * 96), &mut dc).unwrap();
    graph.launch().unwrap();
    let err = error_vs_reference(&p, 1.0, &s.clone_dtoh(&dc).unwrap(), (&a, &w), Some(&bias));
    assert!(err <= 1e-2, "caller's graph: {err:e}");
    assert_eq!(gpu.plans().graphs(), 1);

    // A call first made twice inside the caller's capture (a new key: another α) falls due
    // there; nothing is captured then, and the next call outside the capture captures it.
    // SAFETY: as `call`.
    let call2 = || unsafe {
        gpu.gemm_raw(
            &p,
            Scale::new(0.5, 0.0),
            RawOperands { a: ra, b: rw, c: rc, bias: extras.bias, aux: extras.aux, c_in: None },
            s.cu_stream(),
        )
    };
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let captured = (0..2).try_for_each(|_| call2());
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    captured.unwrap();
    let graph = graph.unwrap().expect("a graph");
    assert_eq!(gpu.plans().graphs(), 1, "nothing captured into the caller's capture");
    s.memcpy_htod(&poison::<bf16>(64 * 96), &mut dc).unwrap();
    graph.launch().unwrap();
    let err = error_vs_reference(&p, 0.5, &s.clone_dtoh(&dc).unwrap(), (&a, &w), Some(&bias));
    assert!(err <= 1e-2, "caller's second graph: {err:e}");
    s.memcpy_htod(&poison::<bf16>(64 * 96), &mut dc).unwrap();
    call2().unwrap();
    assert_eq!(gpu.plans().graphs(), 2, "the postponed capture happens on the next eager call");
    let err = error_vs_reference(&p, 0.5, &s.clone_dtoh(&dc).unwrap(), (&a, &w), Some(&bias));
    assert!(err <= 1e-2, "first replayed call after the caller's capture: {err:e}");
}
