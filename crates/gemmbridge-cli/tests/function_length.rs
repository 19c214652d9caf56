//! No function of the CLI's sources is longer than 80 lines, counted from its `fn` line to its
//! closing brace (the sources are rustfmt-formatted, so a body closes with a `}` at the
//! indentation of its `fn`). A failure lists every function over the limit.

use std::path::{Path, PathBuf};

const LIMIT: usize = 80;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The name of the function a line declares, and the line's indentation.
fn declared(line: &str) -> Option<(&str, &str)> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let mut rest = body;
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some((&name[..end], indent))
}

/// (length in lines, name, first line) of every function in `text` longer than `limit` lines.
fn too_long(text: &str, limit: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((name, indent)) = declared(line) else { continue };
        // the signature ends at the first line ending in `{` (a body) or `;` (none)
        let Some(open) = (i..lines.len()).find(|&j| lines[j].trim_end().ends_with(['{', ';'])) else { continue };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) else { continue };
        if end - i + 1 > limit {
            out.push((end - i + 1, name.to_string(), i + 1));
        }
    }
    out
}

#[test]
fn counts_from_fn_line_to_closing_brace() {
    let f = "fn a() {\n    1;\n    2;\n}\n\nimpl X {\n    pub fn b(\n        x: u8,\n    ) -> u8 {\n        x\n    }\n    fn c();\n}\n";
    assert_eq!(too_long(f, 3), vec![(4, "a".to_string(), 1), (5, "b".to_string(), 7)]);
    assert!(too_long(f, 5).is_empty());
}

#[test]
fn no_cli_function_is_longer_than_80_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, name, line) in too_long(&text, LIMIT) {
            offenders.push(format!("{n:>4} lines: {name} ({}:{line})", f.strip_prefix(&src).unwrap().display()));
        }
        assert!(!text.contains("clippy::too_many_arguments"), "{}: too_many_arguments allowed", f.display());
    }
    assert!(offenders.is_empty(), "functions over {LIMIT} lines:\n{}", offenders.join("\n"));
}
