//! The tactic database: tuned cuBLASLt algorithms that persist across runs.
//!
//! A file is JSON: a header naming the GPU, its SM version, the cuBLASLt version and the
//! format version, then one entry per problem signature. A file whose header does not match
//! the machine (another GPU, another cuBLASLt, another format) or that does not parse (a
//! truncated write, say) is ignored with a warning — never a crash, never a wrong algorithm;
//! and an entry's algorithm is still checked by cuBLASLt (`cublasLtMatmulAlgoCheck`) before a
//! plan uses it.
//!
//! Writes are atomic: the file is written beside its final name, flushed to disk and renamed
//! over it, so a reader sees the old file or the new one, never half of one. Writers take an
//! exclusive lock on `<file>.lock` and merge with what is on disk first, so two processes
//! tuning at once both keep their results (the faster entry wins where both tuned the same
//! signature).
//!
//! # Bucketing rule
//! A signature leaves out the row-major M (the column-major call's n) in favour of its bucket,
//! the next power of two ≥ M (1, 2, 4, …, 4096, 8192, …), and leaves out the batch strides
//! (which scale with M). A tactic tuned at M = 3537 therefore serves every M in 2049..=4096
//! with the same other dimensions, leading dimensions, ops, precision, epilogue and alignment.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::lt::plan::PlanKey;

/// The file format version this code reads and writes.
pub const FORMAT: u32 = 1;

/// The bucket a row-major M falls in: the next power of two ≥ M (0 → 1; M is at most
/// [`MAX_DIM`](crate::MAX_DIM) in any valid problem, larger values saturate at `usize::MAX`).
pub fn m_bucket(m: usize) -> usize {
    m.max(1).checked_next_power_of_two().unwrap_or(usize::MAX)
}

/// The stable text signature of a plan key under the bucketing rule (module docs).
pub(crate) fn signature(key: &PlanKey) -> String {
    let c = &key.call;
    format!(
        "{}{} m{} n{} k{} lda{} ldb{} ldc{} b{} {} {} aux{} al{}/{}/{}/{} ws{}",
        c.transa,
        c.transb,
        c.m,
        m_bucket(c.n as usize),
        c.k,
        c.lda,
        c.ldb,
        c.ldc,
        c.batch,
        key.precision,
        key.epilogue,
        key.aux_ld,
        key.align[0],
        key.align[1],
        key.align[2],
        key.align[3],
        key.workspace
    )
}

/// Which machine a database belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// GPU name, e.g. "NVIDIA H200".
    pub gpu: String,
    /// Compute capability, e.g. "9.0".
    pub sm: String,
    /// cuBLASLt version (cublasLtGetVersion), e.g. 130100.
    pub cublaslt: usize,
}

/// One tuned algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tactic {
    /// cublasLtMatmulAlgo_t's opaque data.
    pub algo: [u64; 8],
    /// Workspace it needs, bytes.
    pub workspace: usize,
    /// The heuristic's first choice, median ms, when tuned.
    pub heuristic_ms: f64,
    /// This algorithm, median ms, when tuned.
    pub tuned_ms: f64,
}

/// The database: identity + tactics by signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TacticDb {
    /// File format version ([`FORMAT`]).
    pub format: u32,
    /// The machine it was tuned on.
    pub identity: Identity,
    /// Tactics by signature.
    pub entries: BTreeMap<String, Tactic>,
}

impl TacticDb {
    /// An empty database for this machine.
    pub fn new(identity: Identity) -> TacticDb {
        TacticDb { format: FORMAT, identity, entries: BTreeMap::new() }
    }

    /// Reads `path` for this machine. A missing file gives an empty database; a corrupt,
    /// foreign or stale one gives an empty database and a warning (also logged through
    /// `tracing`), never an error.
    pub fn load(path: &Path, identity: &Identity) -> (TacticDb, Vec<String>) {
        let empty = TacticDb::new(identity.clone());
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (empty, Vec::new()),
            Err(e) => return (empty, warn(format!("tactic database {}: unreadable ({e}); ignored", path.display()))),
        };
        let db: TacticDb = match serde_json::from_str(&text) {
            Ok(db) => db,
            Err(e) => {
                return (empty, warn(format!("tactic database {}: corrupt ({e}); ignored", path.display())));
            }
        };
        if db.format != FORMAT {
            let w = format!(
                "tactic database {}: format {} (this build reads {FORMAT}); stale, ignored",
                path.display(),
                db.format
            );
            return (empty, warn(w));
        }
        if db.identity.gpu != identity.gpu || db.identity.sm != identity.sm {
            let w = format!(
                "tactic database {}: tuned on {} (sm {}), this is {} (sm {}); foreign, ignored",
                path.display(),
                db.identity.gpu,
                db.identity.sm,
                identity.gpu,
                identity.sm
            );
            return (empty, warn(w));
        }
        if db.identity.cublaslt != identity.cublaslt {
            let w = format!(
                "tactic database {}: tuned with cuBLASLt {}, this is {}; stale, ignored",
                path.display(),
                db.identity.cublaslt,
                identity.cublaslt
            );
            return (empty, warn(w));
        }
        (db, Vec::new())
    }

    /// Adds `other`'s entries; where both have a signature, the lower `tuned_ms` wins.
    /// Entries with a non-finite or negative time are skipped.
    pub fn merge(&mut self, other: &TacticDb) {
        for (sig, t) in &other.entries {
            if !valid(t) {
                continue;
            }
            match self.entries.get(sig) {
                Some(mine) if mine.tuned_ms <= t.tuned_ms => {}
                _ => {
                    self.entries.insert(sig.clone(), *t);
                }
            }
        }
    }

    /// Writes the database to `path` atomically, merged with what another process may have
    /// written there meanwhile (under an exclusive lock on `<path>.lock`).
    ///
    /// # Errors
    /// An entry with a non-finite or negative time (`InvalidInput`); an existing file at
    /// `path` that is corrupt, foreign or stale (`AlreadyExists`: it is never overwritten —
    /// remove it or choose another path); I/O errors creating, locking, writing or renaming.
    /// Every message names the path.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        if let Some((sig, _)) = self.entries.iter().find(|(_, t)| !valid(t)) {
            let msg = format!("{}: tactic {sig} has a non-finite or negative time", path.display());
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        let lock_path = sibling(path, ".lock");
        let lock =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(named)?;
        lock.lock().map_err(named)?;
        let (mut merged, warnings) = TacticDb::load(path, &self.identity);
        if let Some(w) = warnings.first() {
            let msg = format!("refusing to overwrite: {w}");
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, msg));
        }
        merged.merge(self);
        let tmp = sibling(path, &format!(".tmp.{}", std::process::id()));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(serde_json::to_string_pretty(&merged).map_err(std::io::Error::other)?.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(named)?;
        lock.unlock().map_err(named)?;
        Ok(())
    }
}

fn valid(t: &Tactic) -> bool {
    t.tuned_ms.is_finite() && t.heuristic_ms.is_finite() && t.tuned_ms >= 0.0 && t.heuristic_ms >= 0.0
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn warn(w: String) -> Vec<String> {
    tracing::warn!("{w}");
    vec![w]
}
