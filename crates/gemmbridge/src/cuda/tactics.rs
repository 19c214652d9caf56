//! The tactic database: tuned library choices (cuBLASLt algorithms, cuDNN convolution plans)
//! that persist across runs, one file for every library and kind of problem.
//!
//! # File format 2 ([`FORMAT`])
//! A file is JSON, written by [`TacticDb::save`] (pretty-printed, one trailing newline): a
//! cuBLASLt GEMM entry of the repository's `tactics/h200.json` (tuned on an H200) and a cuDNN
//! convolution entry as `gemmbridge tune` writes one (its engine and knob values illustrative);
//! arrays folded and times shortened here:
//!
//! ```json
//! {
//!   "format": 2,
//!   "identity": { "gpu": "NVIDIA H200", "sm": "9.0", "cublaslt": 130100, "cudnn": 91900 },
//!   "entries": {
//!     "NN m1024 n1024 k1024 lda1024 ldb1024 ldc1024 b1 f32 none aux0 al256/256/256/256 ws33554432": {
//!       "library": "cublaslt",
//!       "version": 130100,
//!       "kind": "gemm",
//!       "choice": {
//!         "type": "lt_algo",
//!         "algo": [77309411383, 4294967327, 0, 0, 558775245209601, 0, 292057776128, 0],
//!         "workspace": 0
//!       },
//!       "heuristic_ms": 0.05742,
//!       "tuned_ms": 0.05547
//!     },
//!     "conv2d fwd_bias_relu n32 c64 h56 w56 k64 r3 s3 stride1,1 pad1,1 dil1,1 g1 nhwc bf16 graph al16": {
//!       "library": "cudnn",
//!       "version": 91900,
//!       "kind": "conv2d",
//!       "choice": {
//!         "type": "cudnn_engine",
//!         "engine": 12,
//!         "knobs": [[14, 3], [2, 17], [25, 0]],
//!         "workspace": 0,
//!         "unfused": false
//!       },
//!       "heuristic_ms": 0.06127,
//!       "tuned_ms": 0.05012
//!     }
//!   }
//! }
//! ```
//!
//! - `format`: 2. `identity`: the machine the file belongs to ([`Identity`]): its GPU name and
//!   compute capability decide whether the file is ours; its library versions are those of the
//!   process that saved last and are informational only (every entry carries its own; `cudnn`
//!   is absent where libcudnn was not installed, and in older files). The GPU name is
//!   `cuDeviceGetName`'s, the SM `cuDeviceGetAttribute`'s compute capability
//!   ([`Gpu::tactic_identity`](super::Gpu::tactic_identity)).
//! - `entries`: [`Tactic`]s by signature. Each names its `library` ([`Library`]: "cublaslt",
//!   "cudnn"), that library's `version` when it was tuned (cuBLASLt: `cublasLtGetVersion()`,
//!   cuDNN: `cudnnGetVersion()`, both `major·10000 + minor·100 + patch`), the `kind` of problem
//!   ([`ProblemKind`]: "gemm", "fp8_gemm", "conv2d"), the tuned `choice` ([`Choice`], tagged by
//!   `type`: "lt_algo"; for cuDNN's graph API "cudnn_engine", the engine's global index, its
//!   knob choices as `[knob type, value]` pairs and the plan's workspace in bytes; for cuDNN's
//!   legacy API "cudnn_algo", the algorithm's and the math type's enum values and the
//!   workspace) and two median times in milliseconds measured when it was tuned:
//!   `heuristic_ms` (the library heuristic's first choice) and `tuned_ms` (this choice).
//!
//! # Signatures: one prefix rule per kind
//! A key is the stable text of the problem a choice serves. A cuBLASLt GEMM ("gemm") key is
//! what format 1 used, unchanged: the two op letters (`NN`, `NT`, `TN`, `TT`) then
//! ` m…` (see the bucketing rule below), e.g. `TN m768 n4096 k3072 …`. Every other kind's
//! key starts with its kind's name and a space (`fp8_gemm …`, `conv2d …`), so keys of two
//! kinds never collide and a format-1 key is a valid format-2 key.
//!
//! A convolution ("conv2d") key states everything its plan was made for, in this order:
//! the direction (`fwd`; the fused forward `fwd_bias_relu` or `fwd_bias` with the identity,
//! `_unfused` appended where fusion was off; `dgrad`; `wgrad`), `n c h w k r s` with their
//! values, `stride`, `pad` and `dil` as `h,w` pairs, `g` (groups), the layout (`nhwc`,
//! `nchw`), the precision (`f32`, `tf32`, `f16`, `bf16`), the cuDNN API (`graph`, `legacy`)
//! and the buffers' byte alignment class (`al16`, `al8`, `al4`, `al2`: the largest power of
//! two ≤ 16 dividing every address, as cuDNN's `BYTE_ALIGNMENT`; `alany` for the legacy API,
//! whose plans do not depend on it). Nothing is bucketed: a tactic serves exactly that
//! problem.
//!
//! # Bucketing rule (GEMM)
//! A signature leaves out the row-major M (the column-major call's n) in favour of its bucket,
//! the next power of two ≥ M (1, 2, 4, …, 4096, 8192, …), and leaves out the batch strides
//! (which scale with M). A tactic tuned at M = 3537 therefore serves every M in 2049..=4096
//! with the same other dimensions, leading dimensions, ops, precision, epilogue and alignment.
//!
//! # What [`TacticDb::load`] returns
//! Only what can be used here, never an error, a warning for everything left out (also logged
//! through `tracing`):
//! - a missing file: an empty database, no warning;
//! - an unreadable file, one that does not parse (a truncated write, say), one of a format this
//!   build does not read, or one naming a library, kind or choice this build does not know
//!   (`"library": "rocblas"`): an empty database and a warning ("corrupt", or "stale" for an
//!   unknown format). Such a file is never overwritten by [`TacticDb::save`];
//! - a file tuned on another GPU or SM: an empty database and a warning ("foreign");
//! - a format-1 file (`format: 1`, entries `{ algo, workspace, heuristic_ms, tuned_ms }`, no
//!   library fields): read as cuBLASLt "gemm" entries whose version is the file's
//!   `identity.cublaslt`;
//! - entries whose library version is not the one loaded now (the given identity's
//!   `cublaslt`, `cudnn`) are left out, with one warning per library naming how many, their
//!   versions and the current one ("stale"): a format-1 file of another cuBLASLt therefore
//!   loads empty, as it always did, and convolution plans of another cuDNN are not used.
//!   They stay in the file;
//! - entries of a library whose current version the identity does not record (cuDNN where
//!   libcudnn is not installed: `cudnn` is `None`) are left out without a warning (they are
//!   not wrong, this process just has no use for them; a `tracing` debug line counts them).
//!   They stay in the file too;
//! - entries with a non-finite or negative time, and entries whose library, kind, choice and
//!   key disagree (a cuDNN entry holding a cuBLASLt algorithm, a "conv2d" key of kind "gemm",
//!   a legacy algorithm under a key that names the graph API, …): left out with one warning
//!   each kind ("inconsistent"); [`TacticDb::save`] refuses to write either.
//!
//! The engine ([`Gpu::load_tactics`](super::Gpu::load_tactics)) uses the cuBLASLt "gemm" and
//! "fp8_gemm" entries and the cuDNN "conv2d" entries of the cuDNN version it loads (it checks
//! the version again, for a database built in memory). A cuBLASLt entry's algorithm is still
//! checked by cuBLASLt (`cublasLtMatmulAlgoCheck`) before a plan uses it, and one cuBLASLt
//! rejects is not used. A convolution entry is rebuilt, without a search, the first time its
//! problem is planned: the engine by its global index with the recorded knobs (or the legacy
//! algorithm with its math type), used only if cuDNN finalizes it, it keeps the precision's
//! promise and its workspace fits the limit; otherwise a warning is logged and the problem is
//! planned as without the database.
//!
//! # Writing
//! Writes are atomic: the file is written beside its final name, flushed to disk and renamed
//! over it, so a reader sees the old file or the new one, never half of one. Writers take an
//! exclusive lock on `<file>.lock` and merge with everything on disk first (including entries
//! `load` leaves out as stale or unused), so two processes tuning at once both keep their
//! results and no library version's entries are lost. A save always writes format 2, so it
//! upgrades a format-1 file in place.
//!
//! Compatibility: a build reads both formats; adding a [`Library`], [`ProblemKind`] or
//! [`Choice`] variant keeps old files readable, but a build that predates a variant treats a
//! file using it as corrupt (ignores it, never overwrites it): a file holding "cudnn_engine"
//! or "cudnn_algo" entries is corrupt to builds from before the convolutions were tuned.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file format version this code writes. It reads this one and [`FORMAT_V1`].
pub const FORMAT: u32 = 2;

