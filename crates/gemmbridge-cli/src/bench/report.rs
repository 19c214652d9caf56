//! The table printed after a benchmark, with the peer's times beside ours.

use std::collections::HashMap;
use std::fmt::Write;

use anyhow::Context;

use crate::row::Row;
use crate::suites::is_square_or_llm;

/// (op, dtype, m, n, k, batch), the op with its FP8 scaling ([`Row::label`])
type Key = (String, String, usize, usize, usize, usize);

fn key(r: &Row) -> Key {
    (r.label(), r.dtype.clone(), r.m, r.n, r.k, r.batch)
}

/// Reads bench/peer.py's JSON lines, keeping the timed rows (skips "env", "launch", rows
/// with an "error", and anything else without a median), with what its "env" rows say; read
/// before anything is timed.
///
/// # Errors
/// As [`read_rows`]; a file without timed rows (nor "launch" rows) is refused as `gemmbridge
/// compare` refuses one: there would be nothing to set beside the run.
pub fn read_peer(path: &str) -> anyhow::Result<(Envs, Vec<Row>)> {
    let (envs, rows) = read_rows(path)?;
    if rows.is_empty() && read_peer_launch(path)?.is_empty() {
        anyhow::bail!("{path} has no timed rows");
    }
    Ok((envs, rows))
}

/// Warns when the peer's "env" rows (`theirs`) name another device than `our_device`, or
/// another idle gap before each row than `our_gap_ms`.
pub fn warn_unlike(theirs: &Envs, our_device: &str, our_gap_ms: f64) {
    for t in theirs.devices.iter().filter(|t| *t != our_device) {
        eprintln!("warning: the peer ran on {t:?}, this run on {our_device:?}: the ratios compare different machines");
    }
    for g in theirs.gaps_ms.iter().filter(|g| **g != our_gap_ms) {
        eprintln!(
            "warning: the peer was timed with --gap-ms {g}, this run with {our_gap_ms}: rows timed after \
             different idle gaps are not comparable"
        );
    }
}

/// What a file's "env" rows say (a file of several runs concatenated has several), each value
/// listed once.
#[derive(Debug, Default, PartialEq)]
pub struct Envs {
    /// The devices named.
    pub devices: Vec<String>,
    /// The idle gaps before each row, ms (`gap_ms`; 0 where a row has none, as in files
    /// written before the field existed).
    pub gaps_ms: Vec<f64>,
}

/// The "env" rows' devices and gaps ([`Envs`]) and the timed rows of a JSON-lines file in
/// bench/peer.py's schema (ours or the peer's), as [`read_peer`].
///
/// # Errors
/// The file cannot be read; a line is not JSON or not a row; a median that is not a positive
/// finite number of ms; the same row (op, dtype, m, n, k, batch) twice. Each names the line.
pub fn read_rows(path: &str) -> anyhow::Result<(Envs, Vec<Row>)> {
    let text = std::fs::read_to_string(path)?;
    let runs = crate::runs::split(&text)?;
    if let [one] = &runs[..] {
        return rows_of(&one.lines);
    }
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    anyhow::bail!(
        "{} runs packed in one file ({}): give one run here; `gemmbridge compare` reads packed runs",
        runs.len(),
        names.join(", ")
    )
}

/// Every run of a JSON-lines file, one run or several packed ([`crate::runs`]), each as
/// [`read_rows`] reads one, with its name (`""` for an unpacked file).
///
/// # Errors
/// As [`read_rows`], naming the run.
pub fn read_runs(path: &str) -> anyhow::Result<Vec<(String, Envs, Vec<Row>)>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for r in crate::runs::split(&text)? {
        let read = rows_of(&r.lines);
        let (envs, rows) = if r.name.is_empty() { read? } else { read.with_context(|| format!("run {}", r.name))? };
        out.push((r.name, envs, rows));
    }
    Ok(out)
}

