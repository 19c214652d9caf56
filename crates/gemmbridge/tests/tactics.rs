//! The tactic database survives what happens to files: truncation, another GPU's file, a
//! stale cuBLASLt version, garbage, and several writers at once.

use std::path::{Path, PathBuf};

use gemmbridge::cuda::tactics::{m_bucket, Choice, Identity, Library, ProblemKind, Tactic, TacticDb, FORMAT};
use gemmbridge::grouped::streams::GroupedBackend;

fn identity() -> Identity {
    Identity { gpu: "NVIDIA H200".into(), sm: "9.0".into(), cublaslt: 130100, cudnn: None }
}

/// A cuBLASLt GEMM tactic of this machine's cuBLASLt (130100).
fn tactic(ms: f64, tag: u64) -> Tactic {
    tactic_of(130100, ms, tag)
}

/// A cuBLASLt GEMM tactic tuned with cuBLASLt `version`.
fn tactic_of(version: usize, ms: f64, tag: u64) -> Tactic {
    Tactic::lt_gemm([tag, 1, 2, 3, 4, 5, 6, 7], 1024, version, 1.0, ms)
}

/// A fresh directory's `db.json`, unique to this call (tests run in parallel and several use
/// the same name).
fn tmp(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gemmbridge-tactics-{}-{name}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("db.json")
}

#[test]
fn round_trip() {
    let path = tmp("round");
    let mut db = TacticDb::new(identity());
    db.entries.insert("sig-a".into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back, db);
    assert_eq!(back.format, FORMAT);
}

#[test]
fn missing_file_is_empty_without_warning() {
    let (db, warnings) = TacticDb::load(&tmp("missing"), &identity());
    assert!(db.entries.is_empty() && warnings.is_empty());
}

#[test]
fn truncated_file_is_ignored_with_warning() {
    let path = tmp("trunc");
    let mut db = TacticDb::new(identity());
    db.entries.insert("sig-a".into(), tactic(0.5, 1));
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(back.entries.is_empty());
    assert!(warnings.len() == 1 && warnings[0].contains("corrupt"), "{warnings:?}");
    std::fs::write(&path, [0xff, 0x00, 0x13]).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(back.entries.is_empty() && warnings.len() == 1, "{warnings:?}");
}

#[test]
fn foreign_and_stale_files_are_ignored_with_warning() {
    let path = tmp("foreign");
    let mut other = TacticDb::new(Identity {
        gpu: "NVIDIA A100-SXM4-80GB".into(),
        sm: "8.0".into(),
        cublaslt: 130100,
        cudnn: None,
    });
    other.entries.insert("sig-a".into(), tactic(0.5, 1));
    other.save(&path).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(back.entries.is_empty());
    assert!(warnings[0].contains("foreign"), "{warnings:?}");

    let path = tmp("stale");
    let mut old = TacticDb::new(Identity { cublaslt: 120900, ..identity() });
    old.entries.insert("sig-a".into(), tactic_of(120900, 0.5, 1));
    old.save(&path).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(back.entries.is_empty());
    assert!(warnings[0].contains("stale"), "{warnings:?}");

    let path = tmp("format");
    let mut text = serde_json_like(&TacticDb::new(identity()));
    text = text.replace(&format!("\"format\": {FORMAT}"), "\"format\": 999");
    std::fs::write(&path, text).unwrap();
    let (_, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings[0].contains("stale"), "{warnings:?}");
}

fn serde_json_like(db: &TacticDb) -> String {
    let path = tmp("serialise");
    db.save(&path).unwrap();
    std::fs::read_to_string(path).unwrap()
}

