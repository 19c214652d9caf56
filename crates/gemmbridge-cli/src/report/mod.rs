//! `gemmbridge report`: the tables and plots of docs/PERFORMANCE.md, made again from the runs
//! in docs/results/ that a manifest lists, so that anyone can regenerate them.
//!
//! The manifest is a JSON object with these lists, paths relative to the manifest:
//!
//! - `"figures"` ([`figure::Figure`]): alternated runs, the i-th run of `ours` paired with the
//!   i-th of `peer` (files as `gemmbridge bench --out`, `gemmbridge train-bench` and the
//!   PyTorch peers write them, one run each or several packed, [`crate::runs`]), the ops kept
//!   (label prefixes, e.g. `conv_fwd/nhwc`) and a bound. Each gives a Markdown
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
//!   numbers ([`figure::Figure::stat`]: `mean_min`, `mean_max`, `mean_min_pct`, `mean_max_pct`,
//!   `lowest`, `highest`, `rows`, `below`, `bound`, and over chosen groups `means:SEL`,
//!   `lowest:SEL`). The filled-in sentences are printed.
//!
//! A figure, row table or table with `"page": false` is printed and may be quoted by headlines,
//! but the page need not show it and it draws no plot: the page keeps one table and one plot
//! per capability, the report prints the detail.
//!
//! With `--check PAGE` the command also fails unless every table on the page it makes appears
//! in PAGE verbatim (a figure's per-dtype detail, printed with the "op" layout, and the tables
//! off the page may but need not), every plot is linked from it, every Markdown table of PAGE
//! is one it makes, and every headline's page holds its filled-in text (line breaks and runs of
//! spaces read as one space).

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

/// What the report made: the text printed; (what, its table) the page must hold; tables it
/// may hold besides; the ids of the plots it must link; each figure's rows, for headlines.
#[derive(Default)]
struct Made<'m> {
    printed: String,
    tables: Vec<(String, String)>,
    optional: Vec<String>,
    plots: Vec<String>,
    kept: std::collections::BTreeMap<String, (&'m figure::Figure, Vec<figure::Kept>)>,
}

impl<'m> Made<'m> {
    /// A table the page must hold (`page`) or may hold.
    fn table(&mut self, what: String, t: String, page: bool) {
        if page {
            self.tables.push((what, t));
        } else {
            self.optional.push(t);
        }
    }

    /// A figure's tables, its plot (into `out`, when on the page) and its rows.
    fn figure(&mut self, fig: &'m figure::Figure, base: &Path, out: &Path) -> anyhow::Result<()> {
        let rows = fig.medians(base)?;
        let where_ = if fig.page {
            let svg = out.join(format!("{}.svg", fig.id));
            plot::figure(fig, &rows, &svg)?;
            self.plots.push(fig.id.clone());
            svg.display().to_string()
        } else {
            "not on the page".to_string()
        };
        let t = fig.table(&rows)?;
        let caption = fig.caption(base)?;
        let _ = writeln!(self.printed, "## {} ({where_})\n\n{t}\n{caption}\n", fig.title);
        self.table(format!("{}: its table", fig.id), t, fig.page);
        if let Some(d) = fig.detail(&rows)? {
            let _ = writeln!(self.printed, "## {}, per dtype and op\n\n{d}\n{caption}\n", fig.title);
            self.optional.push(d);
        }
        if let Some((r, page)) = fig.row_table(base, &rows)? {
            let _ = writeln!(self.printed, "## {}, row by row\n\n{r}", fig.title);
            self.table(format!("{}: its row table", fig.id), r, fig.page && page);
        }
        self.kept.insert(fig.id.clone(), (fig, rows));
        Ok(())
    }

    /// A fields table, and its plot (into `out`) when it has one and is on the page.
    fn fields(&mut self, t: &fields::Table, base: &Path, out: &Path) -> anyhow::Result<()> {
        let made = t.make(base)?;
        let _ = writeln!(self.printed, "## {}\n\n{}", t.id, made.markdown);
        if let (Some(p), true) = (&t.plot, t.page) {
            let svg = out.join(format!("{}.svg", t.id));
            plot::grouped(p, &made.rows, &svg)?;
            let _ = writeln!(self.printed, "({})\n", svg.display());
            self.plots.push(t.id.clone());
        }
        self.table(format!("{}: its table", t.id), made.markdown, t.page);
        Ok(())
    }

