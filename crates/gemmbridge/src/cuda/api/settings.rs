//! The engine's settings: library choice, workspaces, tactics, plan and replay caches,
//! padding, SM count target, raw-address checks.

use super::engine::Gpu;
use crate::cuda::device::GraphReplay;
use crate::cuda::lt::launch::Algorithm;
use crate::cuda::route::{Backend, Padding};
use crate::cuda::status;
use crate::error::{Error, Result};
use crate::tactics;

impl Gpu {
    /// Chooses the library for later calls (default [`Backend::Auto`]).
    pub fn set_backend(&self, backend: Backend) {
        self.lock().libs.backend = backend;
    }

    /// The library chosen for calls.
    pub fn backend(&self) -> Backend {
        self.lock().libs.backend
    }

    /// Whether cuBLASLt was found.
    pub fn has_lt(&self) -> bool {
        self.lock().libs.lt.is_some()
    }

    /// Sets the workspace size (bytes) for streams that get their first call from now on.
    pub fn set_workspace_bytes(&self, bytes: usize) {
        self.lock().dev.workspaces.bytes = bytes;
    }

    /// The workspace size (bytes) new streams get.
    pub fn workspace_bytes(&self) -> usize {
        self.lock().dev.workspaces.bytes
    }

    /// Loads tuned algorithms (from [`tactics::TacticDb::load`]): plans built from now on use
    /// them wherever cuBLASLt confirms they are valid (cublasLtMatmulAlgoCheck); cached plans
    /// are dropped so that they are rebuilt.
    ///
    /// Convolutions: the entries of kind "conv2d" tuned with the cuDNN version this process
    /// loads (entries of another are left out with a warning, once the cuDNN room exists) are
    /// kept by problem signature. The first time a problem with an entry is planned, its plan is
    /// rebuilt from the entry without a search, whatever [`Gpu::set_conv_search`] says: the
    /// graph API's engine by its global index with the recorded knobs (the legacy API's
    /// algorithm with its math type), used if cuDNN finalizes it, it keeps the precision's
    /// promise and its workspace fits [`Gpu::set_conv_workspace_limit`] (the legacy API: the
    /// stream's workspace); otherwise a warning is logged and the problem is planned as without
    /// the database. Convolution plans an entry replaces are dropped.
    ///
    /// Attention: the entries of kind "attention" of the cuDNN version loaded are taken the
    /// same way; a problem, direction and alignment with an entry is planned from its engine
    /// and knobs, whatever [`Gpu::set_attention_search`] says, if cuDNN finalizes the plan and
    /// its workspace fits the limit (otherwise a warning, and the usual planning). Attention
    /// plans an entry replaces are dropped.
    ///
    /// Grouped GEMMs: the entries of kind "grouped_gemm" are kept by signature
    /// ([`crate::grouped::GroupedProblem::signature`]); a problem with an entry runs the
    /// entry's backend where it applies to it and none is forced
    /// ([`crate::grouped::streams::GroupedSettings::choose`]).
    pub fn load_tactics(&self, db: &tactics::TacticDb) {
        {
            let mut st = self.lock();
            let grouped = db.entries.iter().filter_map(|(k, t)| Some((k.clone(), t.grouped_backend()?)));
            st.libs.grouped.tuned.extend(grouped);
            let kinds = [tactics::ProblemKind::Conv2d, tactics::ProblemKind::Attention];
            let dnn = db.entries.iter().filter(|(_, t)| kinds.contains(&t.kind));
            st.libs.dnn_tactics.extend(dnn.map(|(k, t)| (k.clone(), t.clone())));
            if let Some(d) = st.libs.dnn.as_mut() {
                let _ = self.device().bind(); // replay graphs may be destroyed
                d.load_tactics(db.entries.iter());
            }
        }
        self.with_lt(|lt| {
            // GEMM and FP8 GEMM keys share the map: their prefixes never collide (tactics docs)
            let lt_kinds = [tactics::ProblemKind::Gemm, tactics::ProblemKind::Fp8Gemm];
            for (sig, t) in db.entries.iter().filter(|(_, t)| lt_kinds.contains(&t.kind)) {
                if let Some((data, workspace)) = t.lt_algo() {
                    lt.tuned.insert(sig.clone(), Algorithm { data, workspace });
                }
            }
            lt.forget_plans(|_| true);
        });
    }

    /// The signatures of the tuned entries this `Gpu` has built plans with since it was
    /// created, sorted: entries of a tactic database ([`Gpu::load_tactics`]) and choices this
    /// `Gpu` tuned itself ([`Gpu::autotune_raw`], [`Gpu::autotune_fp8`]: these keep their
    /// result for their signature, even where it is the heuristic's own choice) — cuBLASLt GEMM
    /// and FP8 entries whose algorithm cuBLASLt accepted for the call, convolution and attention
    /// entries cuDNN rebuilt, grouped GEMM entries whose way ran a call ([`Gpu::tune_grouped`]'s
    /// included). Never cleared (loading other entries or dropping plans keeps the record). An
    /// entry that was loaded but is missing here has served no call yet — or was refused (a
    /// warning is logged) or does not match the calls made (another alignment, workspace or SM
    /// count target gives another signature). `gemmbridge tune` uses this to check that the
    /// call it times is the one an entry serves.
    pub fn applied_tactics(&self) -> Vec<String> {
        let st = self.lock();
        let mut all: Vec<String> =
            st.libs.lt.as_ref().map(|lt| lt.applied.iter().cloned().collect()).unwrap_or_default();
        all.extend(st.libs.dnn.as_ref().map(|d| d.applied().iter().cloned().collect::<Vec<_>>()).unwrap_or_default());
        all.extend(st.libs.grouped.applied.iter().cloned());
        all.sort();
        all
    }

