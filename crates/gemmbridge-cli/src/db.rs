//! Tactic-database helpers shared by `bench` and `tune`: this machine's identity, and loading
//! a database into a `Gpu`.

use gemmbridge::cuda::tactics::{Identity, TacticDb};
use gemmbridge::cuda::Gpu;

/// This machine's identity for the tactic database.
pub fn identity(gpu: &Gpu) -> anyhow::Result<Identity> {
    Ok(gpu.info()?.tactic_identity())
}

/// Warns when the tactic database at `path` does not exist (every command runs on without
/// tuned entries then, on the GPU or the CPU backend alike); whether it exists.
pub fn warn_if_missing(path: &str) -> bool {
    let exists = std::path::Path::new(path).exists();
    if !exists {
        eprintln!("warning: tactic database {path} does not exist: running without tuned entries");
    }
    exists
}

/// Loads a tactic database into `gpu`, printing its warnings.
pub fn load_db(gpu: &Gpu, path: &str) -> anyhow::Result<usize> {
    let id = identity(gpu)?;
    warn_if_missing(path);
    let (db, warnings) = TacticDb::load(std::path::Path::new(path), &id);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    gpu.plans().load_tactics(&db);
    Ok(db.entries.len())
}
