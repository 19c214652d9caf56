//! Files of benchmark runs: one run per file, as `gemmbridge bench --out` and the PyTorch peers
//! write them, or several runs of one side packed into one file, each line tagged with its run
//! (`{"run": 2, "op": "matmul", …}`; `tools/pack-runs` writes such a file). `compare` and
//! `report` read both; a packed file counts as its runs, in the order they first appear.
//!
//! Packing is lossless: removing the `"run"` field from a packed file's lines of one run gives
//! back that run's file.

use std::collections::BTreeMap;

use anyhow::bail;

/// One run of a file: its name (the `run` field as written, `""` for an unpacked file) and its
/// lines, each with its line number in the file (1-based).
#[derive(Debug, PartialEq)]
pub struct Run<'a> {
    pub name: String,
    pub lines: Vec<(usize, &'a str)>,
}

/// The runs of a JSON-lines text (blank lines skipped): one run when no line has a `run`
/// field, else one per distinct value, in the order of first appearance.
///
/// # Errors
/// A line that is not JSON, a `run` that is neither a number nor a string, or a packed file
/// with a line that names no run (each names the line).
pub fn split(text: &str) -> anyhow::Result<Vec<Run<'_>>> {
    let mut runs: Vec<Run> = Vec::new();
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    let mut untagged: Option<usize> = None;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("line {}: {e}", i + 1))?;
        let name = match v.get("run") {
            None => {
                untagged.get_or_insert(i + 1);
                String::new()
            }
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => bail!("line {}: run {other} is neither a number nor a name", i + 1),
        };
        let slot = *at.entry(name.clone()).or_insert_with(|| {
            runs.push(Run { name, lines: Vec::new() });
            runs.len() - 1
        });
        runs[slot].lines.push((i + 1, line));
    }
    if let (Some(line), true) = (untagged, runs.len() > 1) {
        bail!("line {line} names no run, while other lines of the file do: tag every line of a packed file");
    }
    if runs.is_empty() {
        runs.push(Run { name: String::new(), lines: Vec::new() });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_file_is_one_run_and_a_packed_one_its_runs_in_order() {
        let plain = "{\"op\":\"env\"}\n\n{\"op\":\"matmul\"}\n";
        let runs = split(plain).unwrap();
        assert_eq!(
            runs,
            vec![Run { name: String::new(), lines: vec![(1, "{\"op\":\"env\"}"), (3, "{\"op\":\"matmul\"}")] }]
        );
        let packed = "{\"run\":2,\"op\":\"env\"}\n{\"run\":1,\"op\":\"env\"}\n{\"run\":2,\"op\":\"matmul\"}\n";
        let runs = split(packed).unwrap();
        let got: Vec<(&str, Vec<usize>)> =
            runs.iter().map(|r| (r.name.as_str(), r.lines.iter().map(|l| l.0).collect())).collect();
        assert_eq!(got, vec![("2", vec![1, 3]), ("1", vec![2])]);
        let named = split("{\"run\": \"plain-llm\", \"m\": 1}\n").unwrap();
        assert_eq!(named[0].name, "plain-llm");
        assert_eq!(split("").unwrap().len(), 1, "an empty file is one empty run");
    }

    #[test]
    fn a_packed_file_with_an_untagged_line_or_an_odd_run_is_refused() {
        let e = split("{\"run\":1,\"op\":\"env\"}\n{\"op\":\"matmul\"}\n{\"run\":2}\n").unwrap_err().to_string();
        assert!(e.contains("line 2 names no run"), "{e}");
        let e = split("{\"run\":[1]}\n").unwrap_err().to_string();
        assert!(e.contains("line 1: run [1] is neither"), "{e}");
        assert!(split("{\"run\":1\n").unwrap_err().to_string().starts_with("line 1:"));
    }
}
