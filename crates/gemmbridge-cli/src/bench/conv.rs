//! The convolution rows of `gemmbridge bench` (`--ops conv_fwd,conv_bias_relu,…`): ResNet-50's
//! convolutions, timed as the GEMM rows are, in `bench/conv_peer.py`'s fields (m = P·Q,
//! n = K, k = C/groups·R·S, batch = N, the layout in `layout`).

use std::sync::Arc;

use anyhow::{bail, Context};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use gemmbridge::conv::{Conv2d, ConvActivation, ConvLayout};
use gemmbridge::cuda::{ConvApi, ConvSearch, Gpu};
use gemmbridge::{DType, Element, Precision};

use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The convolution ops: the forward; bias + ReLU fused (one cuDNN call where cuDNN offers
/// it); the same unfused (the convolution, then cuDNN's bias add and ReLU); the input and the
/// filter gradients.
pub const OPS: [&str; 5] = ["conv_fwd", "conv_bias_relu", "conv_bias_relu_unfused", "conv_dgrad", "conv_wgrad"];

/// One convolution of the suite: (C, H, W, K, R, S, stride, pad), square strides and pads.
pub type ConvShape = (usize, usize, usize, usize, usize, usize, usize, usize);

/// ResNet-50's convolutions, from `bench/resnet50.json` (the file `bench/conv_peer.py` reads
/// too, so both sides time the same shapes).
pub fn resnet50() -> anyhow::Result<Vec<ConvShape>> {
    #[derive(serde::Deserialize)]
    struct Suite {
        shapes: Vec<ConvShape>,
    }
    let suite: Suite = serde_json::from_str(include_str!("../../../../bench/resnet50.json"))?;
    Ok(suite.shapes)
}

/// What the convolution rows run over.
pub struct Plan<'a> {
    pub ops: &'a [String],
    pub dtypes: &'a [(String, Precision)],
    pub layouts: Vec<ConvLayout>,
    pub batches: Vec<usize>,
    pub search: ConvSearch,
    pub api: ConvApi,
}

/// `--conv-layouts` parsed.
pub fn parse_layouts(s: &str) -> anyhow::Result<Vec<ConvLayout>> {
    let mut out = Vec::new();
    for l in crate::lists::entries("--conv-layouts", s)? {
        let layout = match l {
            "nhwc" => ConvLayout::Nhwc,
            "nchw" => ConvLayout::Nchw,
            other => bail!("unknown layout {other:?}; choose nhwc or nchw"),
        };
        if !out.contains(&layout) {
            out.push(layout);
        }
    }
    if out.is_empty() {
        bail!("--conv-layouts names no layout; give nhwc, nchw or both");
    }
    Ok(out)
}

