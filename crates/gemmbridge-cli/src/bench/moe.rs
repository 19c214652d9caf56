//! The mixture-of-experts layer rows of `gemmbridge bench` (`--ops moe_fwd,moe_fwd_bwd`): one
//! MoE feed-forward step, bf16, on the layers of `bench/moe.json` (the file
//! `bench/moe_peer.py` reads too). The forward: router logits `x·Wrᵀ` (a GEMM), the router's
//! top-k and sort ([`GpuMoe::route`]), x's rows gathered into expert order
//! ([`GpuMoe::gather`]), the gate/up projection, SwiGLU and the down projection as grouped
//! products ([`Gpu::grouped_gemm`], the engine's way for the sizes), and the weighted combine
//! reading each slot's row through the router's `pos` (the unpermute fused into it). The
//! grouped products take host group sizes: the router's group starts are copied to the host
//! once per step (the only host synchronisation; cuDNN's MoE grouped matmul, which takes them
//! on the device, is several times slower on Hopper with cuDNN 9.19 and has no backward).
//! Where [`gemmbridge::moe::capacity`] says it pays (`--moe-layout auto`), the routing is laid
//! out with every expert padded to the largest group ([`MoeRouting::pad`]) before x is
//! gathered, so every product is one strided batch of equal groups. The
//! backward: the combine's (the router logits' gradient with it, the output gradient written
//! in expert order), the two data gradients and the two weight gradients as grouped products,
//! SwiGLU's, the input gradient summed per token by a combine without weights, and the
//! router's two GEMMs. A row's m is the tokens, n the hidden size, k the intermediate size,
//! batch the experts, layout the layer's name; its TFLOP/s counts the expert GEMMs and the
//! router's (forward: `6·R·H·I + 2·S·H·E` for R = S·k routed rows; forward and backward three
//! times that).

use cudarc::driver::CudaSlice;
use gemmbridge::cuda::{Gpu, MoeCombineGrads, MoeRouting};
use gemmbridge::grouped::{GroupedOp, GroupedProblem};
use gemmbridge::half::bf16;
use gemmbridge::layer_ops::{GluLayout, SwiGlu};
use gemmbridge::moe::{MoeCombine, MoeRouter};
use gemmbridge::{DType, GemmProblem, MatrixLayout, Operand, Precision};

use crate::random::normal;
use crate::row::Row;
use crate::timing;

/// The ops: the forward, the forward and backward.
pub const OPS: [&str; 2] = ["moe_fwd", "moe_fwd_bwd"];

/// One layer of `bench/moe.json`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Shape {
    pub name: String,
    pub tokens: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
}

impl Shape {
    /// Routed rows R = S·k.
    pub fn rows(&self) -> usize {
        self.tokens * self.top_k
    }

    /// Floating-point operations of a forward: the expert GEMMs (`6·R·H·I`) and the router's
    /// (`2·S·H·E`).
    pub fn forward_flops(&self) -> f64 {
        let (r, h, i) = (self.rows() as f64, self.hidden as f64, self.intermediate as f64);
        6.0 * r * h * i + 2.0 * (self.tokens * self.hidden * self.experts) as f64
    }
}

/// The layers of `bench/moe.json`.
pub fn shapes() -> anyhow::Result<Vec<Shape>> {
    super::suite_shapes(include_str!("../../../../bench/moe.json"), "bench/moe.json")
}

/// A layer's weights, activations and gradients on the GPU.
struct Layer {
    s: Shape,
    routing: MoeRouting,
    /// Whether the capacity layout may be used.
    pad: bool,
    /// Rows per expert, from the last forward's routing (the capacity, each, when padded).
    sizes: Vec<usize>,
    combine: MoeCombine,
    /// SwiGLU over the last forward's rows in expert order.
    glu: SwiGlu,
    /// x, Wr, W_gu `[E, 2I, H]`, W_d `[E, H, I]`, dy.
    x: CudaSlice<bf16>,
    wr: CudaSlice<bf16>,
    w_gu: CudaSlice<bf16>,
    w_d: CudaSlice<bf16>,
    dy: CudaSlice<bf16>,
    /// Forward: logits, x in expert order, h `[R, 2I]`, a `[R, I]`, o `[R, H]` (expert order), y.
    logits: CudaSlice<bf16>,
    xs: CudaSlice<bf16>,
    h: CudaSlice<bf16>,
    a: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    y: CudaSlice<bf16>,
    /// Backward.
    d_o: CudaSlice<bf16>,
    d_w: CudaSlice<f32>,
    d_logits: CudaSlice<bf16>,
    d_a: CudaSlice<bf16>,
    d_h: CudaSlice<bf16>,
    dxs: CudaSlice<bf16>,
    dx: CudaSlice<bf16>,
    dwr: CudaSlice<bf16>,
    dw_gu: CudaSlice<bf16>,
    dw_d: CudaSlice<bf16>,
}

