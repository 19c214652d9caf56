//! The database file: [`TacticDb`] — load (module docs of [`super`]: what is left out and
//! why), merge, and the atomic, locked, merging save.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::entry::{consistent, valid, Identity, Library, Tactic};
use super::{FORMAT, FORMAT_V1};

/// The database: identity + tactics by signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TacticDb {
    /// File format version ([`FORMAT`] once loaded or created).
    pub format: u32,
    /// The machine it is for (once loaded: the identity passed to [`TacticDb::load`]).
    pub identity: Identity,
    /// Tactics by signature (module docs).
    pub entries: BTreeMap<String, Tactic>,
}

/// A format-1 file (read only).
#[derive(Deserialize)]
struct V1 {
    identity: Identity,
    entries: BTreeMap<String, V1Tactic>,
}

/// A format-1 entry: always a cuBLASLt GEMM algorithm.
#[derive(Deserialize)]
struct V1Tactic {
    algo: [u64; 8],
    workspace: usize,
    heuristic_ms: f64,
    tuned_ms: f64,
}

/// Just the format, to choose how to read the rest.
#[derive(Deserialize)]
struct Header {
    format: u32,
}

impl TacticDb {
    /// An empty database for this machine.
    pub fn new(identity: Identity) -> TacticDb {
        TacticDb { format: FORMAT, identity, entries: BTreeMap::new() }
    }

    /// Reads `path` for this machine: the entries usable here, and a warning for everything
    /// left out (module docs: missing, corrupt, foreign, format 1, stale and unused entries).
    /// Never an error; warnings are also logged through `tracing`. The result's `identity` is
    /// `identity` and its `format` is [`FORMAT`].
    pub fn load(path: &Path, identity: &Identity) -> (TacticDb, Vec<String>) {
        let mut db = match read_all(path, identity) {
            Ok(Some(db)) => db,
            Ok(None) => return (TacticDb::new(identity.clone()), Vec::new()),
            Err(w) => return (TacticDb::new(identity.clone()), warn(w)),
        };
        db.identity = identity.clone();
        // per library: (entries, their versions, the current version)
        let mut stale: BTreeMap<Library, (usize, BTreeSet<usize>, usize)> = BTreeMap::new();
        let mut unused = 0usize;
        db.entries.retain(|_, t| match identity.version(t.library) {
            Some(v) if v == t.version => true,
            Some(v) => {
                let s = stale.entry(t.library).or_insert((0, BTreeSet::new(), v));
                s.0 += 1;
                s.1.insert(t.version);
                false
            }
            None => {
                unused += 1;
                false
            }
        });
        let invalid = db.entries.len();
        db.entries.retain(|_, t| valid(t));
        let invalid = invalid - db.entries.len();
        let inconsistent = db.entries.len();
        db.entries.retain(|sig, t| consistent(sig, t));
        let inconsistent = inconsistent - db.entries.len();
        if unused > 0 {
            tracing::debug!(
                "tactic database {}: {unused} entries of libraries this build does not use",
                path.display()
            );
        }
        let mut warnings = Vec::new();
        if invalid > 0 {
            let w = format!(
                "tactic database {}: {invalid} {} with a non-finite or negative time; ignored",
                path.display(),
                if invalid == 1 { "entry" } else { "entries" }
            );
            warnings.extend(warn(w));
        }
        if inconsistent > 0 {
            let w = format!(
                "tactic database {}: {inconsistent} {} whose library, kind, choice and key disagree \
                 (e.g. a cuDNN entry holding a cuBLASLt algorithm); inconsistent, ignored",
                path.display(),
                if inconsistent == 1 { "entry" } else { "entries" }
            );
            warnings.extend(warn(w));
        }
        for (lib, (n, versions, current)) in stale {
            let versions: Vec<String> = versions.iter().map(usize::to_string).collect();
            let w = format!(
                "tactic database {}: {n} {} tuned with {lib} {}, this is {lib} {current}; stale, ignored",
                path.display(),
                if n == 1 { "entry" } else { "entries" },
                versions.join(", ")
            );
            warnings.extend(warn(w));
        }
        (db, warnings)
    }

    /// Adds `other`'s entries. Where both have a signature and their entries are of the same
    /// library, library version and kind, the lower `tuned_ms` wins; where they differ, `other`'s
    /// entry replaces this one (times of different library versions do not compare; in
    /// [`save`](TacticDb::save), `other` is the database being saved, so the latest tuning wins).
    /// Entries with a non-finite or negative time are skipped.
    pub fn merge(&mut self, other: &TacticDb) {
        for (sig, t) in &other.entries {
            if !valid(t) {
                continue;
            }
            match self.entries.get(sig) {
                Some(mine) if mine.comparable(t) && mine.tuned_ms <= t.tuned_ms => {}
                _ => {
                    self.entries.insert(sig.clone(), t.clone());
                }
            }
        }
    }

    /// Whether [`save`](TacticDb::save) would write over `path` for this `identity`: `Ok` for a
    /// missing file in an existing directory, or a file of this machine in a format this build
    /// reads (whatever its entries' library versions); otherwise the error `save` would give.
    /// Takes no lock.
    ///
    /// # Errors
    /// `InvalidInput` for an empty path or one naming a directory; `NotFound` when the
    /// directory it would be written in does not exist (or is not a directory);
    /// `AlreadyExists` naming the path and why (corrupt, unreadable, unknown format, foreign).
    pub fn check_writable(path: &Path, identity: &Identity) -> std::io::Result<()> {
        TacticDb::check_path(path)?;
        read_all(path, identity).map(drop).map_err(refusal)
    }

