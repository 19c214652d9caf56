//! What the soak counts and measures, and how it reports it: shared counters, the memory and
//! cache snapshots (start, halfway, end), the progress line, the final table and its JSON.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use gemmbridge::cuda::Gpu;
use serde::Serialize;

/// The backends calls are spread over, in the order of [`Counters::by_backend`].
pub const BACKENDS: [&str; 3] = ["auto", "lt", "blas"];

/// Failures printed (and kept for the JSON) at most; all are counted.
const KEPT: usize = 20;

/// Counters every thread adds to.
#[derive(Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub by_backend: [AtomicU64; 3],
    pub checked: AtomicU64,
    pub mismatches: AtomicU64,
    /// Calls or set-up steps that returned an error (each stops the soak).
    pub errors: AtomicU64,
    /// The first [`KEPT`] mismatches and errors, described.
    details: Mutex<Vec<String>>,
    /// Cases the Lt backend refused as unsupported in the warm-up (not run there since).
    excluded: Mutex<BTreeSet<String>>,
}

impl Counters {
    fn keep(&self, what: String) {
        let mut d = self.details.lock().unwrap_or_else(|p| p.into_inner());
        if d.len() < KEPT {
            eprintln!("{what}");
            d.push(what);
        }
    }

    /// Records a result outside its tolerance.
    pub fn mismatch(&self, what: String) {
        self.mismatches.fetch_add(1, Relaxed);
        self.keep(format!("MISMATCH {what}"));
    }

    /// Records an error.
    pub fn error(&self, what: String) {
        self.errors.fetch_add(1, Relaxed);
        self.keep(format!("ERROR {what}"));
    }

    /// Records a case cuBLASLt does not support (run on the other backends only).
    pub fn exclude(&self, what: String) {
        self.excluded.lock().unwrap_or_else(|p| p.into_inner()).insert(what);
    }

    /// The failures kept, and the excluded cases.
    pub fn lists(&self) -> (Vec<String>, Vec<String>) {
        let d = self.details.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let x = self.excluded.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        (d, x)
    }
}

/// Memory and caches at one moment.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Snapshot {
    /// Seconds since the timed run began.
    pub at_s: f64,
    pub calls: u64,
    /// Host resident set (VmRSS), bytes.
    pub rss_bytes: u64,
    /// Device memory in use (total − free, whole device), bytes.
    pub device_used_bytes: u64,
    /// Cached cuBLASLt plans per `Gpu` (auto, lt, blas).
    pub plans: [usize; 3],
    /// Cached replay graphs per `Gpu` (auto, lt, blas).
    pub graphs: [usize; 3],
}

/// VmRSS of /proc/self/status text, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

/// Takes a snapshot (binds the context to this thread for the device query).
///
/// # Errors
/// /proc/self/status unreadable or without VmRSS; the driver's memory query failing.
pub fn snapshot(gpus: &[&Gpu; 3], counters: &Counters, at_s: f64) -> anyhow::Result<Snapshot> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| anyhow::anyhow!("reading /proc/self/status for the resident set: {e}"))?;
    let rss_bytes = parse_vm_rss(&status).ok_or_else(|| anyhow::anyhow!("no VmRSS line in /proc/self/status"))?;
    gpus[0].context().bind_to_thread()?;
    let (free, total) = cudarc::driver::result::mem_get_info()
        .map_err(|e| anyhow::anyhow!("cuMemGetInfo (device memory in use): {e}"))?;
    Ok(Snapshot {
        at_s,
        calls: counters.calls.load(Relaxed),
        rss_bytes,
        device_used_bytes: (total - free) as u64,
        plans: gpus.map(|g| g.plans().cached()),
        graphs: gpus.map(|g| g.plans().graphs()),
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// One progress line.
pub fn progress(c: &Counters, at_s: f64, total_s: f64) -> String {
    let b = |i: usize| c.by_backend[i].load(Relaxed);
    format!(
        "[{at_s:>6.0}/{total_s:.0} s] calls {} (auto {} lt {} blas {}), checked {}, mismatches {}, errors {}",
        c.calls.load(Relaxed),
        b(0),
        b(1),
        b(2),
        c.checked.load(Relaxed),
        c.mismatches.load(Relaxed),
        c.errors.load(Relaxed)
    )
}

/// The run's outcome, as printed and written with `--json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub pass: bool,
    pub seed: u64,
    pub threads: usize,
    pub seconds: u64,
    pub elapsed_s: f64,
    pub cases: usize,
    pub calls: u64,
    pub calls_by_backend: [u64; 3],
    pub checked: u64,
    pub mismatches: u64,
    pub errors: u64,
    pub failures: Vec<String>,
    pub lt_unsupported: Vec<String>,
    pub start: Snapshot,
    pub half: Option<Snapshot>,
    pub end: Snapshot,
    pub rss_growth_bytes: i64,
    pub device_growth_bytes: i64,
}

/// The final report, human-readable.
pub fn table(s: &Summary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\nsoak: {} threads, {:.0} s, seed {}, {} cases", s.threads, s.elapsed_s, s.seed, s.cases);
    let [a, l, b] = s.calls_by_backend;
    let _ = writeln!(o, "calls {} (auto {a}, lt {l}, blas {b}; warm-up included), checked {}", s.calls, s.checked);
    let _ = writeln!(o, "mismatches {}, errors {}", s.mismatches, s.errors);
    if !s.lt_unsupported.is_empty() {
        let _ = writeln!(o, "not run on lt (cuBLASLt: not supported): {}", s.lt_unsupported.join("; "));
    }
    let _ = writeln!(
        o,
        "{:<8} {:>8} {:>10} {:>12} {:>18} {:>18}",
        "when", "at s", "calls", "host RSS MiB", "device used MiB", "plans/graphs a,l,b"
    );
    let snaps = [("start", Some(s.start)), ("halfway", s.half), ("end", Some(s.end))];
    for (name, snap) in snaps.iter().filter_map(|(n, x)| x.map(|x| (n, x))) {
        let _ = writeln!(
            o,
            "{:<8} {:>8.0} {:>10} {:>12.1} {:>18.1} {:>18}",
            name,
            snap.at_s,
            snap.calls,
            mib(snap.rss_bytes),
            mib(snap.device_used_bytes),
            format!("{:?}/{:?}", snap.plans, snap.graphs).replace(' ', "")
        );
    }
    let _ = writeln!(
        o,
        "growth start→end: host RSS {:+.1} MiB, device {:+.1} MiB",
        s.rss_growth_bytes as f64 / (1 << 20) as f64,
        s.device_growth_bytes as f64 / (1 << 20) as f64
    );
    let _ = writeln!(o, "soak: {}", if s.pass { "PASS" } else { "FAIL" });
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let text = "Name:\tgemmbridge\nVmPeak:\t  999 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(text), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("VmRSS: 12 MB\n"), None);
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(parse_vm_rss(&std::fs::read_to_string("/proc/self/status").unwrap()).unwrap() > 0);
    }
}
