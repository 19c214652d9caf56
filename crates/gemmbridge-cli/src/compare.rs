//! `gemmbridge compare`: several alternated benchmark runs against bench/peer.py, summarised
//! row by row.
//!
//! One run of a large row differs by 3–8 % from the next run of the same side on the H200
//! (docs/DESIGN.md, Design rationale), more than the 3 % margin of a "no row below 0.97" bound, so a
//! single pair of runs cannot settle such a bound either way. Given N pairs (ours i, peer i),
//! taken alternately on one machine, this prints for every row present in all pairs the
//! ratio peer time / our time of each pair and their median (the row's estimate), and per
//! dtype and op over the square + llm suites: the geometric mean of the row medians, the rows
//! whose median is below the bound, and each pair's own geometric mean and count below the
//! bound (what a single run would have said).

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::{bail, Context};

use crate::bench::report::{read_runs, Envs};
use crate::row::Row;
use crate::suites::is_square_or_llm;

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated JSON-lines files written by `gemmbridge bench --out`, one per run.
    #[arg(long)]
    ours: String,
    /// Comma-separated bench/peer.py JSON-lines files, as many as `--ours`: the i-th is paired
    /// with the i-th of `--ours` (take them alternately, on one warm machine).
    #[arg(long)]
    peer: String,
    /// A row whose median ratio is below this is listed.
    #[arg(long, default_value_t = 0.97, allow_negative_numbers = true)]
    bound: f64,
}

/// (dtype, op, m, n, k, batch)
pub type Key = (String, String, usize, usize, usize, usize);

/// The rows of one (dtype, op): each row's key and its ratio per pair.
type Group<'a> = Vec<(&'a Key, &'a Vec<f64>)>;

fn key(r: &Row) -> Key {
    (r.dtype.clone(), r.label(), r.m, r.n, r.k, r.batch)
}

/// The group a row is summarised in: its dtype and its op, convolution rows also by batch
/// size N (`conv_fwd/nhwc/n32`), attention rows by kind: `attn_fwd gpu-bound` (full batches of
/// s ≥ 2048), `attn_fwd varlen` (per-sequence lengths; the peer's row is its padded
/// equivalent), `attn_fwd vs varlen_attn` (the same rows against the peer's packed
/// variable-length kernel), `attn_fwd host-bound` (the rest: shorter sequences, decoding);
/// grouped GEMM rows by routing (`grouped equal`, `grouped skewed`, and `grouped vs matmul
/// loop` against the peer's per-expert loop).
pub fn group(k: &Key) -> (String, String) {
    let op = if k.1.starts_with("conv") {
        format!("{}/n{}", k.1, k.5)
    } else if let Some(rest) = k.1.strip_prefix("attn") {
        let (op, label) = rest.split_once('/').unwrap_or((rest, ""));
        let kind = if label.ends_with("+varlen_attn") {
            "vs varlen_attn"
        } else if label.contains("varlen") {
            "varlen"
        } else if k.2 >= 2048 && k.3 >= 2048 {
            "gpu-bound"
        } else {
            "host-bound"
        };
        format!("attn{op} {kind}")
    } else if let Some((
        op @ ("grouped" | "grouped_dx" | "grouped_dw" | "grouped_fp8" | "grouped_fp8_dx" | "grouped_fp8_dw"),
        rest,
    )) = k.1.split_once('/')
    {
        let kind = if rest.ends_with("+loop") {
            "vs matmul loop"
        } else if rest.contains("zipf") {
            "skewed"
        } else {
            "equal"
        };
        format!("{op} {kind}")
    } else {
        k.1.clone()
    };
    (k.0.clone(), op)
}

/// Median of a non-empty list (the mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let h = s.len() / 2;
    if s.len() % 2 == 1 {
        s[h]
    } else {
        (s[h - 1] + s[h]) / 2.0
    }
}

fn geomean(v: &[f64]) -> f64 {
    crate::bench::report::geomean(v).unwrap_or(f64::NAN)
}

/// The peers' other ways of running one of our rows: `bench/attn_peer.py`'s packed
/// variable-length kernel, `bench/grouped_peer.py`'s per-expert loop, `bench/norm_peer.py`'s
/// `torch.compile`d RMSNorm, `bench/decode_peer.py`'s flash and memory-efficient SDPA backends,
/// `gemmbridge-candle bench --impl candle`'s attention with its scores kept in bf16.
const PEER_VARIANTS: [&str; 6] = ["varlen_attn", "loop", "compile", "flash", "efficient", "bf16_scores"];

