//! Finding the NVIDIA libraries at run time.
//!
//! gemmbridge builds without CUDA installed: cudarc loads `libcuda`, `libcublas` and friends
//! when they are first used (its `dynamic-loading` feature). cudarc panics when a library is
//! missing, so every entry point checks here first and returns a named error instead.

use crate::error::{Error, Result};

const HINT_DRIVER: &str = "install the NVIDIA driver (it provides libcuda.so.1); on a machine \
                           without a GPU use the CPU backend (gemmbridge::cpu)";
const HINT_CUDNN: &str = "install cuDNN 9 (the libcudnn9 package or the nvidia-cudnn-cu13 wheel) \
                          and add the folder that holds libcudnn.so.9 to LD_LIBRARY_PATH";
const HINT_TOOLKIT: &str = "install the CUDA 13 toolkit or the nvidia-cublas wheel, and add the \
                            folder that holds it (usually /usr/local/cuda/lib64) to \
                            LD_LIBRARY_PATH";

/// The file names cudarc tries for a library, without repeats.
pub(crate) fn tried(name: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    for c in cudarc::get_lib_name_candidates(name) {
        if !seen.contains(&c) {
            seen.push(c);
        }
    }
    seen.join(", ")
}

/// Checks that the CUDA driver library can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_driver() -> Result<()> {
    // SAFETY: only tries to dlopen candidate file names; calls nothing in them.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryNotFound { library: "the CUDA driver (libcuda)", tried: tried("cuda"), hint: HINT_DRIVER })
    }
}

/// Checks that cuBLAS can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_cublas() -> Result<()> {
    // SAFETY: as in ensure_driver.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryNotFound { library: "cuBLAS (libcublas)", tried: tried("cublas"), hint: HINT_TOOLKIT })
    }
}

/// Whether cuBLASLt can be loaded.
pub fn has_cublaslt() -> bool {
    // SAFETY: as in ensure_driver.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// Whether the CUDA runtime (libcudart) can be loaded.
pub fn has_runtime() -> bool {
    // SAFETY: as in ensure_driver.
    unsafe { cudarc::runtime::sys::is_culib_present() }
}

/// Checks that cuDNN (libcudnn, major version 9) can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_cudnn() -> Result<()> {
    // SAFETY: as in ensure_driver.
    if unsafe { cudarc::cudnn::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryNotFound { library: "cuDNN (libcudnn)", tried: tried("cudnn"), hint: HINT_CUDNN })
    }
}

/// Checks that NVRTC (libnvrtc), which compiles gemmbridge's own kernels, can be loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`] naming the files tried and how to provide them.
pub fn ensure_nvrtc() -> Result<()> {
    // SAFETY: as in ensure_driver.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryNotFound { library: "NVRTC (libnvrtc)", tried: tried("nvrtc"), hint: HINT_TOOLKIT })
    }
}
