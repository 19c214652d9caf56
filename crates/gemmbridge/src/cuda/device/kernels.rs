//! gemmbridge's own kernels (`kernels/*.cu`): compiled once per device with NVRTC for its
//! architecture, on first use, and kept with the device's state; launched on raw streams.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::cuda::{library, status};
use crate::error::{Error, Result};

/// The FP8 quantisation kernels' source.
const FP8_SOURCE: &str = include_str!("kernels/fp8.cu");

/// The virtual architecture NVRTC compiles for: the device's own where NVRTC knows it, else
/// the oldest with FP8 conversions (8.9), which the driver compiles forward.
fn arch((major, minor): (i32, i32)) -> &'static str {
    match (major, minor) {
        (9, _) => "compute_90",
        (10, _) => "compute_100",
        (12, _) => "compute_120",
        _ => "compute_89",
    }
}

/// The compiled module and its functions by name.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
}

impl Kernels {
    /// Compiles the kernels for the context's device (compute capability `cc`, ≥ 8.9:
    /// checked by the caller) and loads them.
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] without libnvrtc; [`Error::Driver`] naming NVRTC's or the
    /// driver's failure (with NVRTC's log).
    pub fn compile(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Kernels> {
        library::ensure_nvrtc()?;
        let opts =
            CompileOptions { arch: Some(arch(cc)), name: Some("gemmbridge_fp8.cu".into()), ..Default::default() };
        let ptx = compile_ptx_with_opts(FP8_SOURCE, opts).map_err(|e| Error::Driver {
            operation: "nvrtcCompileProgram",
            status: match e {
                CompileError::CompileError { nvrtc, log, .. } => format!("{nvrtc:?}: {}", log.to_string_lossy()),
                other => format!("{other:?}"),
            },
        })?;
        let module = ctx.load_module(ptx).map_err(status::driver("cuModuleLoadData"))?;
        let mut functions = HashMap::new();
        for kernel in ["amax", "cast_tensor", "cast_rows", "cast_vec128", "cast_blk128", "cast_transpose", "transpose"]
        {
            for suffix in ["f32", "f16", "bf16"] {
                let name = format!("{kernel}_{suffix}");
                let f = module.load_function(&name).map_err(status::driver("cuModuleGetFunction"))?;
                functions.insert(name, f);
            }
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

// SAFETY: CUfunction handles are plain driver handles usable from any thread; the module is
// only used under the device's lock.
unsafe impl Send for Kernels {}