/// Per row present in every pair: the ratio (peer median ms / our median ms) of each pair, in
/// pair order. A peer row whose label is one of ours followed by `+variant` (another way the
/// peer runs the same problem: `…+varlen_attn`, `…+loop`) is compared with that row of ours,
/// under its own label. Also returns how many rows some pair lacked (left out).
pub fn ratios(pairs: &[(Vec<Row>, Vec<Row>)]) -> (BTreeMap<Key, Vec<f64>>, usize) {
    let mut all: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    let mut seen: BTreeMap<Key, usize> = BTreeMap::new();
    for (ours, peer) in pairs {
        let mine: BTreeMap<Key, &Row> = ours.iter().map(|r| (key(r), r)).collect();
        for o in ours {
            *seen.entry(key(o)).or_default() += 1;
        }
        for p in peer {
            let k = key(p);
            // the same label first; a known variant's suffix only where there is none
            let variant = || {
                let (label, suffix) = k.1.rsplit_once('+')?;
                let base = (k.0.clone(), label.to_string(), k.2, k.3, k.4, k.5);
                PEER_VARIANTS.contains(&suffix).then(|| mine.get(&base)).flatten()
            };
            if let Some(o) = mine.get(&k) {
                all.entry(k).or_default().push(p.median_ms / o.median_ms);
            } else if let Some(o) = variant() {
                *seen.entry(k.clone()).or_default() += 1;
                all.entry(k).or_default().push(p.median_ms / o.median_ms);
            }
        }
    }
    let left_out = seen.keys().filter(|k| all.get(*k).map_or(0, Vec::len) != pairs.len()).count();
    all.retain(|_, v| v.len() == pairs.len());
    (all, left_out)
}

/// The report for `pairs` (ours, peer), `bound` as `--bound`.
pub fn summary(pairs: &[(Vec<Row>, Vec<Row>)], bound: f64) -> String {
    let (rows, left_out) = ratios(pairs);
    let mut s = String::new();
    let plural = if pairs.len() == 1 { "" } else { "s" };
    let _ = writeln!(s, "peer time / our time per row (> 1: gemmbridge faster), {} pair{plural}", pairs.len());
    let _ = writeln!(
        s,
        "{:<28} {:<5} {:>6} {:>6} {:>6} {:>8} {:>7}  per pair",
        "op", "dtype", "m", "n", "k", "median", "lowest"
    );
    for ((dtype, op, m, n, k, _), v) in &rows {
        let each: Vec<String> = v.iter().map(|r| format!("{r:.3}")).collect();
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let mark = if median(v) < bound { " ◂" } else { "" };
        let _ = writeln!(
            s,
            "{op:<28} {dtype:<5} {m:>6} {n:>6} {k:>6} {:>8.3} {min:>7.3}  {}{mark}",
            median(v),
            each.join(" ")
        );
    }
    if left_out > 0 {
        let _ = writeln!(s, "({left_out} rows left out: missing from at least one file)");
    }
    // per (dtype, op), square + llm rows only; convolution rows per op, layout and batch
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let grouped = |k: &Key| {
        k.1.starts_with("conv")
            || k.1.starts_with("attn")
            || k.1.starts_with("grouped")
            || k.1.starts_with("rmsnorm")
            || is_square_or_llm((k.2, k.3, k.4))
    };
    for (k, v) in rows.iter().filter(|(k, _)| grouped(k)) {
        groups.entry(group(k)).or_default().push((k, v));
    }
    let _ = writeln!(s, "\nsquare + llm (convolutions: per layout and batch N; attention: per kind), per dtype and op: geometric mean of the row medians; rows whose median < {bound}; each pair's own geometric mean / rows < {bound}");
    let _ = writeln!(s, "{:<5} {:<28} {:>4} {:>8} {:>7}  per pair", "dtype", "op", "rows", "geomean", "< bound");
    for ((dtype, op), members) in &groups {
        let medians: Vec<f64> = members.iter().map(|(_, v)| median(v)).collect();
        let below = medians.iter().filter(|&&m| m < bound).count();
        let per_pair: Vec<String> = (0..pairs.len())
            .map(|i| {
                let r: Vec<f64> = members.iter().map(|(_, v)| v[i]).collect();
                format!("{:.3}/{}", geomean(&r), r.iter().filter(|&&x| x < bound).count())
            })
            .collect();
        let _ = writeln!(
            s,
            "{dtype:<5} {op:<28} {:>4} {:>8.3} {below:>7}  {}",
            medians.len(),
            geomean(&medians),
            per_pair.join(" ")
        );
    }
    s
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let split = |flag: &str, s: &str| -> anyhow::Result<Vec<String>> {
        let files: Vec<String> = s.split(',').map(|x| x.trim().to_string()).collect();
        if files.iter().any(String::is_empty) {
            bail!("{flag} {s:?} has an empty entry: give comma-separated file names");
        }
        Ok(files)
    };
    let (ours, peer) = (split("--ours", &args.ours)?, split("--peer", &args.peer)?);
    if !(args.bound.is_finite() && args.bound > 0.0) {
        bail!("--bound {} is not a positive number", args.bound);
    }
    let pairs = load(&ours, &peer)?;
    let (rows, _) = ratios(&pairs);
    if rows.is_empty() {
        bail!("no row (op, dtype, m, n, k, batch) is present in every file: nothing to compare");
    }
    print!("{}", summary(&pairs, args.bound));
    Ok(0)
}

