//! Small safe wrappers over cudarc's raw cuDNN calls (cudarc's safe `Cudnn` is `!Send`, unwraps
//! in `new`/`Drop` and picks algorithms by assertion): statuses by name, descriptors that
//! destroy themselves, nothing that panics. Every function here is host-side set-up; the
//! launches are in `run.rs`, `legacy_launch.rs` and `graph_plan.rs`.

use cudarc::cudnn::sys;
use cudarc::driver::sys::CUstream;

use crate::cuda::device::Pool;

use crate::conv::{Conv2d, ConvActivation, ConvLayout};
use crate::error::{Error, Result};
use crate::precision::Precision;

/// `Ok` or [`Error::Cudnn`] naming the call, the status and the problem.
pub(crate) fn check(
    status: sys::cudnnStatus_t,
    operation: &'static str,
    problem: impl FnOnce() -> String,
) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        // The enum's Debug form is its C name, e.g. CUDNN_STATUS_NOT_SUPPORTED.
        Err(Error::Cudnn { operation, status: format!("{status:?}"), problem: problem() })
    }
}

fn none() -> String {
    String::new()
}

/// An owned cuDNN handle and the stream it is bound to. Destroyed explicitly (with the
/// context bound), as the cuBLAS handle is.
pub(crate) struct Handle {
    raw: sys::cudnnHandle_t,
    bound: CUstream,
    /// The device whose pool the handle goes back to (a primary context's).
    pool: Option<usize>,
}

/// Handles of dropped engines, by device.
static POOL: Pool<sys::cudnnContext> = Pool::new();

// SAFETY: the raw handle is used only under the device's Mutex, one call at a time; cuDNN
// allows a handle on any host thread as long as no two threads use it at once (cuDNN
// developer guide, "Thread Safety").
unsafe impl Send for Handle {}

impl Handle {
    /// A handle for the current context (bound by the caller): one from device `pool`'s
    /// [`Pool`] or a new one; `pool` is `Some(ordinal)` for a primary context, `None`
    /// otherwise (the handle is then destroyed at the end).
    pub fn new(pool: Option<usize>) -> Result<Handle> {
        let (raw, _) = POOL.take_or_create(pool, || {
            let mut raw = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the context is current.
            check(unsafe { sys::cudnnCreate(&mut raw) }, "cudnnCreate", none)?;
            Ok(raw)
        })?;
        Ok(Handle { raw, bound: std::ptr::null_mut(), pool })
    }

    /// The raw handle, bound to `stream` first if needed.
    pub fn on(&mut self, stream: CUstream) -> Result<sys::cudnnHandle_t> {
        if self.bound != stream {
            // SAFETY: a live handle and a live stream of its context.
            check(unsafe { sys::cudnnSetStream(self.raw, stream as sys::cudaStream_t) }, "cudnnSetStream", none)?;
            self.bound = stream;
        }
        Ok(self.raw)
    }

    /// Lets go of the handle: back to its pool, or destroyed (which synchronises the device:
    /// cuDNN's documentation of `cudnnDestroy`). The context is bound and the work enqueued
    /// with the handle has finished (the caller's contract).
    pub fn release(&mut self) {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if !raw.is_null() {
            POOL.release(self.pool, raw, |raw| {
                // SAFETY: created in new, destroyed once (the field is null from now on).
                let _ = unsafe { sys::cudnnDestroy(raw) };
            });
        }
    }

    /// Forgets the handle without destroying it (no context to destroy it in).
    pub fn leak(&mut self) {
        self.raw = std::ptr::null_mut();
    }
}

/// The version of the loaded libcudnn (`cudnnGetVersion`, e.g. 91400 for 9.14.0).
pub(crate) fn version() -> usize {
    // SAFETY: a version query; the caller checked that the library loads.
    unsafe { sys::cudnnGetVersion() }
}

/// cuDNN's data type, the convolution's compute type and math type for `precision`: strict
/// f32 is `CUDNN_FMA_MATH` (`CUDNN_DEFAULT_MATH` permits TF32 on A100 and later, cuDNN
/// documentation, `cudnnMathType_t`), tf32, f16 and bf16 are `CUDNN_TENSOR_OP_MATH`; the
/// compute type is f32 for all four (f16/bf16: f32 accumulation).
pub(crate) fn types(precision: Precision) -> (sys::cudnnDataType_t, sys::cudnnMathType_t) {
    use sys::cudnnDataType_t::*;
    use sys::cudnnMathType_t::*;
    match precision {
        Precision::F16 => (CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH),
        Precision::BF16 => (CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH),
        Precision::TF32 => (CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH),
        _ => (CUDNN_DATA_FLOAT, CUDNN_FMA_MATH),
    }
}

/// Whether an algorithm of `math` keeps `precision`'s promise: strict f32 takes FMA only.
pub(crate) fn math_ok(precision: Precision, math: sys::cudnnMathType_t) -> bool {
    precision != Precision::F32 || math == sys::cudnnMathType_t::CUDNN_FMA_MATH
}

