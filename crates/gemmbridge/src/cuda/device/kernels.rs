//! gemmbridge's own kernels (`kernels/*.cu`): compiled with NVRTC for the device's
//! architecture on first use — once per process for a primary context ([`shared`]), once per
//! engine otherwise — and launched on raw streams.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::cuda::library;
use crate::cuda::status;
use crate::error::{Error, Result};

/// The suffix of a kernel's instance for a source dtype (`amax_bf16`, `gelu_erf_f32`, …).
pub(crate) fn suffix(d: crate::dtype::DType) -> &'static str {
    match d {
        crate::dtype::DType::F32 => "f32",
        crate::dtype::DType::F16 => "f16",
        crate::dtype::DType::BF16 => "bf16",
    }
}

/// CUDA's largest grid x dimension (2³¹ − 1), for every kernel of ours.
pub(crate) const GRID_X_MAX: u64 = i32::MAX as u64;
/// CUDA's largest grid y (and z) dimension.
pub(crate) const GRID_Y_MAX: u64 = 65535;

/// The stack of the thread NVRTC compiles on. NVRTC's front end recurses deeply: CCCL measured
/// 1.0–1.5 MiB for CUB's headers (NVIDIA/cccl pull request 10839), near the 2 MiB of a thread
/// Rust spawns and above what some runtimes give their workers. Compiling on a thread of our
/// own makes the caller's stack irrelevant; only the pages touched are committed.
const NVRTC_STACK: usize = 64 << 20;

/// A kernel argument: the address of a local, as `cuLaunchKernel` takes it.
pub(crate) fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

/// A module of gemmbridge's own kernels, compiled on its first use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelSet {
    /// FP8 quantisation (`kernels/fp8.cu`; needs compute capability 8.9).
    Fp8,
    /// The training layers' elementwise kernels (`kernels/act.cu`; any GPU).
    Train,
    /// The misaligned-operand path's pitched copy with zero fill (`kernels/copy.cu`; any GPU).
    Copy,
    /// A transformer layer's elementwise operations, RoPE and SwiGLU (`kernels/layer.cu`;
    /// compute capability 7.0 or later, for its `__grid_constant__` argument), and a
    /// mixture-of-experts layer's routing pieces (`kernels/moe.cu`, which uses layer.cu's
    /// exponential).
    Layer,
    /// The append into a paged KV cache (`kernels/paged.cu`; any GPU).
    Paged,
}

impl KernelSet {
    /// Index into the device state's module slots.
    pub const fn index(self) -> usize {
        self as usize
    }

    fn source(self) -> (&'static str, &'static str) {
        match self {
            KernelSet::Fp8 => {
                (concat!(include_str!("kernels/fp8_chunks.cu"), include_str!("kernels/fp8.cu")), "gemmbridge_fp8.cu")
            }
            KernelSet::Train => {
                (concat!(include_str!("kernels/elem.cu"), include_str!("kernels/act.cu")), "gemmbridge_act.cu")
            }
            KernelSet::Copy => (include_str!("kernels/copy.cu"), "gemmbridge_copy.cu"),
            KernelSet::Layer => (
                concat!(
                    include_str!("kernels/elem.cu"),
                    include_str!("kernels/layer.cu"),
                    include_str!("kernels/moe.cu")
                ),
                "gemmbridge_layer.cu",
            ),
            KernelSet::Paged => (include_str!("kernels/paged.cu"), "gemmbridge_paged.cu"),
        }
    }

    /// Every kernel's name and the suffixes of its instances (per source dtype: `_f32`, `_f16`,
    /// `_bf16`; the copies per element size in bytes: `_b2`, `_b4`), and the kernels of one
    /// instance, named without a suffix.
    fn kernels(self) -> (&'static [&'static str], &'static [&'static str], &'static [&'static str]) {
        let (typed, suffixes) = self.typed();
        let plain: &[&str] = match self {
            KernelSet::Layer => &["moe_count", "moe_scan", "moe_place", "moe_starts", "moe_clamp", "moe_pad"],
            _ => &[],
        };
        (typed, suffixes, plain)
    }

    /// The kernels with an instance per suffix, and the suffixes.
    fn typed(self) -> (&'static [&'static str], &'static [&'static str]) {
        const DTYPES: &[&str] = &["f32", "f16", "bf16"];
        match self {
            KernelSet::Fp8 => (
                &[
                    "amax",
                    "cast_tensor",
                    "cast_rows",
                    "cast_rows_short",
                    "cast_vec128",
                    "cast_blk128",
                    "cast_transpose",
                    "transpose",
                    "attn_bwd_scales",
                ],
                DTYPES,
            ),
            KernelSet::Train => (
                &[
                    "dact_relu",
                    "dact_gelu_tanh",
                    "dact_gelu_erf",
                    "gelu_erf",
                    "gelu_tanh",
                    "relu",
                    "dact_gelu_tanh_v8",
                    "gelu_tanh_v8",
                ],
                DTYPES,
            ),
            KernelSet::Copy => (&["pad_copy"], &["b2", "b4"]),
            KernelSet::Paged => (&["paged_append_v8", "paged_append"], &["b2"]),
            KernelSet::Layer => (
                &[
                    "rope_neox_v8",
                    "rope_neox",
                    "rope_gptj_v8",
                    "rope_gptj",
                    "swiglu",
                    "dswiglu",
                    "swiglu_v8",
                    "swiglu_il_v8",
                    "dswiglu_v8",
                    "dswiglu_il_v8",
                    "moe_topk",
                    "moe_combine",
                    "moe_combine_bwd",
                    "moe_gather",
                    "moe_zero_rows",
                ],
                DTYPES,
            ),
        }
    }

    /// The virtual architecture NVRTC compiles for: the device's own where NVRTC knows it,
    /// else the oldest the set needs (FP8 conversions: 8.9; the others: 7.0),
    /// which the driver compiles forward.
    fn arch(self, (major, _minor): (i32, i32)) -> &'static str {
        match (major, self) {
            (9, _) => "compute_90",
            (10, _) => "compute_100",
            (12, _) => "compute_120",
            (8, KernelSet::Train | KernelSet::Copy | KernelSet::Layer | KernelSet::Paged) => "compute_80",
            (_, KernelSet::Fp8) => "compute_89",
            (_, KernelSet::Train | KernelSet::Copy | KernelSet::Layer | KernelSet::Paged) => "compute_70",
        }
    }
}