    /// The path half of [`check_writable`](TacticDb::check_writable), which needs no machine
    /// identity (so a command can check its `--db` before it opens a GPU): `path` names a file
    /// in an existing directory.
    ///
    /// # Errors
    /// `InvalidInput` for an empty path or one naming a directory; `NotFound` when the
    /// directory it would be written in does not exist (or is not a directory).
    pub fn check_path(path: &Path) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        if path.as_os_str().is_empty() || path.is_dir() {
            let msg = format!("{:?} is not a file name", path.display().to_string());
            return Err(Error::new(ErrorKind::InvalidInput, msg));
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            let what = if dir.exists() { "is not a directory" } else { "does not exist" };
            let msg = format!("{}: the directory {} {what}", path.display(), dir.display());
            return Err(Error::new(ErrorKind::NotFound, msg));
        }
        Ok(())
    }

    /// Writes the database to `path` atomically as format 2, merged (as [`merge`](TacticDb::merge)
    /// with `self` second) with everything on disk, including entries
    /// [`load`](TacticDb::load) leaves out, under an exclusive lock on `<path>.lock`. The
    /// header's identity becomes `self.identity`. A format-1 file is upgraded.
    ///
    /// # Errors
    /// An entry with a non-finite or negative time, or whose library, kind, choice and key
    /// disagree (`InvalidInput`); an existing file at
    /// `path` that is unreadable, corrupt, of an unknown format or foreign (`AlreadyExists`:
    /// it is never overwritten — remove it or choose another path); I/O errors creating,
    /// locking, writing or renaming. Every message names the path (the lock file's, for a
    /// failure to create or lock it). The lock file `<path>.lock` is left in place (removing it
    /// would race with another writer waiting on it).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        self.save_dropping(path, &|_, _| false)
    }

    /// [`save`](TacticDb::save), leaving out — under the same lock, from the file's entries and
    /// this database's alike — every entry `drop` selects by signature and tactic: how
    /// `gemmbridge tune` retires an entry that only held the heuristic's own choice.
    ///
    /// # Errors
    /// As [`save`](TacticDb::save).
    pub fn save_dropping(&self, path: &Path, drop: &dyn Fn(&str, &Tactic) -> bool) -> std::io::Result<()> {
        let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        if let Some((sig, _)) = self.entries.iter().find(|(_, t)| !valid(t)) {
            let msg = format!("{}: tactic {sig} has a non-finite or negative time", path.display());
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        if let Some((sig, t)) = self.entries.iter().find(|(sig, t)| !consistent(sig, t)) {
            let msg = format!(
                "{}: tactic {sig}: library {}, kind {:?} and choice {:?} do not belong together",
                path.display(),
                t.library,
                t.kind,
                t.choice
            );
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        if path.as_os_str().is_empty() {
            let msg = "an empty path is not a file name".to_string();
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        let lock_path = sibling(path, ".lock");
        let named_lock =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{} (lock file): {e}", lock_path.display()));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(named_lock)?;
        lock.lock().map_err(named_lock)?;
        let mut merged =
            read_all(path, &self.identity).map_err(refusal)?.unwrap_or_else(|| TacticDb::new(self.identity.clone()));
        merged.format = FORMAT;
        merged.identity = self.identity.clone();
        merged.merge(self);
        merged.entries.retain(|sig, t| !drop(sig, t));
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

/// Every entry of the file at `path`, unfiltered, converted to format 2 (a format-1 entry
/// becomes a cuBLASLt "gemm" entry of the file's cuBLASLt version); the header as in the file
/// but `format` = [`FORMAT`]. `Ok(None)`: no file. `Err`: the warning for an unreadable,
/// corrupt, unknown-format or foreign file.
fn read_all(path: &Path, identity: &Identity) -> Result<Option<TacticDb>, String> {
    let p = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("tactic database {p}: unreadable ({e}); ignored")),
    };
    let corrupt = |e: serde_json::Error| format!("tactic database {p}: corrupt ({e}); ignored");
    let db = match serde_json::from_str::<Header>(&text).map_err(corrupt)?.format {
        FORMAT => serde_json::from_str::<TacticDb>(&text).map_err(corrupt)?,
        FORMAT_V1 => {
            let v1: V1 = serde_json::from_str(&text).map_err(corrupt)?;
            let version = v1.identity.cublaslt;
            let entries = v1
                .entries
                .into_iter()
                .map(|(sig, t)| (sig, Tactic::lt_gemm(t.algo, t.workspace, version, t.heuristic_ms, t.tuned_ms)))
                .collect();
            TacticDb { format: FORMAT, identity: v1.identity, entries }
        }
        other => {
            return Err(format!(
                "tactic database {p}: format {other} (this build reads {FORMAT_V1} and {FORMAT}); stale, ignored"
            ));
        }
    };
    if db.identity.gpu != identity.gpu || db.identity.sm != identity.sm {
        return Err(format!(
            "tactic database {p}: tuned on {} (sm {}), this is {} (sm {}); foreign, ignored",
            db.identity.gpu, db.identity.sm, identity.gpu, identity.sm
        ));
    }
    Ok(Some(db))
}

fn refusal(w: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("refusing to overwrite (remove it or choose another path): {w}"),
    )
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