/// The first file format (cuBLASLt GEMM algorithms only): still read, and upgraded to
/// [`FORMAT`] by a save (module docs).
pub const FORMAT_V1: u32 = 1;

/// The bucket a row-major M falls in: the next power of two ≥ M (0 → 1; M is at most
/// [`MAX_DIM`](crate::MAX_DIM) in any valid problem, larger values saturate at `usize::MAX`).
pub fn m_bucket(m: usize) -> usize {
    m.max(1).checked_next_power_of_two().unwrap_or(usize::MAX)
}

/// Which machine a database belongs to, and the library versions present now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// GPU name, e.g. "NVIDIA H200" (cuDeviceGetName).
    pub gpu: String,
    /// Compute capability "major.minor", e.g. "9.0".
    pub sm: String,
    /// cuBLASLt version (cublasLtGetVersion, `major·10000 + minor·100 + patch`), e.g. 130100;
    /// 0 where libcublasLt is not loaded.
    pub cublaslt: usize,
    /// cuDNN version (cudnnGetVersion, `major·10000 + minor·100 + patch`), e.g. 91900; `None`
    /// (and absent from the file) where libcudnn is not installed, and in files written before
    /// the convolutions were tuned, which still load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn: Option<usize>,
}

impl Identity {
    /// The version of `library` present now, where this identity records it (cuBLASLt: always;
    /// cuDNN: where libcudnn is installed).
    pub fn version(&self, library: Library) -> Option<usize> {
        match library {
            Library::CublasLt => Some(self.cublaslt),
            Library::Cudnn => self.cudnn,
        }
    }
}

