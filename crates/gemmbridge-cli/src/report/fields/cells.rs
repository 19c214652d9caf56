//! The values of a fields table's cells: the runs of its sets read once, the plain columns'
//! fields and the ratio columns' per-pair ratios, per key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use super::{lookup, meets, Column, Line, Over, Table};

/// The runs of the files tables read, each file read once: files relative to a base folder (the
/// manifest's), each of one run or of several packed ([`crate::runs`]).
pub struct Sets {
    base: PathBuf,
    files: BTreeMap<String, Vec<Vec<Line>>>,
}

/// Which lines of a run count for one side of a cell, and the field they give.
struct Side<'a> {
    set: &'a str,
    field: &'a str,
    filter: &'a Map<String, Value>,
}

impl Sets {
    /// No file read yet; files are relative to `base`.
    pub fn new(base: &Path) -> Sets {
        Sets { base: base.to_path_buf(), files: BTreeMap::new() }
    }

    /// Reads the files of `t`'s set `set` not read yet.
    fn load(&mut self, t: &Table, set: &str) -> anyhow::Result<()> {
        let Some(files) = t.runs.get(set) else {
            bail!("table {}: no run set {set:?} (sets: {:?})", t.id, t.runs.keys().collect::<Vec<_>>())
        };
        let new: Vec<&String> = files.iter().filter(|f| !self.files.contains_key(*f)).collect();
        for f in new {
            let path = self.base.join(f);
            let body = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let mut runs = Vec::new();
            for run in crate::runs::split(&body).with_context(|| path.display().to_string())? {
                let mut lines = Vec::new();
                for (n, l) in run.lines {
                    let v: Line = serde_json::from_str(l).with_context(|| format!("{} line {n}", path.display()))?;
                    lines.push(v);
                }
                runs.push(lines);
            }
            self.files.insert(f.clone(), runs);
        }
        Ok(())
    }

    /// The runs of `t`'s set `set` (loaded), its files' in order.
    fn runs(&self, t: &Table, set: &str) -> Vec<&Vec<Line>> {
        t.runs.get(set).map_or_else(Vec::new, |files| files.iter().flat_map(|f| self.files[f].iter()).collect())
    }

    /// Every line of `t`'s set `set`.
    pub(super) fn lines(&mut self, t: &Table, set: &str) -> anyhow::Result<Vec<&Line>> {
        self.load(t, set)?;
        Ok(self.runs(t, set).into_iter().flatten().collect())
    }

    /// A plain column's values per key: the field of every line of the key that counts.
    ///
    /// # Errors
    /// A file that cannot be read, or no line of the column's runs with its field.
    pub(super) fn values(&mut self, t: &Table, c: &Column, keys: &[Vec<String>]) -> anyhow::Result<Vec<Vec<f64>>> {
        let mut by_key = vec![Vec::new(); keys.len()];
        let mut has_field = false;
        for line in self.lines(t, &c.runs)? {
            let Some(x) = lookup(line, &c.field).and_then(Value::as_f64) else { continue };
            has_field = true;
            if !(meets(&t.filter, line) && meets(&c.filter, line)) {
                continue;
            }
            if let Some(at) = t.key(line).and_then(|k| keys.iter().position(|x| *x == k)) {
                by_key[at].push(x);
            }
        }
        if !has_field {
            bail!(
                "table {}: column {:?}: no line of the runs {:?} has the field {:?}",
                t.id,
                c.header,
                c.runs,
                c.field
            );
        }
        Ok(by_key)
    }

    /// A ratio column's values per key: per pair of runs, the column's line over `over`'s (see
    /// [`Over`]); none for a key some pair lacks.
    ///
    /// # Errors
    /// A file that cannot be read, sets of different run counts, a side's field on no line, or
    /// a run with two lines of one key.
    pub(super) fn ratios(
        &mut self,
        t: &Table,
        (c, over): (&Column, &Over),
        keys: &[Vec<String>],
    ) -> anyhow::Result<Vec<Vec<f64>>> {
        let top = Side { set: &c.runs, field: &c.field, filter: &c.filter };
        let bottom = Side { set: &over.runs, field: &over.field, filter: &over.filter };
        self.load(t, top.set)?;
        self.load(t, bottom.set)?;
        let (a, b) = (self.runs(t, top.set), self.runs(t, bottom.set));
        let what = || format!("table {}: column {:?}", t.id, c.header);
        if a.len() != b.len() {
            bail!(
                "{}: the set {:?} holds {} runs and {:?} {}: give as many, paired in order",
                what(),
                top.set,
                a.len(),
                bottom.set,
                b.len()
            );
        }
        for (side, runs) in [(&top, &a), (&bottom, &b)] {
            if !runs.iter().flat_map(|r| r.iter()).any(|l| lookup(l, side.field).and_then(Value::as_f64).is_some()) {
                bail!("{}: no line of the runs {:?} has the field {:?}", what(), side.set, side.field);
            }
        }
        let mut by_key = vec![Vec::new(); keys.len()];
        for (i, (ra, rb)) in a.iter().zip(&b).enumerate() {
            let x = one_per_key(t, ra, &top, keys)
                .with_context(|| format!("{}: run {} of {:?}", what(), i + 1, top.set))?;
            let y = one_per_key(t, rb, &bottom, keys)
                .with_context(|| format!("{}: run {} of {:?}", what(), i + 1, bottom.set))?;
            for (r, (x, y)) in x.into_iter().zip(y).enumerate() {
                if let (Some(x), Some(y)) = (x, y.filter(|&y| y > 0.0)) {
                    by_key[r].push(x / y);
                }
            }
        }
        for v in &mut by_key {
            if v.len() != a.len() {
                v.clear();
            }
        }
        Ok(by_key)
    }
}

/// Per key, the field of the one line of `run` that counts for `side` (None where none does).
///
/// # Errors
/// Two lines of one key count.
fn one_per_key(t: &Table, run: &[Line], side: &Side, keys: &[Vec<String>]) -> anyhow::Result<Vec<Option<f64>>> {
    let mut out = vec![None; keys.len()];
    for line in run.iter().filter(|l| meets(&t.filter, l) && meets(side.filter, l)) {
        let Some(x) = lookup(line, side.field).and_then(Value::as_f64) else { continue };
        let Some(at) = t.key(line).and_then(|k| keys.iter().position(|x| *x == k)) else { continue };
        if out[at].replace(x).is_some() {
            bail!("two lines of the row {:?} count (narrow the column's \"where\")", keys[at].join(" "));
        }
    }
    Ok(out)
}
