//! The READMEs' Rust snippets are whole programs a user can paste into a new crate's
//! `src/main.rs`: each has a `fn main` and no hidden (`# `) doctest lines. That they compile is
//! checked by the doctests of the crate that includes each README (`gemmbridge`,
//! `gemmbridge-burn` and `gemmbridge-candle`, `#[cfg(doctest)]`).

use std::path::Path;

const READMES: [&str; 3] = ["README.md", "crates/gemmbridge-burn/README.md", "crates/gemmbridge-candle/README.md"];

/// (info string, first line, code) of every fenced block whose info string starts with `rust`.
fn rust_blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), i + 1, String::new())),
            (Some(_), Some(_)) => {
                let block = open.take().expect("open");
                if block.0.starts_with("rust") {
                    out.push(block);
                }
            }
            (Some((_, _, code)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn readme_snippets_are_whole_programs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut problems = Vec::new();
    let mut seen = 0;
    for readme in READMES {
        let text = std::fs::read_to_string(root.join(readme)).unwrap();
        for (info, line, code) in rust_blocks(&text) {
            seen += 1;
            if info.split(',').any(|a| a == "ignore") {
                problems.push(format!("{readme}:{line}: `ignore`d (use no_run for a snippet that needs a GPU)"));
            }
            if !code.contains("fn main(") {
                problems.push(format!("{readme}:{line}: no fn main"));
            }
            if code.lines().any(|l| l.trim_start() == "#" || l.trim_start().starts_with("# ")) {
                problems.push(format!("{readme}:{line}: hidden doctest lines"));
            }
        }
    }
    assert!(seen >= 6, "only {seen} Rust snippets found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