impl Layer {
    fn new(gpu: &Gpu, s: &Shape, pad: bool) -> anyhow::Result<Layer> {
        let (t, h, i, e, k) = (s.tokens, s.hidden, s.intermediate, s.experts, s.top_k);
        // rows in expert order: at most the capacity rule's bound when padding
        let r = if pad { (s.rows() as f64 * gemmbridge::moe::PAD_LIMIT) as usize + 8 * e } else { s.rows() };
        let router = MoeRouter { tokens: t, experts: e, top_k: k, dtype: DType::BF16 };
        let st = gpu.stream();
        let up = |n: usize| st.clone_htod(&normal::<bf16>(n));
        let zeros = |n: usize| st.alloc_zeros::<bf16>(n);
        // weights scaled as an initialisation would (so activations stay of order 1)
        let scaled = |n: usize, fan_in: usize| {
            let v: Vec<bf16> =
                normal::<bf16>(n).iter().map(|x| bf16::from_f32(x.to_f32() / (fan_in as f32).sqrt())).collect();
            st.clone_htod(&v)
        };
        Ok(Layer {
            routing: MoeRouting::new(gpu, &router)?,
            pad,
            sizes: vec![0; e],
            combine: MoeCombine { tokens: t, top_k: k, n: h, dtype: DType::BF16 },
            glu: SwiGlu::new(s.rows(), i, GluLayout::Halves),
            x: up(t * h)?,
            wr: scaled(e * h, h)?,
            w_gu: scaled(e * 2 * i * h, h)?,
            w_d: scaled(e * h * i, i)?,
            dy: up(t * h)?,
            logits: zeros(t * e)?,
            xs: zeros(r * h)?,
            h: zeros(r * 2 * i)?,
            a: zeros(r * i)?,
            o: zeros(r * h)?,
            y: zeros(t * h)?,
            d_o: zeros(r * h)?,
            d_w: st.alloc_zeros::<f32>(s.rows())?,
            d_logits: zeros(t * e)?,
            d_a: zeros(r * i)?,
            d_h: zeros(r * 2 * i)?,
            dxs: zeros(r * h)?,
            dx: zeros(t * h)?,
            dwr: zeros(e * h)?,
            dw_gu: zeros(e * 2 * i * h)?,
            dw_d: zeros(e * h * i)?,
            s: s.clone(),
        })
    }

    /// The grouped product `op` of N = `n`, K = `k` over the last routing's sizes.
    fn grouped(&self, op: GroupedOp, (n, k): (usize, usize)) -> gemmbridge::Result<GroupedProblem> {
        GroupedProblem::new(op, &self.sizes, n, k, Precision::BF16)
    }

    fn forward(&mut self, gpu: &Gpu) -> gemmbridge::Result<()> {
        let (t, h, i, e, r) = (self.s.tokens, self.s.hidden, self.s.intermediate, self.s.experts, self.s.rows());
        gpu.gemm(&GemmProblem::linear(t, e, h, Precision::BF16)?, 1.0, &self.x, &self.wr, 0.0, &mut self.logits)?;
        gpu.moe().route(&self.logits, &mut self.routing)?;
        let starts: Vec<i32> = gpu
            .stream()
            .clone_dtoh(self.routing.starts())
            .map_err(|e| gemmbridge::Error::Driver { operation: "cuMemcpyDtoHAsync", status: e.to_string() })?;
        self.sizes = gemmbridge::moe::sizes_of(&starts, r);
        if let Some(cap) = gemmbridge::moe::capacity(&self.sizes).filter(|_| self.pad) {
            self.routing.pad(gpu, cap)?;
            self.sizes = vec![cap; e];
        }
        self.glu = SwiGlu::new(self.routing.rows(), i, GluLayout::Halves);
        gpu.moe().gather(self.routing.index(), h, &self.x, &mut self.xs)?;
        gpu.grouped_gemm(&self.grouped(GroupedOp::Forward, (2 * i, h))?, &self.xs, &self.w_gu, &mut self.h, None)?;
        gpu.swiglu(&self.glu, &self.h, &mut self.a)?;
        gpu.grouped_gemm(&self.grouped(GroupedOp::Forward, (h, i))?, &self.a, &self.w_d, &mut self.o, None)?;
        let rt = &self.routing;
        gpu.moe().combine(&self.combine, (&self.o, Some(rt.pos())), Some(rt.weights()), &mut self.y)
    }

