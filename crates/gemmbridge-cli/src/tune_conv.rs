//! `gemmbridge tune --ops conv_…`: the measured search of every convolution `bench` times
//! (ResNet-50's 11 convolutions per dtype, layout and batch size, `bench/resnet50.json`), each
//! chosen cuDNN plan stored in the tactic database, where `bench --db` (and any
//! `Gpu::load_tactics`) rebuilds it without searching.

use std::path::Path;

use anyhow::{bail, Context};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::conv::{Conv2d, ConvActivation, ConvLayout};
use gemmbridge::cuda::tactics::TacticDb;
use gemmbridge::cuda::{ConvApi, ConvSearch, Gpu};
use gemmbridge::{DType, Element, Precision};

use crate::bench::conv::{direction, resnet50};
use crate::random::normal;

/// What the convolution tuning runs over (as `bench`'s convolution rows).
pub struct Plan<'a> {
    pub ops: &'a [String],
    pub dtypes: &'a [(String, Precision)],
    pub layouts: Vec<ConvLayout>,
    pub batches: Vec<usize>,
    pub api: ConvApi,
}

/// Tunes every convolution of `plan` into `db`, saved to `path` after every problem (merged
/// with what is there). Returns how many tactics were stored.
pub fn run(gpu: &Gpu, plan: &Plan<'_>, db: &mut TacticDb, path: &Path) -> anyhow::Result<usize> {
    gpu.set_conv_search(ConvSearch::Measured);
    gpu.set_conv_api(plan.api);
    println!(
        "{:<22} {:<5} {:<4} {:>4} {:>28} {:>10} {:>10} {:>7}  plan",
        "op", "dtype", "lay.", "n", "c h w k r×s /stride", "heur. ms", "tuned ms", "gain"
    );
    let mut stored = 0;
    for (name, precision) in plan.dtypes {
        for &layout in &plan.layouts {
            for &n in &plan.batches {
                for &(c, h, w, k, r, s, stride, pad) in &resnet50()? {
                    let p = Conv2d::new([n, c, h, w], [k, r, s], *precision)
                        .with_stride(stride, stride)
                        .with_pad(pad, pad)
                        .with_layout(layout);
                    stored += match precision.input() {
                        DType::F32 => shape::<f32>(gpu, &p, name, plan.ops, db, path)?,
                        DType::F16 => shape::<half::f16>(gpu, &p, name, plan.ops, db, path)?,
                        DType::BF16 => shape::<half::bf16>(gpu, &p, name, plan.ops, db, path)?,
                        other => bail!("no convolution tuning for dtype {other}"),
                    };
                }
            }
        }
    }
    gpu.set_conv_fusion(true);
    Ok(stored)
}

/// Every op of one problem: its first call runs the measured search on fresh random buffers
/// (allocated as `bench` allocates them, so the plans are keyed by the same alignment).
fn shape<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &Conv2d,
    name: &str,
    ops: &[String],
    db: &mut TacticDb,
    path: &Path,
) -> anyhow::Result<usize> {
    let s = gpu.stream();
    let [lx, lw, ly] = p.lens();
    let up = |v: Vec<T>| -> anyhow::Result<CudaSlice<T>> { Ok(s.clone_htod(&v)?) };
    let (x, wt, b, dy) = (up(normal(lx))?, up(normal(lw))?, up(normal(p.k))?, up(normal(ly))?);
    let (mut y, mut dx, mut dw) = (up(normal(ly))?, up(normal(lx))?, up(normal(lw))?);
    let mut stored = 0;
    for op in ops {
        gpu.set_conv_fusion(op != "conv_bias_relu_unfused");
        match op.as_str() {
            "conv_fwd" => gpu.conv2d_forward(p, &x, &wt, &mut y),
            "conv_bias_relu" | "conv_bias_relu_unfused" => {
                gpu.conv2d_fused(p, &x, &wt, &b, ConvActivation::Relu, &mut y)
            }
            "conv_dgrad" => gpu.conv2d_backward_data(p, &wt, &dy, &mut dx),
            "conv_wgrad" => gpu.conv2d_backward_filter(p, &x, &dy, &mut dw),
            other => bail!("unknown convolution op {other:?}"),
        }
        .with_context(|| format!("{op} {name} {}", p.describe()))?;
        s.synchronize()?;
        let shape = format!("{} {} {} {} {}×{} /{}", p.c, p.h, p.w, p.k, p.r, p.s, p.stride[0]);
        let plan = gpu.conv2d_plan(p, direction(op)).unwrap_or_default();
        let Some((sig, tactic)) = gpu.conv2d_tactic(p, direction(op)) else {
            println!(
                "{op:<22} {name:<5} {:<4} {:>4} {shape:>28}  not stored: no measured plan ({plan})",
                p.layout, p.n
            );
            continue;
        };
        println!(
            "{op:<22} {name:<5} {:<4} {:>4} {shape:>28} {:>10.4} {:>10.4} {:>6.1}%  {plan}",
            p.layout,
            p.n,
            tactic.heuristic_ms,
            tactic.tuned_ms,
            (tactic.heuristic_ms / tactic.tuned_ms - 1.0) * 100.0,
        );
        db.entries.insert(sig, tactic);
        // saved after every problem, so an interrupted run keeps what it tuned
        db.save(path).with_context(|| format!("writing {}", path.display()))?;
        stored += 1;
    }
    Ok(stored)
}
