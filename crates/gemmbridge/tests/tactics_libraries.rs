//! The tactic database beyond cuBLASLt: cuDNN's engines and algorithms with their library
//! version and identity, inconsistent entries, retired entries, and the grouped GEMM's choice.

mod tactics_common;

use gemmbridge::cuda::tactics::{Choice, Identity, Library, ProblemKind, Tactic, TacticDb};
use gemmbridge::grouped::streams::GroupedBackend;
use tactics_common::{identity, tactic, tactic_of, tmp, V1_KEY};

/// This machine with cuDNN 9.19 loaded.
fn with_cudnn() -> Identity {
    Identity { cudnn: Some(91900), ..identity() }
}

const CONV_KEY: &str = "conv2d fwd_bias_relu n32 c64 h56 w56 k64 r3 s3 stride1,1 pad1,1 dil1,1 g1 nhwc bf16 graph al16";

/// A graph-API convolution tactic tuned with cuDNN `version`.
fn engine_tactic(version: usize, engine: i64, ms: f64) -> Tactic {
    let choice =
        Choice::CudnnEngine { engine, knobs: vec![(14, 3), (2, 17), (25, 0)], workspace: 4096, unfused: false };
    Tactic::cudnn_conv(choice, version, 1.0, ms)
}

/// A legacy-API convolution tactic tuned with cuDNN `version`.
fn algo_tactic(version: usize, algo: u32, ms: f64) -> Tactic {
    Tactic::cudnn_conv(Choice::CudnnAlgo { algo, math: 1, workspace: 512 }, version, 2.0, ms)
}

#[test]
fn cudnn_choices_and_identity_round_trip_with_their_fields() {
    let path = tmp("cudnn-fields");
    let mut db = TacticDb::new(with_cudnn());
    db.entries.insert(CONV_KEY.into(), engine_tactic(91900, 12, 0.5));
    let legacy = "conv2d dgrad n32 c64 h56 w56 k64 r3 s3 stride1,1 pad1,1 dil1,1 g1 nchw f16 legacy alany";
    db.entries.insert(legacy.into(), algo_tactic(91900, 1, 0.25));
    db.entries.insert(V1_KEY.into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["identity"]["cudnn"], 91900);
    let e = &json["entries"][CONV_KEY];
    assert_eq!(
        (e["library"].as_str(), e["kind"].as_str(), e["version"].as_u64()),
        (Some("cudnn"), Some("conv2d"), Some(91900))
    );
    assert_eq!(
        e["choice"],
        serde_json::json!({"type": "cudnn_engine", "engine": 12, "knobs": [[14, 3], [2, 17], [25, 0]], "workspace": 4096, "unfused": false})
    );
    let e = &json["entries"][legacy];
    assert_eq!(e["choice"], serde_json::json!({"type": "cudnn_algo", "algo": 1, "math": 1, "workspace": 512}));
    assert_eq!((e["heuristic_ms"].as_f64(), e["tuned_ms"].as_f64()), (Some(2.0), Some(0.25)));
    let (back, warnings) = TacticDb::load(&path, &with_cudnn());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back, db);
    assert_eq!(back.identity.version(Library::Cudnn), Some(91900));
    assert_eq!(back.entries[CONV_KEY].lt_algo(), None);
    // `unfused` may be absent: false
    let short = text.replace(",\n        \"unfused\": false", "");
    assert!(!short.contains("unfused"), "{short}");
    std::fs::write(&path, short).unwrap();
    let (back, warnings) = TacticDb::load(&path, &with_cudnn());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back.entries[CONV_KEY], db.entries[CONV_KEY]);
}

/// Files without the `cudnn` identity field (every file before the convolutions were tuned,
/// the repository's included) still load; a file with it loads under an identity without it.
#[test]
fn files_with_and_without_the_cudnn_identity_field_load() {
    let path = tmp("cudnn-identity");
    let mut db = TacticDb::new(identity());
    db.entries.insert(V1_KEY.into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("cudnn"), "no cuDNN version, no field: {text}");
    for id in [identity(), with_cudnn()] {
        let (back, warnings) = TacticDb::load(&path, &id);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back.entries.len(), 1);
        assert_eq!(back.identity, id);
    }
    let parsed: TacticDb = serde_json::from_str(&text).unwrap();
    assert_eq!((parsed.identity.cudnn, parsed.identity.version(Library::Cudnn)), (None, None));
    assert_eq!(parsed.identity.version(Library::CublasLt), Some(130100));

    let mut db = TacticDb::new(with_cudnn());
    db.entries.insert(CONV_KEY.into(), engine_tactic(91900, 12, 0.5));
    db.entries.insert(V1_KEY.into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    assert!(std::fs::read_to_string(&path).unwrap().contains("\"cudnn\": 91900"));
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), [V1_KEY]);
    let (back, _) = TacticDb::load(&path, &with_cudnn());
    assert_eq!(back.entries.len(), 2);
}

