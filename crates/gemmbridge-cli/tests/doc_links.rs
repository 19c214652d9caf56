//! The repository's Markdown files link only what exists, and docs/results/ keeps only the runs
//! something links (no GPU needed).
//!
//! A link is a Markdown link `[text](target)` (images too), or a path written as code,
//! `` `results/2026-12-02/burn-sm-reserve/` ``, that starts with a folder of the repository
//! (or `results/`, `notes/`, `figures/` beside docs/, or `../`). It resolves against the file's
//! own folder or, failing that, the repository root or docs/ (`results/…` is docs/results/);
//! `*` and `{a,b}` match as in a shell. Web links, anchors and paths with placeholders (`<date>`, `$OUT`) are not
//! checked.
//!
//! What docs/results/ keeps: every file a Markdown file links; every file under a linked run
//! folder (a folder at least two levels below docs/results/: a link to docs/results/ or to a
//! date's folder only has to exist); every file `docs/results/report.json` names; every
//! `docs/results/…` path a Rust source names; the READMEs there and report.json itself.
//! `cargo test -p gemmbridge-cli --test doc_links -- --ignored` lists what else is there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Files under `dir` (recursively) whose name ends with `ext`, skipping hidden folders and
/// build output.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" {
                files(&p, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(p);
        }
    }
}

/// `{a,b}` expanded, as a shell does.
fn braces(s: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else { return vec![s.to_string()] };
    if close < open {
        return vec![s.to_string()];
    }
    s[open + 1..close].split(',').flat_map(|alt| braces(&format!("{}{alt}{}", &s[..open], &s[close + 1..]))).collect()
}

/// Whether `name` matches `pattern`, where `*` is any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len())
                    .any(|i| name.is_char_boundary(head.len() + i) && matches(tail, &name[head.len() + i..]))
        }
    }
}

/// The paths `target` names from `base`: itself, or what its `*` parts match.
fn expand(base: &Path, target: &str) -> Vec<PathBuf> {
    let mut found = vec![base.to_path_buf()];
    for part in target.trim_end_matches('/').split('/') {
        let mut next = Vec::new();
        for dir in &found {
            if part.contains('*') {
                let Ok(entries) = std::fs::read_dir(dir) else { continue };
                let mut names: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|e| matches(part, &e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect();
                names.sort();
                next.extend(names);
            } else {
                next.push(dir.join(part));
            }
        }
        found = next;
    }
    found.into_iter().filter(|p| p.exists()).collect()
}

const ROOTS: [&str; 13] = [
    "../",
    "results/",
    "notes/",
    "figures/",
    "docs/",
    "bench/",
    "crates/",
    "tactics/",
    "tools/",
    "scripts/",
    ".ci/",
    "README.md",
    "CONTRIBUTING.md",
];

/// Every link of a Markdown text: (line number, target).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.split('#').next().unwrap_or("");
            if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
                out.push((i + 1, target.to_string()));
            }
            rest = &after[end..];
        }
        // code spans, except a link's text (`[`x`](y)`: the link is y)
        let parts: Vec<&str> = line.split('`').collect();
        for (n, span) in parts.iter().enumerate() {
            let link_text = parts.get(n + 1).is_some_and(|next| next.starts_with("]("));
            let placeholder = ['<', '$', '…', ' '].iter().any(|c| span.contains(*c)) || span.contains("...");
            if n % 2 == 1 && !link_text && !placeholder && ROOTS.iter().any(|r| span.starts_with(r)) {
                out.push((i + 1, span.to_string()));
            }
        }
    }
    out
}

/// Every Markdown file of the repository.
fn docs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(&root(), ".md", &mut out);
    out.sort();
    out
}

