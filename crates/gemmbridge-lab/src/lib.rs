//! # gemmbridge-lab
//!
//! The measuring laboratory beside the `gemmbridge` library, built on its public API only (and
//! on cudarc, which gemmbridge re-exports): what the `gemmbridge` and `gemmbridge-burn` commands
//! and the GPU test suite share, and what a program using the library does not need.
//!
//! - [`suites`]: the benchmark's shapes (those of `bench/peer.py`).
//! - [`churn`]: a self-test of engines created, used and dropped on many threads beside graph
//!   captures (`gemmbridge soak --churn`; `tests/churn_gpu.rs`).
//!
//! The library never depends on this crate.
#![warn(missing_docs)]

pub mod churn;
mod relaxed;
pub mod suites;
