//! What `gemmbridge info` reports about the device and the libraries.

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUdevice_attribute;

use super::engine::Gpu;
use crate::cuda::library;
use crate::cuda::status;
use crate::error::Result;
use crate::fp8::{check_support, Scaling};
use crate::tactics::Identity;

/// The device and the library versions found at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: i32,
    /// Device memory, in bytes.
    pub total_memory_bytes: usize,
    /// CUDA version the driver supports, as `major·1000 + minor·10` (cuDriverGetVersion).
    pub driver_cuda_version: i32,
    /// CUDA runtime version (cudaRuntimeGetVersion), when libcudart can be loaded.
    pub runtime_version: Option<i32>,
    /// cuBLAS version (major, minor, patch), from cublasGetProperty.
    pub cublas_version: (i32, i32, i32),
    /// cuBLASLt version as `major·10000 + minor·100 + patch` (cublasLtGetVersion), when
    /// libcublasLt can be loaded.
    pub cublaslt_version: Option<usize>,
    /// Whether the loaded cuBLASLt offers its grouped matmul
    /// ([`library::has_cublaslt_grouped_matmul`]: version 13.2 or later and the symbol
    /// present).
    pub cublaslt_grouped_matmul: bool,
}

impl DeviceInfo {
    /// This machine's [`Identity`] for the tactic database: the device name, its compute
    /// capability as "major.minor", the cuBLASLt version (0 where libcublasLt is not loaded),
    /// and the cuDNN version where libcudnn is installed
    /// ([`cudnn_version`](crate::cuda::cudnn_version): this loads libcudnn, but creates no cuDNN
    /// handle).
    pub fn tactic_identity(&self) -> Identity {
        Identity {
            gpu: self.name.clone(),
            sm: format!("{}.{}", self.compute_capability.0, self.compute_capability.1),
            cublaslt: self.cublaslt_version.unwrap_or(0),
            cudnn: crate::cuda::dnn::cudnn_version(),
        }
    }

    /// Whether this GPU and the loaded cuBLASLt offer FP8 with `scaling`
    /// ([`check_support`] of [`DeviceInfo::compute_capability`] and
    /// [`DeviceInfo::cublaslt_version`], 0 without cuBLASLt).
    ///
    /// # Errors
    /// [`Error::Fp8`](crate::Error::Fp8) with [`crate::fp8::Fp8Rule::ComputeCapability`] or
    /// [`crate::fp8::Fp8Rule::LibraryVersion`].
    pub fn check_fp8(&self, scaling: Scaling) -> Result<()> {
        check_support(self.compute_capability, self.cublaslt_version.unwrap_or(0), scaling)
    }
}

/// Formats a CUDA version number `major·1000 + minor·10` as `major.minor`.
pub fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl Gpu {
    /// Reads the device's properties and the loaded libraries' versions.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) or [`Error::Cublas`](crate::Error::Cublas)
    /// naming the call that failed.
    pub fn info(&self) -> Result<DeviceInfo> {
        let ctx = self.context();
        let attr = |a| ctx.attribute(a).map_err(status::driver("cuDeviceGetAttribute"));
        let mut driver = 0;
        // SAFETY: out-pointer to a local int; the driver library is loaded (a Gpu exists).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
            .result()
            .map_err(status::driver("cuDriverGetVersion"))?;
        let runtime_version = library::has_runtime().then(|| {
            let mut v = 0;
            // SAFETY: out-pointer to a local int; libcudart was found loadable above.
            let ok = unsafe { cudarc::runtime::sys::cudaRuntimeGetVersion(&mut v) };
            (ok == cudarc::runtime::sys::cudaError_t::cudaSuccess).then_some(v)
        });
        let mut ver = [0i32; 3];
        for (slot, prop) in ver.iter_mut().zip([
            cublas_sys::libraryPropertyType::MAJOR_VERSION,
            cublas_sys::libraryPropertyType::MINOR_VERSION,
            cublas_sys::libraryPropertyType::PATCH_LEVEL,
        ]) {
            // SAFETY: out-pointer to a local int; libcublas is loaded (a Gpu exists).
            status::cublas(unsafe { cublas_sys::cublasGetProperty(prop, slot) }, "cublasGetProperty", String::new)?;
        }
        let cublaslt_version = library::cublaslt_version();
        Ok(DeviceInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name().map_err(status::driver("cuDeviceGetName"))?,
            compute_capability: (
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            total_memory_bytes: ctx.total_mem().map_err(status::driver("cuDeviceTotalMem"))?,
            driver_cuda_version: driver,
            runtime_version: runtime_version.flatten(),
            cublas_version: (ver[0], ver[1], ver[2]),
            cublaslt_version,
            cublaslt_grouped_matmul: library::has_cublaslt_grouped_matmul(),
        })
    }
}
