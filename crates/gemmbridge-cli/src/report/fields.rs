//! A manifest table of fields: any JSON-lines runs (e.g. `gemmbridge-burn bench`, `gemmbridge
//! firstcall`, a probe's table written as JSON lines), one Markdown row per key, one column
//! per field, each cell the median (or the range) of that field over the lines of the row's
//! key in the column's runs.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::fill;
use crate::compare::median;

/// One table of the manifest.
#[derive(Deserialize)]
pub struct Table {
    /// The table's name in messages, and the plot's file stem, `<id>.svg`.
    pub id: String,
    /// Named sets of runs (JSON-lines files relative to the manifest), used by the columns.
    runs: BTreeMap<String, Vec<String>>,
    /// The columns that tell rows apart, first in each row. The rows come in the order their
    /// keys first appear in the columns' runs.
    key: Vec<KeyColumn>,
    /// The value columns, right-aligned.
    columns: Vec<Column>,
    /// A bar plot of some columns, one group of bars per row (drawn only for a table on the
    /// page).
    #[serde(default)]
    pub plot: Option<Plot>,
    /// Whether the checked page shows the table (the default); printed by the report either way.
    #[serde(default = "super::figure::on_page")]
    pub page: bool,
}

#[derive(Deserialize)]
struct KeyColumn {
    header: String,
    /// A template: `{field}` is replaced by that field of the line; a line without one of its
    /// fields is in no row.
    value: String,
    /// Text shown in place of a filled-in value, e.g. {"true": "with prewarm"}.
    #[serde(default)]
    names: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Column {
    header: String,
    /// The name of a set in `runs`.
    runs: String,
    /// The field shown (a number).
    field: String,
    /// "fixed:N" (N decimals), "sci:N" (N decimals of a power of ten, 2.0e-7) or "sig:N" (N
    /// significant digits, whole numbers never rounded).
    format: String,
    /// "median" (the default) or "range" (lowest–highest, one value when both read the same).
    #[serde(default)]
    agg: Option<String>,
    /// Appended to every value, e.g. " ms".
    #[serde(default)]
    unit: String,
    /// Only lines whose fields equal these count, e.g. {"prewarm": true}.
    #[serde(default, rename = "where")]
    filter: Map<String, Value>,
    /// Shown where no line counts (default "–").
    #[serde(default)]
    missing: Option<String>,
}

/// Which columns the plot draws and how its axis reads.
#[derive(Deserialize)]
pub struct Plot {
    /// The plot's caption.
    pub title: String,
    /// Headers of the columns drawn, one colour each.
    pub columns: Vec<String>,
    /// The y axis' description.
    pub y: String,
}

/// A table made: its Markdown and, for a plot, per row its key text and the plotted columns'
/// medians (None where a column has no value).
pub struct Made {
    pub markdown: String,
    pub rows: Vec<(String, Vec<Option<f64>>)>,
}

type Line = Map<String, Value>;

/// The text of a field as a template shows it: strings bare, numbers and booleans as JSON
/// writes them.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
        _ => None,
    }
}

/// `x` in `format` (see [`Column::format`]).
pub fn format_value(x: f64, format: &str) -> anyhow::Result<String> {
    let (kind, n) = format.split_once(':').unwrap_or((format, ""));
    let n: usize = n.parse().map_err(|_| anyhow::anyhow!("format {format:?}: give fixed:N, sci:N or sig:N"))?;
    Ok(match kind {
        "fixed" => format!("{x:.n$}"),
        "sci" => format!("{x:.n$e}"),
        "sig" => {
            let digits = if x == 0.0 { 1 } else { x.abs().log10().floor() as i64 + 1 };
            let decimals = (n as i64 - digits).max(0) as usize;
            format!("{x:.decimals$}")
        }
        _ => bail!("format {format:?}: give fixed:N, sci:N or sig:N"),
    })
}