/// The "env" rows' devices and gaps and the timed rows of one run's lines (with their line
/// numbers in the file).
fn rows_of(lines: &[(usize, &str)]) -> anyhow::Result<(Envs, Vec<Row>)> {
    let (mut envs, mut rows) = (Envs::default(), Vec::new());
    let mut seen: HashMap<Key, usize> = HashMap::new();
    for &(n, line) in lines {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("line {n}: {e}"))?;
        if v.get("op").and_then(|o| o.as_str()) == Some("env") {
            let d = v.get("device").and_then(|d| d.as_str()).unwrap_or("?").to_string();
            if !envs.devices.contains(&d) {
                envs.devices.push(d);
            }
            let gap = match v.get("gap_ms") {
                None => 0.0,
                Some(g) => match g.as_f64() {
                    Some(ms) if ms.is_finite() && ms >= 0.0 => ms + 0.0, // -0 is 0
                    _ => anyhow::bail!("line {n}: gap_ms {g} is not a number of milliseconds ≥ 0"),
                },
            };
            if !envs.gaps_ms.contains(&gap) {
                envs.gaps_ms.push(gap);
            }
        }
        if v.get("median_ms").is_none() || v.get("error").is_some() {
            continue;
        }
        let r: Row = serde_json::from_value(v).map_err(|e| anyhow::anyhow!("line {n}: {e}"))?;
        if !(r.median_ms.is_finite() && r.median_ms > 0.0) {
            anyhow::bail!("line {n}: median_ms {} is not a positive time", r.median_ms);
        }
        if let Some(first) = seen.insert(key(&r), n) {
            anyhow::bail!(
                "line {n}: the row {} {} {}×{}×{} (batch {}) already appeared on line {first}",
                r.label(),
                r.dtype,
                r.m,
                r.n,
                r.k,
                r.batch
            );
        }
        rows.push(r);
    }
    Ok((envs, rows))
}

/// Reads bench/peer.py's "launch" rows.
pub fn read_peer_launch(path: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("op").and_then(|o| o.as_str()) == Some("launch"))
        .collect())
}

/// The launch rows beside the peer's: host µs per call (ours safe / raw with graph replay, the
/// safe path direct, bare cuBLASLt, bare cuBLAS, PyTorch), wall µs, graph µs, and the
/// throughput ratios PyTorch-eager / ours.
pub fn launch_table(ours: &[serde_json::Value], peer: &[serde_json::Value]) -> String {
    let f = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    let show = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mut s = String::new();
    let _ = writeln!(s, "\ntiny GEMM (64³) per call, µs: host = enqueue cost, wall = with the GPU, graph = GPU time per GEMM in a replayed graph");
    let _ = writeln!(
        s,
        "{:<5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>11} {:>11}",
        "dtype",
        "host",
        "raw",
        "fresh",
        "direct",
        "bare Lt",
        "bare BLAS",
        "torch",
        "wall",
        "torch",
        "graph",
        "torch",
        "eager ×",
        "graph ×"
    );
    for o in ours {
        let d = o.get("dtype").and_then(|x| x.as_str()).unwrap_or("?");
        let p = peer.iter().find(|p| p.get("dtype").and_then(|x| x.as_str()) == Some(d));
        let pk = |k| p.and_then(|p| f(p, k));
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let _ = writeln!(
            s,
            "{:<5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>11} {:>11}",
            d,
            show(f(o, "host_us")),
            show(f(o, "host_raw_us")),
            show(f(o, "host_fresh_us")),
            show(f(o, "host_direct_us")),
            show(f(o, "bare_lt_us")),
            show(f(o, "bare_blas_us")),
            show(pk("host_us")),
            show(f(o, "wall_us")),
            show(pk("wall_us")),
            show(f(o, "graph_us")),
            show(pk("graph_us")),
            show(ratio(pk("wall_us"), f(o, "wall_us"))),
            show(ratio(pk("wall_us"), f(o, "graph_us"))),
        );
    }
    let _ = writeln!(
        s,
        "host/raw: graph replay on (default), the call repeated; fresh: replay on, no call repeated (α changes); direct: replay off, every call through cublasLtMatmul"
    );
    let _ = writeln!(s, "eager × = torch wall / ours wall; graph × = torch eager wall / ours graph (per-call throughput vs PyTorch eager)");
    s
}

