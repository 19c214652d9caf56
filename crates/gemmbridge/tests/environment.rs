//! What happens when the NVIDIA libraries are, or are not, on the machine.

use gemmbridge::cuda::Gpu;
use gemmbridge::Error;

/// Without libcuda (CI, a laptop), opening a GPU is a named error that says which library
/// and how to provide it, never a panic. With one, it opens (or says there is no device).
#[test]
fn opening_a_gpu_never_panics() {
    // SAFETY: only tries to load the library.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    match Gpu::new(0) {
        Ok(gpu) => {
            assert!(driver_present);
            let info = gpu.info().unwrap();
            assert!(info.sm_count > 0 && !info.name.is_empty(), "{info:?}");
            // the grouped matmul is offered only by a cuBLASLt of 13.2 or later (which must
            // also export it: not assumed from the version)
            let recent =
                info.cublaslt_version.is_some_and(|v| v >= gemmbridge::cuda::library::CUBLASLT_GROUPED_MATMUL_VERSION);
            assert!(!info.cublaslt_grouped_matmul || recent, "{info:?}");
        }
        Err(Error::LibraryNotFound { library, tried, hint }) => {
            assert!(!driver_present || library.contains("cuBLAS"), "{library}");
            assert!(tried.contains(".so") || tried.contains(".dll"), "{tried}");
            assert!(!hint.is_empty());
            let msg = Error::LibraryNotFound { library, tried, hint }.to_string();
            assert!(msg.contains("could not be loaded"), "{msg}");
        }
        Err(Error::NoDevice { detail }) => assert!(driver_present, "{detail}"),
        Err(other) => panic!("unexpected error opening a GPU: {other}"),
    }
}
