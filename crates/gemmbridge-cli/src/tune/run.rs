//! The three modes of `gemmbridge tune`: tune (search, confirm, store the winners), `--verify`
//! and `--noise`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use gemmbridge::cuda::tactics::{Tactic, TacticDb};
use gemmbridge::cuda::{library, ConvSearch, Gpu, GpuOptions, TuneOptions};

use super::confirm::{confirm, median, rounds_needed, spread, Bar, Protocol, Verdict};
use super::gemm::{self, Found};
use super::items::{Item, Rows};
use super::{attn, conv, grouped, Args, Plan};
use crate::db::identity;
use crate::timing::Sampling;

/// The least confirmed gain an entry is stored for: the candidate's median burst ratio
/// (heuristic time / candidate time) at least 1.02.
const GAIN: f64 = 1.02;

pub fn run(args: Args) -> anyhow::Result<i32> {
    let plan = Plan::parse(&args)?;
    let proto = Protocol { gap_ms: args.confirm_gap_ms, rounds: args.confirm_rounds };
    if let Some(path) = &args.db {
        if let Err(e) = TacticDb::check_path(Path::new(path)) {
            bail!("--db: {e}");
        }
    }
    let base = engine(&args, &plan)?;
    let mut rows = Rows::new(base.stream());
    if args.noise {
        noise(&args, &plan, &base, &mut rows, proto)?;
        return Ok(0);
    }
    if let Some(path) = &args.verify {
        return verify(&args, &plan, (&base, &mut rows), proto, Path::new(path));
    }
    tune(&args, &plan, (&base, &mut rows), proto)?;
    Ok(0)
}

/// A `Gpu` on device 0 as `bench` sets one up (measured convolution search, the --conv-api),
/// under the SM count target of the arguments; checked to offer cuBLASLt where GEMMs are in
/// the selection.
fn engine(args: &Args, plan: &Plan) -> anyhow::Result<Gpu> {
    let options = GpuOptions::default()
        .sm_count_target(args.sm_count_target)
        .conv_search(ConvSearch::Measured)
        .conv_api(plan.conv.api);
    let gpu = crate::gpu::open_with("tune", options)?;
    if plan.has_gemms() && !library::has_cublaslt() {
        bail!("tuning GEMMs needs cuBLASLt (libcublasLt), which was not found");
    }
    // SAFETY: every buffer tune allocates is made on one stream and waited for before another
    // stream reads it (`Rows`), so cudarc's cross-stream events have nothing to order.
    unsafe { gpu.context().disable_event_tracking() };
    Ok(gpu)
}

/// A fresh engine with `entries` loaded.
fn with_entries(args: &Args, plan: &Plan, db: &TacticDb) -> anyhow::Result<Gpu> {
    let gpu = engine(args, plan)?;
    gpu.plans().load_tactics(db);
    Ok(gpu)
}

/// The mode that fills `--db`: per problem, the search's finalists confirmed in order; the
/// first that wins by [`GAIN`] is stored (with its confirmed burst times), and where none
/// does, the file loses any entry it held for the problem.
fn tune(args: &Args, plan: &Plan, (base, rows): (&Gpu, &mut Rows), proto: Protocol) -> anyhow::Result<()> {
    let path_s = args.db.as_deref().expect("clap requires --db in this mode");
    let path = Path::new(path_s);
    let tuner = engine(args, plan)?;
    // the baseline and the candidates keep cuDNN's heuristic attention plans, as `bench` does
    tuner.update_options(|o| o.attention_search = true)?;
    let mut db = TacticDb::new(identity(&tuner)?);
    // checked before any GPU time is spent: a file that save() would refuse to overwrite
    if let Err(e) = TacticDb::check_writable(path, &db.identity) {
        bail!("--db {path_s}: {e}");
    }
    let opts = TuneOptions { candidates: args.candidates, reps: args.reps, ..TuneOptions::default() };
    println!(
        "{:<48} {:>9} {:>9} {:>7} {:>7} {:>3}   confirmed ratio (rounds)  stored",
        "problem", "heur. ms", "best ms", "gain", "cands", "bad"
    );
    let mut stored = 0;
    for item in &plan.items {
        let (sig, finalists, cols) = match item {
            Item::Attn { .. } | Item::Grouped { .. } | Item::Conv { .. } => {
                match search(&tuner, rows, item, args.reps)? {
                    Some(found) => found,
                    None => continue,
                }
            }
            _ => match gemm::search(&tuner, item, opts)? {
                Found::NotOffered(why) => {
                    println!("{}  not offered here: {why}", item.describe());
                    continue;
                }
                Found::Tuned(sig, r) if r.graph_failed => {
                    println!("{}  not timed (graph capture failed twice)", item.describe());
                    forget(&mut db, path, &sig)?;
                    continue;
                }
                Found::Tuned(sig, r) => (sig, r.finalists.clone(), gemm::columns(&r)),
            },
        };
        let (kept, tried) = judge(args, plan, (base, rows), proto, item, (&sig, &finalists), &db)?;
        println!("{} {cols} {:<26} {}", item.describe(), tried, if kept.is_some() { "yes" } else { "no" });
        match kept {
            Some(t) => {
                db.entries.insert(sig, t);
                // saved after every problem, so an interrupted run keeps what it tuned
                db.save(path).with_context(|| format!("writing {path_s}"))?;
                stored += 1;
            }
            None => forget(&mut db, path, &sig)?,
        }
    }
    println!("{stored} entries stored in {path_s} (merged with what was there)");
    Ok(())
}

