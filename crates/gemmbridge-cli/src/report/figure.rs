//! A manifest figure: alternated runs of gemmbridge and a peer (or runs that carry their own
//! ratio), summarised per dtype and op, optionally also row by row.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

use super::fill;
use crate::bench::report::geomean;
use crate::compare::{group, load, median, ratios, Key};
use crate::row::Row;
use crate::suites::is_square_or_llm;

/// One figure of the manifest.
#[derive(Deserialize)]
pub struct Figure {
    /// File stem of the plot, `<id>.svg`.
    pub id: String,
    /// The plot's caption.
    pub title: String,
    /// gemmbridge's runs: files of one run each, or of several packed ([`crate::runs`]).
    pub ours: Vec<String>,
    /// The peer's runs, likewise, paired in order with those of `ours`.
    pub peer: Vec<String>,
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
    /// the field's name. Then `peer` stays empty, each run of `ours` (a file's, or each of a
    /// packed file's in order) is one group, named by the same position in `labels`, and a
    /// row's value is that field.
    #[serde(default)]
    pub field: Option<String>,
    /// With `field`: each run's group name.
    #[serde(default)]
    labels: Vec<String>,
    /// Also a table of every kept row (see [`RowTable`]); paired figures only.
    #[serde(default)]
    row_table: Option<RowTable>,
    /// The summary table's layout: "dtype+op" (the default: a row per dtype and op) or "op" (a
    /// row per op, a column per dtype with the geometric mean of that dtype's rows; then the
    /// table per dtype and op is printed too, as [`Figure::detail`], but a page need not hold it).
    #[serde(default)]
    layout: Option<String>,
    /// Whether the checked page shows the figure (its table and its plot; the default). A
    /// figure off the page is printed by the report and quoted by headlines, but draws no plot.
    #[serde(default = "on_page")]
    pub page: bool,
}

pub(super) fn on_page() -> bool {
    true
}

/// A paired figure's table row by row: its name, dtype, each side's median time over the runs
/// and the row's median ratio over the pairs.
#[derive(Deserialize)]
pub struct RowTable {
    /// The first column's header, e.g. "layer".
    header: String,
    /// Rows of these ops only, in this order (then by dtype, then as in the first of `ours`),
    /// each named by its template: `{m}`, `{n}`, `{k}`, `{batch}`, `{dtype}` are filled in.
    names: Vec<OpName>,
    /// Whether the checked page shows it (the default); printed by the report either way.
    #[serde(default = "on_page")]
    pub page: bool,
}

#[derive(Deserialize)]
struct OpName {
    op: String,
    name: String,
}

fn default_bound() -> f64 {
    0.97
}

/// The order of the dtype columns of a table per op; other dtypes follow, by name.
const DTYPE_ORDER: [&str; 6] = ["f32", "tf32", "f16", "bf16", "fp8", "fp8_e4m3"];