#[test]
fn cudnn_entries_of_another_version_are_stale_and_kept() {
    let path = tmp("cudnn-stale");
    let mut db = TacticDb::new(with_cudnn());
    db.entries.insert(CONV_KEY.into(), engine_tactic(91900, 12, 0.5));
    db.entries.insert("conv2d fwd old-a graph al16".into(), engine_tactic(91400, 3, 0.5));
    db.entries.insert("conv2d fwd old-b legacy alany".into(), algo_tactic(90100, 2, 0.5));
    db.entries.insert("old gemm".into(), tactic_of(120900, 0.5, 2));
    db.entries.insert(V1_KEY.into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    let (back, warnings) = TacticDb::load(&path, &with_cudnn());
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), [V1_KEY, CONV_KEY]);
    assert_eq!(warnings.len(), 2, "one per library: {warnings:?}");
    let conv = warnings.iter().find(|w| w.contains("cuDNN")).expect("a cuDNN warning");
    for word in ["stale", "2 entries", "cuDNN 90100, 91400", "this is cuDNN 91900"] {
        assert!(conv.contains(word), "{word}: {conv}");
    }
    assert!(warnings.iter().any(|w| w.contains("cuBLASLt 120900")), "{warnings:?}");
    // the stale entries stay in the file through a save of what was loaded
    back.save(&path).unwrap();
    let (theirs, warnings) = TacticDb::load(&path, &Identity { cudnn: Some(91400), ..identity() });
    assert!(theirs.entries.contains_key("conv2d fwd old-a graph al16") && !theirs.entries.contains_key(CONV_KEY));
    assert!(warnings.iter().any(|w| w.contains("cuDNN 90100, 91900")), "{warnings:?}");
    // a faster tuning of the same version replaces an entry, a slower one does not
    let mut faster = TacticDb::new(with_cudnn());
    faster.entries.insert(CONV_KEY.into(), engine_tactic(91900, 40, 0.25));
    faster.save(&path).unwrap();
    let mut slower = TacticDb::new(with_cudnn());
    slower.entries.insert(CONV_KEY.into(), engine_tactic(91900, 41, 0.75));
    slower.save(&path).unwrap();
    let (now, _) = TacticDb::load(&path, &with_cudnn());
    assert!(
        matches!(now.entries[CONV_KEY].choice, Choice::CudnnEngine { engine: 40, .. }),
        "{:?}",
        now.entries[CONV_KEY]
    );
}

/// Entries whose library, kind, choice and key disagree cannot come from this crate: load
/// leaves them out with an "inconsistent" warning, save refuses them.
#[test]
fn inconsistent_entries_are_left_out_and_never_saved() {
    let lt_under_cudnn_copy = || Tactic { library: Library::Cudnn, version: 91900, ..tactic(0.5, 2) };
    let attention_engine = |unfused: bool| {
        let choice = Choice::CudnnEngine { engine: 2, knobs: vec![(24, 7)], workspace: 256, unfused };
        Tactic::cudnn_attention(choice, 91900, 1.0, 0.9)
    };
    let path = tmp("inconsistent");
    let good_gemm = tactic(0.5, 1);
    let mut lt_under_cudnn = tactic(0.5, 2);
    (lt_under_cudnn.library, lt_under_cudnn.kind, lt_under_cudnn.version) =
        (Library::Cudnn, ProblemKind::Conv2d, 91900);
    let mut conv_as_gemm = engine_tactic(91900, 3, 0.5);
    conv_as_gemm.kind = ProblemKind::Gemm;
    let cases: Vec<(&str, Tactic)> = vec![
        ("conv2d lt-algo graph al16", lt_under_cudnn),
        ("conv2d kind-gemm graph al16", conv_as_gemm),
        ("conv2d legacy-choice graph al16", algo_tactic(91900, 2, 0.5)),
        ("conv2d engine-choice legacy alany", engine_tactic(91900, 3, 0.5)),
        ("NN gemm-key-for-a-conv", engine_tactic(91900, 3, 0.5)),
        ("conv2d gemm-under-a-conv-key", good_gemm.clone()),
        ("attention lt-algo", Tactic { kind: ProblemKind::Attention, ..lt_under_cudnn_copy() }),
        ("attention unfused-engine", attention_engine(true)),
        ("conv2d attention-kind graph al16", attention_engine(false)),
        ("NN grouped-choice-under-a-gemm-key", Tactic::grouped(GroupedBackend::StreamPool, 130100, 1.0, 0.9)),
        ("grouped_gemm forward e2 n8 k8 m8 skew0 bf16", good_gemm.clone()),
    ];
    for (key, t) in cases {
        let mut db = TacticDb::new(with_cudnn());
        db.entries.insert(V1_KEY.into(), good_gemm.clone());
        db.entries.insert(key.into(), t.clone());
        let e = db.save(&path).unwrap_err();
        assert!(e.kind() == std::io::ErrorKind::InvalidInput && e.to_string().contains(key), "{key}: {e}");
        // written by hand (as another tool might), then loaded
        let text = serde_json::to_string(&db).unwrap();
        std::fs::write(&path, text).unwrap();
        let (back, warnings) = TacticDb::load(&path, &with_cudnn());
        assert_eq!(back.entries.keys().collect::<Vec<_>>(), [V1_KEY], "{key}");
        assert!(warnings.len() == 1 && warnings[0].contains("inconsistent"), "{key}: {warnings:?}");
    }
}

