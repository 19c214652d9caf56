//! The search for attention: cuDNN's measured search (`GpuOptions::attention_search`) on every
//! attention row `bench` times (the shapes of `bench/attention.json`, f16/bf16); the plan it
//! chooses is the finalist the confirmation judges against cuDNN's heuristic plan (what
//! `bench` runs without a database). `attn_fwd` tunes the forward (with statistics),
//! `attn_fwd_bwd` the backward (timed in the forward-and-backward row, whose forward is the
//! heuristic's on both sides), `attn_fwd_fp8` the FP8 forward.

use gemmbridge::cuda::tactics::Tactic;
use gemmbridge::cuda::Gpu;

use super::items::{Item, Rows};
use super::Dense;
use crate::bench::attn;
pub use crate::bench::attn::unsupported;
use crate::timing::Sampling;

/// The attention problems, in `bench`'s order: dtype, shape, op. Decoding shapes (one query
/// row) get no `attn_fwd_bwd`, as in `bench`.
pub fn items(ops: &[String], dtypes: &[Dense], names: &[String]) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    for (name, precision) in
        dtypes.iter().filter(|(_, p)| matches!(p.input(), gemmbridge::DType::F16 | gemmbridge::DType::BF16))
    {
        for shape in attn::shapes()?.into_iter().filter(|s| names.is_empty() || names.contains(&s.name)) {
            let problem = shape.problem(precision.input())?;
            for op in ops.iter().filter(|op| !(*op == "attn_fwd_bwd" && problem.s_q == 1)) {
                out.push(Item::Attn { op: op.clone(), dtype: name.clone(), shape: shape.clone(), problem });
            }
        }
    }
    Ok(out)
}

/// The direction an attention op tunes (`Plans::attention_tactic`'s name).
pub fn direction(op: &str) -> &'static str {
    match op {
        "attn_fwd_bwd" => "backward",
        "attn_fwd_fp8" => "forward_fp8",
        _ => "forward",
    }
}

/// What the measured search of an attention item found.
pub enum Found {
    /// A plan faster than the heuristic's first: its signature and tactic.
    Tactic(String, Tactic),
    /// The heuristic's first plan was the fastest timed (a call without the database runs it
    /// already).
    Heuristic,
    /// The loaded cuDNN has no engine for the row (FP8 decoding, say): the error.
    Unsupported(String),
}

/// Runs the measured search for an attention item on `gpu` (its first call, on the shared
/// inputs).
pub fn search(gpu: &Gpu, rows: &mut Rows, item: &Item) -> anyhow::Result<Found> {
    let Item::Attn { op, problem, .. } = item else { anyhow::bail!("{} is not an attention row", item.describe()) };
    match rows.time(gpu, item, Sampling::new(0, 1)) {
        Err(e) if unsupported(&e) => return Ok(Found::Unsupported(e.to_string())),
        other => other?,
    };
    Ok(match gpu.plans().attention_tactic(problem, direction(op)) {
        Some((sig, t)) => Found::Tactic(sig, t),
        None => Found::Heuristic,
    })
}
