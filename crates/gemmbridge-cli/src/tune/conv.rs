//! The search for convolutions: cuDNN's measured search (`ConvSearch::Measured`) on every
//! convolution `bench` times (ResNet-50's 11 convolutions per dtype, layout and batch size,
//! `bench/resnet50.json`); the plan it chooses is the finalist the confirmation judges against
//! a fresh search of its own (what `bench` runs without a database). A stored plan is rebuilt
//! by `bench --db` (and any `Plans::load_tactics`) without searching.

use gemmbridge::conv::Conv2d;
use gemmbridge::cuda::tactics::Tactic;
use gemmbridge::cuda::Gpu;

use super::items::{Item, Rows};
use super::Dense;
use crate::bench::conv::{direction, resnet50};
use crate::suite_args::ConvSettings;
use crate::timing::Sampling;

/// The convolution problems, in `bench`'s order: dtype, layout, batch, shape, op.
pub fn items(ops: &[String], dtypes: &[Dense], conv: &ConvSettings) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    for (name, precision) in dtypes {
        for &layout in &conv.layouts {
            for &n in &conv.batches {
                for &(c, h, w, k, r, s, stride, pad) in &resnet50()? {
                    let p = Conv2d::new([n, c, h, w], [k, r, s], *precision)
                        .with_stride(stride, stride)
                        .with_pad(pad, pad)
                        .with_layout(layout);
                    out.extend(ops.iter().map(|op| Item::Conv {
                        op: op.clone(),
                        dtype: name.clone(),
                        precision: *precision,
                        problem: p,
                    }));
                }
            }
        }
    }
    Ok(out)
}

/// Runs the measured search for a convolution item on `gpu` (its first call, on the shared
/// inputs): the chosen plan's signature and tactic, and its name; `Ok(None)` where no
/// measured plan came of it (the legacy API's heuristic, say).
pub fn search(gpu: &Gpu, rows: &mut Rows, item: &Item) -> anyhow::Result<Option<(String, Tactic, String)>> {
    let Item::Conv { op, problem, .. } = item else { anyhow::bail!("{} is not a convolution", item.describe()) };
    rows.time(gpu, item, Sampling::new(0, 1))?;
    gpu.update_options(|o| o.conv_fusion = op != "conv_bias_relu_unfused")?;
    let plan = gpu.plans().conv2d(problem, direction(op)).unwrap_or_default();
    let found = gpu.plans().conv2d_tactic(problem, direction(op));
    gpu.update_options(|o| o.conv_fusion = true)?;
    Ok(found.map(|(sig, t)| (sig, t, plan)))
}

/// The search's columns of the table: the heuristic's first plan's and the chosen plan's times
/// as the search measured them (two rounds of three calls).
pub fn columns(t: &Tactic) -> String {
    format!(
        "{:>9.4} {:>9.4} {:>6.1}% {:>7} {:>3}  ",
        t.heuristic_ms,
        t.tuned_ms,
        (t.heuristic_ms / t.tuned_ms - 1.0) * 100.0,
        "",
        ""
    )
}