/// The finalist of a cuDNN or grouped item's search, with its signature and the table's
/// columns; `None` (after a line saying why) where there is nothing to confirm.
fn search(
    tuner: &Gpu,
    rows: &mut Rows,
    item: &Item,
    reps: usize,
) -> anyhow::Result<Option<(String, Vec<Tactic>, String)>> {
    Ok(match item {
        Item::Attn { .. } => match attn::search(tuner, rows, item)? {
            attn::Found::Tactic(sig, t) => {
                let cols = conv::columns(&t);
                Some((sig, vec![t], cols))
            }
            attn::Found::Heuristic => {
                println!("{}  the heuristic's plan is the fastest measured (nothing to store)", item.describe());
                None
            }
            attn::Found::Unsupported(why) => {
                println!("{}  not offered here: {why}", item.describe());
                None
            }
        },
        Item::Grouped { .. } => match grouped::search(tuner, rows.pools(), item, reps)? {
            grouped::Found::Tactic(sig, t, listed) => Some((sig, vec![t], format!("{listed:<40}"))),
            grouped::Found::Rule(listed) => {
                println!("{}  the rule's way is the fastest measured ({listed}; nothing to store)", item.describe());
                None
            }
        },
        Item::Conv { .. } => match conv::search(tuner, rows, item)? {
            Some((sig, t, _plan)) => {
                let cols = conv::columns(&t);
                Some((sig, vec![t], cols))
            }
            None => {
                println!("{}  no measured plan (nothing to store)", item.describe());
                None
            }
        },
        _ => anyhow::bail!("{} has its own search", item.describe()),
    })
}

/// Confirms `finalists` of one problem in order, up to `--finalists`: the first that wins by
/// [`GAIN`] and that the benchmark's call really uses (its signature is applied), with its
/// confirmed times; and the ratios tried, as text.
fn judge(
    args: &Args,
    plan: &Plan,
    (base, rows): (&Gpu, &mut Rows),
    proto: Protocol,
    item: &Item,
    (sig, finalists): (&str, &[Tactic]),
    db: &TacticDb,
) -> anyhow::Result<(Option<Tactic>, String)> {
    if finalists.is_empty() {
        return Ok((None, "(no finalist)".into()));
    }
    let mut tried = Vec::new();
    for t in finalists.iter().take(args.finalists) {
        let mut one = TacticDb::new(db.identity.clone());
        one.entries.insert(sig.to_string(), t.clone());
        let cand = with_entries(args, plan, &one)?;
        let v = confirm(rows, item, (base, &cand), proto, Some(Bar { at: GAIN }))?;
        let applied = cand.plans().applied_tactics().iter().any(|s| s == sig);
        tried.push(format!("{:.3} ({}){}", v.ratio, v.ratios.len(), if applied { "" } else { " unused" }));
        if applied && v.ratio >= GAIN {
            let kept = Tactic { heuristic_ms: v.base_ms, tuned_ms: v.cand_ms, ..t.clone() };
            return Ok((Some(kept), tried.join(", ")));
        }
    }
    Ok((None, tried.join(", ")))
}

/// Removes `sig`'s entry from `db` and from the file.
fn forget(db: &mut TacticDb, path: &Path, sig: &str) -> anyhow::Result<()> {
    db.entries.remove(sig);
    db.save_dropping(path, &|s, _| s == sig).with_context(|| format!("writing {}", path.display()))
}

