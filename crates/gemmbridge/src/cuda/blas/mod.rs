//! The cuBLAS room: one handle per engine, pooled per device ([`handle`]), and its launches
//! ([`gemm`]: the GEMM of a column-major call, and `axpy`; [`grouped`]: many GEMMs in one
//! grouped batched call).

mod gemm;
mod grouped;
mod handle;

pub(crate) use gemm::{Axpy, BlasGemm};
pub(crate) use handle::BlasHandle;
