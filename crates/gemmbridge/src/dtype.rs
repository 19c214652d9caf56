//! Element types, compute types and the precisions built from them.
//!
//! A precision is three separate choices, never inferred from one another: the storage dtype of
//! A and B, the compute type (how products are accumulated), and the storage dtype of C. The
//! combinations offered are those of cuBLAS's `cublasGemmEx` type table (cuBLAS documentation,
//! section "cublasGemmEx"), each checked against a float64 reference on the H200
//! (`gemmbridge probe`, docs/PERFORMANCE.md).

use crate::error::{Error, Result};
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

/// A validated (input dtype, compute type, output dtype) triple.
///
/// Construct one with [`Precision::new`] (which rejects combinations cuBLAS does not offer) or
/// take one of the named constants. α and β are always f32 host scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Precision {
    input: DType,
    compute: Compute,
    output: DType,
}

impl Precision {
    /// f32 in, strict f32 compute (`CUBLAS_COMPUTE_32F`), f32 out. Band: ‖err‖/‖ref‖ ≤ 1e-5.
    pub const F32: Precision = Precision { input: DType::F32, compute: Compute::F32, output: DType::F32 };
    /// f32 in, tf32 tensor-core compute (`CUBLAS_COMPUTE_32F_FAST_TF32`), f32 out. Band ≤ 1e-3.
    pub const TF32: Precision = Precision { input: DType::F32, compute: Compute::Tf32, output: DType::F32 };
    /// f16 in, f32 accumulate, f16 out. Band ≤ 1e-2.
    pub const F16: Precision = Precision { input: DType::F16, compute: Compute::F32, output: DType::F16 };
    /// f16 in, f32 accumulate, f32 out. Band ≤ 1e-2.
    pub const F16_F32OUT: Precision = Precision { input: DType::F16, compute: Compute::F32, output: DType::F32 };
    /// bf16 in, f32 accumulate, bf16 out. Band ≤ 1e-2.
    pub const BF16: Precision = Precision { input: DType::BF16, compute: Compute::F32, output: DType::BF16 };
    /// bf16 in, f32 accumulate, f32 out. Band ≤ 1e-2.
    pub const BF16_F32OUT: Precision = Precision { input: DType::BF16, compute: Compute::F32, output: DType::F32 };

    /// Every precision the library offers, in the order the probe reports them.
    pub const ALL: [Precision; 6] = [
        Precision::F32,
        Precision::TF32,
        Precision::F16,
        Precision::F16_F32OUT,
        Precision::BF16,
        Precision::BF16_F32OUT,
    ];

    /// Checks a combination against the supported table.
    ///
    /// # Errors
    /// [`Error::UnsupportedPrecision`] for any combination not in [`Precision::ALL`], e.g. f16
    /// inputs with a bf16 output, or tf32 compute on f16 inputs.
    pub fn new(input: DType, compute: Compute, output: DType) -> Result<Precision> {
        let p = Precision { input, compute, output };
        if Precision::ALL.contains(&p) {
            Ok(p)
        } else {
            Err(Error::UnsupportedPrecision { input, compute, output })
        }
    }

    /// Storage dtype of A and B.
    pub const fn input(self) -> DType {
        self.input
    }

    /// Compute type.
    pub const fn compute(self) -> Compute {
        self.compute
    }

    /// Storage dtype of C.
    pub const fn output(self) -> DType {
        self.output
    }

    /// The name used on the command line and in benchmark JSON: `f32`, `tf32`, `f16`,
    /// `f16:f32`, `bf16`, `bf16:f32` (input, then `:output` where the output differs).
    pub fn name(self) -> String {
        let base = match self.compute {
            Compute::Tf32 => "tf32",
            Compute::F32 => self.input.name(),
        };
        if self.output == self.input {
            base.to_string()
        } else {
            format!("{base}:{}", self.output)
        }
    }

    /// Parses a name produced by [`Precision::name`]; `None` for anything else.
    pub fn parse(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The accuracy band for ‖out − ref‖ / ‖ref‖ against a float64 reference (README.md, "Accuracy"):
    /// f32 1e-5, tf32 1e-3, f16/bf16 1e-2.
    pub fn tolerance(self) -> f64 {
        match (self.input, self.compute) {
            (DType::F32, Compute::F32) => 1e-5,
            (DType::F32, Compute::Tf32) => 1e-3,
            _ => 1e-2,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(&p.name()), Some(p), "{p}");
        }
        assert_eq!(Precision::parse("f16:bf16"), None);
        assert_eq!(Precision::parse("fp8"), None);
    }

    #[test]
    fn unsupported_combinations_are_named_errors() {
        let e = Precision::new(DType::F16, Compute::F32, DType::BF16).unwrap_err();
        assert_eq!(e, Error::UnsupportedPrecision { input: DType::F16, compute: Compute::F32, output: DType::BF16 });
        assert!(Precision::new(DType::BF16, Compute::Tf32, DType::BF16).is_err());
        assert!(Precision::new(DType::F32, Compute::F32, DType::F16).is_err());
        assert_eq!(Precision::new(DType::F32, Compute::Tf32, DType::F32), Ok(Precision::TF32));
    }
}