    /// Number of cached cuBLASLt plans.
    pub fn cached_plans(&self) -> usize {
        self.lock().libs.lt.as_ref().map_or(0, |lt| lt.plans.len())
    }

    /// Drops every cached plan and replay graph (they are rebuilt on next use).
    pub fn clear_plans(&self) {
        self.with_lt(|lt| {
            lt.forget_plans(|_| true);
            lt.unsupported.clear();
        });
    }

    /// Chooses when repeated small eager calls are replayed from cached CUDA graphs
    /// ([`GraphReplay`]; default on, for problems up to 1024³ multiply-adds, from the second
    /// call with the same operands). Changing it drops the graphs cached so far. Without
    /// cuBLASLt nothing is replayed and the setting is not kept.
    pub fn set_graph_replay(&self, options: GraphReplay) {
        self.with_lt(|lt| {
            lt.replay.clear();
            lt.replay.options = options;
            lt.composite.clear();
            lt.composite.options = options;
        });
    }

    /// The replay settings in use.
    pub fn graph_replay(&self) -> GraphReplay {
        self.lock().libs.lt.as_ref().map_or_else(GraphReplay::default, |lt| lt.replay.options)
    }

    /// Chooses when calls whose operands are off 16-byte alignment run on aligned copies
    /// ([`Padding`]; default on above the measured thresholds).
    pub fn set_padding(&self, padding: Padding) {
        self.lock().libs.padding = padding;
    }

    /// The padding settings in use.
    pub fn padding(&self) -> Padding {
        self.lock().libs.padding
    }

    /// Leaves SMs free for kernels that run beside gemmbridge's GEMMs: dense GEMMs planned from
    /// now on are told to use `Some(sms)` SMs (cuBLASLt's `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`
    /// for [`Backend::Lt`] and Auto, `cublasSetSmCountTarget` for [`Backend::Blas`]); `None`
    /// (the default) uses them all. Plans are kept per target, and a tactic database entry
    /// applies only under the target it was tuned with (tuning runs under the `Gpu`'s target,
    /// [`Gpu::autotune_raw`]; `gemmbridge tune --sm-count-target`): entries tuned on the whole
    /// GPU are not applied under a target, where the heuristic chooses for that SM count unless
    /// an entry tuned for it exists. FP8 GEMMs and convolutions are not affected.
    ///
    /// Why: a kernel that stays resident while a GEMM runs — the spin kernel that orders the
    /// burn adapter's GEMMs with cubecl's stream — can keep one of the GEMM's CTAs from an SM
    /// until the others finish. Measured on the H200 (132 SMs, bf16 4096³, cuBLASLt 13.1): a
    /// one-thread kernel resident on another stream made the GEMM 1.46× slower; with a target
    /// of 131 SMs, 1.14× (1.055× without the resident kernel). See docs/PERFORMANCE.md.
    ///
    /// `Some(n)` with `n` equal to the device's SM count is a target too: its plans are cached
    /// apart and only entries tuned under it apply; `None` is the default.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for 0 or more SMs than the device has (nothing changed);
    /// [`Error::Driver`] from the device query; [`Error::Cublas`] from cuBLAS.
    pub fn set_sm_count_target(&self, sms: Option<u32>) -> Result<()> {
        let have = self
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(status::driver("cuDeviceGetAttribute"))? as u32;
        let n = match sms {
            None => 0,
            Some(n) if (1..=have).contains(&n) => n,
            Some(n) => {
                return Err(Error::OutOfRange {
                    what: "SM count target",
                    value: u64::from(n),
                    expected: format!("1 to {have}, the device's SMs (or None for all of them)"),
                })
            }
        };
        let mut st = self.lock();
        self.device().bind()?;
        st.libs.blas.set_sm_count_target(n as i32)?;
        st.libs.sm_count_target = n;
        if let Some(lt) = st.libs.lt.as_mut() {
            lt.sm_count = n;
        }
        Ok(())
    }

    /// The SM count target set by [`Gpu::set_sm_count_target`] (`None`: all SMs).
    pub fn sm_count_target(&self) -> Option<u32> {
        Some(self.lock().libs.sm_count_target).filter(|&n| n > 0)
    }

    /// Checks, before each raw call ([`Gpu::gemm_raw`], [`Gpu::autotune_raw`]), that every
    /// byte the call reads or writes lies inside one allocation this GPU can access — its own
    /// device memory (plain, stream-ordered pool or virtual-memory-managed), managed memory,
    /// or host memory CUDA allocated or registered — with `cuPointerGetAttributes`, one query
    /// per operand. Without the check, a host pointer given as a device address is enqueued
    /// and faults on the GPU, which breaks the context for every later call of the process
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`); with it, the call returns [`Error::NotDeviceMemory`]
    /// before anything is enqueued and the engine stays usable. Off by default, because it
    /// costs the host 0.44–0.51 µs per call with A, B and C on the H200 (1.55 → 1.99 µs for a
    /// replayed f32 64³ call, 1.65 → 2.16 µs bf16: `gemmbridge bench --ops launch`, fields
    /// `host_raw_us` and `host_raw_checked_us`), a third of the call itself.
    pub fn set_check_raw_addresses(&self, on: bool) {
        self.device().set_check_raw_addresses(on);
    }

    /// Whether raw addresses are checked ([`Gpu::set_check_raw_addresses`]).
    pub fn check_raw_addresses(&self) -> bool {
        self.device().checks_raw_addresses()
    }

    /// Number of cached replay graphs: of single calls, and of whole grouped GEMMs.
    pub fn cached_graphs(&self) -> usize {
        self.lock().libs.lt.as_ref().map_or(0, |lt| lt.replay.graphs.len() + lt.composite.graphs.len())
    }
}