    fn backward(&mut self, gpu: &Gpu) -> gemmbridge::Result<()> {
        let (t, h, i, e) = (self.s.tokens, self.s.hidden, self.s.intermediate, self.s.experts);
        let (bf, rt) = (Precision::BF16, &self.routing);
        let grads = MoeCombineGrads { d_o: &mut self.d_o, dw: &mut self.d_w, dlogits: &mut self.d_logits };
        gpu.moe().combine_backward(&self.combine, (rt, true), (&self.dy, &self.o), grads)?;
        // the down projection's data and weight gradients, SwiGLU's, the gate/up projection's
        let (dd, dwd) =
            (self.grouped(GroupedOp::BackwardData, (h, i))?, self.grouped(GroupedOp::BackwardWeight, (h, i))?);
        gpu.grouped_gemm(&dd, &self.d_o, &self.w_d, &mut self.d_a, None)?;
        gpu.grouped_gemm(&dwd, &self.d_o, &self.a, &mut self.dw_d, None)?;
        gpu.swiglu_backward(&self.glu, &self.d_a, &self.h, &mut self.d_h)?;
        let (dgu, dwgu) =
            (self.grouped(GroupedOp::BackwardData, (2 * i, h))?, self.grouped(GroupedOp::BackwardWeight, (2 * i, h))?);
        gpu.grouped_gemm(&dwgu, &self.d_h, &self.xs, &mut self.dw_gu, None)?;
        gpu.grouped_gemm(&dgu, &self.d_h, &self.w_gu, &mut self.dxs, None)?;
        // the input gradient: expert order, summed per token through pos, plus the router's
        gpu.moe().combine(&self.combine, (&self.dxs, Some(rt.pos())), None, &mut self.dx)?;
        gpu.gemm(&GemmProblem::matmul(t, h, e, bf)?, 1.0, &self.d_logits, &self.wr, 1.0, &mut self.dx)?;
        let dwr = GemmProblem::new(
            Operand::t(MatrixLayout::row_major(t, e)),
            Operand::n(MatrixLayout::row_major(t, h)),
            MatrixLayout::row_major(e, h),
            1,
            bf,
        )?;
        gpu.gemm(&dwr, 1.0, &self.d_logits, &self.x, 0.0, &mut self.dwr)
    }
}

/// Every row: each op of `ops` on each layer, with bf16 in `dtypes`, in the capacity layout
/// where the rule says and `pad` allows it; `each` is called with every row as it is made.
pub fn bench(
    gpu: &Gpu,
    (ops, pad): (&[String], bool),
    dtypes: &[(String, Precision)],
    sampling: timing::Sampling,
    each: &mut dyn FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    if !dtypes.iter().any(|(n, _)| n == "bf16") {
        eprintln!("moe rows: skipped (they run in bf16, and --dtypes does not name it)");
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    for s in shapes()? {
        let mut layer = Layer::new(gpu, &s, pad)?;
        layer.forward(gpu)?;
        match layer.routing.capacity() {
            Some(cap) => eprintln!(
                "{}: capacity layout, {cap} rows per expert ({:.3}× the routed rows)",
                s.name,
                (cap * s.experts) as f64 / s.rows() as f64
            ),
            None => eprintln!("{}: sorted layout (largest group {:?})", s.name, layer.sizes.iter().max()),
        }
        for op in ops {
            let backward = op == "moe_fwd_bwd";
            let mut step = || -> gemmbridge::Result<()> {
                layer.forward(gpu)?;
                if backward {
                    layer.backward(gpu)?;
                }
                Ok(())
            };
            let t = timing::time_gpu(gpu, sampling, &mut step)?;
            let flops = s.forward_flops() * if backward { 3.0 } else { 1.0 };
            let dims = [s.tokens, s.hidden, s.intermediate, s.experts];
            let row = Row::timed(op, "bf16", dims, &t, flops, s.name.clone());
            each(&row)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layers_are_qwen3s_and_mixtrals() {
        let all = shapes().unwrap();
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["qwen3-30b-a3b", "mixtral-8x7b"]);
        // Qwen3: 32768 routed rows, 6·R·H·I = 309 GFLOP of expert GEMMs and 2.1 of router
        assert_eq!(all[0].rows(), 32768);
        assert!((all[0].forward_flops() / 1e9 - 311.4).abs() < 0.1, "{}", all[0].forward_flops());
        for s in &all {
            let r = MoeRouter { tokens: s.tokens, experts: s.experts, top_k: s.top_k, dtype: DType::BF16 };
            r.validate().unwrap();
        }
    }
}
