//! The benchmark suites (`gemmbridge::suites`, bench/peer.py's shapes), with the CLI's error
//! for an unknown name.

pub use gemmbridge::suites::{is_square_or_llm, Shape, CPU, NAMES};

/// Shapes of a suite; an unknown name is an error that lists the names accepted.
pub fn shapes(name: &str) -> anyhow::Result<Vec<Shape>> {
    gemmbridge::suites::shapes(name)
        .ok_or_else(|| anyhow::anyhow!("unknown suite {name:?}; choose one of {}", NAMES.join(", ")))
}
