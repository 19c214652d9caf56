//! `gemmbridge report`: the tables and plots of docs/PERFORMANCE.md, made again from the runs
//! in docs/results/ that a manifest lists, so that anyone can regenerate them.
//!
//! The manifest is a JSON object with these lists, paths relative to the manifest:
//!
//! - `"figures"` ([`figure::Figure`]): alternated runs, `ours[i]` paired with `peer[i]` (files
//!   as `gemmbridge bench --out`, `gemmbridge train-bench` and the PyTorch peers write them),
//!   the ops kept (label prefixes, e.g. `conv_fwd/nhwc`) and a bound. Each gives a Markdown
//!   table — per dtype and op (or, with `"layout": "op"`, per op with a column per dtype), the
//!   geometric mean of the rows' median ratios (PyTorch's time / gemmbridge's), the lowest and
//!   highest median, and the rows below the bound; its caption is printed under it — and an SVG
//!   plot of every row's median ratio, one colour per dtype, with the line at 1. With
//!   `row_table` it also gives a table of every row: each side's median time and the ratio.
//!   A figure with `field` reads runs that carry their own ratio instead (`gemmbridge-burn
//!   bench`'s `speedup_vs_burn`).
//! - `"tables"` ([`fields::Table`]; may be absent): any JSON-lines runs, one row per key (e.g.
//!   shape and dtype), one column per field, each cell the median or the range of that field
//!   over named sets of runs; with `plot`, an SVG of some columns as grouped bars.
//! - `"headlines"` (may be absent): sentences of other pages that quote a figure's numbers, each
//!   `{"page": "../../README.md", "text": "… {dense-gpu-bound.mean_max_pct} % …"}`: the page
//!   (relative to the manifest) and a template whose `{figure.name}` are that figure's
//!   numbers ([`figure::Figure::stats`]: `mean_min`, `mean_max`, `mean_min_pct`, `mean_max_pct`,
//!   `lowest`, `highest`, `rows`, `below`, `bound`). The filled-in sentences are printed.
//!
//! With `--check PAGE` the command also fails unless every table it makes appears in PAGE
//! verbatim (a figure's per-dtype detail, printed with the "op" layout, may but need not),
//! every plot is linked from it, every Markdown table of PAGE is one it makes, and every
//! headline's page holds its filled-in text (line breaks and runs of spaces read as one space).

mod fields;
mod figure;
mod plot;

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

#[derive(clap::Args)]
pub struct Args {
    /// The manifest: a JSON object {"figures": [...], "tables": [...]} (see the module
    /// documentation in crates/gemmbridge-cli/src/report/).
    #[arg(long, default_value = "docs/results/report.json")]
    manifest: String,
    /// Folder the SVG plots are written to (created if missing).
    #[arg(long, default_value = "docs/figures")]
    out: String,
    /// A Markdown page that must contain every table verbatim, link every plot, and hold no
    /// other table; exit 1 if it does not.
    #[arg(long)]
    check: Option<String>,
}

#[derive(Deserialize)]
struct Manifest {
    figures: Vec<figure::Figure>,
    #[serde(default)]
    tables: Vec<fields::Table>,
    #[serde(default)]
    headlines: Vec<Headline>,
}

/// A sentence of another page made from figures' numbers (see the module documentation).
#[derive(Deserialize)]
struct Headline {
    /// The page, relative to the manifest.
    page: String,
    /// The sentence, with `{figure.name}` for a figure's number.
    text: String,
}

