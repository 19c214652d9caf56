//! Driver and cuBLAS statuses reported by name, not by number.

use crate::error::Error;
use cudarc::cublas::sys::cublasStatus_t;
use cudarc::driver::DriverError;

/// Turns a driver error into [`Error::Driver`] (or [`Error::NoDevice`]) naming the call.
pub(crate) fn driver(operation: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| {
        // The enum's Debug form is its C name, e.g. CUDA_ERROR_NO_DEVICE.
        let status = format!("{:?}", e.0);
        if status == "CUDA_ERROR_NO_DEVICE" {
            Error::NoDevice { detail: format!("{operation} returned {status}") }
        } else {
            Error::Driver { operation, status }
        }
    }
}

/// Turns a cuBLAS status into `Ok` or [`Error::Cublas`] naming the call and the problem.
pub(crate) fn cublas(
    status: cublasStatus_t,
    operation: &'static str,
    problem: impl FnOnce() -> String,
) -> Result<(), Error> {
    if status == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        // The enum's Debug form is its C name, e.g. CUBLAS_STATUS_INVALID_VALUE.
        Err(Error::Cublas { operation, status: format!("{status:?}"), problem: problem() })
    }
}

/// A cuBLAS error with the row-major problem appended to its description.
pub(crate) fn with_problem(e: Error, p: &crate::problem::GemmProblem) -> Error {
    match e {
        Error::Cublas { operation, status, problem } => {
            let sep = if problem.is_empty() { "" } else { "; " };
            Error::Cublas { operation, status, problem: format!("{problem}{sep}row-major {}", p.describe()) }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named() {
        let e = cublas(cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx", || "m=1".into()).unwrap_err();
        assert_eq!(e.to_string(), "cublasGemmEx failed with CUBLAS_STATUS_INVALID_VALUE (m=1)");
        let e = driver("cuInit")(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE));
        assert!(matches!(e, Error::NoDevice { .. }), "{e}");
        let e = driver("cuMemAlloc")(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(e, Error::Driver { operation: "cuMemAlloc", status: "CUDA_ERROR_OUT_OF_MEMORY".into() });
    }
}