/// The library a tactic belongs to (serialised as "cublaslt", "cudnn").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Library {
    /// cuBLASLt (`libcublasLt`).
    #[serde(rename = "cublaslt")]
    CublasLt,
    /// cuDNN (`libcudnn`).
    #[serde(rename = "cudnn")]
    Cudnn,
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Library::CublasLt => "cuBLASLt",
            Library::Cudnn => "cuDNN",
        })
    }
}

/// The kind of problem a tactic serves (serialised as "gemm", "fp8_gemm", "conv2d"); its
/// signature's prefix follows from it (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// A cuBLASLt GEMM of this crate's precisions; key: the plan's signature (module docs).
    Gemm,
    /// An FP8 cuBLASLt GEMM; key prefix "fp8_gemm ".
    Fp8Gemm,
    /// A 2-D convolution; key prefix "conv2d ".
    Conv2d,
}

/// A tuned choice, tagged by `type` in the file (module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Choice {
    /// A cuBLASLt algorithm ("lt_algo").
    LtAlgo {
        /// `cublasLtMatmulAlgo_t`'s opaque data.
        algo: [u64; 8],
        /// Workspace it needs, bytes.
        workspace: usize,
    },
    /// A cuDNN graph (backend) API engine configuration ("cudnn_engine"): the execution plan
    /// is rebuilt from the engine's global index and these knob choices.
    CudnnEngine {
        /// The engine's global index (`CUDNN_ATTR_ENGINE_GLOBAL_INDEX`).
        engine: i64,
        /// The engine configuration's knob choices: `(cudnnBackendKnobType_t value, knob
        /// value)` pairs, in cuDNN's order.
        knobs: Vec<(u32, i64)>,
        /// Workspace the plan needs, bytes.
        workspace: usize,
        /// For a fused forward: the engine runs the convolution alone, followed by cuDNN's
        /// bias add and activation (no engine took the fused graph, or fusion was off).
        #[serde(default)]
        unfused: bool,
    },
    /// A cuDNN legacy API algorithm ("cudnn_algo").
    CudnnAlgo {
        /// The algorithm's value in its direction's enum (`cudnnConvolutionFwdAlgo_t`,
        /// `cudnnConvolutionBwdDataAlgo_t` or `cudnnConvolutionBwdFilterAlgo_t`).
        algo: u32,
        /// Its math type's value (`cudnnMathType_t`: 0 default, 1 tensor op, 2 tensor op
        /// allowing conversion, 3 FMA).
        math: u32,
        /// Workspace it needs, bytes.
        workspace: usize,
    },
}