/// TFLOP/s with three significant digits or so: 761, 45.3, 0.0123.
fn tf(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

/// A row's rate column: TB/s for a bandwidth row (RMSNorm), else TFLOP/s (× `scale`).
fn rate(r: &Row, scale: f64) -> String {
    match r.tbps {
        Some(tb) => format!("{tb:.2} TB/s"),
        None => tf(r.tflops * scale),
    }
}

/// Geometric mean (`None` for an empty list).
pub fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// Formats our rows (and the peer's, where given) as a table; ratio = peer time / our time
/// (> 1: gemmbridge is faster). Ends with the geometric mean of the ratio per dtype, over all
/// matched rows and over the square + llm suites. A bandwidth row's rate is in TB/s.
pub fn table(rows: &[Row], peer: Option<&[Row]>, cpu: bool) -> String {
    let peer: HashMap<Key, &Row> = peer.unwrap_or(&[]).iter().map(|r| (key(r), r)).collect();
    let mut s = String::new();
    // the CPU's rates read better in GFLOP/s
    let (unit, scale) = if cpu { ("GFLOP/s", 1e3) } else { ("TFLOP/s", 1.0) };
    let _ = writeln!(
        s,
        "{:<7} {:<5} {:>6} {:>6} {:>6} {:>10} {:>9} {:>10} {:>9} {:>7}",
        "op", "dtype", "m", "n", "k", "ours ms", unit, "peer ms", unit, "ratio"
    );
    let mut ratios: Vec<(String, bool, f64)> = Vec::new();
    for r in rows {
        let p = peer.get(&key(r));
        let (pm, pt, ratio) = match p {
            Some(p) => {
                let ratio = p.median_ms / r.median_ms;
                ratios.push((r.dtype.clone(), is_square_or_llm((r.m, r.n, r.k)), ratio));
                (format!("{:.4}", p.median_ms), rate(p, scale), format!("{ratio:.3}"))
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<7} {:<5} {:>6} {:>6} {:>6} {:>10.4} {:>9} {:>10} {:>9} {:>7}",
            r.label(),
            r.dtype,
            r.m,
            r.n,
            r.k,
            r.median_ms,
            rate(r, scale),
            pm,
            pt,
            ratio
        );
    }
    if !ratios.is_empty() {
        let mut dtypes: Vec<&String> = ratios.iter().map(|(d, _, _)| d).collect();
        dtypes.dedup();
        let _ = writeln!(s, "\ngeometric mean of peer time / our time (> 1: gemmbridge faster)");
        let _ = writeln!(s, "{:<6} {:>10} {:>6} {:>16} {:>6}", "dtype", "all rows", "n", "square+llm", "n");
        let mut seen = Vec::new();
        for d in dtypes {
            if seen.contains(&d) {
                continue;
            }
            seen.push(d);
            let all: Vec<f64> = ratios.iter().filter(|(x, _, _)| x == d).map(|r| r.2).collect();
            let big: Vec<f64> = ratios.iter().filter(|(x, b, _)| x == d && *b).map(|r| r.2).collect();
            let f = |v: &[f64]| geomean(v).map_or("-".to_string(), |g| format!("{g:.3}"));
            let _ = writeln!(s, "{:<6} {:>10} {:>6} {:>16} {:>6}", d, f(&all), all.len(), f(&big), big.len());
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::row::square_row as r;

    #[test]
    fn ratio_and_geomean() {
        let ours = [r("matmul", "bf16", 1024, 1.0), r("linear", "bf16", 1024, 2.0), r("matmul", "bf16", 64, 1.0)];
        let peer = [r("matmul", "bf16", 1024, 2.0), r("linear", "bf16", 1024, 1.0), r("matmul", "bf16", 64, 4.0)];
        let t = table(&ours, Some(&peer), false);
        assert!(t.contains(" 2.000"), "{t}");
        assert!(t.contains(" 0.500"), "{t}");
        // all rows: (2·0.5·4)^(1/3) = 4^(1/3) = 1.587; square+llm: (2·0.5)^(1/2) = 1
        assert!(t.contains("1.587"), "{t}");
        assert!(t.contains("1.000"), "{t}");
    }

    #[test]
    fn a_non_positive_median_or_a_repeated_row_is_an_error_naming_the_line() {
        let path = std::env::temp_dir().join(format!("gemmbridge-rows-{}", std::process::id()));
        let row = |ms: &str| {
            format!("{{\"op\": \"matmul\", \"dtype\": \"f16\", \"m\": 64, \"n\": 64, \"k\": 64, \"batch\": 1, \"median_ms\": {ms}, \"min_ms\": 0.01, \"tflops\": 0.05}}\n")
        };
        for (text, want) in [
            (row("0"), "line 1: median_ms 0 is not a positive time"),
            (row("-0.5"), "line 1: median_ms -0.5 is not a positive time"),
            (
                row("0.01") + "\n" + &row("0.02"),
                "line 3: the row matmul f16 64×64×64 (batch 1) already appeared on line 1",
            ),
            (
                "{\"op\": \"env\", \"gap_ms\": \"200\"}".into(),
                "line 1: gap_ms \"200\" is not a number of milliseconds ≥ 0",
            ),
            ("{\"op\": \"env\", \"gap_ms\": -5}".into(), "line 1: gap_ms -5 is not a number of milliseconds ≥ 0"),
            ("{\"op\": \"env\", \"gap_ms\": null}".into(), "line 1: gap_ms null is not a number of milliseconds ≥ 0"),
            (
                "{\"run\": 1, \"op\": \"env\"}\n{\"run\": 2, \"op\": \"env\"}".into(),
                "2 runs packed in one file (1, 2): give one run here; `gemmbridge compare` reads packed runs",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_rows(path.to_str().unwrap()).unwrap_err().to_string();
            assert_eq!(err, want);
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn reads_peer_json_lines() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-peer-{}", std::process::id()));
        std::fs::write(
            &dir,
            "{\"op\": \"env\", \"torch\": \"2.11\", \"device\": \"cpu\"}\n\
             {\"op\": \"matmul\", \"dtype\": \"f16\", \"m\": 64, \"n\": 64, \"k\": 64, \"batch\": 1, \"median_ms\": 0.01, \"min_ms\": 0.009, \"tflops\": 0.05}\n\
             {\"op\": \"scaled_mm\", \"dtype\": \"fp8_e4m3\", \"scaling\": \"rowwise\", \"m\": 64, \"n\": 64, \"k\": 64, \"batch\": 1, \"median_ms\": 0.01, \"min_ms\": 0.01, \"tflops\": 0.05}\n\
             {\"op\": \"launch\", \"dtype\": \"f16\", \"m\": 64, \"n\": 64, \"k\": 64, \"host_us\": 13.8, \"wall_us\": 14.0, \"graph_us\": 2.1}\n",
        )
        .unwrap();
        let (envs, rows) = read_peer(dir.to_str().unwrap()).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(envs.devices, ["cpu"]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].op, "matmul");
        assert_eq!(rows[0].median_ms, 0.01);
        // FP8 rows are told apart by their scaling
        assert_eq!((rows[1].label(), rows[1].scaling.as_deref()), ("scaled_mm/rowwise".to_string(), Some("rowwise")));
    }

    #[test]
    fn a_peer_file_without_timed_rows_is_refused() {
        let path = std::env::temp_dir().join(format!("gemmbridge-peer-empty-{}", std::process::id()));
        let p = path.to_str().unwrap();
        for text in ["", "{\"op\": \"env\", \"device\": \"cpu\"}\n"] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(read_peer(p).unwrap_err().to_string(), format!("{p} has no timed rows"));
        }
        // launch rows alone are what `--ops launch` sets beside its own
        std::fs::write(&path, "{\"op\": \"launch\", \"dtype\": \"f16\", \"host_us\": 13.8}\n").unwrap();
        assert!(read_peer(p).unwrap().1.is_empty());
        std::fs::remove_file(&path).unwrap();
    }
}
