//! The problems a `tune` run covers, and each one's benchmark row: the same call `bench`
//! times, so that the confirmation and `--verify` time what `bench --db` will run.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gemmbridge::attention::Attention;
use gemmbridge::conv::Conv2d;
use gemmbridge::cuda::Gpu;
use gemmbridge::grouped::GroupedProblem;
use gemmbridge::{DType, Precision};

use crate::bench::attn;
use crate::bench::conv::{self, Buffers};
use crate::bench::{self, fp8, grouped, Pools};
use crate::suites::Shape;
use crate::timing::Sampling;

/// One problem: a dense GEMM op, an FP8 recipe's `scaled_mm`, a convolution op, an
/// attention op on a shape of `bench/attention.json`, or a grouped op on a shape of
/// `bench/grouped.json`.
#[derive(Clone, Debug)]
pub enum Item {
    Gemm { op: String, dtype: String, precision: Precision, shape: Shape },
    Fp8 { scaling: String, shape: Shape },
    Conv { op: String, dtype: String, precision: Precision, problem: Conv2d },
    Attn { op: String, dtype: String, shape: attn::Shape, problem: Attention },
    Grouped { op: String, dtype: String, shape: grouped::Shape, problem: GroupedProblem },
}

impl Item {
    /// One line naming the problem, as the tables print it.
    pub fn describe(&self) -> String {
        match self {
            Item::Gemm { op, dtype, shape: (m, n, k), .. } => format!("{op:<16} {dtype:<8} {m:>6} {n:>6} {k:>6}"),
            Item::Fp8 { scaling, shape: (m, n, k) } => {
                format!("{:<16} {:<8} {m:>6} {n:>6} {k:>6}", format!("scaled_mm/{scaling}"), "fp8_e4m3")
            }
            Item::Conv { op, dtype, problem: p, .. } => format!(
                "{op:<16} {dtype:<8} {} n{} c{} {}×{} k{} {}×{}/{}",
                p.layout, p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.stride[0]
            ),
            Item::Attn { op, dtype, shape: attn::Shape { name, .. }, .. }
            | Item::Grouped { op, dtype, shape: grouped::Shape { name, .. }, .. } => {
                format!("{op:<16} {dtype:<8} {name}")
            }
        }
    }
}

/// A convolution problem's buffers, of its input type.
enum ConvBufs {
    F32(Buffers<f32>),
    F16(Buffers<half::f16>),
    BF16(Buffers<half::bf16>),
}

/// An attention problem's buffers, of its dtype.
enum AttnBufs {
    F16(attn::Buffers<half::f16>),
    BF16(attn::Buffers<half::bf16>),
}

/// Times items' rows on any `Gpu` of the device. The random inputs are made once, on the home
/// stream (whose `Gpu` outlives the `Rows`), and read by every `Gpu`.
pub struct Rows {
    home: Arc<CudaStream>,
    pools: Pools,
    /// The last convolution problem's buffers (a problem's ops come one after another).
    conv: Option<(Conv2d, ConvBufs)>,
    /// The last attention problem's buffers (with its shape's name: the lengths are the
    /// shape's).
    attn: Option<((String, Attention), AttnBufs)>,
}

impl Rows {
    /// The random pools rows are drawn from (made on the home stream).
    pub fn pools(&mut self) -> &mut Pools {
        &mut self.pools
    }

    pub fn new(home: &Arc<CudaStream>) -> Rows {
        Rows { home: home.clone(), pools: Pools::default(), conv: None, attn: None }
    }

