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
//! - `"tables"` ([`fields::Table`]; may be absent; a manifest without a figure and without a
//!   table is an error): any JSON-lines runs, one row per key (e.g.
//!   shape and dtype), one column per field, each cell the median or the range of that field
//!   over named sets of runs, or the median over paired runs of a ratio of two sets' fields
//!   (e.g. PyTorch's time over gemmbridge's); with `plot`, an SVG of some columns as grouped
//!   bars.
//! - `"headlines"` (may be absent): sentences of other pages that quote a figure's or a table's
//!   numbers, each `{"page": "../../README.md", "text": "… {dense-gpu-bound.mean_max_pct} % …"}`:
//!   the page (relative to the manifest) and a template whose `{id.name}` are the numbers of the
//!   figure or table `id` (a figure's, [`figure::Figure::stat`]: `mean_min`, `mean_max`,
//!   `mean_min_pct`, `mean_max_pct`, `lowest`, `highest`, `rows`, `below`, `bound`, and over
//!   chosen groups `means:SEL`, `lowest:SEL`; a table's, [`fields::Table::stat`]: over chosen
//!   columns `range:H`, `lowest:H`, `highest:H`, `mean:H`). The filled-in sentences are printed.
//! - `"pending"` (may be absent): folders (relative to the manifest) of a topic whose runs are
//!   not in yet. The figures and tables that read a file under one, and the headlines that
//!   quote them, are skipped (named in the printed report) and need not be on the pages; a
//!   pending folder that exists, or that no figure or table reads, is an error (take it off the
//!   list once its runs are in).
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
    /// documentation in crates/gemmbridge-cli/src/report/); one with neither a figure nor a
    /// table is an error.
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
    #[serde(default)]
    pending: Vec<String>,
}

impl Manifest {
    /// The pending folder (see the module documentation) one of `files` is under, if any.
    fn pending_of<'a>(&'a self, files: impl IntoIterator<Item = &'a String>) -> Option<&'a str> {
        let files: Vec<&String> = files.into_iter().collect();
        self.pending
            .iter()
            .map(|p| p.trim_end_matches('/'))
            .find(|p| files.iter().any(|f| f.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))))
    }

    /// The ids of the figures and tables that read a pending folder, each with its folder.
    ///
    /// # Errors
    /// A pending folder that exists under `base`, or that no figure or table reads.
    fn pending_ids(&self, base: &Path) -> anyhow::Result<Vec<(&str, &str)>> {
        let mut out = Vec::new();
        for f in &self.figures {
            if let Some(p) = self.pending_of(f.ours.iter().chain(&f.peer)) {
                out.push((f.id.as_str(), p));
            }
        }
        for t in &self.tables {
            if let Some(p) = self.pending_of(t.runs.values().flatten()) {
                out.push((t.id.as_str(), p));
            }
        }
        for p in &self.pending {
            let folder = p.trim_end_matches('/');
            if base.join(folder).exists() {
                bail!(
                    "pending {p:?}: {} exists; take it off the manifest's \"pending\" list",
                    base.join(folder).display()
                );
            }
            if !out.iter().any(|(_, q)| *q == folder) {
                bail!("pending {p:?}: no figure or table reads a file under it");
            }
        }
        Ok(out)
    }
}

/// A sentence of another page made from figures' and tables' numbers (see the module
/// documentation).
#[derive(Deserialize)]
struct Headline {
    /// The page, relative to the manifest.
    page: String,
    /// The sentence, with `{id.name}` for a number of the figure or table `id`.
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

/// The ids a headline's template quotes: the part of each `{id.name}` before the first `.`.
fn quoted(template: &str) -> Vec<String> {
    let ids = std::cell::RefCell::new(Vec::new());
    let _ = fill(template, |name| {
        ids.borrow_mut().push(name.split_once('.').map_or(name, |(id, _)| id).to_string());
        Some(String::new())
    });
    ids.into_inner()
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
    /// Each fields table made, for headlines.
    made: std::collections::BTreeMap<String, (&'m fields::Table, fields::Made)>,
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

    /// A fields table (its runs through `sets`), and its plot (into `out`) when it has one and
    /// is on the page.
    fn fields(&mut self, t: &'m fields::Table, sets: &mut fields::Sets, out: &Path) -> anyhow::Result<()> {
        let made = t.make(sets)?;
        let _ = writeln!(self.printed, "## {}\n\n{}", t.id, made.markdown);
        if let (Some(p), true) = (&t.plot, t.page) {
            let svg = out.join(format!("{}.svg", t.id));
            plot::grouped(p, &t.plot_rows(&made)?, &svg)?;
            let _ = writeln!(self.printed, "({})\n", svg.display());
            self.plots.push(t.id.clone());
        }
        self.table(format!("{}: its table", t.id), made.markdown.clone(), t.page);
        self.made.insert(t.id.clone(), (t, made));
        Ok(())
    }

    /// A figure or table skipped: its runs, under the pending `folder`, are not in yet.
    fn pending(&mut self, id: &str, folder: &str) {
        let _ = writeln!(self.printed, "## {id} (pending: its runs, under {folder}/, are not in yet)\n");
    }

    /// A headline filled in from the figures' and tables' numbers.
    fn headline(&self, h: &Headline) -> anyhow::Result<String> {
        fill(&h.text, |name| {
            let (id, stat) = name.split_once('.')?;
            match (self.kept.get(id), self.made.get(id)) {
                (Some((f, rows)), _) => f.stat(rows, stat),
                (None, Some((t, made))) => t.stat(made, stat),
                (None, None) => None,
            }
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
    if m.figures.is_empty() && m.tables.is_empty() {
        bail!("{}: the manifest lists no figure and no table: nothing to report", manifest.display());
    }
    let base = manifest.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut made = Made::default();
    let pending = m.pending_ids(&base)?;
    let skipped = |id: &str| pending.iter().find(|(p, _)| *p == id).map(|(_, folder)| *folder);
    for fig in &m.figures {
        match skipped(&fig.id) {
            Some(folder) => made.pending(&fig.id, folder),
            None => made.figure(fig, &base, out)?,
        }
    }
    let mut sets = fields::Sets::new(&base);
    for t in &m.tables {
        match skipped(&t.id) {
            Some(folder) => made.pending(&t.id, folder),
            None => made.fields(t, &mut sets, out)?,
        }
    }
    let mut headlines = Vec::new();
    for h in &m.headlines {
        // a headline quoting what is pending waits with it
        if quoted(&h.text).iter().any(|id| skipped(id).is_some()) {
            let _ = writeln!(made.printed, "## headline for {} (pending)\n\n{}\n", h.page, h.text);
            continue;
        }
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
mod tests;
