//! A manifest table of fields: any JSON-lines runs (e.g. `gemmbridge-burn bench`, `gemmbridge
//! firstcall`, a probe's table written as JSON lines, the rows of `gemmbridge bench` and its
//! peers), one Markdown row per key, one column per field, each cell the median (or the range)
//! of that field over the lines of the row's key in the column's runs; or, for a column with
//! `over`, the median over paired runs of a ratio of two lines' fields ([`Over`]).

mod cells;

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::fill;
use crate::compare::median;

pub use cells::Sets;

/// One table of the manifest.
#[derive(Deserialize)]
pub struct Table {
    /// The table's name in messages and headlines (no `.` in it), and the plot's file stem,
    /// `<id>.svg`.
    pub id: String,
    /// Named sets of runs (JSON-lines files relative to the manifest, each of one run or of
    /// several packed, [`crate::runs`]), used by the columns.
    pub runs: BTreeMap<String, Vec<String>>,
    /// Only lines that meet this count at all, in keys and cells (as [`Column::filter`]), e.g.
    /// {"op": ["rope", "swiglu"]}.
    #[serde(default, rename = "where")]
    filter: Map<String, Value>,
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
    /// The field shown (a number); `a.b` is field `b` of the object in field `a` (e.g.
    /// `backends.eager`).
    field: String,
    /// "fixed:N" (N decimals), "sci:N" (N decimals of a power of ten, 2.0e-7), "sig:N" (N
    /// significant digits, whole numbers never rounded) or "pct:N" (× 100, N decimals).
    format: String,
    /// "median" (the default) or "range" (lowest–highest, one value when both read the same).
    #[serde(default)]
    agg: Option<String>,
    /// Appended to every value, e.g. " ms".
    #[serde(default)]
    unit: String,
    /// Only lines whose fields equal these count, e.g. {"prewarm": true}; an array is a choice,
    /// {"layout": ["d4096", "d4096+compile"]}.
    #[serde(default, rename = "where")]
    filter: Map<String, Value>,
    /// A ratio column: the field of the column's line over that of this line (see [`Over`]).
    #[serde(default)]
    over: Option<Over>,
    /// Shown where no line counts (default "–").
    #[serde(default)]
    missing: Option<String>,
}

/// The denominator of a ratio column: in each pair of runs (the i-th run of the column's set and
/// the i-th of this set; both sets hold as many runs), the column's line of the row's key over
/// this line of the same key, e.g. PyTorch's `median_ms` over gemmbridge's. The cell is the
/// median of the pairs' ratios, "–" unless every pair has both lines; a run with two lines of
/// one key (after the filters) is an error.
#[derive(Deserialize)]
struct Over {
    /// The name of a set in `runs`.
    runs: String,
    /// The field (a number, `a.b` as in [`Column::field`]).
    field: String,
    /// Only lines whose fields equal these count (as [`Column::filter`]).
    #[serde(default, rename = "where")]
    filter: Map<String, Value>,
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

/// A table made: its Markdown; per row its key as shown, joined by spaces; per column, per row the cell's value (the
/// median; None where the cell has none).
pub struct Made {
    pub markdown: String,
    keys: Vec<String>,
    values: Vec<Vec<Option<f64>>>,
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

/// The field `path` of `line`: `a.b` is field `b` of the object in field `a`.
fn lookup<'l>(line: &'l Line, path: &str) -> Option<&'l Value> {
    let mut parts = path.split('.');
    let mut v = line.get(parts.next()?)?;
    for p in parts {
        v = v.get(p)?;
    }
    Some(v)
}

/// Whether `line` meets `filter`: each named field equals the value, or one of an array's.
fn meets(filter: &Map<String, Value>, line: &Line) -> bool {
    filter.iter().all(|(f, want)| match (want, lookup(line, f)) {
        (Value::Array(choice), Some(got)) => choice.contains(got),
        (want, got) => got == Some(want),
    })
}

/// `x` in `format` (see [`Column::format`]).
pub fn format_value(x: f64, format: &str) -> anyhow::Result<String> {
    let wrong = || anyhow::anyhow!("format {format:?}: give fixed:N, sci:N, sig:N or pct:N");
    let (kind, n) = format.split_once(':').unwrap_or((format, ""));
    let n: usize = n.parse().map_err(|_| wrong())?;
    Ok(match kind {
        "fixed" => format!("{x:.n$}"),
        "sci" => format!("{x:.n$e}"),
        "sig" => {
            let digits = if x == 0.0 { 1 } else { x.abs().log10().floor() as i64 + 1 };
            let decimals = (n as i64 - digits).max(0) as usize;
            format!("{x:.decimals$}")
        }
        "pct" => format!("{:.n$}", x * 100.0),
        _ => return Err(wrong()),
    })
}

/// The lowest and the highest of `v`, each in `format`, as "a–b", one value when both read the
/// same.
fn range(v: &[f64], format: &str) -> anyhow::Result<String> {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = (format_value(lo, format)?, format_value(hi, format)?);
    Ok(if lo == hi { lo } else { format!("{lo}–{hi}") })
}

impl Table {
    /// The line's key: each key column's filled-in template (None if it lacks a field).
    fn key(&self, line: &Line) -> Option<Vec<String>> {
        self.key.iter().map(|c| fill(&c.value, |f| lookup(line, f).and_then(text)).ok()).collect()
    }