/// The modules compiled for primary contexts, by device ordinal and set: kept for the life of
/// the process, like the context itself (`lifetime::keep_primary`), so that engines created
/// and dropped in turn neither compile again nor unload a module another may be using.
static SHARED: Mutex<Vec<(usize, KernelSet, Arc<Kernels>)>> = Mutex::new(Vec::new());

/// The kernels of `set` for `ctx`'s device: the process's shared module for a primary
/// context (compiled by the first engine that needs it), else a module of this context's own.
/// The caller has bound the context and relaxed the thread's capture mode.
///
/// # Errors
/// As [`Kernels::compile`]; a failure is not kept (the next call tries again).
pub(crate) fn shared(ctx: &Arc<CudaContext>, set: KernelSet) -> Result<Arc<Kernels>> {
    let cc = ctx.compute_capability().map_err(status::driver("cuDeviceGetAttribute"))?;
    if !ctx.is_primary() {
        return Ok(Arc::new(Kernels::compile(ctx, cc, set)?));
    }
    let ordinal = ctx.ordinal();
    // Held while compiling: another engine that needs the same module waits for it.
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, k)) = shared.iter().find(|(o, s, _)| *o == ordinal && *s == set) {
        return Ok(k.clone());
    }
    let k = Arc::new(Kernels::compile(ctx, cc, set)?);
    shared.push((ordinal, set, k.clone()));
    Ok(k)
}

/// The compiled module and its functions by name.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
}

impl Kernels {
    /// Compiles a set of kernels for the context's device (compute capability `cc`; ≥ 8.9 for
    /// FP8, checked by the caller) and loads them.
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] without libnvrtc; [`Error::Driver`] naming NVRTC's or the
    /// driver's failure (with NVRTC's log).
    pub fn compile(ctx: &Arc<CudaContext>, cc: (i32, i32), set: KernelSet) -> Result<Kernels> {
        library::ensure_nvrtc()?;
        let (source, name) = set.source();
        let opts = CompileOptions { arch: Some(set.arch(cc)), name: Some(name.into()), ..Default::default() };
        let failed = |status: String| Error::Driver { operation: "nvrtcCompileProgram", status };
        let ptx = std::thread::Builder::new()
            .name("gemmbridge-nvrtc".into())
            .stack_size(NVRTC_STACK)
            .spawn(move || compile_ptx_with_opts(source, opts))
            .map_err(|e| Error::Driver { operation: "std::thread::spawn (NVRTC's thread)", status: e.to_string() })?
            .join()
            .map_err(|panic| {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                failed(format!("the compiling thread panicked: {why}"))
            })?
            .map_err(|e| {
                failed(match e {
                    CompileError::CompileError { nvrtc, log, .. } => format!("{nvrtc:?}: {}", log.to_string_lossy()),
                    other => format!("{other:?}"),
                })
            })?;
        let module = ctx.load_module(ptx).map_err(status::driver("cuModuleLoadData"))?;
        let mut functions = HashMap::new();
        let (kernels, suffixes, plain) = set.kernels();
        let typed = kernels.iter().flat_map(|k| suffixes.iter().map(move |s| format!("{k}_{s}")));
        for name in typed.chain(plain.iter().map(|k| k.to_string())) {
            let f = module.load_function(&name).map_err(status::driver("cuModuleGetFunction"))?;
            functions.insert(name, f);
        }
        Ok(Kernels { _module: module, functions })
    }

    /// Enqueues kernel `name` on `stream`.
    ///
    /// # Safety
    /// `args` point to values of exactly the kernel's parameter types, in order, and every
    /// device address among them is valid for what the kernel reads and writes with the
    /// given grid; `stream` is a live stream of the module's context, which is current.
    pub unsafe fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        stream: CUstream,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self
            .functions
            .get(name)
            .ok_or(Error::Driver { operation: "cuModuleGetFunction", status: format!("no kernel named {name}") })?;
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::launch_kernel(f.cu_function(), grid, (block, 1, 1), 0, stream, args) }
            .map_err(status::driver("cuLaunchKernel"))
    }
}

// SAFETY: CUfunction handles are plain driver handles usable from any thread, and launching
// one from several threads at once is allowed (cuLaunchKernel takes no lock of ours); the
// module is only loaded and unloaded, never changed.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}
