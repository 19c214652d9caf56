//! GPU tests of the engine's settings as one value ([`GpuOptions`]): the defaults read back
//! from a new engine, every option given at creation read back, options out of range refused
//! by name at creation and on update (nothing changed), and what an update reports
//! ([`Applied`]: each changed setting and how far it reaches; replay graphs dropped).

mod common;

use common::{gpu, normal, poison, rng};
use gemmbridge::cuda::{library, Backend, Change, ConvApi, ConvSearch, Gpu, GpuOptions, GraphReplay, Padding, Reach};
use gemmbridge::grouped::streams::GroupedBackend;
use gemmbridge::reference::{gemm_rowmajor, rel_error};
use gemmbridge::{Error, GemmProblem, Precision};

/// The device's SM count and the workspace size cuBLASLt's documentation recommends for it.
fn device(gpu: &Gpu) -> (u32, usize) {
    let info = gpu.info().unwrap();
    (info.sm_count as u32, if info.compute_capability.0 >= 9 { 32 << 20 } else { 4 << 20 })
}

/// Options with every setting away from its default.
fn every_option_changed(sms: u32) -> GpuOptions {
    GpuOptions::default()
        .backend(Backend::Blas)
        .workspace_bytes(Some(8 << 20))
        .padding(Padding::off())
        .graph_replay(GraphReplay::default().with_after_calls(3))
        .sm_count_target(Some(sms - 1))
        .check_raw_addresses(true)
        .conv_search(ConvSearch::Measured)
        .conv_api(ConvApi::Legacy)
        .conv_fusion(false)
        .conv_workspace_limit(1 << 20)
        .attention_search(true)
        .grouped_backend(Some(GroupedBackend::StreamPool))
        .grouped_streams(7)
        .plan_cache_capacity(3)
        .norm_fusion(false)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn defaults_and_every_option_read_back() {
    let gpu = gpu();
    let (sms, recommended) = device(&gpu);
    assert_eq!(gpu.options(), GpuOptions::default().workspace_bytes(Some(recommended)));
    let all = every_option_changed(sms);
    assert_ne!(all, GpuOptions::default());
    let made = Gpu::with_options(0, all.clone()).unwrap();
    // without cuBLASLt nothing is replayed or cached: the replay settings and the plan cache's
    // capacity are not kept
    let without_lt = || all.clone().graph_replay(GraphReplay::default()).plan_cache_capacity(4096);
    let want = if library::has_cublaslt() { all.clone() } else { without_lt() };
    assert_eq!(made.options(), want);
    let other = Gpu::with_stream(gpu.stream().clone(), all).unwrap();
    assert_eq!(other.options(), want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn options_out_of_range_are_refused_by_name() {
    let gpu = gpu();
    let (sms, _) = device(&gpu);
    let bad = [
        (GpuOptions::default().sm_count_target(Some(0)), "SM count target", 0),
        (GpuOptions::default().sm_count_target(Some(sms + 1)), "SM count target", u64::from(sms) + 1),
        (GpuOptions::default().grouped_streams(0), "grouped GEMM streams", 0),
        (GpuOptions::default().grouped_streams(17), "grouped GEMM streams", 17),
        (GpuOptions::default().workspace_bytes(Some(usize::MAX)), "workspace bytes", usize::MAX as u64),
    ];
    let before = gpu.options();
    for (options, name, v) in bad {
        match Gpu::with_options(0, options.clone()) {
            Err(Error::OutOfRange { what, value, .. }) => assert_eq!((what, value), (name, v)),
            r => panic!("creation with {name} {v}: {:?}", r.map(|g| g.options())),
        }
        match gpu.update_options(|o| *o = options.clone().backend(Backend::Blas)) {
            Err(Error::OutOfRange { what, value, .. }) => assert_eq!((what, value), (name, v)),
            r => panic!("update with {name} {v}: {r:?}"),
        }
        assert_eq!(gpu.options(), before, "a refused update changes nothing ({name} {v})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_update_says_what_changed_and_how_far_it_reaches() {
    let gpu = gpu();
    let (sms, _) = device(&gpu);
    assert_eq!(gpu.update_options(|_| {}).unwrap().changes, []);
    assert_eq!(gpu.update_options(|o| o.backend = Backend::Auto).unwrap().changes, [], "an unchanged value");

    // a repeated small call is captured into a replay graph on its second call (replay is on)
    let s = gpu.stream().clone();
    let mut rng = rng();
    let (m, n, k) = (32, 48, 64);
    let p = GemmProblem::matmul(m, n, k, Precision::F32).unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (normal(&mut rng, m * k), normal(&mut rng, k * n));
    let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
    let mut want = vec![0.0; m * n];
    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    gemm_rowmajor(&p, 1.0, &wide(&a), &wide(&b), 0.0, &mut want);
    let mut dc = s.alloc_zeros::<f32>(m * n).unwrap();
    let mut run = |gpu: &Gpu| {
        s.memcpy_htod(&poison::<f32>(m * n), &mut dc).unwrap(); // the same address every call
        gpu.gemm(&p, 1.0, &da, &db, 0.0, &mut dc).unwrap();
        let e = rel_error(&wide(&s.clone_dtoh(&dc).unwrap()), &want);
        assert!(e <= 1e-5, "rel error {e:e}");
    };
    for _ in 0..3 {
        run(&gpu);
    }
    let graphs = gpu.plans().graphs();
    assert_eq!(graphs, usize::from(library::has_cublaslt()), "one replay graph of the repeated call");

    let all = every_option_changed(sms);
    let applied = gpu.update_options(|o| *o = all.clone()).unwrap();
    let reach = [
        ("backend", Reach::NextCall),
        ("workspace_bytes", Reach::NewlyMade),
        ("padding", Reach::NextCall),
        ("graph_replay", Reach::GraphsDropped(graphs)),
        ("sm_count_target", Reach::NextCall),
        ("check_raw_addresses", Reach::NextCall),
        ("conv_search", Reach::NewlyMade),
        ("conv_api", Reach::NextCall),
        ("conv_fusion", Reach::NextCall),
        ("conv_workspace_limit", Reach::NewlyMade),
        ("attention_search", Reach::NewlyMade),
        ("grouped_backend", Reach::NextCall),
        ("grouped_streams", Reach::NextCall),
        ("plan_cache_capacity", Reach::NewlyMade),
        ("norm_fusion", Reach::NextCall),
    ];
    // without cuBLASLt the replay settings and the plan cache's capacity are not kept: no change
    let kept = |setting: &str| library::has_cublaslt() || !matches!(setting, "graph_replay" | "plan_cache_capacity");
    let want_changes: Vec<Change> =
        reach.iter().filter(|r| kept(r.0)).map(|&(setting, reach)| Change { setting, reach }).collect();
    assert_eq!(applied.changes, want_changes);
    assert_eq!(gpu.plans().graphs(), 0, "the replay graphs are dropped");
    assert_eq!(gpu.options().sm_count_target, Some(sms - 1));
    // the engine still computes, on cuBLAS with the SM count target
    run(&gpu);

    // and back to the defaults (the workspace size as it is: only new streams would see it)
    let back = gpu.update_options(|o| *o = GpuOptions::default().workspace_bytes(Some(8 << 20))).unwrap();
    assert_eq!(back.changes.len(), want_changes.len() - 1, "{back:?}");
    assert_eq!(back.reach("workspace_bytes"), None);
    assert_eq!(gpu.options(), GpuOptions::default().workspace_bytes(Some(8 << 20)));
    run(&gpu);
}
