//! What the routing floor keeps under the device's lock: the backends' states and the settings
//! that choose between them ([`Backend`]), and which one served a call ([`Served`]).

use crate::cuda::blas::BlasHandle;
use crate::cuda::device::Resources;
use crate::cuda::dnn::{ConvApi, ConvSearch, DnnState};
use crate::cuda::lt::LtState;
use crate::cuda::route::Padding;
use crate::tactics;

/// Which library runs a GEMM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// cuBLASLt wherever it supports the problem (and is installed), cuBLAS otherwise.
    /// Epilogues always need cuBLASLt.
    #[default]
    Auto,
    /// cuBLAS (`cublasGemmEx` / `cublasGemmStridedBatchedEx`); no epilogues.
    Blas,
    /// cuBLASLt (`cublasLtMatmul`) with cached plans; an error where it cannot run. Two cases
    /// still go to cuBLAS: α = 0 without an epilogue (C = β·C, A and B not read) and the
    /// unfused bias gradient where cuBLASLt has no BGRAD algorithm.
    Lt,
}

/// Which library a call was served by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// cuBLAS.
    Blas,
    /// cuBLASLt.
    Lt,
}

/// The backends' state, kept under the device's lock.
pub(crate) struct Libraries {
    /// The library chosen for calls.
    pub backend: Backend,
    pub blas: BlasHandle,
    /// `None` without libcublasLt.
    pub lt: Option<LtState>,
    /// When misaligned calls run on aligned copies.
    pub padding: Padding,
    /// cuDNN (created on the first convolution) and how it chooses algorithms.
    pub dnn: Option<DnnState>,
    pub conv_search: ConvSearch,
    pub conv_fuse: bool,
    pub conv_api: ConvApi,
    pub conv_ws_limit: usize,
    /// [`GpuOptions::norm_fusion`](crate::cuda::GpuOptions::norm_fusion)'s value.
    pub norm_fuse: bool,
    /// The tactic database's convolution and attention entries
    /// ([`Plans::load_tactics`](crate::cuda::Plans::load_tactics)), handed to the cuDNN room when
    /// it is created (it keeps those of its cuDNN version).
    pub dnn_tactics: std::collections::BTreeMap<String, tactics::Tactic>,
    /// [`GpuOptions::attention_search`](crate::cuda::GpuOptions::attention_search)'s value.
    pub attn_search: bool,
    /// How grouped GEMMs run
    /// ([`GpuOptions::grouped_backend`](crate::cuda::GpuOptions::grouped_backend),
    /// [`GpuOptions::grouped_streams`](crate::cuda::GpuOptions::grouped_streams)).
    pub grouped: crate::grouped::streams::GroupedSettings,
    /// [`GpuOptions::sm_count_target`](crate::cuda::GpuOptions::sm_count_target)'s value (0: all
    /// SMs); cuBLASLt's room keeps its own copy.
    pub sm_count_target: u32,
}

impl Libraries {
    /// Creates the cuDNN room on first use (libcudnn loaded, the handle made, the convolution
    /// settings and tactic-database entries handed over); `pool` as [`DnnState::new`]'s.
    ///
    /// # Errors
    /// As [`DnnState::new`].
    pub fn ensure_dnn(&mut self, pool: Option<usize>) -> crate::error::Result<()> {
        if self.dnn.is_none() {
            let mut d = DnnState::new(self.conv_search, self.conv_fuse, self.conv_api, pool)?;
            d.ws_limit = self.conv_ws_limit;
            d.attn_search = self.attn_search;
            d.load_tactics(self.dnn_tactics.iter());
            self.dnn = Some(d);
        }
        Ok(())
    }
}

impl Resources for Libraries {
    fn release(&mut self) {
        self.lt = None; // plans, graphs and the handle
        self.blas.release();
        if let Some(d) = self.dnn.as_mut() {
            d.release();
        }
    }

    fn leak(&mut self) {
        if let Some(lt) = self.lt.as_mut() {
            std::mem::forget(std::mem::take(&mut lt.replay.graphs));
        }
        if let Some(d) = self.dnn.as_mut() {
            d.leak();
        }
    }
}
