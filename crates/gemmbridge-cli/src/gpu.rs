//! Opening GPU 0 for a command, and saying in one line why there is none: which library could
//! not be loaded, with the file names tried only in the debug log (`RUST_LOG=debug`).

use gemmbridge::cuda::{Gpu, GpuOptions};

/// Why `Gpu::new` failed, in one line, with how to fix it where `hint`. For a library that could
/// not be loaded the file names tried go to the debug log instead of the line.
fn describe(e: &gemmbridge::Error, hint: bool) -> String {
    match e {
        gemmbridge::Error::LibraryNotFound { library, tried, hint: fix } => {
            tracing::debug!("{library}: tried {tried}");
            let fix = if hint { format!("; {fix}") } else { String::new() };
            format!("{library} was not found (RUST_LOG=debug lists the files tried){fix}")
        }
        other => other.to_string(),
    }
}

/// Why `Gpu::new` failed, in one short line (for a command that goes on without a GPU).
pub fn why_not(e: &gemmbridge::Error) -> String {
    describe(e, false)
}

/// GPU 0 for `command`.
///
/// # Errors
/// Without one: "`command` needs a CUDA GPU: " and why, with how to fix it.
pub fn open(command: &str) -> anyhow::Result<Gpu> {
    open_with(command, GpuOptions::default())
}

/// GPU 0 for `command`, with `options`.
///
/// # Errors
/// An option out of range, as the library names it; without a GPU: "`command` needs a CUDA
/// GPU: " and why, with how to fix it.
pub fn open_with(command: &str, options: GpuOptions) -> anyhow::Result<Gpu> {
    Gpu::with_options(0, options).map_err(|e| match e {
        e @ gemmbridge::Error::OutOfRange { .. } => anyhow::Error::new(e).context(format!("{command}: an option")),
        e => anyhow::anyhow!("{command} needs a CUDA GPU: {}", describe(&e, true)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_without_the_files_tried() {
        let e = gemmbridge::Error::LibraryNotFound {
            library: "the CUDA driver (libcuda)",
            tried: "libcuda.so, libcuda.so.1".into(),
            hint: "install the NVIDIA driver",
        };
        let short = why_not(&e);
        assert_eq!(short, "the CUDA driver (libcuda) was not found (RUST_LOG=debug lists the files tried)");
        let fix = describe(&e, true);
        assert!(fix.starts_with(&short) && fix.ends_with("; install the NVIDIA driver"), "{fix}");
        assert!(!fix.contains("libcuda.so"), "{fix}");
        let other = gemmbridge::Error::NoDevice { detail: "CUDA_ERROR_NO_DEVICE".into() };
        assert_eq!(why_not(&other), other.to_string());
    }
}