/// Eight writers (separate open file descriptions, so the lock really contends) each save
/// their own entry and one shared signature: every entry survives, the fastest shared one
/// wins, and the file parses.
#[test]
fn concurrent_writers_merge() {
    let path = tmp("concurrent");
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let path = path.clone();
            s.spawn(move || {
                let mut db = TacticDb::new(identity());
                db.entries.insert(format!("own-{i}"), tactic(1.0, i));
                db.entries.insert("shared".into(), tactic(1.0 + i as f64, i));
                db.save(&path).unwrap();
            });
        }
    });
    let (db, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(db.entries.len(), 9);
    assert_eq!(db.entries["shared"].tuned_ms, 1.0);
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn bucketing_rule() {
    assert_eq!(m_bucket(0), 1);
    assert_eq!(m_bucket(1), 1);
    assert_eq!(m_bucket(3), 4);
    assert_eq!(m_bucket(128), 128);
    assert_eq!(m_bucket(129), 256);
    assert_eq!(m_bucket(3537), 4096);
}

/// Run as a child process by `concurrent_processes_merge` (it sets GEMMBRIDGE_DB_CHILD to
/// "<path>,<id>"); run directly it has nothing to do.
#[test]
#[ignore = "helper process for concurrent_processes_merge"]
fn db_writer_child() {
    let Ok(spec) = std::env::var("GEMMBRIDGE_DB_CHILD") else { return };
    let (path, id) = spec.rsplit_once(',').expect("path,id");
    let id: u64 = id.parse().unwrap();
    for round in 0..20 {
        let mut db = TacticDb::new(identity());
        db.entries.insert(format!("proc-{id}-{round}"), tactic(1.0, id));
        db.entries.insert("shared".into(), tactic(2.0 + id as f64, id));
        db.save(std::path::Path::new(path)).unwrap();
    }
}

/// Four processes write the same database 20 times each, at once: every entry survives and
/// the file always parses.
#[test]
fn concurrent_processes_merge() {
    let path = tmp("processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4u64)
        .map(|id| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "db_writer_child", "--test-threads", "1"])
                .env("GEMMBRIDGE_DB_CHILD", format!("{},{id}", path.display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let (db, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(db.entries.len(), 4 * 20 + 1);
    assert_eq!(db.entries["shared"].tuned_ms, 2.0);
}

#[test]
fn save_never_overwrites_a_foreign_or_corrupt_file_nor_writes_nan() {
    let path = tmp("overwrite");
    let mut other = TacticDb::new(Identity {
        gpu: "NVIDIA A100-SXM4-80GB".into(),
        sm: "8.0".into(),
        cublaslt: 130100,
        cudnn: None,
    });
    other.entries.insert("a100".into(), tactic(0.5, 1));
    other.save(&path).unwrap();
    let mut mine = TacticDb::new(identity());
    mine.entries.insert("h200".into(), tactic(0.5, 2));
    let e = mine.save(&path).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    assert!(e.to_string().contains("foreign"), "{e}");
    let (still, _) = TacticDb::load(&path, &other.identity);
    assert!(still.entries.contains_key("a100"));

    std::fs::write(&path, "{ not json").unwrap();
    assert_eq!(mine.save(&path).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");

    let path = tmp("nan");
    let mut bad = TacticDb::new(identity());
    bad.entries.insert("nan".into(), tactic(f64::NAN, 3));
    assert_eq!(bad.save(&path).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    let mut good = TacticDb::new(identity());
    good.entries.insert("nan".into(), tactic(1.0, 4));
    good.merge(&bad);
    assert_eq!(good.entries["nan"].tuned_ms, 1.0);
}

/// A format-1 file as the previous code wrote it (cuBLASLt `version` in its header).
fn v1_text(version: usize) -> String {
    format!(
        r#"{{
  "format": 1,
  "identity": {{ "gpu": "NVIDIA H200", "sm": "9.0", "cublaslt": {version} }},
  "entries": {{
    "NN m1024 n1024 k1024 lda1024 ldb1024 ldc1024 b1 f32 none aux0 al256/256/256/256 ws33554432": {{
      "algo": [77309411383, 4294967327, 0, 0, 558775245209601, 0, 292057776128, 0],
      "workspace": 0, "heuristic_ms": 0.0574, "tuned_ms": 0.0554
    }},
    "TN m768 n4096 k3072 lda3072 ldb3072 ldc768 b1 bf16 bias aux0 al256/256/256/256 ws33554432": {{
      "algo": [1, 2, 3, 4, 5, 6, 7, 18446744073709551615],
      "workspace": 4096, "heuristic_ms": 0.2, "tuned_ms": 0.1
    }}
  }}
}}
"#
    )
}

const V1_KEY: &str = "NN m1024 n1024 k1024 lda1024 ldb1024 ldc1024 b1 f32 none aux0 al256/256/256/256 ws33554432";

#[test]
fn v1_file_reads_as_cublaslt_gemm_entries_of_its_version() {
    let path = tmp("v1");
    std::fs::write(&path, v1_text(130100)).unwrap();
    let (db, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(db.format, FORMAT);
    assert_eq!(db.entries.len(), 2);
    let t = &db.entries[V1_KEY];
    assert_eq!((t.library, t.kind, t.version), (Library::CublasLt, ProblemKind::Gemm, 130100));
    assert_eq!(t.lt_algo(), Some(([77309411383, 4294967327, 0, 0, 558775245209601, 0, 292057776128, 0], 0)));
    assert_eq!((t.heuristic_ms, t.tuned_ms), (0.0574, 0.0554));
    let t = db.entries.values().find(|t| t.tuned_ms == 0.1).unwrap();
    assert_eq!(t.lt_algo(), Some(([1, 2, 3, 4, 5, 6, 7, u64::MAX], 4096)));

    // another cuBLASLt's v1 file: every entry stale, one warning naming both versions
    std::fs::write(&path, v1_text(120900)).unwrap();
    let (db, warnings) = TacticDb::load(&path, &identity());
    assert!(db.entries.is_empty());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for word in ["stale", "2 entries", "cuBLASLt 120900", "130100"] {
        assert!(warnings[0].contains(word), "{word}: {warnings:?}");
    }
}

#[test]
fn v2_round_trip_names_library_version_kind_and_choice() {
    let path = tmp("v2");
    let mut db = TacticDb::new(identity());
    db.entries.insert(V1_KEY.into(), tactic(0.5, 1));
    let mut fp8 = tactic(0.25, 2);
    fp8.kind = ProblemKind::Fp8Gemm;
    db.entries.insert("fp8_gemm TN m64".into(), fp8);
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    for field in [
        "\"format\": 2",
        "\"library\": \"cublaslt\"",
        "\"version\": 130100",
        "\"kind\": \"gemm\"",
        "\"kind\": \"fp8_gemm\"",
        "\"type\": \"lt_algo\"",
        "\"workspace\": 1024",
    ] {
        assert!(text.contains(field), "{field} not in {text}");
    }
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back, db);
    assert_eq!(back.entries[V1_KEY].lt_algo(), Some(([1, 1, 2, 3, 4, 5, 6, 7], 1024)));
}

#[test]
fn entries_of_another_cublaslt_version_are_left_out_with_one_warning() {
    let path = tmp("versions");
    let mut db = TacticDb::new(identity());
    db.entries.insert("current".into(), tactic(0.5, 1));
    db.entries.insert("old-a".into(), tactic_of(120900, 0.5, 2));
    db.entries.insert("old-b".into(), tactic_of(120900, 0.5, 3));
    db.entries.insert("older".into(), tactic_of(120800, 0.5, 4));
    db.save(&path).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), ["current"]);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for word in ["stale", "3 entries", "cuBLASLt", "120800, 120900", "130100"] {
        assert!(warnings[0].contains(word), "{word}: {warnings:?}");
    }
    // the other version's own load sees its entries, and nothing of ours
    let (theirs, warnings) = TacticDb::load(&path, &Identity { cublaslt: 120900, ..identity() });
    assert_eq!(theirs.entries.keys().collect::<Vec<_>>(), ["old-a", "old-b"]);
    assert!(warnings.len() == 1 && warnings[0].contains("2 entries"), "{warnings:?}");
}

#[test]
fn saving_over_a_v1_file_upgrades_it_keeping_its_entries() {
    for version in [130100, 120900] {
        let path = tmp(&format!("upgrade-{version}"));
        std::fs::write(&path, v1_text(version)).unwrap();
        TacticDb::check_writable(&path, &identity()).unwrap();
        let mut mine = TacticDb::new(identity());
        mine.entries.insert("new".into(), tactic(0.5, 9));
        mine.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"format\": 2") && text.contains("\"cublaslt\": 130100"), "{text}");
        let (all, _) = TacticDb::load(&path, &Identity { cublaslt: version, ..identity() });
        assert!(all.entries.contains_key(V1_KEY), "{version}: {:?}", all.entries.keys());
        assert_eq!(all.entries[V1_KEY].version, version);
        assert_eq!(all.entries.len(), if version == 130100 { 3 } else { 2 });
        let (now, _) = TacticDb::load(&path, &identity());
        assert!(now.entries.contains_key("new"));
    }
}

