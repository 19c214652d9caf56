//! Finding the NVIDIA libraries at run time.
//!
//! gemmbridge builds without CUDA installed: cudarc loads `libcuda`, `libcublas` and friends
//! when they are first used (its `dynamic-loading` mode). cudarc panics when a library is
//! missing, so every entry point checks here first and returns a named error instead.
//!
//! With the `cuda-dynamic-linking` feature cudarc is linked against the libraries at build time
//! instead: the loader opens them when the program starts (or the program does not start), so
//! every library counts as present and a symbol is looked up in the process itself.
//!
//! The check keeps a library it found loaded for the process. cudarc's own
//! `is_culib_present` opens and closes it on every call, and a close before cudarc's first real
//! use unloads the library again after its initialisers ran — on threads racing through
//! `Gpu::new`, a load/unload cycle of the driver, cuBLAS, cuDNN or NVRTC per thread; on the FP8
//! path, a `dlopen`/`dlclose` pair per GEMM.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// The libraries gemmbridge loads, by cudarc's names for them.
#[derive(Clone, Copy)]
enum Lib {
    Driver,
    Cublas,
    CublasLt,
    Runtime,
    Cudnn,
    Nvrtc,
}

impl Lib {
    /// cudarc's names for the library (`get_lib_name_candidates` makes the file names).
    const fn names(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &["cuda", "nvcuda"],
            Lib::Cublas => &["cublas"],
            Lib::CublasLt => &["cublasLt"],
            Lib::Runtime => &["cudart"],
            Lib::Cudnn => &["cudnn"],
            Lib::Nvrtc => &["nvrtc"],
        }
    }
}

/// Whether one of cudarc's candidate file names for `lib` loads (tried in cudarc's order, so
/// the file is the one cudarc will use). The first that loads is never unloaded, and a found
/// library is not looked for again; a missing one is, on every call (it may be loaded later
/// by something else in the process).
fn present(lib: Lib) -> bool {
    if cfg!(feature = "cuda-dynamic-linking") {
        return true; // linked at build time: loaded before `main`
    }
    static FOUND: [AtomicBool; 6] = [const { AtomicBool::new(false) }; 6];
    if FOUND[lib as usize].load(Ordering::Acquire) {
        return true;
    }
    let found = lib.names().iter().flat_map(|n| candidates(n)).any(|file| {
        // SAFETY: loading runs the library's initialisers, as cudarc's own loading of the same
        // file does; nothing in it is called here.
        match unsafe { libloading::Library::new(&file) } {
            Ok(lib) => {
                // kept loaded for the process: cudarc opens the same file on first use (two
                // threads racing here only add one reference each)
                std::mem::forget(lib);
                true
            }
            Err(_) => false,
        }
    });
    if found {
        FOUND[lib as usize].store(true, Ordering::Release);
    }
    found
}

const HINT_DRIVER: &str = "install the NVIDIA driver (it provides libcuda.so.1); on a machine \
                           without a GPU use the CPU backend (gemmbridge::cpu)";
const HINT_CUDNN: &str = "install cuDNN 9 (the libcudnn9 package or the nvidia-cudnn-cu13 wheel) \
                          and add the folder that holds libcudnn.so.9 to LD_LIBRARY_PATH";
const HINT_TOOLKIT: &str = "install the CUDA 13 toolkit or the nvidia-cublas wheel, and add the \
                            folder that holds it (usually /usr/local/cuda/lib64) to \
                            LD_LIBRARY_PATH";

/// The file names cudarc tries for the library `name` when it opens it at run time.
#[cfg(not(feature = "cuda-dynamic-linking"))]
fn candidates(name: &str) -> Vec<String> {
    cudarc::get_lib_name_candidates(name)
}

/// With the libraries linked at build time: the file the linker took (`-l{name}`).
#[cfg(feature = "cuda-dynamic-linking")]
fn candidates(name: &str) -> Vec<String> {
    vec![format!("lib{name}.so (linked at build time)")]
}

/// The file names cudarc tries for a library, without repeats.
pub(crate) fn tried(name: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    for c in candidates(name) {
        if !seen.contains(&c) {
            seen.push(c);
        }
    }
    seen.join(", ")
}

/// `Ok` where `lib` loads, else [`Error::LibraryNotFound`] naming it as `library`, the files
/// tried (for its first name) and `hint`.
fn ensure(lib: Lib, library: &'static str, hint: &'static str) -> Result<()> {
    if present(lib) {
        Ok(())
    } else {
        Err(Error::LibraryNotFound { library, tried: tried(lib.names()[0]), hint })
    }
}

/// Checks that the CUDA driver library can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_driver() -> Result<()> {
    ensure(Lib::Driver, "the CUDA driver (libcuda)", HINT_DRIVER)
}