    /// A headline filled in from the figures' numbers.
    fn headline(&self, h: &Headline) -> anyhow::Result<String> {
        fill(&h.text, |name| {
            let (fig, stat) = name.split_once('.')?;
            let (f, rows) = self.kept.get(fig)?;
            f.stat(rows, stat)
        })
        .with_context(|| format!("the headline for {}", h.page))
    }

    /// What `page` lacks or holds besides (see the module documentation).
    fn check(&self, page: &str) -> Vec<String> {
        let mut wrong = Vec::new();
        for (what, t) in &self.tables {
            if !page.contains(t.trim_end()) {
                wrong.push(what.clone());
            }
        }
        for id in &self.plots {
            if !page.contains(&format!("{id}.svg")) {
                wrong.push(format!("{id}: a link to {id}.svg"));
            }
        }
        for (line, t) in page_tables(page) {
            if !self.tables.iter().map(|(_, made)| made).chain(&self.optional).any(|made| made.contains(&t)) {
                let first = t.lines().next().unwrap_or_default();
                wrong.push(format!("line {line}: a table the manifest does not make ({first})"));
            }
        }
        wrong
    }
}

/// Makes every table and plot of the manifest (plots into `out`); returns the text printed
/// and, with a page, what the page lacks or holds besides.
fn report(manifest: &Path, out: &Path, page: Option<&str>) -> anyhow::Result<(String, Vec<String>)> {
    let text = std::fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let m: Manifest = serde_json::from_str(&text).with_context(|| format!("parsing {}", manifest.display()))?;
    let base = manifest.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut made = Made::default();
    for fig in &m.figures {
        made.figure(fig, &base, out)?;
    }
    for t in &m.tables {
        made.fields(t, &base, out)?;
    }
    let mut headlines = Vec::new();
    for h in &m.headlines {
        let text = made.headline(h)?;
        let _ = writeln!(made.printed, "## headline for {}\n\n{text}\n", h.page);
        headlines.push((base.join(&h.page), text));
    }
    let mut wrong = Vec::new();
    if let Some(page) = page {
        wrong = made.check(page);
        for (path, text) in &headlines {
            let other = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            if !spaced(&other).contains(&spaced(text)) {
                wrong.push(format!("{}: its headline \"{text}\"", path.display()));
            }
        }
    }
    Ok((made.printed, wrong))
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

    /// The repository's own page holds every table its manifest puts on it, links every plot and
    /// has no table of its own, docs/figures/ holds exactly those plots, README.md and the page
    /// hold their headlines; the burn adapter's README holds the device-ordering table.
    #[test]
    fn performance_page_matches_its_runs() {
        let out = std::env::temp_dir().join(format!("gemmbridge-report-test-{}", std::process::id()));
        let page = std::fs::read_to_string(root().join("docs/PERFORMANCE.md")).unwrap();
        let (printed, wrong) = report(&root().join("docs/results/report.json"), &out, Some(&page)).unwrap();
        assert!(wrong.is_empty(), "docs/PERFORMANCE.md is out of date (run gemmbridge report): {wrong:?}");
        let svg = std::fs::read_to_string(out.join("conv-forward.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("bf16"), "{}", &svg[..200.min(svg.len())]);
        // docs/figures holds exactly the plots the manifest draws (none for what is off the page)
        let names = |dir: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(&root().join("docs/figures")),
            names(&out),
            "docs/figures/ against the plots the report draws"
        );
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
        let manifest = r#"{"figures":[{"id":"f","title":"F","ours":["o.jsonl"],"peer":["p.jsonl"]},
                                      {"id":"g","title":"G","ours":["o.jsonl"],"peer":["p.jsonl"],"bound":3.0,"page":false}],
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
        // a figure off the page is printed, need not be on it, and draws no plot
        let table_g = "| dtype | op | rows | geometric mean | lowest | highest | rows < 3 |";
        assert!(printed.contains(&format!("## G (not on the page)\n\n{table_g}")), "{printed}");
        assert!(figs.join("f.svg").exists() && !figs.join("g.svg").exists());
        let without_g = good.replace(table_g, "");
        assert_eq!(check(&without_g), Vec::<String>::new());
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