/// `--verify DB`: every problem of the selection timed with the database and without it;
/// each entry's ratio (its worst over the problems that use it), the losers pruned on request.
/// Exit status 1 while a loser remains in the file.
fn verify(
    args: &Args,
    plan: &Plan,
    (base, rows): (&Gpu, &mut Rows),
    proto: Protocol,
    path: &Path,
) -> anyhow::Result<i32> {
    if !path.exists() {
        bail!("--verify {}: no such file", path.display());
    }
    let (db, warnings) = TacticDb::load(path, &identity(base)?);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    if db.entries.is_empty() {
        bail!("--verify {}: no entry of this machine's identity to verify", path.display());
    }
    println!("{:<48} {:>9} {:>9} {:>7} {:>7}  entry", "problem", "heur. ms", "db ms", "ratio", "rounds");
    let mut by_entry: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for item in &plan.items {
        let cand = with_entries(args, plan, &db)?;
        // one call learns which entries the problem's call uses
        match rows.time(&cand, item, Sampling::new(0, 1)) {
            Err(e) if attn::unsupported(&e) => {
                println!("{}  not offered here: {e}", item.describe());
                continue;
            }
            other => other?,
        };
        let used = cand.plans().applied_tactics();
        if used.is_empty() {
            continue;
        }
        let v: Verdict = confirm(rows, item, (base, &cand), proto, Some(Bar { at: 1.0 }))?;
        println!(
            "{} {:>9.4} {:>9.4} {:>7.3} {:>7}  {}",
            item.describe(),
            v.base_ms,
            v.cand_ms,
            v.ratio,
            v.ratios.len(),
            used.join(" | ")
        );
        for sig in used {
            by_entry.entry(sig).or_default().push(v.ratio);
        }
    }
    let losers: Vec<&String> = by_entry
        .iter()
        .filter(|(_, r)| r.iter().cloned().fold(f64::INFINITY, f64::min) < 1.0)
        .map(|(s, _)| s)
        .collect();
    let unchecked = db.entries.keys().filter(|s| !by_entry.contains_key(*s)).count();
    println!(
        "{} entries checked: {} win, {} lose; {unchecked} not used by the selection's calls (not checked)",
        by_entry.len(),
        by_entry.len() - losers.len(),
        losers.len()
    );
    if let Some(worst) = by_entry.values().flatten().cloned().reduce(f64::min) {
        let all: Vec<f64> = by_entry.values().flatten().cloned().collect();
        println!("ratio over the checked problems: worst {worst:.3}, median {:.3}", median(&all));
    }
    for s in &losers {
        println!("loses: {s}");
    }
    if losers.is_empty() {
        return Ok(0);
    }
    if args.prune {
        db.save_dropping(path, &|s, _| losers.iter().any(|l| *l == s))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("{} losing entries removed from {}", losers.len(), path.display());
        return Ok(0);
    }
    Ok(1)
}

/// `--noise`: the baseline against itself (two engines, the same plan) in the confirmation's
/// protocol; per problem the spread of a round's ratio and the rounds a 2 % bar needs.
fn noise(args: &Args, plan: &Plan, base: &Gpu, rows: &mut Rows, proto: Protocol) -> anyhow::Result<()> {
    let other = engine(args, plan)?;
    println!("{:<48} {:>9} {:>8} {:>8} {:>7}", "problem", "ms", "ratio", "spread", "rounds");
    let mut spreads = Vec::new();
    for item in &plan.items {
        let v = match confirm(rows, item, (base, &other), proto, None) {
            Err(e) if attn::unsupported(&e) => {
                println!("{}  not offered here: {e}", item.describe());
                continue;
            }
            other => other?,
        };
        let s = spread(&v.ratios);
        spreads.push(s);
        let need = rounds_needed(s, GAIN - 1.0);
        println!("{} {:>9.4} {:>8.4} {:>7.2}% {:>7}", item.describe(), v.base_ms, v.ratio, s * 100.0, need);
    }
    let worst = spreads.iter().cloned().fold(0.0, f64::max);
    println!(
        "{} problems, {} rounds each, gap {} ms: spread of a round's ratio median {:.2}%, worst {:.2}%; \
         rounds a 2% bar needs: {} (median spread), {} (worst)",
        spreads.len(),
        proto.rounds,
        proto.gap_ms,
        median(&spreads) * 100.0,
        worst * 100.0,
        rounds_needed(median(&spreads), GAIN - 1.0),
        rounds_needed(worst, GAIN - 1.0)
    );
    Ok(())
}
