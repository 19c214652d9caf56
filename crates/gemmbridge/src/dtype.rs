//! Element types and compute types: the three ingredients of a [`Precision`](crate::Precision)
//! (in `precision.rs`).

use half::{bf16, f16};

/// Storage type of a matrix element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32, 4 bytes.
    F32,
    /// IEEE 754 binary16, 2 bytes.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa), 2 bytes.
    BF16,
}

impl DType {
    /// Size of one element, in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The short name used on the command line and in benchmark JSON: `f32`, `f16`, `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How products are accumulated. Accumulation is always in f32; the modes differ in what the
/// tensor cores may round the inputs to first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Compute {
    /// `CUBLAS_COMPUTE_32F`: f32 accumulation; f32 inputs are multiplied in full f32 (no tf32).
    F32,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: f32 inputs are rounded to tf32 (10-bit mantissa) for the
    /// tensor cores; accumulation in f32. Only for f32 inputs.
    Tf32,
}

impl std::fmt::Display for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compute::F32 => "32F",
            Compute::Tf32 => "32F_FAST_TF32",
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A Rust element type gemmbridge can read and write: `f32`, [`half::f16`], [`half::bf16`].
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + std::fmt::Debug + 'static {
    /// The matching storage dtype.
    const DTYPE: DType;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounds from f32 to nearest.
    fn from_f32(v: f32) -> Self;
    /// Widens to f64 (exact).
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// Rounds from f64 to nearest (through f32 for the half types).
    fn from_f64(v: f64) -> Self;
    /// The slice itself when the element type is f32 (lets the CPU path skip a copy).
    #[doc(hidden)]
    fn as_f32s(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
    /// The slice itself when the element type is f32.
    #[doc(hidden)]
    fn as_f32s_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn as_f32s(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32s_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}
