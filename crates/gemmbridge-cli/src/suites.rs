//! The benchmark suites (`gemmbridge_lab::suites`, bench/peer.py's shapes), with the CLI's error
//! for an unknown name.

pub use gemmbridge_lab::suites::{is_square_or_llm, Shape, CPU, NAMES};

/// Shapes of a suite; an unknown name is an error that lists the names accepted.
pub fn shapes(name: &str) -> anyhow::Result<Vec<Shape>> {
    gemmbridge_lab::suites::shapes(name)
        .ok_or_else(|| anyhow::anyhow!("unknown suite {name:?}; choose one of {}", NAMES.join(", ")))
}
