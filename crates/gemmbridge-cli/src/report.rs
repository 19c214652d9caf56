//! `gemmbridge report`: the comparison tables and plots of docs/PERFORMANCE.md, made again from
//! the runs in docs/results/ that a manifest lists, so that anyone can regenerate them.
//!
//! The manifest (JSON) lists figures. Each names alternated runs (`ours[i]` paired with
//! `peer[i]`, files as `gemmbridge bench --out` and the PyTorch peers write them, paths relative
//! to the manifest), the ops it keeps (label prefixes, e.g. `conv_fwd/nhwc`) and a bound. For
//! each figure the command prints a Markdown table — per dtype and op, the geometric mean of
//! the rows' median ratios (PyTorch's time / gemmbridge's), the lowest and highest median, and
//! the rows below the bound — and writes an SVG plot of every row's median ratio, one colour
//! per dtype, with the line at 1. With `--check PAGE` it also fails unless every table appears
//! in PAGE verbatim and every plot is linked from it.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use plotters::prelude::*;
use serde::Deserialize;

use crate::bench::report::geomean;
use crate::compare::{group, load, median, ratios, Key};
use crate::suites::is_square_or_llm;

#[derive(clap::Args)]
pub struct Args {
    /// The manifest: a JSON object {"figures": [...]} (see the module documentation).
    #[arg(long, default_value = "docs/results/report.json")]
    manifest: String,
    /// Folder the SVG plots are written to (created if missing).
    #[arg(long, default_value = "docs/figures")]
    out: String,
    /// A Markdown page that must contain every table verbatim and link every plot; exit 1 if
    /// it does not.
    #[arg(long)]
    check: Option<String>,
}

/// One figure of the manifest.
#[derive(Deserialize)]
struct Figure {
    /// File stem of the plot, `<id>.svg`.
    id: String,
    /// The plot's caption.
    title: String,
    /// gemmbridge's runs.
    ours: Vec<String>,
    /// The peer's runs, paired in order with `ours`.
    peer: Vec<String>,
    /// Label prefixes of the rows kept (all rows when empty).
    #[serde(default)]
    ops: Vec<String>,
    /// GEMM rows kept by shape: "square+llm" (those suites), "gpu-bound" (those suites above
    /// 1024³ multiply-adds), "other" (the rest, e.g. the host-bound small suite); all when
    /// absent.
    #[serde(default)]
    shapes: Option<String>,
    /// Rows whose median is below this are counted.
    #[serde(default = "default_bound")]
    bound: f64,
    /// Runs that carry their own ratio (e.g. `gemmbridge-burn bench`'s `speedup_vs_burn`):
    /// the field's name. Then `peer` stays empty, each of `ours` is one group, named by the
    /// same position in `labels`, and a row's value is that field.
    #[serde(default)]
    field: Option<String>,
    /// With `field`: each run's group name.
    #[serde(default)]
    labels: Vec<String>,
}

fn default_bound() -> f64 {
    0.97
}

#[derive(Deserialize)]
struct Manifest {
    figures: Vec<Figure>,
}

/// A row a figure keeps: its group (dtype, op), its key and its median ratio.
type Kept = ((String, String), Key, f64);

/// The rows a figure keeps, each with its median ratio, in the groups' order.
fn medians(fig: &Figure, base: &Path) -> anyhow::Result<Vec<Kept>> {
    if let Some(field) = &fig.field {
        return field_rows(fig, base, field);
    }
    if fig.ours.is_empty() || fig.ours.len() != fig.peer.len() {
        bail!(
            "figure {}: {} runs of ours and {} of the peer; give as many of each, at least one",
            fig.id,
            fig.ours.len(),
            fig.peer.len()
        );
    }
    let path = |f: &String| base.join(f).to_string_lossy().into_owned();
    let (ours, peer): (Vec<String>, Vec<String>) =
        (fig.ours.iter().map(path).collect(), fig.peer.iter().map(path).collect());
    let pairs = load(&ours, &peer).with_context(|| format!("figure {}", fig.id))?;
    let (rows, _) = ratios(&pairs);
    let shape_ok = |k: &Key| match fig.shapes.as_deref() {
        None => Ok(true),
        Some("square+llm") => Ok(is_square_or_llm((k.2, k.3, k.4))),
        Some("gpu-bound") => Ok(is_square_or_llm((k.2, k.3, k.4)) && k.2 * k.3 * k.4 > 1 << 30),
        Some("other") => Ok(!is_square_or_llm((k.2, k.3, k.4))),
        Some(other) => Err(anyhow::anyhow!("figure {}: shapes {other:?}: give square+llm, gpu-bound or other", fig.id)),
    };
    let op_ok = |k: &Key| fig.ops.is_empty() || fig.ops.iter().any(|o| k.1.starts_with(o.as_str()));
    let mut kept = Vec::new();
    for (k, v) in &rows {
        if op_ok(k) && shape_ok(k)? {
            kept.push((group(k), k.clone(), median(v)));
        }
    }
    let mut out = kept;
    if out.is_empty() {
        bail!("figure {}: no row of ops {:?} is in every run", fig.id, fig.ops);
    }
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    Ok(out)
}

