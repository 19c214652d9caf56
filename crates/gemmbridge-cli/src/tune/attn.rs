//! The search for attention: cuDNN's measured search (`Gpu::set_attention_search`) on every
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

/// The direction an attention op tunes ([`Gpu::attention_tactic`]'s name).
pub fn direction(op: &str) -> &'static str {
    match op {
        "attn_fwd_bwd" => "backward",
        "attn_fwd_fp8" => "forward_fp8",
        _ => "forward",
    }
}

/// Runs the measured search for an attention item on `gpu` (its first call, on the shared
/// inputs): the chosen plan's signature and tactic; `Ok(None)` where the heuristic's first plan
/// was the fastest timed (a call without the database runs it already).
pub fn search(gpu: &Gpu, rows: &mut Rows, item: &Item) -> anyhow::Result<Option<(String, Tactic)>> {
    let Item::Attn { op, problem, .. } = item else { anyhow::bail!("{} is not an attention row", item.describe()) };
    rows.time(gpu, item, Sampling::new(0, 1))?;
    Ok(gpu.attention_tactic(problem, direction(op)))
}
