//! One tactic: the machine's identity, the library and kind of problem, the tuned choice and
//! its times; the bucketing rule of GEMM keys; which combinations belong together.

use serde::{Deserialize, Serialize};

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

/// The kind of problem a tactic serves (serialised as "gemm", "fp8_gemm", "conv2d",
/// "attention", "grouped_gemm"); its signature's prefix follows from it (module docs).
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
    /// Scaled-dot-product attention on cuDNN; key prefix "attention ".
    Attention,
    /// A grouped GEMM's way of running; key prefix "grouped_gemm "
    /// ([`GroupedProblem::signature`](crate::grouped::GroupedProblem::signature)).
    GroupedGemm,
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
    /// How a grouped GEMM runs ("grouped_backend"): one of the ways of
    /// [`GroupedBackend`](crate::grouped::streams::GroupedBackend), measured fastest.
    GroupedBackend {
        /// The way ("strided_batch", "grouped_batched", "stream_pool", "in_order").
        backend: crate::grouped::streams::GroupedBackend,
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

    /// A cuDNN attention tactic (kind [`ProblemKind::Attention`]): `choice` (a
    /// [`Choice::CudnnEngine`]; its workspace is the plan's whole, cuDNN's part and the
    /// attention's own scratch) tuned with cuDNN `version`; median times in ms.
    pub fn cudnn_attention(choice: Choice, version: usize, heuristic_ms: f64, tuned_ms: f64) -> Tactic {
        Tactic { library: Library::Cudnn, version, kind: ProblemKind::Attention, choice, heuristic_ms, tuned_ms }
    }

    /// A grouped GEMM tactic (kind [`ProblemKind::GroupedGemm`]): `backend`, measured with
    /// cuBLASLt `version` loaded (the pool runs cuBLASLt plans; cuBLAS's grouped call ships
    /// with it); median times in ms, `heuristic_ms` the rule's choice's.
    pub fn grouped(
        backend: crate::grouped::streams::GroupedBackend,
        version: usize,
        heuristic_ms: f64,
        tuned_ms: f64,
    ) -> Tactic {
        let choice = Choice::GroupedBackend { backend };
        Tactic { library: Library::CublasLt, version, kind: ProblemKind::GroupedGemm, choice, heuristic_ms, tuned_ms }
    }

    /// The grouped GEMM backend of a [`ProblemKind::GroupedGemm`] entry; `None` otherwise.
    pub fn grouped_backend(&self) -> Option<crate::grouped::streams::GroupedBackend> {
        match (self.kind, &self.choice) {
            (ProblemKind::GroupedGemm, &Choice::GroupedBackend { backend }) => Some(backend),
            _ => None,
        }
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
    pub(super) fn comparable(&self, other: &Tactic) -> bool {
        self.library == other.library && self.version == other.version && self.kind == other.kind
    }
}

/// Whether both times are finite and not negative.
pub(super) fn valid(t: &Tactic) -> bool {
    t.tuned_ms.is_finite() && t.heuristic_ms.is_finite() && t.tuned_ms >= 0.0 && t.heuristic_ms >= 0.0
}

/// Whether an entry's library, kind, choice and key agree: cuBLASLt GEMMs (`gemm`, key of no
/// other kind's prefix; `fp8_gemm`, key prefix "fp8_gemm ") hold a cuBLASLt algorithm, cuDNN
/// convolutions (key prefix "conv2d ") a graph-API engine (key token "graph") or a legacy
/// algorithm (token "legacy"), cuDNN attention (key prefix "attention ") a graph-API engine
/// that is not `unfused`, grouped GEMMs (key prefix "grouped_gemm ") a backend.
/// Anything else cannot have been
/// written by this crate.
pub(crate) fn consistent(sig: &str, t: &Tactic) -> bool {
    let conv = sig.starts_with("conv2d ");
    let fp8 = sig.starts_with("fp8_gemm ");
    let attn = sig.starts_with("attention ");
    let grouped = sig.starts_with("grouped_gemm ");
    let has = |token: &str| sig.split(' ').any(|w| w == token);
    match (t.library, t.kind, &t.choice) {
        (Library::CublasLt, ProblemKind::Gemm, Choice::LtAlgo { .. }) => !conv && !fp8 && !attn && !grouped,
        (Library::CublasLt, ProblemKind::Fp8Gemm, Choice::LtAlgo { .. }) => fp8,
        (Library::Cudnn, ProblemKind::Conv2d, Choice::CudnnEngine { .. }) => conv && has("graph"),
        (Library::Cudnn, ProblemKind::Conv2d, Choice::CudnnAlgo { .. }) => conv && has("legacy"),
        // attention has no unfused form (that flag is the fused convolution forward's)
        (Library::Cudnn, ProblemKind::Attention, Choice::CudnnEngine { unfused: false, .. }) => attn,
        (Library::CublasLt, ProblemKind::GroupedGemm, Choice::GroupedBackend { .. }) => grouped,
        _ => false,
    }
}