/// `save_dropping` removes the selected entries from the file on disk as well as from the
/// database being saved, under the lock: the way `tune` retires an entry that only held the
/// heuristic's choice, while an entry that beat the heuristic stays.
#[test]
fn save_dropping_retires_entries_on_disk() {
    let path = tmp("dropping");
    let mut db = TacticDb::new(identity());
    db.entries.insert("pinned".into(), Tactic::lt_gemm([1; 8], 0, 130100, 0.5, 0.5));
    db.entries.insert("better".into(), Tactic::lt_gemm([2; 8], 0, 130100, 0.5, 0.4));
    db.save(&path).unwrap();
    // a later process knows none of them, finds nothing better for either, and retires
    // heuristic-only entries of those signatures
    let later = TacticDb::new(identity());
    let heuristic_only = |_: &str, t: &Tactic| t.tuned_ms == t.heuristic_ms;
    later.save_dropping(&path, &heuristic_only).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), vec!["better"]);
    // a plain save keeps everything
    db.save(&path).unwrap();
    assert_eq!(TacticDb::load(&path, &identity()).0.entries.len(), 2);
}

/// A grouped GEMM's measured way is stored under its problem's signature and read back as it
/// was written (the file names the way in words).
#[test]
fn a_grouped_choice_round_trips() {
    use gemmbridge::grouped::{GroupedOp, GroupedProblem};
    let path = tmp("grouped");
    let p =
        GroupedProblem::new(GroupedOp::Forward, &[700, 0, 60, 264], 768, 2048, gemmbridge::Precision::BF16).unwrap();
    let t = Tactic::grouped(GroupedBackend::StreamPool, 130100, 0.38, 0.30);
    assert_eq!(t.grouped_backend(), Some(GroupedBackend::StreamPool));
    let mut db = TacticDb::new(identity());
    db.entries.insert(p.signature(), t.clone());
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(r#""type": "grouped_backend""#) && text.contains(r#""backend": "stream_pool""#), "{text}");
    assert!(text.contains(r#""kind": "grouped_gemm""#), "{text}");
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back.entries.get(&p.signature()), Some(&t));
}

/// cuDNN entries under an identity that records no cuDNN version (libcudnn not installed):
/// load leaves them out (silently: they are not wrong) and save keeps them.
#[test]
fn entries_of_a_library_without_a_current_version_are_kept_but_not_loaded() {
    let path = tmp("cudnn");
    let mut db = TacticDb::new(identity());
    let conv = engine_tactic(91000, 7, 0.5);
    assert_eq!((conv.library, conv.kind), (Library::Cudnn, ProblemKind::Conv2d));
    db.entries.insert("conv2d n1 c64 graph al16".into(), conv.clone());
    db.entries.insert("gemm".into(), tactic(0.5, 2));
    db.save(&path).unwrap();
    assert!(std::fs::read_to_string(&path).unwrap().contains("\"library\": \"cudnn\""));
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), ["gemm"]);
    assert_eq!(conv.lt_algo(), None);
    back.save(&path).unwrap();
    assert!(std::fs::read_to_string(&path).unwrap().contains("\"conv2d n1 c64 graph al16\""));
}