#[test]
fn saving_keeps_stale_entries_on_disk_and_the_latest_tuning_wins_across_versions() {
    let path = tmp("keep-stale");
    let mut old = TacticDb::new(Identity { cublaslt: 120900, ..identity() });
    old.entries.insert("old-only".into(), tactic_of(120900, 0.5, 1));
    old.entries.insert("both".into(), tactic_of(120900, 0.1, 2));
    old.save(&path).unwrap();

    let (mut now, warnings) = TacticDb::load(&path, &identity());
    assert!(now.entries.is_empty() && warnings[0].contains("stale"), "{warnings:?}");
    TacticDb::check_writable(&path, &identity()).unwrap();
    now.entries.insert("both".into(), tactic(0.9, 3)); // slower, but of another version
    now.save(&path).unwrap();
    let (back, _) = TacticDb::load(&path, &identity());
    assert_eq!(back.entries["both"].version, 130100);
    assert_eq!(back.entries["both"].tuned_ms, 0.9);
    let (theirs, _) = TacticDb::load(&path, &old.identity);
    assert_eq!(theirs.entries.keys().collect::<Vec<_>>(), ["old-only"]);

    // merge: same version, lower time wins; another version replaces
    let mut a = TacticDb::new(identity());
    a.entries.insert("s".into(), tactic(1.0, 1));
    let mut b = TacticDb::new(identity());
    b.entries.insert("s".into(), tactic(2.0, 2));
    a.merge(&b);
    assert_eq!(a.entries["s"].tuned_ms, 1.0);
    b.entries.insert("s".into(), tactic_of(120900, 2.0, 2));
    a.merge(&b);
    assert_eq!(a.entries["s"].version, 120900);
}