fn ints<const N: usize>(v: [usize; N]) -> [i32; N] {
    // Conv2d::validate bounds every dimension and count by i32::MAX
    v.map(|x| x as i32)
}

macro_rules! descriptor {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        pub(crate) struct $name($raw);

        // SAFETY: a host-side cuDNN object, used under the device's Mutex only.
        unsafe impl Send for $name {}

        impl $name {
            fn create() -> Result<$name> {
                let mut raw = std::ptr::null_mut();
                // SAFETY: a valid out-pointer.
                check(unsafe { sys::$create(&mut raw) }, stringify!($create), none)?;
                Ok($name(raw))
            }

            pub fn raw(&self) -> $raw {
                self.0
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created in create, destroyed once here.
                let _ = unsafe { sys::$destroy(self.0) };
            }
        }
    };
}

descriptor!(TensorDesc, sys::cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor);
descriptor!(FilterDesc, sys::cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor);
descriptor!(
    ConvDesc,
    sys::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);
descriptor!(
    ActivationDesc,
    sys::cudnnActivationDescriptor_t,
    cudnnCreateActivationDescriptor,
    cudnnDestroyActivationDescriptor
);

impl TensorDesc {
    /// A 4-D tensor of logical dims `[N, C, H, W]` stored in `layout`.
    pub fn new(dtype: sys::cudnnDataType_t, dims: [usize; 4], layout: ConvLayout) -> Result<TensorDesc> {
        let d = TensorDesc::create()?;
        let (dims_i, strides) = (ints(dims), ints(layout.strides(dims)));
        // SAFETY: a live descriptor; arrays of 4 ints.
        let st = unsafe { sys::cudnnSetTensorNdDescriptor(d.0, dtype, 4, dims_i.as_ptr(), strides.as_ptr()) };
        check(st, "cudnnSetTensorNdDescriptor", || format!("dims {dims:?} {layout}"))?;
        Ok(d)
    }
}

impl FilterDesc {
    /// The filter `[K, C/groups, R, S]` in `layout` (KRSC for NHWC, KCRS for NCHW).
    pub fn new(dtype: sys::cudnnDataType_t, dims: [usize; 4], layout: ConvLayout) -> Result<FilterDesc> {
        let d = FilterDesc::create()?;
        let format = match layout {
            ConvLayout::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            ConvLayout::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        };
        let dims_i = ints(dims);
        // SAFETY: a live descriptor; an array of 4 ints.
        let st = unsafe { sys::cudnnSetFilterNdDescriptor(d.0, dtype, format, 4, dims_i.as_ptr()) };
        check(st, "cudnnSetFilterNdDescriptor", || format!("dims {dims:?} {layout}"))?;
        Ok(d)
    }
}

impl ConvDesc {
    /// Cross-correlation (PyTorch's `conv2d`) with `p`'s padding, stride, dilation and
    /// groups, f32 compute, `math` as the math type.
    pub fn new(p: &Conv2d, math: sys::cudnnMathType_t) -> Result<ConvDesc> {
        let d = ConvDesc::create()?;
        let (pad, stride, dil) = (ints(p.pad), ints(p.stride), ints(p.dilation));
        let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
        let compute = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let describe = || p.describe();
        // SAFETY: a live descriptor; arrays of 2 ints.
        let st = unsafe {
            sys::cudnnSetConvolutionNdDescriptor(d.0, 2, pad.as_ptr(), stride.as_ptr(), dil.as_ptr(), mode, compute)
        };
        check(st, "cudnnSetConvolutionNdDescriptor", describe)?;
        // SAFETY: a live descriptor.
        let st = unsafe { sys::cudnnSetConvolutionGroupCount(d.0, p.groups as i32) };
        check(st, "cudnnSetConvolutionGroupCount", describe)?;
        d.set_math(math)?;
        Ok(d)
    }

    /// Sets the math type (to the chosen algorithm's: cuDNN needs both to pick its kernel).
    pub fn set_math(&self, math: sys::cudnnMathType_t) -> Result<()> {
        // SAFETY: a live descriptor.
        check(unsafe { sys::cudnnSetConvolutionMathType(self.0, math) }, "cudnnSetConvolutionMathType", none)
    }
}

impl ActivationDesc {
    /// ReLU or the identity, NaN propagated.
    pub fn new(act: ConvActivation) -> Result<ActivationDesc> {
        let d = ActivationDesc::create()?;
        let mode = match act {
            ConvActivation::Relu => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
            ConvActivation::Identity => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY,
        };
        let nan = sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN;
        // SAFETY: a live descriptor.
        let st = unsafe { sys::cudnnSetActivationDescriptor(d.0, mode, nan, 0.0) };
        check(st, "cudnnSetActivationDescriptor", none)?;
        Ok(d)
    }
}
