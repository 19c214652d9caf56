//! The engine's public surface stays small: `Gpu` has at most 30 public inherent methods
//! (`pub fn` and `pub unsafe fn` in the `impl Gpu` blocks of the library's sources; settings
//! are one `GpuOptions` value, plan queries are under `Gpu::plans`, the operations of a
//! capability with several under its view — `Gpu::attention`, `Gpu::conv`, `Gpu::fp8`,
//! `Gpu::moe`, `Gpu::paged`, `Gpu::tune` — each view at most 10), and no function of the
//! library allows `clippy::too_many_arguments` (arguments are bundled in a struct). The
//! sources are rustfmt-formatted: an `impl Gpu {` block opens at column 0 and closes with a `}`
//! at column 0, its methods are indented four spaces. A failure lists every method counted.

use std::path::{Path, PathBuf};

const LIMIT: usize = 30;
/// The most public methods one capability view (`impl GpuX<'_>`) has.
const VIEW_LIMIT: usize = 10;

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
    methods_of(text, |l| l.starts_with("impl Gpu {"))
}

/// The names of the public methods in the blocks of `text` whose opening line `opens` accepts.
fn methods_of(text: &str, opens: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if !inside {
            inside = opens(line);
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
fn gpu_has_at_most_30_public_methods_and_no_long_argument_lists() {
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

/// The view a line opens (`impl GpuConv<'_> {` → `GpuConv`), if it opens one.
fn view_of(line: &str) -> Option<&str> {
    let name = line.strip_prefix("impl Gpu")?.strip_suffix("<'_> {")?;
    (!name.is_empty() && name.chars().all(char::is_alphanumeric)).then_some(line[5..5 + 3 + name.len()].trim())
}

#[test]
fn each_capability_view_has_at_most_10_public_methods() {
    assert_eq!(view_of("impl GpuConv<'_> {"), Some("GpuConv"));
    assert_eq!(view_of("impl Gpu {"), None);
    assert_eq!(view_of("impl<'a> GpuConv<'a> {"), None);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut views: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let in_file: std::collections::BTreeSet<&str> = text.lines().filter_map(view_of).collect();
        for view in in_file {
            let found = methods_of(&text, |l| view_of(l) == Some(view));
            views.entry(view.to_string()).or_default().extend(found);
        }
    }
    for v in ["GpuAttention", "GpuConv", "GpuFp8", "GpuMoe", "GpuPaged", "GpuTuning"] {
        assert!(views.get(v).is_some_and(|m| !m.is_empty()), "no methods found for {v}: {views:?}");
    }
    for (view, methods) in &views {
        assert!(methods.len() <= VIEW_LIMIT, "{view} has {} public methods: {methods:?}", methods.len());
    }
}
