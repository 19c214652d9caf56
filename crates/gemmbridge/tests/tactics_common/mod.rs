//! What the tactic-database tests share: this machine's identity, tactics, fresh files.

#![allow(dead_code)] // each test file uses its own part

use std::path::PathBuf;

use gemmbridge::cuda::tactics::{Identity, Tactic, TacticDb};

pub fn identity() -> Identity {
    Identity { gpu: "NVIDIA H200".into(), sm: "9.0".into(), cublaslt: 130100, cudnn: None }
}

/// Another GPU's identity (an A100 with the same cuBLASLt).
pub fn a100() -> Identity {
    Identity { gpu: "NVIDIA A100-SXM4-80GB".into(), sm: "8.0".into(), cublaslt: 130100, cudnn: None }
}

/// A cuBLASLt GEMM tactic of this machine's cuBLASLt (130100).
pub fn tactic(ms: f64, tag: u64) -> Tactic {
    tactic_of(130100, ms, tag)
}

/// A cuBLASLt GEMM tactic tuned with cuBLASLt `version`.
pub fn tactic_of(version: usize, ms: f64, tag: u64) -> Tactic {
    Tactic::lt_gemm([tag, 1, 2, 3, 4, 5, 6, 7], 1024, version, 1.0, ms)
}

/// A fresh directory's `db.json`, unique to this call (tests run in parallel and several use
/// the same name).
pub fn tmp(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gemmbridge-tactics-{}-{name}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("db.json")
}

/// A cuBLASLt GEMM signature as the first format wrote it (still the key of a cuBLASLt
/// entry).
pub const V1_KEY: &str = "NN m1024 n1024 k1024 lda1024 ldb1024 ldc1024 b1 f32 none aux0 al256/256/256/256 ws33554432";

/// The text `save` writes for `db`.
pub fn serde_json_like(db: &TacticDb) -> String {
    let path = tmp("serialise");
    db.save(&path).unwrap();
    std::fs::read_to_string(path).unwrap()
}