/// One tuned choice: which library and version, which kind of problem, what was chosen, and
/// how fast it was when tuned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tactic {
    /// The library the choice is for.
    pub library: Library,
    /// That library's version when tuned (cuBLASLt: `major·10000 + minor·100 + patch`).
    pub version: usize,
    /// The kind of problem; decides the key's prefix (module docs).
    pub kind: ProblemKind,
    /// The choice.
    pub choice: Choice,
    /// The heuristic's first choice, median ms, when tuned.
    pub heuristic_ms: f64,
    /// This choice, median ms, when tuned.
    pub tuned_ms: f64,
}

impl Tactic {
    /// A cuBLASLt GEMM tactic: `algo` (`cublasLtMatmulAlgo_t`'s data) needing `workspace`
    /// bytes, tuned with cuBLASLt `version`; median times in ms.
    pub fn lt_gemm(algo: [u64; 8], workspace: usize, version: usize, heuristic_ms: f64, tuned_ms: f64) -> Tactic {
        Tactic {
            library: Library::CublasLt,
            version,
            kind: ProblemKind::Gemm,
            choice: Choice::LtAlgo { algo, workspace },
            heuristic_ms,
            tuned_ms,
        }
    }

    /// A cuBLASLt FP8 GEMM tactic (kind [`ProblemKind::Fp8Gemm`]), as [`Tactic::lt_gemm`].
    pub fn lt_fp8_gemm(algo: [u64; 8], workspace: usize, version: usize, heuristic_ms: f64, tuned_ms: f64) -> Tactic {
        Tactic { kind: ProblemKind::Fp8Gemm, ..Tactic::lt_gemm(algo, workspace, version, heuristic_ms, tuned_ms) }
    }

    /// A cuDNN convolution tactic (kind [`ProblemKind::Conv2d`]): `choice` (a
    /// [`Choice::CudnnEngine`] or [`Choice::CudnnAlgo`]) tuned with cuDNN `version`; median
    /// times in ms.
    pub fn cudnn_conv(choice: Choice, version: usize, heuristic_ms: f64, tuned_ms: f64) -> Tactic {
        Tactic { library: Library::Cudnn, version, kind: ProblemKind::Conv2d, choice, heuristic_ms, tuned_ms }
    }

    /// The cuBLASLt algorithm data and its workspace (bytes), for a cuBLASLt entry (of any
    /// kind: check [`kind`](Tactic::kind)); `None` for another library's.
    pub fn lt_algo(&self) -> Option<([u64; 8], usize)> {
        match (self.library, &self.choice) {
            (Library::CublasLt, &Choice::LtAlgo { algo, workspace }) => Some((algo, workspace)),
            _ => None,
        }
    }

    /// Same library, version and kind: tuned times that can be compared.
    fn comparable(&self, other: &Tactic) -> bool {
        self.library == other.library && self.version == other.version && self.kind == other.kind
    }
}

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

fn valid(t: &Tactic) -> bool {
    t.tuned_ms.is_finite() && t.heuristic_ms.is_finite() && t.tuned_ms >= 0.0 && t.heuristic_ms >= 0.0
}

/// Whether an entry's library, kind, choice and key agree: cuBLASLt GEMMs (`gemm`, key of no
/// other kind's prefix; `fp8_gemm`, key prefix "fp8_gemm ") hold a cuBLASLt algorithm, cuDNN
/// convolutions (key prefix "conv2d ") a graph-API engine (key token "graph") or a legacy
/// algorithm (token "legacy"). Anything else cannot have been written by this crate.
pub(crate) fn consistent(sig: &str, t: &Tactic) -> bool {
    let conv = sig.starts_with("conv2d ");
    let fp8 = sig.starts_with("fp8_gemm ");
    let has = |token: &str| sig.split(' ').any(|w| w == token);
    match (t.library, t.kind, &t.choice) {
        (Library::CublasLt, ProblemKind::Gemm, Choice::LtAlgo { .. }) => !conv && !fp8,
        (Library::CublasLt, ProblemKind::Fp8Gemm, Choice::LtAlgo { .. }) => fp8,
        (Library::Cudnn, ProblemKind::Conv2d, Choice::CudnnEngine { .. }) => conv && has("graph"),
        (Library::Cudnn, ProblemKind::Conv2d, Choice::CudnnAlgo { .. }) => conv && has("legacy"),
        _ => false,
    }
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