/// `text` with every run of whitespace (line breaks included) read as one space.
fn spaced(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `template` with every `{name}` replaced by `value(name)`.
///
/// # Errors
/// A `{` without its `}`, or a name `value` does not know.
fn fill(template: &str, value: impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else { bail!("{template:?}: a {{ without its }}") };
        let name = &rest[open + 1..open + close];
        out.push_str(&value(name).ok_or_else(|| anyhow::anyhow!("{template:?}: no value for {{{name}}}"))?);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The Markdown tables of a page: each run of lines that begin with `|`, with its first line's
/// number.
fn page_tables(page: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in page.lines().enumerate() {
        if line.starts_with('|') {
            match out.last_mut() {
                Some((_, t)) if open => {
                    t.push('\n');
                    t.push_str(line);
                }
                _ => out.push((i + 1, line.to_string())),
            }
            open = true;
        } else {
            open = false;
        }
    }
    out
}

/// Makes every table and plot of the manifest (plots into `out`); returns the text printed
/// and, with a page, what the page lacks or holds besides.
fn report(manifest: &Path, out: &Path, page: Option<&str>) -> anyhow::Result<(String, Vec<String>)> {
    let text = std::fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let m: Manifest = serde_json::from_str(&text).with_context(|| format!("parsing {}", manifest.display()))?;
    let base = manifest.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut printed = String::new();
    // (what, its table) the page must hold; tables it may hold besides; (what, its plot's id)
    let (mut tables, mut optional, mut plots) = (Vec::new(), Vec::new(), Vec::new());
    let mut stats = std::collections::BTreeMap::new();
    for fig in &m.figures {
        let rows = fig.medians(&base)?;
        let svg = out.join(format!("{}.svg", fig.id));
        plot::figure(fig, &rows, &svg)?;
        let t = fig.table(&rows)?;
        let caption = fig.caption(&base)?;
        let _ = writeln!(printed, "## {} ({})\n\n{t}\n{caption}\n", fig.title, svg.display());
        tables.push((format!("{}: its table", fig.id), t));
        if let Some(d) = fig.detail(&rows)? {
            let _ = writeln!(printed, "## {}, per dtype and op\n\n{d}\n{caption}\n", fig.title);
            optional.push(d);
        }
        if let Some(r) = fig.row_table(&base, &rows)? {
            let _ = writeln!(printed, "## {}, row by row\n\n{r}", fig.title);
            tables.push((format!("{}: its row table", fig.id), r));
        }
        stats.insert(fig.id.clone(), fig.stats(&rows));
        plots.push(fig.id.clone());
    }
    for t in &m.tables {
        let made = t.make(&base)?;
        let _ = writeln!(printed, "## {}\n\n{}", t.id, made.markdown);
        if let Some(p) = &t.plot {
            let svg = out.join(format!("{}.svg", t.id));
            plot::grouped(p, &made.rows, &svg)?;
            let _ = writeln!(printed, "({})\n", svg.display());
            plots.push(t.id.clone());
        }
        tables.push((format!("{}: its table", t.id), made.markdown));
    }
    let mut headlines = Vec::new();
    for h in &m.headlines {
        let text = fill(&h.text, |name| {
            let (fig, stat) = name.split_once('.')?;
            stats.get(fig)?.get(stat).cloned()
        })
        .with_context(|| format!("the headline for {}", h.page))?;
        let _ = writeln!(printed, "## headline for {}\n\n{text}\n", h.page);
        headlines.push((base.join(&h.page), text));
    }
    let mut wrong = Vec::new();
    if let Some(page) = page {
        for (what, t) in &tables {
            if !page.contains(t.trim_end()) {
                wrong.push(what.clone());
            }
        }
        for id in &plots {
            if !page.contains(&format!("{id}.svg")) {
                wrong.push(format!("{id}: a link to {id}.svg"));
            }
        }
        for (line, t) in page_tables(page) {
            if !tables.iter().map(|(_, made)| made).chain(&optional).any(|made| made.contains(&t)) {
                let first = t.lines().next().unwrap_or_default();
                wrong.push(format!("line {line}: a table the manifest does not make ({first})"));
            }
        }
        for (path, text) in &headlines {
            let other = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            if !spaced(&other).contains(&spaced(text)) {
                wrong.push(format!("{}: its headline \"{text}\"", path.display()));
            }
        }
    }
    Ok((printed, wrong))
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let page = match &args.check {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?),
        None => None,
    };
    let (printed, wrong) = report(Path::new(&args.manifest), Path::new(&args.out), page.as_deref())?;
    print!("{printed}");
    if !wrong.is_empty() {
        eprintln!("{}: {}", args.check.unwrap_or_default(), wrong.join("; "));
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The repository's own page holds every table its manifest makes, links every plot and
    /// has no table of its own, and README.md its headline; the burn adapter's README holds the
    /// same device-ordering table.
    #[test]
    fn performance_page_matches_its_runs() {
        let out = std::env::temp_dir().join(format!("gemmbridge-report-test-{}", std::process::id()));
        let page = std::fs::read_to_string(root().join("docs/PERFORMANCE.md")).unwrap();
        let (printed, wrong) = report(&root().join("docs/results/report.json"), &out, Some(&page)).unwrap();
        assert!(wrong.is_empty(), "docs/PERFORMANCE.md is out of date (run gemmbridge report): {wrong:?}");
        let svg = std::fs::read_to_string(out.join("conv-forward.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("bf16"), "{}", &svg[..200.min(svg.len())]);
        let svg = std::fs::read_to_string(out.join("burn-ordering.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("4096×4096×4096"), "{}", &svg[..200.min(svg.len())]);
        let _ = std::fs::remove_dir_all(out);
        let burn = std::fs::read_to_string(root().join("crates/gemmbridge-burn/README.md")).unwrap();
        let ordering = printed.split("## burn-ordering\n\n").nth(1).unwrap().split("\n\n").next().unwrap();
        assert!(burn.contains(ordering), "crates/gemmbridge-burn/README.md lacks:\n{ordering}");
    }

    #[test]
    fn fill_replaces_names_and_refuses_unknown_ones() {
        let v = |n: &str| (n == "k").then(|| "4096".to_string());
        assert_eq!(fill("Linear {k} → {k}", v).unwrap(), "Linear 4096 → 4096");
        assert!(fill("{n}", v).is_err());
        assert!(fill("{k", v).is_err());
    }

    /// `--check` fails for a page that lacks a table, a plot's link, or that holds a table of
    /// its own; it passes for the page made of what the report printed.
    #[test]
    fn check_names_what_a_page_lacks_and_tables_it_should_not_have() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-report-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("r.jsonl"), "{\"m\":1,\"x\":2.5}\n{\"m\":2,\"x\":0.5}\n").unwrap();
        let o = r#"{"op":"env","device":"X"}
{"op":"linear","dtype":"f16","m":64,"n":64,"k":64,"batch":1,"median_ms":1.0,"min_ms":1.0,"tflops":1.0}"#;
        let p = o.replace("\"median_ms\":1.0", "\"median_ms\":2.0");
        std::fs::write(dir.join("o.jsonl"), o).unwrap();
        std::fs::write(dir.join("p.jsonl"), p).unwrap();
        let manifest = r#"{"figures":[{"id":"f","title":"F","ours":["o.jsonl"],"peer":["p.jsonl"]}],
            "tables":[{"id":"t","runs":{"r":["r.jsonl"]},"key":[{"header":"m","value":"{m}"}],
                       "columns":[{"header":"x","runs":"r","field":"x","format":"fixed:1"}],
                       "plot":{"title":"T","columns":["x"],"y":"x"}}],
            "headlines":[{"page":"readme.md","text":"{f.mean_max_pct} % ahead, lowest {f.lowest} ({f.below} below {f.bound})"}]}"#;
        // the headline, wrapped as a page would wrap it
        std::fs::write(dir.join("readme.md"), "It is 100 % ahead,\nlowest 2.000 (0 below 0.97) here.\n").unwrap();
        std::fs::write(dir.join("report.json"), manifest).unwrap();
        let figs = dir.join("figures");
        let (printed, _) = report(&dir.join("report.json"), &figs, None).unwrap();
        let table_t = "| m | x |\n|---|---:|\n| 1 | 2.5 |\n| 2 | 0.5 |";
        assert!(printed.contains(table_t), "{printed}");
        assert!(printed.contains("| f16 | linear | 1 | 2.000 | 2.000 | 2.000 | 0 |"), "{printed}");
        let good = format!("{printed}\n![f](figures/f.svg) ![t](figures/t.svg)\n");
        let check = |page: &str| report(&dir.join("report.json"), &figs, Some(page)).unwrap().1;
        assert_eq!(check(&good), Vec::<String>::new());
        let without_t = good.replace(table_t, "");
        assert_eq!(check(&without_t), vec!["t: its table".to_string()]);
        let without_plot = good.replace("figures/t.svg", "");
        assert_eq!(check(&without_plot), vec!["t: a link to t.svg".to_string()]);
        let typed = format!("{good}\n| a | b |\n|---|---|\n| 1 | 2 |\n");
        let wrong = check(&typed);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].contains("a table the manifest does not make (| a | b |)"), "{wrong:?}");
        // one number typed differently from the runs is a table the manifest does not make
        let edited = good.replace("| 2 | 0.5 |", "| 2 | 0.6 |");
        assert_eq!(check(&edited).len(), 2, "{:?}", check(&edited));
        // the headline is printed, and a page whose headline differs from the runs fails
        assert!(printed.contains("100 % ahead, lowest 2.000 (0 below 0.97)"), "{printed}");
        std::fs::write(dir.join("readme.md"), "It is 90 % ahead, lowest 2.000 (0 below 0.97).\n").unwrap();
        let wrong = check(&good);
        assert!(wrong.len() == 1 && wrong[0].contains("readme.md: its headline"), "{wrong:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