/// A `field` figure's rows: every row of each run that has the field, in the run's group.
fn field_rows(fig: &Figure, base: &Path, field: &str) -> anyhow::Result<Vec<Kept>> {
    if fig.ours.is_empty() || fig.labels.len() != fig.ours.len() || !fig.peer.is_empty() {
        bail!("figure {}: a field figure names runs in ours, one label each, and no peer", fig.id);
    }
    let mut out = Vec::new();
    for (file, label) in fig.ours.iter().zip(&fig.labels) {
        let path = base.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{} line {}", path.display(), i + 1))?;
            let Some(x) = v.get(field).and_then(|x| x.as_f64()) else { continue };
            let dim = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0) as usize;
            let dtype = v.get("dtype").and_then(|d| d.as_str()).unwrap_or("?").to_string();
            let key = (dtype.clone(), label.clone(), dim("m"), dim("n"), dim("k"), 1);
            out.push(((dtype, label.clone()), key, x));
        }
    }
    if out.is_empty() {
        bail!("figure {}: no row has the field {field:?}", fig.id);
    }
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    Ok(out)
}

/// The figure's Markdown table (see the module documentation).
fn table(fig: &Figure, rows: &[Kept]) -> String {
    let mut groups: BTreeMap<&(String, String), Vec<f64>> = BTreeMap::new();
    for (g, _, m) in rows {
        groups.entry(g).or_default().push(*m);
    }
    let pairs = fig.ours.len();
    let mut s = String::new();
    let _ = writeln!(s, "| dtype | op | rows | geometric mean | lowest | highest | rows < {} |", fig.bound);
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for ((dtype, op), v) in groups {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let below = v.iter().filter(|&&x| x < fig.bound).count();
        let gm = geomean(&v).unwrap_or(f64::NAN);
        let _ = writeln!(s, "| {dtype} | {op} | {} | {gm:.3} | {lo:.3} | {hi:.3} | {below} |", v.len());
    }
    match &fig.field {
        Some(f) => {
            let _ = writeln!(s, "\n(each row's `{f}`, one run per group)");
        }
        None => {
            let plural = if pairs == 1 { "" } else { "s" };
            let _ =
                writeln!(s, "\n(PyTorch's time / gemmbridge's, the median of {pairs} alternated pair{plural} per row)");
        }
    }
    s
}

/// The figure's plot: every row's median ratio as a bar, the line at 1; one colour per group
/// (dtype and op) where there are at most ten groups, else one per dtype, named in the legend.
fn plot(fig: &Figure, rows: &[Kept], path: &Path) -> anyhow::Result<()> {
    // headroom above the tallest bar for the legend
    let top = rows.iter().map(|r| r.2).fold(1.2f64, f64::max) * 1.45;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc("rows (shapes), in the table's order, one colour per legend entry")
        .y_desc(if fig.field.is_some() { "ratio (see the table)" } else { "PyTorch time / gemmbridge time" })
        .draw()?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    let mut groups: Vec<&(String, String)> = rows.iter().map(|r| &r.0).collect();
    groups.dedup();
    let by_group = groups.len() <= palette.len();
    let name = |r: &Kept| if by_group { format!("{} {}", r.0 .0, r.0 .1) } else { r.0 .0.clone() };
    let mut names: Vec<String> = rows.iter().map(name).collect();
    names.dedup();
    for (c, entry) in names.iter().enumerate() {
        let colour = palette[c % palette.len()];
        let bars = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| name(r) == *entry)
            .map(move |(i, r)| Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, r.2)], colour.filled()));
        chart
            .draw_series(bars)?
            .label(entry.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart.draw_series(LineSeries::new([(0.0, 1.0), (rows.len() as f64, 1.0)], BLACK.stroke_width(1)))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&args.manifest).with_context(|| format!("reading {}", args.manifest))?;
    let manifest: Manifest = serde_json::from_str(&text).with_context(|| format!("parsing {}", args.manifest))?;
    let base = Path::new(&args.manifest).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out))?;
    let page = match &args.check {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?),
        None => None,
    };
    let mut missing = Vec::new();
    for fig in &manifest.figures {
        let rows = medians(fig, &base)?;
        let t = table(fig, &rows);
        let svg = Path::new(&args.out).join(format!("{}.svg", fig.id));
        plot(fig, &rows, &svg)?;
        println!("## {} ({})\n\n{t}", fig.title, svg.display());
        if let Some(page) = &page {
            if !page.contains(t.trim_end()) {
                missing.push(format!("{}: its table", fig.id));
            }
            if !page.contains(&format!("{}.svg", fig.id)) {
                missing.push(format!("{}: a link to {}.svg", fig.id, fig.id));
            }
        }
    }
    if !missing.is_empty() {
        eprintln!("{} lacks: {}", args.check.unwrap_or_default(), missing.join("; "));
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's own page holds every table its manifest makes, and links every plot.
    #[test]
    fn performance_page_matches_its_runs() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::env::temp_dir().join(format!("gemmbridge-report-test-{}", std::process::id()));
        let args = Args {
            manifest: root.join("docs/results/report.json").to_string_lossy().into_owned(),
            out: out.to_string_lossy().into_owned(),
            check: Some(root.join("docs/PERFORMANCE.md").to_string_lossy().into_owned()),
        };
        assert_eq!(run(args).unwrap(), 0, "docs/PERFORMANCE.md is out of date: run gemmbridge report");
        let svg = std::fs::read_to_string(out.join("conv-forward.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("bf16"), "{}", &svg[..200.min(svg.len())]);
        let _ = std::fs::remove_dir_all(out);
    }
}