impl Table {
    fn read(&self, base: &Path, cache: &mut BTreeMap<String, Vec<Line>>, set: &str) -> anyhow::Result<Vec<Line>> {
        let Some(files) = self.runs.get(set) else {
            bail!("table {}: no run set {set:?} (sets: {:?})", self.id, self.runs.keys().collect::<Vec<_>>())
        };
        let mut out = Vec::new();
        for f in files {
            if !cache.contains_key(f) {
                let path = base.join(f);
                let body = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                let mut lines = Vec::new();
                for (i, l) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    let v: Line =
                        serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))?;
                    lines.push(v);
                }
                cache.insert(f.clone(), lines);
            }
            out.extend(cache[f].iter().cloned());
        }
        Ok(out)
    }

    /// The line's key: each key column's filled-in template (None if it lacks a field).
    fn key(&self, line: &Line) -> Option<Vec<String>> {
        self.key.iter().map(|c| fill(&c.value, |f| line.get(f).and_then(text)).ok()).collect()
    }

    /// A column's cell: its aggregate of `v` with the unit, or the column's mark for none.
    fn cell(&self, c: &Column, v: &[f64]) -> anyhow::Result<String> {
        if v.is_empty() {
            return Ok(c.missing.clone().unwrap_or_else(|| "–".into()));
        }
        let f = |x: f64| format_value(x, &c.format).with_context(|| format!("table {}", self.id));
        let shown = match c.agg.as_deref().unwrap_or("median") {
            "median" => f(median(v))?,
            "range" => {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let (lo, hi) = (f(lo)?, f(hi)?);
                if lo == hi {
                    lo
                } else {
                    format!("{lo}–{hi}")
                }
            }
            other => bail!("table {}: column {:?}: agg {other:?}: give median or range", self.id, c.header),
        };
        Ok(format!("{shown}{}", c.unit))
    }

    /// Reads the runs (relative to `base`) and makes the table.
    pub fn make(&self, base: &Path) -> anyhow::Result<Made> {
        if self.key.is_empty() || self.columns.is_empty() {
            bail!("table {}: give at least one key column and one value column", self.id);
        }
        let mut cache = BTreeMap::new();
        let mut sets = Vec::new();
        for c in &self.columns {
            sets.push(self.read(base, &mut cache, &c.runs)?);
        }
        let mut keys: Vec<Vec<String>> = Vec::new();
        for line in sets.iter().flatten() {
            if let Some(k) = self.key(line) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        // per column, per key: the values of the lines that count
        let mut cells: Vec<Vec<Vec<f64>>> = Vec::new();
        for (c, lines) in self.columns.iter().zip(&sets) {
            let mut by_key = vec![Vec::new(); keys.len()];
            let mut has_field = false;
            for line in lines {
                let Some(x) = line.get(&c.field).and_then(Value::as_f64) else { continue };
                has_field = true;
                if c.filter.iter().any(|(f, want)| line.get(f) != Some(want)) {
                    continue;
                }
                if let Some(at) = self.key(line).and_then(|k| keys.iter().position(|x| *x == k)) {
                    by_key[at].push(x);
                }
            }
            if !has_field {
                bail!(
                    "table {}: column {:?}: no line of the runs {:?} has the field {:?}",
                    self.id,
                    c.header,
                    c.runs,
                    c.field
                );
            }
            cells.push(by_key);
        }
        let mut s = String::new();
        let headers = self.key.iter().map(|c| &c.header).chain(self.columns.iter().map(|c| &c.header));
        let _ = writeln!(
            s,
            "|{}",
            headers.map(|h| if h.is_empty() { " |".into() } else { format!(" {h} |") }).collect::<String>()
        );
        let _ = writeln!(s, "|{}{}", "---|".repeat(self.key.len()), "---:|".repeat(self.columns.len()));
        for (r, k) in keys.iter().enumerate() {
            let mut row: Vec<String> =
                k.iter().zip(&self.key).map(|(v, c)| c.names.get(v).cloned().unwrap_or_else(|| v.clone())).collect();
            for (c, col) in self.columns.iter().zip(&cells) {
                row.push(self.cell(c, &col[r])?);
            }
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        let mut rows = Vec::new();
        if let Some(p) = &self.plot {
            let mut at = Vec::new();
            for h in &p.columns {
                let Some(i) = self.columns.iter().position(|c| &c.header == h) else {
                    bail!("table {}: the plot draws {h:?}, which is not a column's header", self.id)
                };
                at.push(i);
            }
            for (r, k) in keys.iter().enumerate() {
                let vals = at.iter().map(|&i| (!cells[i][r].is_empty()).then(|| median(&cells[i][r]))).collect();
                rows.push((k.join(" "), vals));
            }
        }
        Ok(Made { markdown: s, rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(json: &str) -> Table {
        serde_json::from_str(json).unwrap()
    }

    fn dir(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gemmbridge-report-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for (f, body) in files {
            std::fs::write(d.join(f), body).unwrap();
        }
        d
    }

    #[test]
    fn formats() {
        assert_eq!(format_value(618.7, "fixed:0").unwrap(), "619");
        assert_eq!(format_value(2.029e-7, "sci:1").unwrap(), "2.0e-7");
        assert_eq!(format_value(1e-5, "sci:0").unwrap(), "1e-5");
        assert_eq!(format_value(79.2, "sig:2").unwrap(), "79");
        assert_eq!(format_value(324.2, "sig:2").unwrap(), "324");
        assert_eq!(format_value(0.199547, "sig:2").unwrap(), "0.20");
        assert_eq!(format_value(0.0123, "sig:2").unwrap(), "0.012");
        assert!(format_value(1.0, "round:2").is_err());
        assert!(format_value(1.0, "fixed").is_err());
    }

    #[test]
    fn medians_per_key_a_dash_where_a_set_lacks_the_row_and_rows_in_first_seen_order() {
        let d = dir(
            "fields",
            &[
                ("a.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":1.0}\n{\"m\":1,\"dtype\":\"f32\",\"x\":5.0}\n"),
                ("b.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":3.0}\n"),
                ("c.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":10.0}\n{\"op\":\"env\"}\n"),
                ("z.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":0.25}\n"),
            ],
        );
        let t = table(
            r#"{"id":"t","runs":{"three":["a.jsonl","b.jsonl","c.jsonl"],"other":["z.jsonl"]},
                "key":[{"header":"m","value":"{m}×{m}"},{"header":"dtype","value":"{dtype}"}],
                "columns":[{"header":"x","runs":"three","field":"x","format":"fixed:2"},
                           {"header":"x, other","runs":"other","field":"x","format":"fixed:3"}],
                "plot":{"title":"p","columns":["x, other"],"y":"x"}}"#,
        );
        let made = t.make(&d).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(
            made.markdown,
            "| m | dtype | x | x, other |\n|---|---|---:|---:|\n| 2×2 | f16 | 3.00 | 0.250 |\n| 1×1 | f32 | 5.00 | – |\n"
        );
        assert_eq!(made.rows, vec![("2×2 f16".to_string(), vec![Some(0.25)]), ("1×1 f32".to_string(), vec![None])]);
    }

    #[test]
    fn ranges_filters_names_and_units() {
        let d = dir(
            "fields-range",
            &[(
                "f.jsonl",
                "{\"warm\":false,\"t\":79.2,\"w\":0.0002}\n{\"warm\":true,\"t\":0.44,\"w\":70.9}\n\
                 {\"warm\":false,\"t\":87.3,\"w\":0.0002}\n{\"warm\":true,\"t\":0.48,\"w\":78.0}\n",
            )],
        );
        let t = table(
            r#"{"id":"t","runs":{"all":["f.jsonl"]},
                "key":[{"header":"","value":"{warm}","names":{"false":"cold","true":"warm"}}],
                "columns":[{"header":"warm-up","runs":"all","field":"w","format":"sig:2","agg":"range","unit":" ms",
                            "where":{"warm":true},"missing":"—"},
                           {"header":"first","runs":"all","field":"t","format":"sig:2","agg":"range","unit":" ms"}]}"#,
        );
        let made = t.make(&d).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(
            made.markdown,
            "| | warm-up | first |\n|---|---:|---:|\n| cold | — | 79–87 ms |\n| warm | 71–78 ms | 0.44–0.48 ms |\n"
        );
    }

    #[test]
    fn a_field_no_line_has_is_an_error() {
        let d = dir("fields-typo", &[("f.jsonl", "{\"m\":1,\"x\":1.0}\n")]);
        let t = table(
            r#"{"id":"t","runs":{"all":["f.jsonl"]},"key":[{"header":"m","value":"{m}"}],
                "columns":[{"header":"x","runs":"all","field":"x_ms","format":"fixed:1"}]}"#,
        );
        let e = t.make(&d).err().unwrap().to_string();
        let _ = std::fs::remove_dir_all(&d);
        assert!(e.contains("has the field \"x_ms\""), "{e}");
    }
}
