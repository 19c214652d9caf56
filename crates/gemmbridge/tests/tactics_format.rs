//! The tactic database's format and what it holds: the first format read and upgraded,
//! entries per library version (stale ones kept on disk, never loaded), times and paths
//! checked, cuDNN's and the grouped GEMM's choices, and the repository's own database.

mod tactics_common;

use std::path::{Path, PathBuf};

use gemmbridge::cuda::tactics::{Identity, Library, ProblemKind, Tactic, TacticDb, FORMAT};
use tactics_common::{a100, identity, serde_json_like, tactic, tactic_of, tmp, V1_KEY};

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

#[test]
fn check_writable_matches_what_save_refuses() {
    let path = tmp("writable");
    TacticDb::check_writable(&path, &identity()).unwrap(); // missing
    let mut other = TacticDb::new(a100());
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