/// Reads alternated runs, the i-th run of `ours` paired with the i-th of `peer` (a file holds
/// one run, or several packed, [`crate::runs`]): every file once, every run with timed rows,
/// all from one device and with one idle gap before each row (their "env" rows' `device` and
/// `gap_ms`).
///
/// # Errors
/// A file named twice (under any spelling), unreadable, a run without timed rows, sides of
/// different run counts, runs of different devices, or runs timed with different gaps
/// (`--gap-ms`: a row timed after an idle GPU is not comparable with one timed right after
/// other work).
pub fn load(ours: &[String], peer: &[String]) -> anyhow::Result<Vec<(Vec<Row>, Vec<Row>)>> {
    // the same file under two spellings (./a and a, a link) counts as named twice
    let mut named = std::collections::BTreeMap::new();
    for f in ours.iter().chain(peer) {
        let key = std::fs::canonicalize(f).unwrap_or_else(|_| std::path::PathBuf::from(f));
        if let Some(first) = named.insert(key, f) {
            bail!("{f} is named twice (also as {first}): every run is its own file, on one side only");
        }
    }
    let (o, p) = (runs_of(ours)?, runs_of(peer)?);
    if o.len() != p.len() {
        bail!("--ours holds {} runs and --peer {}: give the same number, paired in order", o.len(), p.len());
    }
    // device name -> the runs that name it
    let mut devices: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // gap in ms (as text, exact) -> the runs timed with it
    let mut gaps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (run, names, rows) in o.iter().chain(&p) {
        if names.devices.is_empty() {
            eprintln!("warning: {run} has no \"env\" row: which device it ran on is unknown");
        }
        for d in &names.devices {
            devices.entry(d.clone()).or_default().push(run.clone());
        }
        // a run without an env row was timed without a gap as far as anyone can tell
        for g in if names.gaps_ms.is_empty() { vec![0.0] } else { names.gaps_ms.clone() } {
            gaps.entry(format!("{g}")).or_default().push(run.clone());
        }
        if rows.is_empty() {
            bail!("{run} has no timed rows");
        }
    }
    if devices.len() > 1 {
        let list: Vec<String> = devices.iter().map(|(d, runs)| format!("{d:?} in {}", runs.join(", "))).collect();
        bail!("the files name different devices ({}): the ratios would compare different machines", list.join("; "));
    }
    if gaps.len() > 1 {
        let list: Vec<String> = gaps.iter().map(|(g, runs)| format!("{g} ms in {}", runs.join(", "))).collect();
        bail!(
            "the files were timed with different idle gaps before each row ({}): run both sides with the same --gap-ms",
            list.join("; ")
        );
    }
    Ok(o.into_iter().zip(p).map(|((_, _, orows), (_, _, prows))| (orows, prows)).collect())
}