    /// A column's cell: its aggregate of `v` with the unit, or the column's mark for none.
    fn cell(&self, c: &Column, v: &[f64]) -> anyhow::Result<String> {
        if v.is_empty() {
            return Ok(c.missing.clone().unwrap_or_else(|| "–".into()));
        }
        let shown = match c.agg.as_deref().unwrap_or("median") {
            "median" => format_value(median(v), &c.format),
            "range" => range(v, &c.format),
            other => bail!("table {}: column {:?}: agg {other:?}: give median or range", self.id, c.header),
        };
        Ok(format!("{}{}", shown.with_context(|| format!("table {}", self.id))?, c.unit))
    }

    /// Reads the runs (through `sets`, files relative to its base) and makes the table.
    ///
    /// # Errors
    /// No key or value column, a file that cannot be read, a column whose field no line of its
    /// runs has or that has no value in any row, ratio columns' sets of different run counts,
    /// two lines of one key in one run of a ratio column, a bad format or aggregate, a plot of a
    /// header no column has.
    pub fn make(&self, sets: &mut Sets) -> anyhow::Result<Made> {
        if self.key.is_empty() || self.columns.is_empty() {
            bail!("table {}: give at least one key column and one value column", self.id);
        }
        let mut keys: Vec<Vec<String>> = Vec::new();
        for c in &self.columns {
            for line in sets.lines(self, &c.runs)? {
                if let Some(k) = self.key(line).filter(|_| meets(&self.filter, line)) {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
        }
        // per column, per key: the values that count (lines' fields, or pairs' ratios)
        let mut cells: Vec<Vec<Vec<f64>>> = Vec::new();
        for c in &self.columns {
            let by_key = match &c.over {
                None => sets.values(self, c, &keys)?,
                Some(over) => sets.ratios(self, (c, over), &keys)?,
            };
            if by_key.iter().all(Vec::is_empty) {
                let why = "do its runs and filters match; for a ratio, in every pair?";
                bail!("table {}: column {:?}: no row has a value ({why})", self.id, c.header);
            }
            cells.push(by_key);
        }
        let markdown = self.markdown(&keys, &cells)?;
        let values = cells.iter().map(|col| col.iter().map(|v| (!v.is_empty()).then(|| median(v))).collect()).collect();
        let made = Made { markdown, keys: keys.iter().map(|k| self.shown(k).join(" ")).collect(), values };
        self.plot_rows(&made)?; // a plot of a column the table lacks is an error, drawn or not
        Ok(made)
    }

    /// A key as its row shows it: each value, or its name in [`KeyColumn::names`].
    fn shown(&self, key: &[String]) -> Vec<String> {
        key.iter().zip(&self.key).map(|(v, c)| c.names.get(v).cloned().unwrap_or_else(|| v.clone())).collect()
    }

    /// The Markdown table of `keys` and `cells` (per column, per key).
    fn markdown(&self, keys: &[Vec<String>], cells: &[Vec<Vec<f64>>]) -> anyhow::Result<String> {
        let mut s = String::new();
        let headers = self.key.iter().map(|c| &c.header).chain(self.columns.iter().map(|c| &c.header));
        let _ = writeln!(
            s,
            "|{}",
            headers.map(|h| if h.is_empty() { " |".into() } else { format!(" {h} |") }).collect::<String>()
        );
        let _ = writeln!(s, "|{}{}", "---|".repeat(self.key.len()), "---:|".repeat(self.columns.len()));
        for (r, k) in keys.iter().enumerate() {
            let mut row = self.shown(k);
            for (c, col) in self.columns.iter().zip(cells) {
                row.push(self.cell(c, &col[r])?);
            }
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        Ok(s)
    }

    /// For the plot: per row its key text and the plotted columns' values.
    pub fn plot_rows(&self, made: &Made) -> anyhow::Result<Vec<(String, Vec<Option<f64>>)>> {
        let Some(p) = &self.plot else { return Ok(Vec::new()) };
        let mut at = Vec::new();
        for h in &p.columns {
            let Some(i) = self.columns.iter().position(|c| &c.header == h) else {
                bail!("table {}: the plot draws {h:?}, which is not a column's header", self.id)
            };
            at.push(i);
        }
        Ok(made
            .keys
            .iter()
            .enumerate()
            .map(|(r, k)| (k.clone(), at.iter().map(|&i| made.values[i][r]).collect()))
            .collect())
    }

    /// A named number of the table for a headline: over the rows' values (the cells' medians)
    /// of the columns a `|`-separated list of headers names, `lowest:H`, `highest:H`, `range:H`
    /// (lowest–highest, one value where both read the same) or `mean:H` (their geometric
    /// mean), in the first column's format, e.g. `range:× eager|× torch.compile`. None for an
    /// unknown kind or header.
    pub fn stat(&self, made: &Made, name: &str) -> Option<String> {
        let (kind, headers) = name.split_once(':')?;
        let mut v = Vec::new();
        let mut format = None;
        for h in headers.split('|') {
            let i = self.columns.iter().position(|c| c.header == h)?;
            format.get_or_insert(self.columns[i].format.as_str());
            v.extend(made.values[i].iter().flatten());
        }
        let format = format?;
        if v.is_empty() {
            return None;
        }
        match kind {
            "lowest" => format_value(v.iter().copied().fold(f64::INFINITY, f64::min), format).ok(),
            "highest" => format_value(v.iter().copied().fold(f64::NEG_INFINITY, f64::max), format).ok(),
            "range" => range(&v, format).ok(),
            "mean" => format_value(crate::bench::report::geomean(&v)?, format).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