/// Each unresolved link as "file:line: target", and the files the links name.
fn check() -> (Vec<String>, BTreeSet<PathBuf>) {
    let root = root();
    let (mut broken, mut named) = (Vec::new(), BTreeSet::new());
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let dir = doc.parent().unwrap();
        for (line, target) in links(&text) {
            let mut hits = Vec::new();
            for t in braces(&target) {
                let mut h = expand(dir, &t);
                for base in [root.clone(), root.join("docs")] {
                    if h.is_empty() {
                        h = expand(&base, &t);
                    }
                }
                if h.is_empty() {
                    hits.clear();
                    break;
                }
                hits.extend(h);
            }
            if hits.is_empty() {
                broken.push(format!("{}:{line}: {target}", doc.strip_prefix(&root).unwrap().display()));
            }
            named.extend(hits.into_iter().map(|p| p.canonicalize().unwrap()));
        }
    }
    (broken, named)
}

#[test]
fn every_link_in_the_docs_resolves() {
    let (broken, _) = check();
    assert!(broken.is_empty(), "{} links name nothing:\n{}", broken.len(), broken.join("\n"));
}

/// The files docs/results/ keeps (see the module documentation).
fn keep() -> BTreeSet<PathBuf> {
    let root = root();
    let results = root.join("docs/results");
    let mut keep = BTreeSet::new();
    let (_, named) = check();
    for p in named.iter().filter(|p| p.starts_with(&results)) {
        if p.is_file() {
            keep.insert(p.clone());
        } else if p.strip_prefix(&results).unwrap().components().count() >= 2 {
            let mut under = Vec::new();
            files(p, "", &mut under);
            keep.extend(under);
        }
    }
    let manifest = std::fs::read_to_string(results.join("report.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut listed = Vec::new();
    strings(&manifest, &mut listed);
    keep.extend(listed.iter().map(|s| results.join(s)).filter(|p| p.is_file()));
    let mut sources = Vec::new();
    files(&root.join("crates"), ".rs", &mut sources);
    for src in sources {
        let text = std::fs::read_to_string(&src).unwrap();
        for (at, _) in text.match_indices("docs/results/") {
            let path: String = text[at..].chars().take_while(|c| !"\"`' )\n".contains(*c)).collect();
            let p = root.join(&path);
            if p.is_file() {
                keep.insert(p);
            }
        }
    }
    let mut all = Vec::new();
    files(&results, "", &mut all);
    keep.extend(all.into_iter().filter(|p| p.ends_with("README.md") || p.ends_with("report.json")));
    keep.into_iter().map(|p| p.canonicalize().unwrap()).collect()
}

/// Lists the files of docs/results/ that nothing links (see the module documentation); fails
/// while there are any. Run it before adding results: `cargo test -p gemmbridge-cli --test
/// doc_links -- --ignored`.
#[test]
#[ignore = "lists the unlinked files of docs/results/; run on demand"]
fn docs_results_holds_only_what_something_links() {
    let results = root().join("docs/results");
    let keep = keep();
    let mut all = Vec::new();
    files(&results, "", &mut all);
    let extra: Vec<String> = all
        .iter()
        .map(|p| p.canonicalize().unwrap())
        .filter(|p| !keep.contains(p))
        .map(|p| p.strip_prefix(&results).unwrap().display().to_string())
        .collect();
    println!("docs/results/: {} files, {} kept", all.len(), keep.len());
    for e in &extra {
        println!("unlinked: docs/results/{e}");
    }
    assert!(extra.is_empty(), "{} files in docs/results/ that nothing links", extra.len());
}

#[test]
fn braces_globs_and_links_are_read_as_a_shell_and_markdown_would() {
    assert_eq!(braces("a/call1{4,5}-*"), vec!["a/call14-*", "a/call15-*"]);
    assert!(matches("final-*.txt", "final-8k.txt") && !matches("final-*.txt", "first-8k.txt"));
    assert!(matches("*", "x") && matches("a*b*c", "aXbYc") && !matches("a*c", "ab"));
    let text = "see [a](x/y.md#s), ![p](figures/f.svg \"t\") and `results/2026/` `cargo run` `docs/<date>/`\n\
                [w](https://e) [`notes/`](../notes/)";
    assert_eq!(
        links(text),
        vec![
            (1, "x/y.md".to_string()),
            (1, "figures/f.svg".to_string()),
            (1, "results/2026/".to_string()),
            (2, "../notes/".to_string())
        ]
    );
}