/// The lowest and the highest of `v`.
fn low_high(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// A row a figure keeps: its group (dtype, op), its key and its median ratio.
pub type Kept = ((String, String), Key, f64);

fn key_of(r: &Row) -> Key {
    (r.dtype.clone(), r.label(), r.m, r.n, r.k, r.batch)
}

impl Figure {
    /// The figure's runs, paired, read from files relative to `base` (a file holds one run or
    /// several packed, [`crate::runs`]).
    fn pairs(&self, base: &Path) -> anyhow::Result<Vec<(Vec<Row>, Vec<Row>)>> {
        if self.ours.is_empty() || self.peer.is_empty() {
            bail!("figure {}: give runs of ours and of the peer, paired in order", self.id);
        }
        let path = |f: &String| base.join(f).to_string_lossy().into_owned();
        let (ours, peer): (Vec<String>, Vec<String>) =
            (self.ours.iter().map(path).collect(), self.peer.iter().map(path).collect());
        load(&ours, &peer).with_context(|| format!("figure {}", self.id))
    }

    /// The rows the figure keeps, each with its median ratio, in the groups' order.
    pub fn medians(&self, base: &Path) -> anyhow::Result<Vec<Kept>> {
        if let Some(field) = &self.field {
            return self.field_rows(base, field);
        }
        let (rows, _) = ratios(&self.pairs(base)?);
        let fig = self;
        let shape_ok = |k: &Key| match fig.shapes.as_deref() {
            None => Ok(true),
            Some("square+llm") => Ok(is_square_or_llm((k.2, k.3, k.4))),
            Some("gpu-bound") => Ok(is_square_or_llm((k.2, k.3, k.4)) && k.2 * k.3 * k.4 > 1 << 30),
            Some("other") => Ok(!is_square_or_llm((k.2, k.3, k.4))),
            Some(other) => {
                Err(anyhow::anyhow!("figure {}: shapes {other:?}: give square+llm, gpu-bound or other", fig.id))
            }
        };
        let op_ok = |k: &Key| fig.ops.is_empty() || fig.ops.iter().any(|o| k.1.starts_with(o.as_str()));
        let mut out = Vec::new();
        for (k, v) in &rows {
            if op_ok(k) && shape_ok(k)? {
                out.push((group(k), k.clone(), median(v)));
            }
        }
        if out.is_empty() {
            bail!("figure {}: no row of ops {:?} is in every run", fig.id, fig.ops);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        Ok(out)
    }

    /// A `field` figure's rows: every row of each run that has the field, in the run's group.
    fn field_rows(&self, base: &Path, field: &str) -> anyhow::Result<Vec<Kept>> {
        let mut texts = Vec::new();
        for file in &self.ours {
            let path = base.join(file);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            texts.push((path, text));
        }
        let mut runs = Vec::new();
        for (path, text) in &texts {
            let split = crate::runs::split(text).with_context(|| path.display().to_string())?;
            runs.extend(split.into_iter().map(|r| (path, r)));
        }
        if runs.is_empty() || self.labels.len() != runs.len() || !self.peer.is_empty() {
            bail!(
                "figure {}: a field figure names runs in ours ({} here), one label each ({} here), and no peer",
                self.id,
                runs.len(),
                self.labels.len()
            );
        }
        let mut out = Vec::new();
        for ((path, run), label) in runs.iter().zip(&self.labels) {
            for &(n, line) in &run.lines {
                let v: serde_json::Value =
                    serde_json::from_str(line).with_context(|| format!("{} line {n}", path.display()))?;
                let Some(x) = v.get(field).and_then(|x| x.as_f64()) else { continue };
                let dim = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                let dtype = v.get("dtype").and_then(|d| d.as_str()).unwrap_or("?").to_string();
                let key = (dtype.clone(), label.clone(), dim("m"), dim("n"), dim("k"), 1);
                out.push(((dtype, label.clone()), key, x));
            }
        }
        if out.is_empty() {
            bail!("figure {}: no row has the field {field:?}", self.id);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        Ok(out)
    }

    /// Each (dtype, op) group's rows' median ratios, in the groups' order.
    fn groups(rows: &[Kept]) -> BTreeMap<&(String, String), Vec<f64>> {
        let mut groups: BTreeMap<&(String, String), Vec<f64>> = BTreeMap::new();
        for (g, _, m) in rows {
            groups.entry(g).or_default().push(*m);
        }
        groups
    }

    /// What a summary table's numbers are, printed under it (a page says it in its own words);
    /// the runs are read from `base` to count the pairs.
    pub fn caption(&self, base: &Path) -> anyhow::Result<String> {
        Ok(match &self.field {
            Some(f) => format!("(each row's `{f}`, one run per group)"),
            None => {
                let pairs = self.pairs(base)?.len();
                let plural = if pairs == 1 { "" } else { "s" };
                format!("(PyTorch's time / gemmbridge's, the median of {pairs} alternated pair{plural} per row)")
            }
        })
    }

    /// Whether the summary table has a row per op (see [`Figure::layout`]).
    fn by_op(&self) -> anyhow::Result<bool> {
        match self.layout.as_deref() {
            None | Some("dtype+op") => Ok(false),
            Some("op") => Ok(true),
            Some(other) => bail!("figure {}: layout {other:?}: give dtype+op or op", self.id),
        }
    }

    /// The figure's Markdown table (see [`Figure::layout`]): per dtype and op, or per op with a
    /// column per dtype, the geometric mean of the rows' median ratios, the lowest and highest
    /// median, and the rows below the bound.
    pub fn table(&self, rows: &[Kept]) -> anyhow::Result<String> {
        if self.by_op()? {
            Ok(self.table_by_op(rows))
        } else {
            Ok(self.table_by_dtype_and_op(rows))
        }
    }

    /// With the "op" layout, the table per dtype and op, for the printed report only.
    pub fn detail(&self, rows: &[Kept]) -> anyhow::Result<Option<String>> {
        Ok(self.by_op()?.then(|| self.table_by_dtype_and_op(rows)))
    }

    fn table_by_dtype_and_op(&self, rows: &[Kept]) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "| dtype | op | rows | geometric mean | lowest | highest | rows < {} |", self.bound);
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
        for ((dtype, op), v) in Self::groups(rows) {
            let (lo, hi) = low_high(&v);
            let below = v.iter().filter(|&&x| x < self.bound).count();
            let gm = geomean(&v).unwrap_or(f64::NAN);
            let _ = writeln!(s, "| {dtype} | {op} | {} | {gm:.3} | {lo:.3} | {hi:.3} | {below} |", v.len());
        }
        s
    }

    fn table_by_op(&self, rows: &[Kept]) -> String {
        let groups = Self::groups(rows);
        let mut dtypes: Vec<&str> = groups.keys().map(|(d, _)| d.as_str()).collect();
        dtypes.sort_by_key(|d| (DTYPE_ORDER.iter().position(|x| x == d).unwrap_or(DTYPE_ORDER.len()), *d));
        dtypes.dedup();
        let mut ops: Vec<&str> = groups.keys().map(|(_, o)| o.as_str()).collect();
        ops.sort();
        ops.dedup();
        let mut s = String::new();
        let _ = writeln!(s, "| op | rows | {} | lowest | highest | rows < {} |", dtypes.join(" | "), self.bound);
        let _ = writeln!(s, "|---|---:|{}---:|---:|---:|", "---:|".repeat(dtypes.len()));
        for op in ops {
            let mut all = Vec::new();
            let mut means = Vec::new();
            for d in &dtypes {
                match groups.get(&(d.to_string(), op.to_string())) {
                    Some(v) => {
                        means.push(format!("{:.3}", geomean(v).unwrap_or(f64::NAN)));
                        all.extend_from_slice(v);
                    }
                    None => means.push("–".into()),
                }
            }
            let (lo, hi) = low_high(&all);
            let below = all.iter().filter(|&&x| x < self.bound).count();
            let _ = writeln!(s, "| {op} | {} | {} | {lo:.3} | {hi:.3} | {below} |", all.len(), means.join(" | "));
        }
        s
    }

    /// Named numbers of the figure for a headline (see the module documentation): the lowest and
    /// highest geometric mean of a (dtype, op) group (`mean_min`, `mean_max`, and as per cent
    /// above 1, `mean_min_pct`, `mean_max_pct`), the lowest and highest row (`lowest`,
    /// `highest`), the rows and those below the bound (`rows`, `below`) and the bound.
    pub fn stats(&self, rows: &[Kept]) -> BTreeMap<&'static str, String> {
        let means: Vec<f64> = Self::groups(rows).values().map(|v| geomean(v).unwrap_or(f64::NAN)).collect();
        let all: Vec<f64> = rows.iter().map(|r| r.2).collect();
        let (mean_min, mean_max) = low_high(&means);
        let (lo, hi) = low_high(&all);
        let pct = |x: f64| format!("{:.0}", (x - 1.0) * 100.0);
        BTreeMap::from([
            ("mean_min", format!("{mean_min:.3}")),
            ("mean_max", format!("{mean_max:.3}")),
            ("mean_min_pct", pct(mean_min)),
            ("mean_max_pct", pct(mean_max)),
            ("lowest", format!("{lo:.3}")),
            ("highest", format!("{hi:.3}")),
            ("rows", all.len().to_string()),
            ("below", all.iter().filter(|&&x| x < self.bound).count().to_string()),
            ("bound", self.bound.to_string()),
        ])
    }

    /// A named number for a headline: one of [`Figure::stats`], or over the (dtype, op) groups a
    /// selector picks, `means:SEL` (the lowest and highest of their geometric means, "a–b", one
    /// value where both read the same) and `lowest:SEL` (their lowest row). `SEL` is a
    /// `|`-separated list of ops, dtypes, or `op@dtype`, e.g. `means:grouped equal@bf16|f32`.
    /// None for an unknown name or a selector that picks no group.
    pub fn stat(&self, rows: &[Kept], name: &str) -> Option<String> {
        let Some((kind, selector)) = name.split_once(':') else {
            return self.stats(rows).get(name).cloned();
        };
        let items: Vec<&str> = selector.split('|').collect();
        let picked = |(d, o): &(String, String)| items.iter().any(|i| i == o || i == d || *i == format!("{o}@{d}"));
        let chosen: Vec<Vec<f64>> = Self::groups(rows).into_iter().filter(|(g, _)| picked(g)).map(|(_, v)| v).collect();
        if chosen.is_empty() {
            return None;
        }
        match kind {
            "means" => {
                let means: Vec<f64> = chosen.iter().map(|v| geomean(v).unwrap_or(f64::NAN)).collect();
                let (lo, hi) = low_high(&means);
                let (lo, hi) = (format!("{lo:.3}"), format!("{hi:.3}"));
                Some(if lo == hi { lo } else { format!("{lo}–{hi}") })
            }
            "lowest" => Some(format!("{:.3}", low_high(&chosen.concat()).0)),
            _ => None,
        }
    }

    /// The figure's table row by row, when the manifest asks for one (see [`RowTable`]), and
    /// whether the page shows it.
    pub fn row_table(&self, base: &Path, kept: &[Kept]) -> anyhow::Result<Option<(String, bool)>> {
        let Some(spec) = &self.row_table else { return Ok(None) };
        if self.field.is_some() {
            bail!("figure {}: a row table needs paired runs (ours and peer), not a field", self.id);
        }
        let pairs = self.pairs(base)?;
        // each side's times per row, pair by pair; the row's place in the first run of ours
        let mut times: BTreeMap<Key, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for (ours, peer) in &pairs {
            for r in ours {
                times.entry(key_of(r)).or_default().0.push(r.median_ms);
            }
            for r in peer {
                times.entry(key_of(r)).or_default().1.push(r.median_ms);
            }
        }
        let place: BTreeMap<Key, usize> = pairs[0].0.iter().enumerate().map(|(i, r)| (key_of(r), i)).collect();
        let mut rows: Vec<(usize, &Kept)> = Vec::new();
        for kept in kept {
            if let Some(at) = spec.names.iter().position(|n| n.op == kept.1 .1) {
                rows.push((at, kept));
            }
        }
        if rows.is_empty() {
            let ops: Vec<&str> = spec.names.iter().map(|n| n.op.as_str()).collect();
            bail!("figure {}: its row table names ops {ops:?}, and the figure keeps no row of them", self.id);
        }
        rows.sort_by_key(|(at, (_, k, _))| (*at, k.0.clone(), place.get(k).copied()));
        let n = pairs.len();
        let mut s = String::new();
        let _ = writeln!(s, "| {} | dtype | PyTorch ms | gemmbridge ms | ratio |", spec.header);
        let _ = writeln!(s, "|---|---|---:|---:|---:|");
        for (at, (_, k, ratio)) in rows {
            let (dtype, _, m, nn, kk, batch) = k;
            let name = fill(&spec.names[at].name, |f| match f {
                "m" => Some(m.to_string()),
                "n" => Some(nn.to_string()),
                "k" => Some(kk.to_string()),
                "batch" => Some(batch.to_string()),
                "dtype" => Some(dtype.clone()),
                _ => None,
            })
            .with_context(|| format!("figure {}: row table", self.id))?;
            let (ours, peer) = &times[k];
            let _ = writeln!(s, "| {name} | {dtype} | {:.3} | {:.3} | {ratio:.3} |", median(peer), median(ours));
        }
        let runs = if n == 1 { "its one run".to_string() } else { format!("its {n} runs") };
        let _ = writeln!(
            s,
            "\n(each side's median time over {runs}; the ratio — PyTorch's time / gemmbridge's, above 1 gemmbridge is faster — is the median of the pairs' ratios, so it need not equal their quotient)"
        );
        Ok(Some((s, spec.page)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, lines: &[&str]) {
        std::fs::write(dir.join(name), lines.join("\n")).unwrap();
    }

    fn line(op: &str, dtype: &str, n: usize, k: usize, ms: f64) -> String {
        format!(
            r#"{{"op":"{op}","dtype":"{dtype}","m":4096,"n":{n},"k":{k},"batch":1,"median_ms":{ms},"min_ms":{ms},"tflops":1.0}}"#
        )
    }

    fn figure(json: &str) -> Figure {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_row_table_gives_each_sides_median_and_the_median_ratio_in_the_names_order() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-report-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // linear 4096 -> 6144 bf16: ours 1, 2, 4 ms; peer 2, 2, 2 ms -> ratios 2, 1, 0.5
        // mlp 4096 -> 14336 -> 4096 bf16: ours 1 ms, peer 1.5 ms every time
        let env = r#"{"op":"env","device":"X"}"#;
        for (i, o) in [1.0, 2.0, 4.0].iter().enumerate() {
            let ours =
                [env, &line("linear_train", "bf16", 6144, 4096, *o), &line("mlp_train", "bf16", 14336, 4096, 1.0)];
            let peer =
                [env, &line("mlp_train", "bf16", 14336, 4096, 1.5), &line("linear_train", "bf16", 6144, 4096, 2.0)];
            write(&dir, &format!("o{i}.jsonl"), &ours);
            write(&dir, &format!("p{i}.jsonl"), &peer);
        }
        let fig = figure(
            r#"{"id":"t","title":"t","ours":["o0.jsonl","o1.jsonl","o2.jsonl"],"peer":["p0.jsonl","p1.jsonl","p2.jsonl"],
               "row_table":{"header":"layer","names":[{"op":"mlp_train","name":"MLP {k} → {n} → {k}"},
                                                        {"op":"linear_train","name":"Linear {k} → {n}"}]}}"#,
        );
        let kept = fig.medians(&dir).unwrap();
        let (t, on_page) = fig.row_table(&dir, &kept).unwrap().unwrap();
        assert!(on_page);
        let _ = std::fs::remove_dir_all(&dir);
        let want = "| layer | dtype | PyTorch ms | gemmbridge ms | ratio |\n|---|---|---:|---:|---:|\n\
                    | MLP 4096 → 14336 → 4096 | bf16 | 1.500 | 1.000 | 1.500 |\n\
                    | Linear 4096 → 6144 | bf16 | 2.000 | 2.000 | 1.000 |\n";
        assert!(t.starts_with(want), "{t}");
        assert!(t.contains("median time over its 3 runs"), "{t}");
    }

    /// The "op" layout: a row per op, the dtypes as columns in precision order ("–" where a
    /// dtype lacks the op), the lowest, highest and rows below the bound over every dtype; the
    /// table per dtype and op is the detail. The stats name the groups' extreme means and rows.
    #[test]
    fn the_op_layout_has_a_column_per_dtype_and_keeps_the_detail() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-report-by-op-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // ratios: f16 linear 2 and 0.5; f32 linear 1; f16 matmul 4
        let ours = [
            line("linear", "f16", 4096, 4096, 1.0),
            line("linear", "f16", 8192, 4096, 4.0),
            line("linear", "f32", 4096, 4096, 1.0),
            line("matmul", "f16", 4096, 4096, 1.0),
        ];
        let peer = [
            line("linear", "f16", 4096, 4096, 2.0),
            line("linear", "f16", 8192, 4096, 2.0),
            line("linear", "f32", 4096, 4096, 1.0),
            line("matmul", "f16", 4096, 4096, 4.0),
        ];
        write(&dir, "o.jsonl", &ours.iter().map(String::as_str).collect::<Vec<_>>());
        write(&dir, "p.jsonl", &peer.iter().map(String::as_str).collect::<Vec<_>>());
        let fig = figure(r#"{"id":"t","title":"t","ours":["o.jsonl"],"peer":["p.jsonl"],"layout":"op","bound":0.98}"#);
        let kept = fig.medians(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let t = fig.table(&kept).unwrap();
        let want = "| op | rows | f32 | f16 | lowest | highest | rows < 0.98 |\n|---|---:|---:|---:|---:|---:|---:|\n\
                    | linear | 3 | 1.000 | 1.000 | 0.500 | 2.000 | 1 |\n\
                    | matmul | 1 | – | 4.000 | 4.000 | 4.000 | 0 |\n";
        assert!(t.starts_with(want), "{t}");
        let detail = fig.detail(&kept).unwrap().unwrap();
        assert!(detail.contains("| f16 | linear | 2 | 1.000 | 0.500 | 2.000 | 1 |"), "{detail}");
        let s = fig.stats(&kept);
        assert_eq!((s["mean_min"].as_str(), s["mean_max"].as_str()), ("1.000", "4.000"));
        assert_eq!((s["mean_min_pct"].as_str(), s["mean_max_pct"].as_str()), ("0", "300"));
        assert_eq!((s["lowest"].as_str(), s["rows"].as_str(), s["below"].as_str()), ("0.500", "4", "1"));
        // over chosen groups: by op, by dtype, by op@dtype
        assert_eq!(fig.stat(&kept, "means:linear").as_deref(), Some("1.000"), "both linear means read 1.000");
        assert_eq!(fig.stat(&kept, "means:f16").as_deref(), Some("1.000–4.000"));
        assert_eq!(fig.stat(&kept, "means:matmul@f16|linear@f32").as_deref(), Some("1.000–4.000"));
        assert_eq!(fig.stat(&kept, "lowest:f16").as_deref(), Some("0.500"));
        assert_eq!(fig.stat(&kept, "lowest").as_deref(), Some("0.500"));
        assert_eq!(fig.stat(&kept, "means:bf16"), None, "no group picked");
        assert_eq!(fig.stat(&kept, "median:f16"), None, "no such kind");
        let plain = figure(r#"{"id":"t","title":"t","ours":["o.jsonl"],"peer":["p.jsonl"]}"#);
        assert!(plain.detail(&kept).unwrap().is_none());
        let typo = figure(r#"{"id":"t","title":"t","ours":["o.jsonl"],"peer":["p.jsonl"],"layout":"dtype"}"#);
        assert!(typo.table(&kept).is_err());
    }

    #[test]
    fn a_row_table_of_ops_the_figure_lacks_is_an_error() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-report-rows-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir, "o.jsonl", &[&line("linear_train", "f16", 4096, 4096, 1.0)]);
        write(&dir, "p.jsonl", &[&line("linear_train", "f16", 4096, 4096, 1.0)]);
        let fig = figure(
            r#"{"id":"t","title":"t","ours":["o.jsonl"],"peer":["p.jsonl"],
               "row_table":{"header":"layer","names":[{"op":"mlp_train","name":"MLP"}]}}"#,
        );
        let kept = fig.medians(&dir).unwrap();
        let e = fig.row_table(&dir, &kept).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.contains("keeps no row"), "{e}");
    }
}