/// Checks that cuBLAS can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_cublas() -> Result<()> {
    ensure(Lib::Cublas, "cuBLAS (libcublas)", HINT_TOOLKIT)
}

/// Whether cuBLASLt can be loaded.
pub fn has_cublaslt() -> bool {
    present(Lib::CublasLt)
}

/// The loaded cuBLASLt's version as `major·10000 + minor·100 + patch` (`cublasLtGetVersion`,
/// e.g. 130100 for 13.1.0), or `None` where libcublasLt does not load.
pub fn cublaslt_version() -> Option<usize> {
    // SAFETY: takes no arguments; only called when libcublasLt loads.
    has_cublaslt().then(|| unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() })
}

/// The first cuBLASLt version with the grouped matmul (`CUBLASLT_BATCH_MODE_GROUPED`,
/// `cublasLtGroupedMatrixLayoutCreate`): 13.2, as cuBLAS 13.2's release notes and header
/// introduce it.
pub const CUBLASLT_GROUPED_MATMUL_VERSION: usize = 130200;

/// Whether the loaded cuBLASLt offers its grouped matmul (a matmul over groups of different
/// shapes whose sizes stay on the device, so a mixture-of-experts call from device offsets
/// needs no copy to the host and can be captured): its version at least
/// [`CUBLASLT_GROUPED_MATMUL_VERSION`] *and* the library exporting
/// `cublasLtGroupedMatrixLayoutCreate` — never assumed from the version alone, since calling a
/// symbol the library lacks aborts the process. gemmbridge's grouped ways do not use it yet
/// ([`crate::grouped::streams::GroupedBackend`]); this is what a way built on it would be
/// offered on. False where libcublasLt does not load.
pub fn has_cublaslt_grouped_matmul() -> bool {
    // decided once the library is loaded: the file does not change afterwards
    static OFFERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let Some(version) = cublaslt_version() else { return false };
    *OFFERED.get_or_init(|| {
        version >= CUBLASLT_GROUPED_MATMUL_VERSION
            && exported(Lib::CublasLt.names(), "cublasLtGroupedMatrixLayoutCreate")
    })
}

/// Whether the first of cudarc's candidate files for `names` that loads (for a loaded library,
/// the file [`present`] found) exports `symbol`.
#[cfg(not(feature = "cuda-dynamic-linking"))]
fn exported(names: &[&str], symbol: &str) -> bool {
    let mut files = names.iter().flat_map(|n| candidates(n));
    // SAFETY: as in `present`: loading runs the library's initialisers, as cudarc's own
    // loading does; the symbol is looked up, never called. The reference taken here is
    // dropped again; the one `present` keeps holds the library loaded.
    let found = files.find_map(|file| unsafe { libloading::Library::new(&file) }.ok());
    // SAFETY: the address is only tested for presence, not called or read.
    found.is_some_and(|l| unsafe { l.get::<*const std::ffi::c_void>(symbol) }.is_ok())
}

/// Whether the process exports `symbol` (the libraries are linked at build time, so the
/// loader has them open): looked up in the process's global scope, whatever `names` says.
#[cfg(all(feature = "cuda-dynamic-linking", unix))]
fn exported(_names: &[&str], symbol: &str) -> bool {
    let this = libloading::os::unix::Library::this();
    // SAFETY: the address is only tested for presence, not called or read.
    unsafe { this.get::<*const std::ffi::c_void>(symbol.as_bytes()) }.is_ok()
}

/// Not looked up on other systems with the libraries linked at build time: never offered.
#[cfg(all(feature = "cuda-dynamic-linking", not(unix)))]
fn exported(_names: &[&str], _symbol: &str) -> bool {
    false
}

/// Whether the CUDA runtime (libcudart) can be loaded.
pub fn has_runtime() -> bool {
    present(Lib::Runtime)
}

/// Checks that cuDNN (libcudnn, major version 9) can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_cudnn() -> Result<()> {
    ensure(Lib::Cudnn, "cuDNN (libcudnn)", HINT_CUDNN)
}

/// Checks that NVRTC (libnvrtc), which compiles gemmbridge's own kernels, can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_nvrtc() -> Result<()> {
    ensure(Lib::Nvrtc, "NVRTC (libnvrtc)", HINT_TOOLKIT)
}

#[cfg(all(test, not(feature = "cuda-dynamic-linking")))]
mod tests {
    use super::exported;

    #[test]
    fn a_library_that_does_not_load_exports_nothing() {
        assert!(!exported(&["gemmbridge-no-such-library"], "cublasLtGroupedMatrixLayoutCreate"));
    }
}
