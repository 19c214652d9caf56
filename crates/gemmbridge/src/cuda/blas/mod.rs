//! The cuBLAS room: one handle per engine, pooled per device ([`handle`]), and its launches
//! ([`gemm`]: the GEMM of a column-major call, and `axpy`).

mod gemm;
mod handle;

pub(crate) use gemm::{Axpy, BlasGemm};
pub(crate) use handle::BlasHandle;
