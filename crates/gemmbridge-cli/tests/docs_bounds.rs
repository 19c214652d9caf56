//! The user-facing documents stay within their bounds, so that they cannot regrow into reference
//! manuals (the reference is the crates' rustdoc): README.md at most 250 lines, docs/DESIGN.md
//! 350, docs/PERFORMANCE.md 250, any other Markdown file in docs/ 150, each crate's README 200,
//! and docs/ at most 60 files (figures and runs included: a comparison's alternated runs are
//! packed into one file per side, tools/pack-runs). README.md's first screen (its first 50
//! lines) holds the set-up, the main job and the test command CI runs (.ci/run), and it names
//! every adapter and capability module. A failure lists every bound crossed.

use std::path::{Path, PathBuf};

/// Lines of the first screen of README.md.
const FIRST_SCREEN: usize = 50;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).lines().count()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// (file relative to the root, its line limit) for every bounded Markdown file.
fn bounded() -> Vec<(String, usize)> {
    let root = root();
    let mut out = vec![("README.md".to_string(), 250)];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let limit = match name.as_str() {
            "DESIGN.md" => 350,
            "PERFORMANCE.md" => 250,
            _ if name.ends_with(".md") => 150,
            _ => continue,
        };
        out.push((format!("docs/{name}"), limit));
    }
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if e.path().join("README.md").is_file() {
            out.push((format!("crates/{}/README.md", e.file_name().to_string_lossy()), 200));
        }
    }
    out.sort();
    out
}

#[test]
fn docs_stay_within_their_bounds() {
    let root = root();
    let mut crossed = Vec::new();
    for (file, limit) in bounded() {
        let n = lines(&root.join(&file));
        if n > limit {
            crossed.push(format!("{file}: {n} lines, at most {limit}"));
        }
    }
    let mut all = Vec::new();
    files(&root.join("docs"), &mut all);
    if all.len() > 60 {
        crossed.push(format!("docs/: {} files, at most 60 (pack alternated runs with tools/pack-runs)", all.len()));
    }
    assert!(crossed.is_empty(), "documents over their bounds:\n{}", crossed.join("\n"));
}

#[test]
fn every_bounded_document_is_found() {
    let names: Vec<String> = bounded().into_iter().map(|(f, _)| f).collect();
    for want in ["README.md", "docs/DESIGN.md", "docs/PERFORMANCE.md", "crates/gemmbridge-burn/README.md"] {
        assert!(names.iter().any(|n| n == want), "{want} is not bounded: {names:?}");
    }
}

#[test]
fn the_readmes_first_screen_sets_up_runs_the_main_job_and_the_ci_tests() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let screen: Vec<&str> = readme.lines().take(FIRST_SCREEN).collect();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let test = ci.lines().find(|l| l.starts_with("cargo test")).expect(".ci/run runs cargo test");
    for command in ["cargo build --release", "cargo run --release -p gemmbridge-cli -- bench", test] {
        assert!(
            screen.iter().any(|l| l.starts_with(command)),
            "README.md's first {FIRST_SCREEN} lines give no line starting with `{command}`"
        );
    }
    assert!(
        screen.iter().any(|l| l.contains("--include-ignored")),
        "README.md's first {FIRST_SCREEN} lines give no GPU quick start (the GPU tests)"
    );
}

/// Modules of the library that are infrastructure rather than a capability (the README's
/// rustdoc list leaves them out; the crate root's documentation links them).
const NOT_CAPABILITIES: [&str; 7] = ["cpu", "dist", "epilogue", "mapping", "reference", "tactics", "validate"];

/// README.md names what the repository holds: every adapter crate (`crates/gemmbridge-<x>`
/// with a README, the command line aside) in its opening lines and in a row of the capability
/// table, and every capability module of the library in its list of rustdoc modules.
#[test]
fn readme_names_every_adapter_and_capability_module() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let opening: String = readme.lines().take(10).collect::<Vec<_>>().join(" ");
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(adapter) = name.strip_prefix("gemmbridge-").filter(|a| *a != "cli") else { continue };
        if !e.path().join("README.md").is_file() {
            continue;
        }
        if !opening.contains(adapter) {
            missing.push(format!("the opening lines do not name the {adapter} adapter"));
        }
        if !readme.lines().any(|l| l.starts_with(&format!("| {adapter} adapter (`crates/{name}`)"))) {
            missing.push(format!("the capability table has no `| {adapter} adapter (`crates/{name}`)` row"));
        }
    }
    let lib = std::fs::read_to_string(root.join("crates/gemmbridge/src/lib.rs")).unwrap();
    let list_start = readme.find("the crate root, then").expect("the rustdoc module list");
    let list = &readme[list_start..list_start + readme[list_start..].find(".\n").expect("the list's end")];
    for module in lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')) {
        if !NOT_CAPABILITIES.contains(&module) && !list.contains(&format!("`{module}`")) {
            missing.push(format!("the rustdoc module list lacks `{module}`"));
        }
    }
    assert!(missing.is_empty(), "README.md:\n{}", missing.join("\n"));
}
