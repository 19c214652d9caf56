//! The engine's public surface stays small: `Gpu` has at most 50 public inherent methods
//! (`pub fn` and `pub unsafe fn` in the `impl Gpu` blocks of the library's sources; settings
//! are one `GpuOptions` value, plan queries are under `Gpu::plans`), and no function of the
//! library allows `clippy::too_many_arguments` (arguments are bundled in a struct). The
//! sources are rustfmt-formatted: an `impl Gpu {` block opens at column 0 and closes with a `}`
//! at column 0, its methods are indented four spaces. A failure lists every method counted.

use std::path::{Path, PathBuf};

const LIMIT: usize = 50;

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

/// The names of the public methods in the `impl Gpu` blocks of `text`.
fn gpu_methods(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if !inside {
            inside = line.starts_with("impl Gpu {");
            continue;
        }
        if line.starts_with('}') {
            inside = false;
            continue;
        }
        let Some(rest) = line.strip_prefix("    pub ") else { continue };
        let rest = rest.strip_prefix("const ").unwrap_or(rest);
        let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
        let Some(name) = rest.strip_prefix("fn ") else { continue };
        let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(name.len());
        out.push(name[..end].to_string());
    }
    out
}

#[test]
fn counts_public_methods_of_impl_gpu_blocks_only() {
    let f =
        "impl Gpu {\n    pub fn a(&self) {\n        let x = 1;\n    }\n    pub(crate) fn b() {}\n    fn c() {}\n    \
             pub unsafe fn d<T>() {}\n}\n\nimpl Other {\n    pub fn e() {}\n}\n\nimpl Gpu {\n    pub fn f() {}\n}\n";
    assert_eq!(gpu_methods(f), ["a", "d", "f"]);
}

#[test]
fn gpu_has_at_most_50_public_methods_and_no_long_argument_lists() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut methods = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let at = f.strip_prefix(&src).unwrap().display().to_string();
        methods.extend(gpu_methods(&text).into_iter().map(|m| format!("{m} ({at})")));
        assert!(!text.contains("clippy::too_many_arguments"), "{at}: too_many_arguments allowed");
    }
    assert!(methods.len() > 10, "the scan found {} methods: is `impl Gpu {{` still the form?", methods.len());
    assert!(
        methods.len() <= LIMIT,
        "Gpu has {} public methods (at most {LIMIT}):\n{}",
        methods.len(),
        methods.join("\n")
    );
}
