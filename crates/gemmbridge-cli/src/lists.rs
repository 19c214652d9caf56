//! Comma-separated flag values, shared by every command's list flags.

use anyhow::bail;

/// The entries of a comma-separated list given to `flag`, trimmed, in order: none for a blank
/// list.
///
/// # Errors
/// An empty entry (`f32,,f16`, a leading or trailing comma), named with the flag: a typo must
/// not silently run less than asked.
pub fn entries<'a>(flag: &str, list: &'a str) -> anyhow::Result<Vec<&'a str>> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    let out: Vec<&str> = list.split(',').map(str::trim).collect();
    if out.iter().any(|e| e.is_empty()) {
        bail!("{flag} {list:?} has an empty entry: give comma-separated names");
    }
    Ok(out)
}
