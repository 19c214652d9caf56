//! The tactic database survives what happens to files: truncation, another GPU's file, a
//! stale cuBLASLt version, garbage, and several writers at once. (Its format, versions and
//! libraries: `tactics_format.rs`.)

mod tactics_common;

use gemmbridge::cuda::tactics::{m_bucket, Identity, TacticDb, FORMAT};
use tactics_common::{a100, identity, serde_json_like, tactic, tactic_of, tmp};

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
    let mut other = TacticDb::new(a100());
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
    let mut other = TacticDb::new(a100());
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
