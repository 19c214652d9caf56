//! Precisions: a precision is three separate choices, never inferred from one another: the
//! storage dtype of A and B, the compute type (how products are accumulated), and the storage
//! dtype of C. The combinations offered are those of cuBLAS's `cublasGemmEx` type table (cuBLAS
//! documentation, section "cublasGemmEx"), each checked against a float64 reference on the
//! H200 (`gemmbridge probe`, docs/PERFORMANCE.md).

use crate::dtype::{Compute, DType};
use crate::error::{Error, Result};

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
