//! Arguments and files the commands refuse before a GPU is opened or anything is timed: each
//! run here fails with its named error and a non-zero exit on any machine, GPU or not.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh folder for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gemmbridge-refusals-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `gemmbridge args`, expects exit 2 (an error), and returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gemmbridge")).args(args).output().expect("runs gemmbridge");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "gemmbridge {args:?}: stderr {stderr}");
    stderr
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_tactic_database_that_cannot_be_read_is_an_error() {
    let dir = scratch("db");
    let missing = dir.join("missing.json");
    for cmd in ["bench", "train-bench"] {
        let e = refused(&[cmd, "--db", s(&missing)]);
        let want = format!("error: --db {}: cannot read the tactic database: ", missing.display());
        assert!(e.contains(&want) && e.contains("os error 2"), "{cmd}: {e}");
        assert!(!e.contains("running without tuned entries"), "{cmd}: {e}");
    }
    let e = refused(&["bench", "--db", s(&dir)]);
    assert!(e.contains(&format!("--db {}: cannot read", dir.display())) && e.contains("os error 21"), "{e}");
    let e = refused(&["tune", "--verify", s(&dir)]);
    assert!(e.contains("no such file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn probe_refuses_an_empty_table_list() {
    let e = refused(&["probe", "--only", ""]);
    assert!(e.contains("error: no table to run: give --only with at least one of convention, precision"), "{e}");
    let e = refused(&["probe", "--only", ","]);
    assert!(e.contains("error: --only \",\" has an empty entry"), "{e}");
}

#[test]
fn bench_refuses_a_peer_file_without_timed_rows() {
    let dir = scratch("peer");
    let peer = dir.join("peer.jsonl");
    std::fs::write(&peer, "{\"op\": \"env\", \"device\": \"cpu\"}\n").unwrap();
    let e = refused(&["bench", "--peer", s(&peer)]);
    assert!(e.contains(&format!("{} has no timed rows", peer.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_refuses_an_empty_manifest() {
    let dir = scratch("report");
    let manifest = dir.join("report.json");
    std::fs::write(&manifest, "{\"figures\": [], \"tables\": []}").unwrap();
    let e = refused(&["report", "--manifest", s(&manifest), "--out", s(&dir.join("figures"))]);
    assert!(e.contains(&format!("{}: the manifest lists no figure and no table", manifest.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn layer_check_refuses_an_output_it_cannot_write_before_any_work() {
    let dir = scratch("layer");
    let file = dir.join("not-a-folder");
    std::fs::write(&file, "x").unwrap();
    let e = refused(&["layer-check", "--out", s(&file)]);
    assert!(e.contains(&format!("error: --out {}: cannot create the folder: ", file.display())), "{e}");
    assert!(!e.contains("GPU layer"), "refused before the layer ran: {e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
