//! The search for grouped GEMMs: every way of running each grouped row `bench` times (the
//! shapes of `bench/grouped.json`, f16/bf16, `--ops grouped,grouped_dx,grouped_dw`) measured by
//! `GpuTuning::grouped`; the fastest, where it is not the engine's rule's own choice, is the
//! finalist the confirmation judges against the rule (what `bench` runs without a database).

use gemmbridge::cuda::tactics::Tactic;
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::GroupedProblem;
use gemmbridge::DType;

use super::items::Item;
use super::Dense;
use crate::bench::{grouped, rotate, Pools};

/// The grouped problems, in `bench`'s order: op, dtype, shape.
pub fn items(ops: &[String], dtypes: &[Dense]) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    for op in ops {
        for (name, precision) in dtypes.iter().filter(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
            for shape in grouped::shapes()? {
                let problem = GroupedProblem::new(grouped::product(op), &shape.sizes, shape.n, shape.k, *precision)?;
                out.push(Item::Grouped { op: op.clone(), dtype: name.clone(), shape, problem });
            }
        }
    }
    Ok(out)
}

/// What the search of a grouped item found.
pub enum Found {
    /// A way faster than the rule's choice: the signature, the tactic, every way's time.
    Tactic(String, Tactic, String),
    /// The rule's choice was the fastest measured (every way's time).
    Rule(String),
}

/// Measures every way of running a grouped item on `gpu` (random buffers from `pools`).
pub fn search(gpu: &Gpu, pools: &mut Pools, item: &Item, reps: usize) -> anyhow::Result<Found> {
    let Item::Grouped { problem: p, .. } = item else { anyhow::bail!("{} is not a grouped row", item.describe()) };
    let (times, sig, t) = match p.precision().input() {
        DType::F16 => tune::<half::f16>(gpu, pools, p, reps)?,
        _ => tune::<half::bf16>(gpu, pools, p, reps)?,
    };
    let listed: Vec<String> = times.iter().map(|(b, ms)| format!("{b:?} {ms:.4}")).collect();
    let listed = listed.join(", ");
    Ok(if t.tuned_ms < t.heuristic_ms { Found::Tactic(sig, t, listed) } else { Found::Rule(listed) })
}

type Tuned = (Vec<(gemmbridge::grouped::streams::GroupedBackend, f64)>, String, Tactic);

fn tune<T: gemmbridge::Element + cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    pools: &mut Pools,
    p: &GroupedProblem,
    reps: usize,
) -> anyhow::Result<Tuned> {
    let s = gpu.stream();
    let [la, lb, lc] = p.lens();
    let pool = pools.get::<T>(s)?;
    let (a, b) = (rotate(s, pool, la)?, rotate(s, pool, lb)?);
    let mut c = rotate(s, pool, lc)?;
    Ok(gpu.tune().grouped(p, (&a, &b), &mut c, None, reps)?)
}