/// Every run of `files` in order, named by its file (and its run, for a packed file).
fn runs_of(files: &[String]) -> anyhow::Result<Vec<(String, Envs, Vec<Row>)>> {
    let mut out = Vec::new();
    for f in files {
        for (run, envs, rows) in read_runs(f).with_context(|| format!("reading {f}"))? {
            let name = if run.is_empty() { f.clone() } else { format!("{f} (run {run})") };
            out.push((name, envs, rows));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(dtype: &str, op: &str, m: usize, median_ms: f64) -> Row {
        crate::row::square_row(op, dtype, m, median_ms)
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn a_row_is_judged_by_its_median_over_pairs() {
        // 4096³ f16 linear: ratios 0.9, 1.1, 1.05 -> median 1.05; 2048³: 0.95, 0.96, 1.2 -> 0.96
        let ours = |a: f64, b: f64| vec![row("f16", "linear", 4096, a), row("f16", "linear", 2048, b)];
        let peer = |a: f64, b: f64| vec![row("f16", "linear", 4096, a), row("f16", "linear", 2048, b)];
        let pairs = vec![
            (ours(1.0, 1.0), peer(0.9, 0.95)),
            (ours(1.0, 1.0), peer(1.1, 0.96)),
            (ours(1.0, 1.0), peer(1.05, 1.2)),
        ];
        let s = summary(&pairs, 0.97);
        assert!(s.contains("   1.050   0.900  0.900 1.100 1.050\n"), "{s}");
        assert!(s.contains("   0.960   0.950  0.950 0.960 1.200 ◂\n"), "{s}");
        // geomean of medians sqrt(1.05·0.96) = 1.004; one row below; pair 1: sqrt(0.9·0.95) = 0.925, 2 below
        assert!(s.contains("f16   linear                          2    1.004       1  0.925/2 1.028/1 1.122/0"), "{s}");
    }

    #[test]
    fn attention_rows_are_grouped_by_kind() {
        let key = |label: &str, s_q: usize, s_kv: usize| ("bf16".to_string(), label.to_string(), s_q, s_kv, 128, 4);
        assert_eq!(group(&key("attn_fwd/h32-causal", 4096, 4096)).1, "attn_fwd gpu-bound");
        assert_eq!(group(&key("attn_fwd_bwd/h32", 1024, 1024)).1, "attn_fwd_bwd host-bound");
        assert_eq!(group(&key("attn_fwd/h32:8-decode", 1, 4096)).1, "attn_fwd host-bound");
        assert_eq!(group(&key("attn_fwd/h32-causal-varlen", 2738, 2738)).1, "attn_fwd varlen");
        let v = "attn_fwd/h32-causal-varlen+varlen_attn";
        assert_eq!(group(&key(v, 2738, 2738)).1, "attn_fwd vs varlen_attn");
        assert_eq!(group(&key("grouped/qwen3-zipf", 32768, 768)).1, "grouped skewed");
        assert_eq!(group(&key("grouped/dsv3+loop", 32768, 2048)).1, "grouped vs matmul loop");
        assert_eq!(group(&key("grouped_dw/mixtral", 32768, 14336)).1, "grouped_dw equal");
        assert_eq!(group(&key("grouped_fp8/qwen3-zipf/rowwise", 32768, 768)).1, "grouped_fp8 skewed");
    }

    #[test]
    fn a_peer_variant_row_is_compared_with_our_row_under_its_own_label() {
        let with = |op: &str, layout: &str, ms: f64| Row { layout: Some(layout.into()), ..row("bf16", op, 2048, ms) };
        let ours = vec![with("attn_fwd", "v", 1.0)];
        let peer = vec![with("attn_fwd", "v", 4.0), with("attn_fwd", "v+varlen_attn", 0.9)];
        let (rows, left_out) = ratios(&[(ours.clone(), peer.clone()), (ours, peer)]);
        let got: Vec<(String, f64)> = rows.iter().map(|(k, v)| (k.1.clone(), v[0])).collect();
        assert_eq!(got, [("attn_fwd/v".to_string(), 4.0), ("attn_fwd/v+varlen_attn".to_string(), 0.9)]);
        assert_eq!(left_out, 0);
        // a label that itself holds a '+' is matched as it is, not as a variant
        let exact = vec![with("attn_fwd", "v", 1.0), with("attn_fwd", "v+varlen_attn", 2.0)];
        let (rows, _) = ratios(&[(exact, vec![with("attn_fwd", "v+varlen_attn", 2.0), with("attn_fwd", "v+x", 1.0)])]);
        let got: Vec<(String, f64)> = rows.iter().map(|(k, v)| (k.1.clone(), v[0])).collect();
        assert_eq!(got, [("attn_fwd/v+varlen_attn".to_string(), 1.0)], "an unknown suffix is no variant");
        // a variant row missing from one pair is left out and counted
        let (rows, left_out) = ratios(&[
            (vec![with("attn_fwd", "v", 1.0)], vec![with("attn_fwd", "v+varlen_attn", 0.9)]),
            (vec![with("attn_fwd", "v", 1.0)], vec![]),
        ]);
        assert!(rows.is_empty());
        assert_eq!(left_out, 2);
    }

    /// bench/norm_peer.py's rows: F.rms_norm under our label, the torch.compile'd one as a
    /// `+compile` variant; both are summarised.
    #[test]
    fn rmsnorm_rows_and_the_compiled_peer_are_compared() {
        let with = |layout: &str, ms: f64| Row {
            layout: Some(layout.into()),
            k: 1,
            tflops: 0.0,
            tbps: Some(2.0),
            ..row("bf16", "rmsnorm", 8192, ms)
        };
        let pairs = [(vec![with("d4096", 1.0)], vec![with("d4096", 1.5), with("d4096+compile", 1.2)])];
        let (rows, left_out) = ratios(&pairs);
        let got: Vec<(String, f64)> = rows.iter().map(|(k, v)| (k.1.clone(), v[0])).collect();
        assert_eq!(got, [("rmsnorm/d4096".to_string(), 1.5), ("rmsnorm/d4096+compile".to_string(), 1.2)]);
        assert_eq!(left_out, 0);
        let text = summary(&pairs, 0.97);
        assert!(text.contains("rmsnorm/d4096+compile"), "{text}");
    }

    #[test]
    fn rows_missing_from_a_pair_are_left_out_and_counted() {
        let pairs = vec![
            (
                vec![row("bf16", "linear", 4096, 1.0), row("bf16", "linear", 2048, 1.0)],
                vec![row("bf16", "linear", 4096, 1.0)],
            ),
            (
                vec![row("bf16", "linear", 4096, 1.0)],
                vec![row("bf16", "linear", 4096, 1.0), row("bf16", "linear", 2048, 1.0)],
            ),
        ];
        let s = summary(&pairs, 0.97);
        assert!(s.contains("(1 rows left out"), "{s}");
        assert!(!s.contains("  2048 "), "{s}");
    }

    /// Files of one run each: an "env" row (device, gap) and one timed row.
    fn run_file(dir: &std::path::Path, name: &str, device: &str, gap: Option<f64>) -> String {
        let gap = gap.map_or(String::new(), |g| format!(", \"gap_ms\": {g}"));
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "{{\"op\": \"env\", \"device\": \"{device}\"{gap}}}\n\
                 {{\"op\": \"linear\", \"dtype\": \"f16\", \"m\": 4096, \"n\": 4096, \"k\": 4096, \"batch\": 1, \"median_ms\": 0.2, \"min_ms\": 0.19, \"tflops\": 687.2}}\n"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    }

    /// Three alternated pairs read from separate files and from packed ones (each line tagged
    /// with its run, as tools/pack-runs writes them) give the same pairs, also mixed.
    #[test]
    fn packed_runs_read_as_the_separate_files() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-compare-packed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |ms: f64| {
            format!(
                "{{\"op\":\"env\",\"device\":\"X\",\"gap_ms\":200.0}}\n\
                 {{\"op\":\"linear\",\"dtype\":\"f16\",\"m\":4096,\"n\":4096,\"k\":4096,\"batch\":1,\"median_ms\":{ms},\"min_ms\":0.1,\"tflops\":1.0}}\n"
            )
        };
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).unwrap();
            dir.join(name).to_str().unwrap().to_string()
        };
        let (ours, peer) = ([0.2, 0.21, 0.19], [0.2, 0.2, 0.2]);
        let o: Vec<String> = ours.iter().enumerate().map(|(i, ms)| write(&format!("o{i}"), &run(*ms))).collect();
        let p: Vec<String> = peer.iter().enumerate().map(|(i, ms)| write(&format!("p{i}"), &run(*ms))).collect();
        let pack = |times: &[f64]| -> String {
            let tag = |(i, ms): (usize, &f64)| {
                run(*ms).lines().map(|l| format!("{{\"run\":{},{}\n", i + 1, &l[1..])).collect::<String>()
            };
            times.iter().enumerate().map(tag).collect()
        };
        let (op, pp) = (write("ours.jsonl", &pack(&ours)), write("peer.jsonl", &pack(&peer)));
        let separate = summary(&load(&o, &p).unwrap(), 0.97);
        assert!(separate.contains("3 pairs"), "{separate}");
        assert_eq!(summary(&load(std::slice::from_ref(&op), std::slice::from_ref(&pp)).unwrap(), 0.97), separate);
        assert_eq!(summary(&load(std::slice::from_ref(&op), &p).unwrap(), 0.97), separate);
        let err = load(std::slice::from_ref(&op), &p[..2]).unwrap_err().to_string();
        assert!(err.contains("--ours holds 3 runs and --peer 2"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `gemmbridge-candle bench`'s runs, as it writes them: our side's rows carry `impl`,
    /// `rel_diff` and `served`, which are read past; candle's side has a `+bf16_scores` variant
    /// of its attention row and a failed row (`error`), which is skipped.
    #[test]
    fn candle_bench_rows_are_compared() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-compare-candle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = |side: &str| {
            format!(r#"{{"op":"env","backend":"{side}","device":"NVIDIA H100 80GB HBM3","reps":30,"gap_ms":200.0}}"#)
        };
        let sdpa = |layout: &str, ms: f64, extra: &str| {
            let dims = r#""op":"sdpa","dtype":"bf16","m":4096,"n":4096,"k":128,"batch":1"#;
            format!(r#"{{{dims},"median_ms":{ms},"min_ms":{ms},"tflops":100.0,"layout":"{layout}",{extra}}}"#)
        };
        let norm = r#""op":"rms_norm","dtype":"bf16","m":4096,"n":4096,"k":1,"batch":1"#;
        let ours = [
            env("gemmbridge-candle"),
            sdpa("h32:8-causal", 1.0, r#""impl":"ours","rel_diff":2.5e-3,"served":"Gemmbridge""#),
            format!(
                r#"{{{norm},"median_ms":0.02,"min_ms":0.02,"tflops":0.0,"layout":"d4096","tbps":3.3,"impl":"ours"}}"#
            ),
        ];
        let peer = [
            env("candle"),
            sdpa("h32:8-causal", 8.0, r#""impl":"candle""#),
            sdpa("h32:8-causal+bf16_scores", 4.0, r#""impl":"candle""#),
            format!(r#"{{{norm},"layout":"d4096","impl":"candle","error":"out of memory"}}"#),
        ];
        let (ours, peer) = (ours.join("\n"), peer.join("\n"));
        let (o, p) = (dir.join("ours.jsonl"), dir.join("candle.jsonl"));
        std::fs::write(&o, ours).unwrap();
        std::fs::write(&p, peer).unwrap();
        let pairs = load(&[o.to_str().unwrap().to_string()], &[p.to_str().unwrap().to_string()]).unwrap();
        let (rows, left_out) = ratios(&pairs);
        let got: Vec<(String, f64)> = rows.iter().map(|(k, v)| (k.1.clone(), v[0])).collect();
        assert_eq!(got, [("sdpa/h32:8-causal".to_string(), 8.0), ("sdpa/h32:8-causal+bf16_scores".to_string(), 4.0)]);
        assert_eq!(left_out, 1, "the rms_norm row the candle side failed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_of_other_devices_or_other_gaps_are_refused() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let h200 = "NVIDIA H200";
        // no gap field (files from before it) reads as 0 and pairs with an explicit 0
        let (o, p) = (run_file(&dir, "o0", h200, None), run_file(&dir, "p0", h200, Some(0.0)));
        assert_eq!(load(&[o], &[p]).unwrap().len(), 1);
        let (o, p) = (run_file(&dir, "o1", h200, Some(200.0)), run_file(&dir, "p1", h200, Some(200.0)));
        assert_eq!(load(&[o], &[p]).unwrap().len(), 1);
        let (o, p) = (run_file(&dir, "o2", h200, Some(200.0)), run_file(&dir, "p2", h200, None));
        let err = load(std::slice::from_ref(&o), std::slice::from_ref(&p)).unwrap_err().to_string();
        assert!(err.contains("different idle gaps") && err.contains("200 ms in") && err.contains("0 ms in"), "{err}");
        assert!(err.contains(&o) && err.contains(&p), "{err}");
        // -0 is 0
        let (o, p) = (run_file(&dir, "o4", h200, Some(-0.0)), run_file(&dir, "p4", h200, None));
        assert_eq!(load(&[o], &[p]).unwrap().len(), 1);
        // a file without an env row counts as timed without a gap
        let o = run_file(&dir, "o5", h200, Some(200.0));
        let p = dir.join("p5");
        std::fs::write(&p, std::fs::read_to_string(&o).unwrap().lines().nth(1).unwrap()).unwrap();
        let err = load(&[o], &[p.to_str().unwrap().to_string()]).unwrap_err().to_string();
        assert!(err.contains("different idle gaps"), "{err}");
        let (o, p) = (run_file(&dir, "o3", h200, None), run_file(&dir, "p3", "NVIDIA H100", None));
        let err = load(&[o], &[p]).unwrap_err().to_string();
        assert!(err.contains("different devices"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
