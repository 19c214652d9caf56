//! The tactic database: tuned library choices (cuBLASLt algorithms, cuDNN convolution and
//! attention plans)
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
//!   ([`DeviceInfo::tactic_identity`](crate::cuda::DeviceInfo::tactic_identity)).
//! - `entries`: [`Tactic`]s by signature. Each names its `library` ([`Library`]: "cublaslt",
//!   "cudnn"), that library's `version` when it was tuned (cuBLASLt: `cublasLtGetVersion()`,
//!   cuDNN: `cudnnGetVersion()`, both `major·10000 + minor·100 + patch`), the `kind` of problem
//!   ([`ProblemKind`]: "gemm", "fp8_gemm", "conv2d", "attention", "grouped_gemm"), the tuned
//!   `choice` ([`Choice`], tagged by `type`: "lt_algo"; for cuDNN's graph API "cudnn_engine",
//!   the engine's global index, its knob choices as `[knob type, value]` pairs and the plan's
//!   workspace in bytes; for cuDNN's legacy API "cudnn_algo", the algorithm's and the math
//!   type's enum values and the workspace; for a grouped GEMM "grouped_backend", the way it
//!   runs, e.g. `{ "type": "grouped_backend", "backend": "stream_pool" }`) and two median times in milliseconds measured when it was tuned:
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
//! An attention ("attention") key states the same for cuDNN's attention graph: the direction
//! (`fwd`, `fwd_stats` where the statistics are written, `bwd`, `fp8_fwd`, `fp8_fwd_stats`),
//! `b hq hkv sq skv d` with their values, the dtype, the mask (`none`, `causal`,
//! `causal_bottom_right`), `var_len` or `fixed`, `scale` (the f32 as Rust's `{:?}` writes it:
//! the shortest decimal that reads back as the same f32, e.g. `scale1.0`, `scale0.125`,
//! `scale1e-6`), the strides of q, k, v and o (`q<batch>,<head>,<row>` in elements) and the
//! alignment class (`al16`, `al8`, `al4`, `al2`, `al1`),
//! e.g. `attention fwd_stats b4 hq32 hkv8 sq4096 skv4096 d128 bf16 causal fixed
//! scale0.088388346 q16777216,128,4096 k4194304,128,1024 v4194304,128,1024 o16777216,128,4096
//! al16`. Its choice is a "cudnn_engine" whose workspace is the plan's whole (cuDNN's part and
//! the attention's own scratch). Nothing is bucketed.
//!
//! A grouped GEMM ("grouped_gemm") key is
//! [`GroupedProblem::signature`](crate::grouped::GroupedProblem::signature): the product, E,
//! N, K, the bucket of the total rows, the groups' spread (`equal`, or `skew<s>` with
//! s = log₂(largest / mean group) rounded) and the precision, e.g. `grouped_gemm forward e128
//! n768 k2048 m32768 skew5 bf16`: the group sizes change every step, so a choice serves every
//! problem of that layer alike in total and skew. Its entry is of library "cublaslt" (the
//! version loaded when it was measured); its `heuristic_ms` is the time of the engine's rule's
//! choice.
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
//! The engine ([`Plans::load_tactics`](crate::cuda::Plans::load_tactics)) uses the cuBLASLt "gemm"
//! and "fp8_gemm" entries, the "grouped_gemm" entries (a backend, used where it applies to the
//! problem), and the cuDNN "conv2d" and "attention" entries of the cuDNN version it loads (it
//! checks the version again, for a database built in memory). A cuBLASLt entry's algorithm is still
//! checked by cuBLASLt (`cublasLtMatmulAlgoCheck`) before a plan uses it, and one cuBLASLt rejects
//! is not used. A convolution entry is rebuilt, without a search, the first time its problem is
//! planned: the engine by its global index with the recorded knobs (or the legacy algorithm with
//! its math type), used only if cuDNN finalizes it, it keeps the precision's promise and its
//! workspace fits the limit; otherwise a warning is logged and the problem is planned as without
//! the database. An attention entry is rebuilt the same way (engine and knobs).
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

//!
//! The file's parts: `entry.rs` (what one tactic is: [`Identity`], [`Library`],
//! [`ProblemKind`], [`Choice`], [`Tactic`], the bucketing rule) and `db.rs` (the file:
//! [`TacticDb`]'s load, merge and atomic save).

mod db;
mod entry;

pub use db::TacticDb;
pub use entry::{m_bucket, Choice, Identity, Library, ProblemKind, Tactic};

/// The file format version this code writes. It reads this one and [`FORMAT_V1`].
pub const FORMAT: u32 = 2;

/// The first file format (cuBLASLt GEMM algorithms only): still read, and upgraded to
/// [`FORMAT`] by a save (module docs).
pub const FORMAT_V1: u32 = 1;