    /// The row's median time per call, ms, timed on `gpu` as `bench` times it (`sampling`:
    /// its gap, warm-up and samples).
    pub fn time(&mut self, gpu: &Gpu, item: &Item, sampling: Sampling) -> anyhow::Result<f64> {
        let median = match item {
            Item::Gemm { op, dtype, precision, shape } => {
                self.pool(precision.input())?;
                let rows = bench::bench_gpu_dispatch(gpu, &mut self.pools, dtype, *precision, *shape, &[op], sampling)?;
                rows[0].median_ms
            }
            Item::Fp8 { scaling, shape } => {
                self.pool(DType::BF16)?;
                let rows = fp8::bench(gpu, &mut self.pools, *shape, std::slice::from_ref(scaling), sampling)?;
                anyhow::ensure!(!rows.is_empty(), "FP8 recipe {scaling} is not offered on this GPU");
                rows[0].median_ms
            }
            Item::Conv { op, precision, problem, .. } => {
                let t = match self.conv_buffers(problem, *precision)? {
                    ConvBufs::F32(b) => conv::time_op(gpu, problem, b, op, sampling)?,
                    ConvBufs::F16(b) => conv::time_op(gpu, problem, b, op, sampling)?,
                    ConvBufs::BF16(b) => conv::time_op(gpu, problem, b, op, sampling)?,
                };
                gpu.update_options(|o| o.conv_fusion = true)?;
                t.median_ms
            }
            Item::Attn { op, shape, problem, .. } => {
                let t = match self.attn_buffers(shape, problem)? {
                    AttnBufs::F16(b) => attn::time_op(gpu, problem, b, op, sampling)?,
                    AttnBufs::BF16(b) => attn::time_op(gpu, problem, b, op, sampling)?,
                };
                t.median_ms
            }
            Item::Grouped { op, dtype, shape, problem } => {
                self.pool(problem.precision().input())?;
                let what = (op.as_str(), shape, problem);
                let row = match problem.precision().input() {
                    DType::F16 => grouped::row::<half::f16>(gpu, &mut self.pools, what, dtype, sampling)?,
                    _ => grouped::row::<half::bf16>(gpu, &mut self.pools, what, dtype, sampling)?,
                };
                row.median_ms
            }
        };
        // the inputs made on this stream are read by other streams next
        gpu.stream().synchronize()?;
        Ok(median)
    }

    /// The random pool of `d` made on the home stream (and waited for) before any row uses it.
    fn pool(&mut self, d: DType) -> anyhow::Result<()> {
        match d {
            DType::F32 => self.pools.get::<f32>(&self.home).map(drop)?,
            DType::F16 => self.pools.get::<half::f16>(&self.home).map(drop)?,
            _ => self.pools.get::<half::bf16>(&self.home).map(drop)?,
        }
        Ok(self.home.synchronize()?)
    }

    fn attn_buffers(&mut self, shape: &attn::Shape, p: &Attention) -> anyhow::Result<&mut AttnBufs> {
        let key = (shape.name.clone(), *p);
        if self.attn.as_ref().is_none_or(|(k, _)| *k != key) {
            self.attn = None; // freed before the next problem's are made
            let bufs = match p.dtype {
                DType::F16 => AttnBufs::F16(attn::Buffers::new(&self.home, shape, p)?),
                _ => AttnBufs::BF16(attn::Buffers::new(&self.home, shape, p)?),
            };
            self.attn = Some((key, bufs));
        }
        Ok(&mut self.attn.as_mut().expect("set above").1)
    }

    fn conv_buffers(&mut self, p: &Conv2d, precision: Precision) -> anyhow::Result<&mut ConvBufs> {
        if self.conv.as_ref().is_none_or(|(q, _)| q != p) {
            self.conv = None; // freed before the next problem's are made
            let bufs = match precision.input() {
                DType::F32 => ConvBufs::F32(Buffers::new(&self.home, p)?),
                DType::F16 => ConvBufs::F16(Buffers::new(&self.home, p)?),
                DType::BF16 => ConvBufs::BF16(Buffers::new(&self.home, p)?),
                other => anyhow::bail!("no convolution for dtype {other}"),
            };
            self.conv = Some((*p, bufs));
        }
        Ok(&mut self.conv.as_mut().expect("set above").1)
    }
}