#[test]
fn unknown_library_kind_or_choice_makes_the_file_corrupt_and_never_overwritten() {
    let mut db = TacticDb::new(identity());
    db.entries.insert("sig-a".into(), tactic(0.5, 1));
    let good = serde_json_like(&db);
    for (from, to) in [
        ("\"library\": \"cublaslt\"", "\"library\": \"rocblas\""),
        ("\"kind\": \"gemm\"", "\"kind\": \"conv3d\""),
        ("\"type\": \"lt_algo\"", "\"type\": \"miopen_solution\""),
    ] {
        let path = tmp("unknown");
        assert!(good.contains(from), "{good}");
        let text = good.replace(from, to);
        std::fs::write(&path, &text).unwrap();
        let (back, warnings) = TacticDb::load(&path, &identity());
        assert!(back.entries.is_empty());
        assert!(warnings.len() == 1 && warnings[0].contains("corrupt"), "{to}: {warnings:?}");
        let e = TacticDb::check_writable(&path, &identity()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        let e = db.save(&path).unwrap_err();
        assert!(e.kind() == std::io::ErrorKind::AlreadyExists && e.to_string().contains("corrupt"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
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

#[test]
fn check_writable_matches_what_save_refuses() {
    let path = tmp("writable");
    TacticDb::check_writable(&path, &identity()).unwrap(); // missing
    let mut other = TacticDb::new(Identity {
        gpu: "NVIDIA A100-SXM4-80GB".into(),
        sm: "8.0".into(),
        cublaslt: 130100,
        cudnn: None,
    });
    other.entries.insert("a100".into(), tactic(0.5, 1));
    other.save(&path).unwrap();
    let e = TacticDb::check_writable(&path, &identity()).unwrap_err();
    assert!(e.kind() == std::io::ErrorKind::AlreadyExists && e.to_string().contains("foreign"), "{e}");
    let text = serde_json_like(&TacticDb::new(identity())).replace("\"format\": 2", "\"format\": 3");
    std::fs::write(&path, text).unwrap();
    let e = TacticDb::check_writable(&path, &identity()).unwrap_err();
    assert!(e.to_string().contains("format 3"), "{e}");
}

/// The repository's tuned database `tactics/h200.json` is what `gemmbridge tune` writes for
/// the H200 of its identity, and nothing else: format 2; the identity of the machine it was
/// tuned on (an H200, cuBLASLt 13.1, and PyTorch's cuDNN 9.19, which the convolution entries
/// need loaded); every entry of a library version of that identity, so that all of them load;
/// every entry a confirmed win (the tuner stores an entry only where it ran faster than the
/// library's own choice in the benchmark's bursts, and records those burst times); and the
/// file byte for byte what `save` writes. Whether each entry still wins is a measurement,
/// not a test: `gemmbridge tune --verify tactics/h200.json` on the GPU.
#[test]
fn repository_db_is_the_tuners_output_for_its_identity() {
    let text = std::fs::read_to_string(repo_path(REPO_DB)).unwrap();
    let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(raw["format"], 2, "{REPO_DB}: format");
    let id = &raw["identity"];
    assert_eq!((id["gpu"].as_str(), id["sm"].as_str()), (Some("NVIDIA H200"), Some("9.0")), "{REPO_DB}: {id}");
    assert_eq!((id["cublaslt"].as_u64(), id["cudnn"].as_u64()), (Some(130100), Some(91900)), "{REPO_DB}: {id}");
    let h200 = Identity { cudnn: Some(91900), ..identity() };
    let (db, warnings) = TacticDb::load(&repo_path(REPO_DB), &h200);
    assert!(warnings.is_empty(), "{REPO_DB}: {warnings:?}");
    let written = raw["entries"].as_object().map_or(0, |e| e.len());
    assert!(written > 0 && db.entries.len() == written, "{REPO_DB}: {} of {written} entries load", db.entries.len());
    for (sig, t) in &db.entries {
        let lt = [ProblemKind::Gemm, ProblemKind::Fp8Gemm].contains(&t.kind);
        let library_ok = if lt { t.library == Library::CublasLt } else { t.library == Library::Cudnn };
        assert!(library_ok && h200.version(t.library) == Some(t.version), "{sig}: {t:?}");
        assert!(t.tuned_ms > 0.0 && t.tuned_ms < t.heuristic_ms, "{sig} records no win: {t:?}");
    }
    let path = tmp("repo");
    db.save(&path).unwrap();
    assert!(std::fs::read_to_string(&path).unwrap() == text, "{REPO_DB} is not what save writes");
}

const REPO_DB: &str = "tactics/h200.json";

/// `rel` in the repository: beside the sources this test was built from, or else (a test
/// executable carried to another machine and run from the repository's root there) under the
/// current directory.
fn repo_path(rel: &str) -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
    if built.exists() {
        built
    } else {
        PathBuf::from(rel)
    }
}

/// Times survive a save and a load bit for bit (serde_json's default float parser can be one
/// ulp off: 1.4143040180206299, a time in the repository's database, came back as
/// 1.41430401802063 before the crate enabled `float_roundtrip`).
#[test]
fn times_round_trip_exactly() {
    let path = tmp("floats");
    let mut db = TacticDb::new(identity());
    for (i, ms) in
        [1.4143040180206299, 0.055466665161980525, 0.1 + 0.2, f64::MIN_POSITIVE, 1e300].into_iter().enumerate()
    {
        db.entries.insert(format!("s{i}"), Tactic::lt_gemm([0; 8], 0, 130100, ms, ms));
    }
    db.save(&path).unwrap();
    let (back, _) = TacticDb::load(&path, &identity());
    for (sig, t) in &db.entries {
        assert_eq!(back.entries[sig].tuned_ms.to_bits(), t.tuned_ms.to_bits(), "{sig}: {}", t.tuned_ms);
    }
}

/// An entry with a negative or non-finite time is left out on load with a warning (so that the
/// loaded database can be saved again), and bad paths are named before anything is written.
#[test]
fn bad_times_and_bad_paths_are_named() {
    let path = tmp("bad-time");
    let mut db = TacticDb::new(identity());
    db.entries.insert("sig-a".into(), tactic(0.5, 1));
    db.entries.insert("sig-b".into(), tactic(0.7, 2));
    db.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap().replacen("\"tuned_ms\": 0.5", "\"tuned_ms\": -0.5", 1);
    std::fs::write(&path, text).unwrap();
    let (back, warnings) = TacticDb::load(&path, &identity());
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), vec!["sig-b"]);
    assert!(warnings.len() == 1 && warnings[0].contains("negative"), "{warnings:?}");
    back.save(&tmp("bad-time-resaved")).unwrap();

    let kind = |r: std::io::Result<()>| r.unwrap_err().kind();
    assert_eq!(kind(TacticDb::check_writable(Path::new(""), &identity())), std::io::ErrorKind::InvalidInput);
    assert_eq!(kind(db.save(Path::new(""))), std::io::ErrorKind::InvalidInput);
    let dir = tmp("dir").parent().unwrap().to_path_buf();
    assert_eq!(kind(TacticDb::check_writable(&dir, &identity())), std::io::ErrorKind::InvalidInput);
    let missing = dir.join("no-such-dir").join("db.json");
    let e = TacticDb::check_writable(&missing, &identity()).unwrap_err();
    assert!(e.kind() == std::io::ErrorKind::NotFound && e.to_string().contains("no-such-dir"), "{e}");
}

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