/// `--conv-batches` parsed: batch sizes from 1 to 1024.
pub fn parse_batches(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for b in crate::lists::entries("--conv-batches", s)? {
        let n: usize = b.parse().with_context(|| format!("--conv-batches: {b:?} is not a number"))?;
        if !(1..=1024).contains(&n) {
            bail!("--conv-batches: {n} is not between 1 and 1024");
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    if out.is_empty() {
        bail!("--conv-batches names no batch size");
    }
    Ok(out)
}

/// The direction `Plans::conv2d` and `Plans::conv2d_tactic` name for a convolution op.
pub fn direction(op: &str) -> &'static str {
    match op {
        "conv_fwd" => "forward",
        "conv_dgrad" => "backward_data",
        "conv_wgrad" => "backward_filter",
        _ => "fused",
    }
}

/// `--conv-api` parsed.
pub fn parse_api(s: &str) -> anyhow::Result<ConvApi> {
    Ok(match s {
        "graph" => ConvApi::Graph,
        "legacy" => ConvApi::Legacy,
        other => bail!("unknown --conv-api {other:?}; choose graph or legacy"),
    })
}

/// `--conv-search` parsed.
pub fn parse_search(s: &str) -> anyhow::Result<ConvSearch> {
    Ok(match s {
        "heuristic" => ConvSearch::Heuristic,
        "measured" => ConvSearch::Measured,
        other => bail!("unknown --conv-search {other:?}; choose heuristic or measured"),
    })
}

/// Every row of `plan`, in the peer's order (dtype, layout, batch, shape, op); `each` is
/// called with every row as it is made.
pub fn bench(
    gpu: &Gpu,
    plan: &Plan<'_>,
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    gpu.update_options(|o| (o.conv_search, o.conv_api) = (plan.search, plan.api))?;
    let shapes = resnet50()?;
    let mut rows = Vec::new();
    for (name, precision) in plan.dtypes {
        for &layout in &plan.layouts {
            for &n in &plan.batches {
                for &(c, h, w, k, r, s, stride, pad) in &shapes {
                    let p = Conv2d::new([n, c, h, w], [k, r, s], *precision)
                        .with_stride(stride, stride)
                        .with_pad(pad, pad)
                        .with_layout(layout);
                    let new = match precision.input() {
                        DType::F32 => shape_rows::<f32>(gpu, &p, name, plan.ops, sampling)?,
                        DType::F16 => shape_rows::<half::f16>(gpu, &p, name, plan.ops, sampling)?,
                        DType::BF16 => shape_rows::<half::bf16>(gpu, &p, name, plan.ops, sampling)?,
                        other => bail!("no convolution benchmark for dtype {other}"),
                    };
                    for row in new {
                        each(&row)?;
                        rows.push(row);
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// The device buffers of one problem (x, w, bias, dy, y, dx, dw), random normals, made on
/// stream `s` (and waited for): usable by any `Gpu` of the same device.
pub struct Buffers<T> {
    x: CudaSlice<T>,
    w: CudaSlice<T>,
    b: CudaSlice<T>,
    dy: CudaSlice<T>,
    y: CudaSlice<T>,
    dx: CudaSlice<T>,
    dw: CudaSlice<T>,
}

impl<T: Element + DeviceRepr> Buffers<T> {
    pub fn new(s: &Arc<CudaStream>, p: &Conv2d) -> anyhow::Result<Self> {
        let [lx, lw, ly] = p.lens();
        let up = |v: Vec<T>| -> anyhow::Result<CudaSlice<T>> { Ok(s.clone_htod(&v)?) };
        let (x, w, b, dy) = (up(normal(lx))?, up(normal(lw))?, up(normal(p.k))?, up(normal(ly))?);
        let (y, dx, dw) = (up(normal(ly))?, up(normal(lx))?, up(normal(lw))?);
        s.synchronize()?;
        Ok(Buffers { x, w, b, dy, y, dx, dw })
    }
}

/// One convolution op of `p` on `gpu`, timed as a bench row (`sampling`); the first call
/// makes its plan (a measured search, the database's entry, or the heuristic's). Leaves the
/// fusion setting as the op needs it (off for `conv_bias_relu_unfused`).
pub fn time_op<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &Conv2d,
    bufs: &mut Buffers<T>,
    op: &str,
    sampling: timing::Sampling,
) -> anyhow::Result<timing::Timing> {
    let Buffers { x, w, b, dy, y, dx, dw } = bufs;
    gpu.update_options(|o| o.conv_fusion = op != "conv_bias_relu_unfused")?;
    let t = match op {
        "conv_fwd" => timing::time_gpu(gpu, sampling, &mut || gpu.conv().forward(p, &*x, &*w, &mut *y)),
        "conv_bias_relu" | "conv_bias_relu_unfused" => {
            timing::time_gpu(gpu, sampling, &mut || gpu.conv().fused(p, &*x, &*w, &*b, ConvActivation::Relu, &mut *y))
        }
        "conv_dgrad" => timing::time_gpu(gpu, sampling, &mut || gpu.conv().backward_data(p, &*w, &*dy, &mut *dx)),
        "conv_wgrad" => timing::time_gpu(gpu, sampling, &mut || gpu.conv().backward_filter(p, &*x, &*dy, &mut *dw)),
        other => bail!("unknown convolution op {other:?}"),
    };
    t
}

/// The rows of one problem: its buffers made once, every op timed on them.
fn shape_rows<T: Element + DeviceRepr>(
    gpu: &Gpu,
    p: &Conv2d,
    name: &str,
    ops: &[String],
    sampling: timing::Sampling,
) -> anyhow::Result<Vec<Row>> {
    let mut bufs = Buffers::<T>::new(gpu.stream(), p)?;
    let [_, _, pp, q] = p.y_dims();
    let mut rows = Vec::new();
    for op in ops {
        let t = time_op(gpu, p, &mut bufs, op, sampling)?;
        tracing::info!(problem = %p.describe(), op = %op, plan = ?gpu.plans().conv2d(p, direction(op)), "convolution row");
        let (m, kk) = (pp * q, p.c_per_group() * p.r * p.s);
        rows.push(Row::timed(op, name, [m, p.k, kk, p.n], &t, 2.0 * p.macs(), p.layout.name().to_string()));
    }
    gpu.update_options(|o| o.conv_fusion = true)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_is_resnet50s_eleven_convolutions() {
        let shapes = resnet50().unwrap();
        assert_eq!(shapes.len(), 11);
        assert_eq!(shapes[0], (3, 224, 224, 64, 7, 7, 2, 3));
        assert_eq!(shapes[10], (2048, 7, 7, 512, 1, 1, 1, 0));
    }
}
