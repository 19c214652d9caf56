//! The settings value itself ([`GpuOptions`]: its fields, defaults, builders and the rules that
//! need no device); the engine takes it at creation (`engine.rs`), `mod.rs` reads and updates
//! a live engine's.

use crate::cuda::device::{GraphReplay, MAX_MATMUL_BYTES};
use crate::cuda::dnn::{ConvApi, ConvSearch, CONV_WORKSPACE_LIMIT};
use crate::cuda::route::{Backend, Padding};
use crate::error::{Error, Result};
use crate::grouped::streams::{GroupedBackend, GroupedSettings};

/// The engine's settings. `GpuOptions::default()` is what [`Gpu::new`](crate::cuda::Gpu::new) uses; the builder
/// methods (one per field, same name) change one setting each:
///
/// ```no_run
/// use gemmbridge::cuda::{Backend, Gpu, GpuOptions};
/// # fn main() -> Result<(), gemmbridge::Error> {
/// let gpu = Gpu::with_options(0,
/// GpuOptions::default().backend(Backend::Lt).sm_count_target(Some(131)))?;
/// assert_eq!(gpu.options().backend, Backend::Lt);
/// # Ok(())
/// # }
/// ```
///
/// Checked when the engine is made or updated: first [`GpuOptions::validate`], the rules that
/// need no device (a CPU-only program or configuration loader can call it too), then, once the
/// device is open, the SM count target's upper bound. The fields are public to read and to set
/// on a value in hand (new fields may be added: build from `default()`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuOptions {
    /// The library dense GEMMs run on ([`Backend`]; default [`Backend::Auto`]).
    pub backend: Backend,
    /// The library workspace (bytes) each stream gets on its first call (plus 1 MiB of
    /// scratch); `None` (the default): 32 MiB on Hopper and later, 4 MiB before, the sizes
    /// cuBLASLt's documentation recommends. [`Gpu::options`](crate::cuda::Gpu::options) reports the size in use.
    /// Checked: at most [`GpuOptions::MAX_WORKSPACE_BYTES`] ([`Error::OutOfRange`](crate::Error::OutOfRange) otherwise);
    /// a size the device cannot allocate fails at a stream's first call ([`Error::Driver`](crate::Error::Driver),
    /// `cuMemAllocAsync`).
    pub workspace_bytes: Option<usize>,
    /// When calls whose operands are off 16-byte alignment run on aligned copies ([`Padding`];
    /// default on above the measured thresholds).
    pub padding: Padding,
    /// When repeated small eager calls are replayed from cached CUDA graphs ([`GraphReplay`];
    /// default on, for problems up to 1024³ multiply-adds, from the second call with the same
    /// operands; `GraphReplay::off()` turns it off). Without cuBLASLt nothing is replayed and
    /// the setting is not kept ([`Gpu::options`](crate::cuda::Gpu::options) then reports the default).
    pub graph_replay: GraphReplay,
    /// Leaves SMs free for kernels that run beside gemmbridge's GEMMs: dense GEMMs are planned
    /// for `Some(sms)` SMs (cuBLASLt's `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET` for
    /// [`Backend::Lt`] and Auto, `cublasSetSmCountTarget` for [`Backend::Blas`]); `None` (the
    /// default) uses them all. Plans are kept per target, and a tactic database entry applies
    /// only under the target it was tuned with (tuning runs under the engine's target,
    /// [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw); `gemmbridge tune --sm-count-target`): entries tuned on the whole
    /// GPU are not applied under a target, where the heuristic chooses for that SM count unless
    /// an entry tuned for it exists. FP8 GEMMs and convolutions are not affected. `Some(n)`
    /// with `n` equal to the device's SM count is a target too: its plans are cached apart and
    /// only entries tuned under it apply.
    ///
    /// Why: a kernel that stays resident while a GEMM runs — the spin kernel that orders the
    /// burn adapter's GEMMs with cubecl's stream — can keep one of the GEMM's CTAs from an SM
    /// until the others finish. Measured on the H200 (132 SMs, bf16 4096³, cuBLASLt 13.1): a
    /// one-thread kernel resident on another stream made the GEMM 1.46× slower; with a target
    /// of 131 SMs, 1.14× (1.055× without the resident kernel). See docs/PERFORMANCE.md.
    ///
    /// Checked: 1 to the device's SM count ([`Error::OutOfRange`](crate::Error::OutOfRange) otherwise; 0 by
    /// [`GpuOptions::validate`], the upper bound only once the device is open).
    pub sm_count_target: Option<u32>,
    /// Checks, before each raw call ([`Gpu::gemm_raw`](crate::cuda::Gpu::gemm_raw), [`GpuTuning::gemm_raw`](crate::cuda::GpuTuning::gemm_raw)), that every
    /// byte the call reads or writes lies inside one allocation this GPU can access — its own
    /// device memory (plain, stream-ordered pool or virtual-memory-managed), managed memory,
    /// or host memory CUDA allocated or registered — with `cuPointerGetAttributes`, one query
    /// per operand. Without the check, a host pointer given as a device address is enqueued
    /// and faults on the GPU, which breaks the context for every later call of the process
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`); with it, the call returns [`Error::NotDeviceMemory`](crate::Error::NotDeviceMemory)
    /// before anything is enqueued and the engine stays usable. Off by default, because it
    /// costs the host 0.44–0.51 µs per call with A, B and C on the H200 (1.55 → 1.99 µs for a
    /// replayed f32 64³ call, 1.65 → 2.16 µs bf16: `gemmbridge bench --ops launch`, fields
    /// `host_raw_us` and `host_raw_checked_us`), a third of the call itself.
    pub check_raw_addresses: bool,
    /// How convolution algorithms are chosen (default [`ConvSearch::Heuristic`]). A problem with an
    /// entry in a loaded tactic database ([`Plans::load_tactics`](crate::cuda::Plans::load_tactics))
    /// takes the entry's plan instead, unless cuDNN refuses it; a measured search's choice can be
    /// stored there ([`Plans::conv2d_tactic`](crate::cuda::Plans::conv2d_tactic)).
    pub conv_search: ConvSearch,
    /// Which cuDNN API runs convolutions (default [`ConvApi::Graph`]; [`ConvApi::Legacy`] is
    /// there for comparisons). Plans are kept per API.
    pub conv_api: ConvApi,
    /// Whether [`GpuConv::fused`](crate::cuda::GpuConv::fused) tries cuDNN's fused call (default, on) or runs the
    /// unfused sequence (the convolution, `cudnnAddTensor`, `cudnnActivationForward`): for
    /// comparisons. Plans are kept per setting.
    pub conv_fusion: bool,
    /// The most workspace (bytes) a convolution or attention plan may use; default 1 GiB. A
    /// plan that needs more than the stream's workspace ([`GpuOptions::workspace_bytes`],
    /// which the GEMMs share) runs on the cuDNN room's own, allocated in stream order when the
    /// plan is made and grown (never per call) when a later plan needs more; PyTorch lets
    /// cuDNN take whatever memory is free. The legacy API keeps to the stream's workspace.
    pub conv_workspace_limit: usize,
    /// How attention plans are chosen: `false` (the default) takes cuDNN's heuristic's first
    /// engine configuration that finalizes; `true` times up to 10 qualifying configurations
    /// of each of cuDNN's lists (heuristic mode A, then the fallback list) on the first call's
    /// own buffers and keeps the fastest — that first call then synchronises its stream, runs
    /// every candidate and is not capturable. A problem with an entry in a loaded tactic
    /// database takes the entry's engine instead, unless cuDNN refuses it; a measured choice
    /// can be stored there ([`Plans::attention_tactic`](crate::cuda::Plans::attention_tactic)).
    pub attention_search: bool,
    /// Forces how grouped products ([`Gpu::grouped_gemm`](crate::cuda::Gpu::grouped_gemm)) run
    /// ([`GroupedBackend`]), or with `None` (the default) lets the measured choices and the rule
    /// choose ([`Plans::grouped_backend`](crate::cuda::Plans::grouped_backend)). A forced backend
    /// that does not apply to a problem makes that call fail with
    /// [`Error::Unsupported`](crate::Error::Unsupported) before any launch (FP8 groups take the
    /// pool only).
    pub grouped_backend: Option<GroupedBackend>,
    /// How many streams a pooled grouped product spreads over (1 to 16; 4 by default, what
    /// TransformerEngine's grouped linear layer uses). Streams are added when a call first
    /// needs them and kept: raise it before capturing. Checked ([`Error::OutOfRange`](crate::Error::OutOfRange)).
    pub grouped_streams: usize,
    /// The most cuBLASLt plans the eager calls keep, dense and FP8 each (default 4096): when a
    /// new plan would pass it, the least recently used plans are dropped (rebuilt on their next
    /// use, which is then not capturable). A plan is a few host descriptors, about 1 KiB. Plans
    /// the caller holds ([`GemmPlan`](crate::cuda::GemmPlan)) are not in this cache. Checked: 1
    /// to [`GpuOptions::MAX_PLAN_CACHE_CAPACITY`] ([`Error::OutOfRange`](crate::Error::OutOfRange)).
    /// Without cuBLASLt there is no such cache: the setting is not kept.
    pub plan_cache_capacity: usize,
    /// Whether [`Gpu::rms_norm_forward`](crate::cuda::Gpu::rms_norm_forward) with a residual
    /// tries cuDNN's graph with the add fused (default, on) or runs the add, then the norm
    /// ([`NormServed::AddThenNorm`](crate::cuda::NormServed::AddThenNorm)), which it also does
    /// where cuDNN refuses the fused graph: for comparisons and tests.
    pub norm_fusion: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        let grouped = GroupedSettings::default();
        GpuOptions {
            backend: Backend::Auto,
            workspace_bytes: None,
            padding: Padding::default(),
            graph_replay: GraphReplay::default(),
            sm_count_target: None,
            check_raw_addresses: crate::cuda::device::CHECK_RAW_DEFAULT,
            conv_search: ConvSearch::default(),
            conv_api: ConvApi::default(),
            conv_fusion: true,
            conv_workspace_limit: CONV_WORKSPACE_LIMIT,
            attention_search: false,
            grouped_backend: grouped.backend,
            grouped_streams: grouped.streams,
            plan_cache_capacity: crate::cuda::lt::PLAN_CAPACITY,
            norm_fusion: true,
        }
    }
}

/// A builder method per field: these options with that field set.
macro_rules! builders {
    ($($(#[$doc:meta])* $field:ident: $ty:ty;)*) => {
        impl GpuOptions {
            $(
                $(#[$doc])*
                #[must_use = "returns new options; give them to Gpu::with_options or Gpu::update_options"]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

builders! {
    /// These options with [`GpuOptions::backend`] set.
    backend: Backend;
    /// These options with [`GpuOptions::workspace_bytes`] set.
    workspace_bytes: Option<usize>;
    /// These options with [`GpuOptions::padding`] set.
    padding: Padding;
    /// These options with [`GpuOptions::graph_replay`] set.
    graph_replay: GraphReplay;
    /// These options with [`GpuOptions::sm_count_target`] set.
    sm_count_target: Option<u32>;
    /// These options with [`GpuOptions::check_raw_addresses`] set.
    check_raw_addresses: bool;
    /// These options with [`GpuOptions::conv_search`] set.
    conv_search: ConvSearch;
    /// These options with [`GpuOptions::conv_api`] set.
    conv_api: ConvApi;
    /// These options with [`GpuOptions::conv_fusion`] set.
    conv_fusion: bool;
    /// These options with [`GpuOptions::conv_workspace_limit`] set.
    conv_workspace_limit: usize;
    /// These options with [`GpuOptions::attention_search`] set.
    attention_search: bool;
    /// These options with [`GpuOptions::grouped_backend`] set.
    grouped_backend: Option<GroupedBackend>;
    /// These options with [`GpuOptions::grouped_streams`] set.
    grouped_streams: usize;
    /// These options with [`GpuOptions::plan_cache_capacity`] set.
    plan_cache_capacity: usize;
    /// These options with [`GpuOptions::norm_fusion`] set.
    norm_fusion: bool;
}

impl GpuOptions {
    /// The largest [`GpuOptions::workspace_bytes`]: what a stream's workspace arithmetic
    /// holds — the size rounded up to 256 bytes (cuBLASLt's alignment) plus the 1 MiB of
    /// scratch within `isize::MAX` bytes. Far above any device's memory: it guards the
    /// arithmetic, and a size the device cannot allocate fails at a stream's first call.
    pub const MAX_WORKSPACE_BYTES: usize = MAX_MATMUL_BYTES;

    /// The largest [`GpuOptions::plan_cache_capacity`]: 2²⁰ plans, about 1 GiB of host
    /// descriptors per cache.
    pub const MAX_PLAN_CACHE_CAPACITY: usize = 1 << 20;

    /// Checks every rule that needs no device, in this order: an SM count target of at least
    /// 1, a workspace of at most [`GpuOptions::MAX_WORKSPACE_BYTES`], a pool of 1 to 16
    /// streams, a plan cache of 1 to [`GpuOptions::MAX_PLAN_CACHE_CAPACITY`] plans. [`Gpu::with_options`](crate::cuda::Gpu::with_options), [`Gpu::with_stream`](crate::cuda::Gpu::with_stream) and [`Gpu::update_options`](crate::cuda::Gpu::update_options) run
    /// it before anything else; the SM count target's upper bound (the device's SM count)
    /// needs the device and is checked there once it is open.
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) naming the setting and the value.
    pub fn validate(&self) -> Result<()> {
        if self.sm_count_target == Some(0) {
            let expected = "1 to the device's SMs (or None for all of them)".to_string();
            return Err(Error::OutOfRange { what: "SM count target", value: 0, expected });
        }
        if let Some(b) = self.workspace_bytes.filter(|&b| b > Self::MAX_WORKSPACE_BYTES) {
            return Err(Error::OutOfRange {
                what: "workspace bytes",
                value: b as u64,
                expected: format!("at most {} (GpuOptions::MAX_WORKSPACE_BYTES)", Self::MAX_WORKSPACE_BYTES),
            });
        }
        GroupedSettings::check_streams(self.grouped_streams)?;
        if !(1..=Self::MAX_PLAN_CACHE_CAPACITY).contains(&self.plan_cache_capacity) {
            return Err(Error::OutOfRange {
                what: "plan cache capacity",
                value: self.plan_cache_capacity as u64,
                expected: format!("1 to {} (GpuOptions::MAX_PLAN_CACHE_CAPACITY)", Self::MAX_PLAN_CACHE_CAPACITY),
            });
        }
        Ok(())
    }

    /// [`GpuOptions::validate`], then the SM count target against a device of `sms` SMs.
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange): as [`GpuOptions::validate`]; an SM count target above `sms`.
    pub(crate) fn validate_for(&self, sms: u32) -> Result<()> {
        self.validate()?;
        match self.sm_count_target {
            Some(n) if n > sms => Err(Error::OutOfRange {
                what: "SM count target",
                value: u64::from(n),
                expected: format!("1 to {sms}, the device's SMs (or None for all of them)"),
            }),
            _ => Ok(()),
        }
    }
}
