//! The convolution entry points on cuDNN: validate (the problem, every buffer's dtype, length,
//! alignment, context and overlap, before anything is enqueued) → plan (once per problem and
//! direction, `dnn/`) → launch on [`Gpu::stream`], no host synchronisation (except a
//! measured search's first call, [`ConvSearch::Measured`](crate::cuda::ConvSearch::Measured)).

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::checks::same_context;
use super::engine::Gpu;
use super::plans::Plans;
use crate::conv::{Conv2d, ConvActivation};
use crate::cuda::device::{refuse_if_capturing, GraphReplay, Needs, Relaxed};
use crate::cuda::dnn::{ConvBuffers, ConvCall, ConvOp};
use crate::cuda::status;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, Which};
use crate::tactics::Tactic;

/// The direction [`Plans::conv2d`] names `name`.
fn direction_op(name: &str) -> Option<ConvOp> {
    Some(match name {
        "forward" => ConvOp::Forward,
        "fused" => ConvOp::Fused(ConvActivation::Relu),
        "fused_identity" => ConvOp::Fused(ConvActivation::Identity),
        "backward_data" => ConvOp::BackwardData,
        "backward_filter" => ConvOp::BackwardFilter,
        _ => return None,
    })
}

/// One operand of a call: which, device address, length in bytes, elements needed.
struct Buf {
    which: Which,
    addr: u64,
    bytes: usize,
    elems: usize,
}

/// The checks every direction shares once the problem is valid: each buffer (dtype by the
/// caller's type, length, element alignment), then that the output overlaps no input.
fn check<T: Element>(p: &Conv2d, inputs: &[Buf], out: &Buf) -> Result<()> {
    if T::DTYPE != p.precision.input() {
        return Err(Error::DTypeMismatch { operand: out.which, expected: p.precision.input(), got: T::DTYPE });
    }
    let elem = T::DTYPE.size_bytes();
    for b in inputs.iter().chain([out]) {
        Error::check_bytes(b.which, b.bytes, b.elems, elem)?;
        if !b.addr.is_multiple_of(elem as u64) {
            return Err(Error::Misaligned { operand: b.which, address: b.addr, align: elem });
        }
    }
    let (o0, o1) = (out.addr, out.addr + (out.elems * elem) as u64);
    for b in inputs {
        let (i0, i1) = (b.addr, b.addr + (b.elems * elem) as u64);
        if o0 < i1 && i0 < o1 {
            return Err(Error::OutputOverlapsInput {
                output: out.which,
                input: b.which,
                out_start: o0,
                out_end: o1,
                in_start: i0,
                in_end: i1,
            });
        }
    }
    Ok(())
}

/// The 2-D convolutions of one [`Gpu`] ([`Gpu::conv`]) on cuDNN: forward ([`GpuConv::forward`], with bias and
/// ReLU fused: [`GpuConv::fused`]), the backward products ([`GpuConv::backward_data`],
/// [`GpuConv::backward_filter`]) and planning ahead ([`GpuConv::prewarm`]), each enqueued on [`Gpu::stream`].
#[derive(Clone, Copy, Debug)]
pub struct GpuConv<'a> {
    pub(super) gpu: &'a Gpu,
}

impl Gpu {
    /// The 2-D convolutions ([`GpuConv`]).
    pub fn conv(&self) -> GpuConv<'_> {
        GpuConv { gpu: self }
    }
}

impl GpuConv<'_> {
    /// `y = x ⋆ w` (PyTorch's `F.conv2d(x, w)` with `p`'s stride, padding, dilation and groups)
    /// on [`Gpu::stream`], through cuDNN: `x[N, C, H, W]`, `w[K, C/groups, R, S]`,
    /// `y[N, K, P, Q]` in `p.layout` ([`crate::conv`] gives the shapes and layouts), all of
    /// `p.precision`'s input dtype. `y` is overwritten.
    ///
    /// The first call of a problem (per direction and buffer alignment) makes its plan: a cuDNN
    /// graph-API execution plan, the engine chosen by
    /// [`GpuOptions::conv_search`](crate::cuda::GpuOptions::conv_search) (the legacy API's
    /// algorithm where no graph engine qualifies, or with
    /// [`GpuOptions::conv_api`](crate::cuda::GpuOptions::conv_api)); later calls only launch, and
    /// can be captured into a CUDA graph ([`GpuConv::prewarm`] plans ahead). A call repeated with
    /// the same buffers on the same stream is captured into a graph once (on its second call, by
    /// default) and from then on launched as that graph
    /// ([`GpuOptions::graph_replay`](crate::cuda::GpuOptions::graph_replay) governs it as for
    /// GEMMs, at every size). The plan's workspace is this stream's
    /// ([`GpuOptions::workspace_bytes`](crate::cuda::GpuOptions::workspace_bytes)) where it fits,
    /// else the cuDNN room's own, up to
    /// [`GpuOptions::conv_workspace_limit`](crate::cuda::GpuOptions::conv_workspace_limit).
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::ConvShape`] / [`Error::Unsupported`] from
    /// [`Conv2d::validate`]; [`Error::DTypeMismatch`], [`Error::BufferTooSmall`],
    /// [`Error::Misaligned`], [`Error::OutputOverlapsInput`], [`Error::WrongContext`] for a
    /// buffer; [`Error::LibraryNotFound`] without libcudnn; [`Error::NotCapturable`] for a
    /// first call inside a capture. From cuDNN: [`Error::Cudnn`] naming the call and status.
    pub fn forward<T: Element, X: DevicePtr<T>, W: DevicePtr<T>, Y: DevicePtrMut<T>>(
        &self,
        p: &Conv2d,
        x: &X,
        w: &W,
        y: &mut Y,
    ) -> Result<()> {
        let gpu = self.gpu;
        gpu.conv_launch::<T>(p, ConvOp::Forward, [Some(x as &dyn DevicePtr<T>), Some(w), None], y)
    }

    /// `y = act(x ⋆ w + b)` with `b[K]` (one value per output channel) and `act` ReLU or the
    /// identity: PyTorch's `relu(F.conv2d(x, w, b))` as one cuDNN operation graph (convolution,
    /// bias add, ReLU) where an engine takes it (the legacy API:
    /// `cudnnConvolutionBiasActivationForward`), else as the convolution, `cudnnAddTensor`
    /// and (ReLU) `cudnnActivationForward` (the choice is logged once per problem at `info`
    /// level, and [`Plans::conv2d`](crate::cuda::Plans::conv2d) says `unfused` for the separate calls).
    /// Otherwise as [`GpuConv::forward`].
    ///
    /// # Errors
    /// As [`GpuConv::forward`], the bias included ([`Which::Bias`]).
    pub fn fused<T: Element, X: DevicePtr<T>, W: DevicePtr<T>, B: DevicePtr<T>, Y: DevicePtrMut<T>>(
        &self,
        p: &Conv2d,
        x: &X,
        w: &W,
        bias: &B,
        act: ConvActivation,
        y: &mut Y,
    ) -> Result<()> {
        let gpu = self.gpu;
        gpu.conv_launch::<T>(p, ConvOp::Fused(act), [Some(x as &dyn DevicePtr<T>), Some(w), Some(bias)], y)
    }

    /// The gradient of the input, `dx = ∂L/∂x` from `dy = ∂L/∂y` and the filter `w`
    /// (PyTorch's `conv2d` backward for `x`), on [`Gpu::stream`]: `dx` has x's shape and is
    /// overwritten.
    ///
    /// # Errors
    /// As [`GpuConv::forward`].
    pub fn backward_data<T: Element, W: DevicePtr<T>, D: DevicePtr<T>, DX: DevicePtrMut<T>>(
        &self,
        p: &Conv2d,
        w: &W,
        dy: &D,
        dx: &mut DX,
    ) -> Result<()> {
        let gpu = self.gpu;
        gpu.conv_launch::<T>(p, ConvOp::BackwardData, [Some(w as &dyn DevicePtr<T>), Some(dy), None], dx)
    }

    /// The gradient of the filter, `dw = ∂L/∂w` from the input `x` and `dy` (PyTorch's
    /// `conv2d` backward for `w`), on [`Gpu::stream`]: `dw` has w's shape and is
    /// overwritten.
    ///
    /// # Errors
    /// As [`GpuConv::forward`].
    pub fn backward_filter<T: Element, X: DevicePtr<T>, D: DevicePtr<T>, DW: DevicePtrMut<T>>(
        &self,
        p: &Conv2d,
        x: &X,
        dy: &D,
        dw: &mut DW,
    ) -> Result<()> {
        let gpu = self.gpu;
        gpu.conv_launch::<T>(p, ConvOp::BackwardFilter, [Some(x as &dyn DevicePtr<T>), Some(dy), None], dw)
    }

    /// Plans every direction of each problem — forward, fused forward with ReLU and with the
    /// identity, backward data, backward filter — on zero-filled scratch buffers of the problem's
    /// sizes (allocated and freed here), so that later calls with buffers aligned as allocations
    /// are (16 bytes or more) only launch and can be captured into a CUDA graph. A measured search
    /// ([`GpuOptions::conv_search`](crate::cuda::GpuOptions::conv_search)) runs here. Synchronises
    /// the stream.
    ///
    /// # Errors
    /// As the directions' entry points ([`GpuConv::forward`] and the rest) for each problem.
    pub fn prewarm(&self, problems: &[Conv2d]) -> Result<()> {
        let gpu = self.gpu;
        let _relaxed = Relaxed::enter()?;
        for p in problems {
            p.validate()?;
            match p.precision.input() {
                DType::F16 => gpu.prewarm_one::<half::f16>(p)?,
                DType::BF16 => gpu.prewarm_one::<half::bf16>(p)?,
                _ => gpu.prewarm_one::<f32>(p)?,
            }
        }
        gpu.stream().synchronize().map_err(status::driver("cuStreamSynchronize"))
    }
}

impl Gpu {
    fn prewarm_one<T: Element + DeviceRepr + ValidAsZeroBits>(&self, p: &Conv2d) -> Result<()> {
        let s = self.stream();
        let [lx, lw, ly] = p.lens();
        let zeros = |n: usize| s.alloc_zeros::<T>(n.max(1)).map_err(status::driver("cuMemAllocAsync"));
        let (x, w, b) = (zeros(lx)?, zeros(lw)?, zeros(p.k)?);
        let (mut y, mut dx, mut dw) = (zeros(ly)?, zeros(lx)?, zeros(lw)?);
        self.conv().forward(p, &x, &w, &mut y)?;
        for act in [ConvActivation::Relu, ConvActivation::Identity] {
            self.conv().fused(p, &x, &w, &b, act, &mut y)?;
        }
        self.conv().backward_data(p, &w, &y, &mut dx)?;
        self.conv().backward_filter(p, &x, &y, &mut dw)
    }

    /// Validate → plan → launch for one direction: `ins` are (forward) x, w, bias; (backward
    /// data) w, dy; (backward filter) x, dy; `out` is y, dx or dw.
    fn conv_launch<T: Element>(
        &self,
        p: &Conv2d,
        op: ConvOp,
        ins: [Option<&dyn DevicePtr<T>>; 3],
        out: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        p.validate()?;
        let [lx, lw, ly] = p.lens();
        let (in_which, out_which, out_elems) = match op {
            ConvOp::Forward | ConvOp::Fused(_) => {
                ([(Which::ConvX, lx), (Which::ConvW, lw), (Which::Bias, p.k)], Which::ConvY, ly)
            }
            ConvOp::BackwardData => ([(Which::ConvW, lw), (Which::ConvY, ly), (Which::Bias, 0)], Which::ConvX, lx),
            ConvOp::BackwardFilter => ([(Which::ConvX, lx), (Which::ConvY, ly), (Which::Bias, 0)], Which::ConvW, lw),
        };
        let (ctx, s) = (self.context(), self.stream());
        for (b, (which, _)) in ins.iter().zip(in_which) {
            if let Some(b) = b {
                same_context(which, b.stream(), ctx)?;
            }
        }
        same_context(out_which, out.stream(), ctx)?;
        let mut guards = Vec::with_capacity(3);
        let mut bufs = Vec::with_capacity(3);
        for (b, (which, elems)) in ins.iter().zip(in_which) {
            if let Some(b) = b {
                let (addr, g) = b.device_ptr(s);
                guards.push(g);
                bufs.push(Buf { which, addr, bytes: b.num_bytes(), elems });
            }
        }
        let out_bytes = out.num_bytes();
        let (out_addr, out_guard) = out.device_ptr_mut(s);
        let o = Buf { which: out_which, addr: out_addr, bytes: out_bytes, elems: out_elems };
        check::<T>(p, &bufs, &o)?;
        let addr = |w: Which| bufs.iter().find(|b| b.which == w).map_or(0, |b| b.addr);
        let b = match op {
            ConvOp::Forward | ConvOp::Fused(_) => {
                ConvBuffers { x: addr(Which::ConvX), w: addr(Which::ConvW), y: out_addr, bias: addr(Which::Bias) }
            }
            ConvOp::BackwardData => ConvBuffers { x: out_addr, w: addr(Which::ConvW), y: addr(Which::ConvY), bias: 0 },
            ConvOp::BackwardFilter => {
                ConvBuffers { x: addr(Which::ConvX), w: out_addr, y: addr(Which::ConvY), bias: 0 }
            }
        };
        let stream = s.cu_stream();
        self.device().bind()?;
        let mut st = self.lock();
        let st = &mut *st;
        let planned = st.libs.dnn.as_ref().is_some_and(|d| d.has_plan(p, op, &b));
        if !planned {
            let needs = Needs::Plan("plan a convolution (cuDNN descriptors and algorithm choice)");
            refuse_if_capturing(stream, needs, || format!("{} {op:?}", p.describe()))?;
        }
        // Planning may allocate, load modules and time candidates: allowed while another
        // thread captures in global mode.
        let _relaxed = if planned { None } else { Some(Relaxed::enter()?) };
        let ctx = self.context();
        st.libs.ensure_dnn(ctx.is_primary().then(|| ctx.ordinal()))?;
        let ws = st.dev.workspaces.get(stream, &|| p.describe())?;
        let replay = st.libs.lt.as_ref().map_or_else(GraphReplay::default, |lt| lt.replay.options);
        let cap = if replay.enabled { st.dev.capture_stream().map(|c| c.raw()) } else { None };
        let dnn = st.libs.dnn.as_mut().expect("created above");
        // SAFETY: every address was checked above against the problem's sizes and belongs to
        // this context, borrowed (guards) until the call is enqueued; the workspace is this
        // stream's; the stream is the Gpu's own, live; `cap` is the device's capture stream.
        let call = ConvCall { problem: p, op, buffers: b, workspace: (ws.ptr, ws.matmul_bytes), stream };
        let r = unsafe { dnn.run(&call, replay, cap) };
        drop((guards, out_guard));
        r
    }
}

impl Plans<'_> {
    /// The algorithm planned for a direction of `p` (name, math type, workspace), once its
    /// first call has run: `forward`, `fused` (bias + ReLU), `fused_identity` (bias only),
    /// `backward_data` or `backward_filter`; `None` for another name or before the first call.
    /// A fused direction that runs as separate calls (the convolution, `cudnnAddTensor`,
    /// `cudnnActivationForward`) says `unfused`.
    pub fn conv2d(&self, p: &Conv2d, direction: &str) -> Option<String> {
        let op = direction_op(direction)?;
        self.gpu.lock().libs.dnn.as_ref().and_then(|d| d.describe_plan(p, op))
    }

    /// The plan a measured search ([`ConvSearch::Measured`](crate::cuda::ConvSearch::Measured))
    /// chose for a direction of `p` (named as for [`Plans::conv2d`]; under the current fusion and
    /// API settings ([`GpuOptions::conv_fusion`](crate::cuda::GpuOptions::conv_fusion),
    /// [`GpuOptions::conv_api`](crate::cuda::GpuOptions::conv_api)), for buffers aligned as
    /// allocations are) as a tactic for the database: its signature (the "conv2d" key,
    /// [`crate::tactics`]) and the [`Tactic`] (cuDNN, this cuDNN version, the engine and knobs or
    /// the legacy algorithm, the workspace, the heuristic's and the chosen plan's measured times).
    /// Insert it into a [`crate::tactics::TacticDb`] and save it; [`Plans::load_tactics`] uses it.
    /// `None` before the first call, for a heuristic choice and for a plan that came from the
    /// database.
    pub fn conv2d_tactic(&self, p: &Conv2d, direction: &str) -> Option<(String, Tactic)> {
        let op = direction_op(direction)?;
        self.gpu.lock().libs.dnn.as_ref().and_then(|d| d.tactic(p, op))
    }

    /// [`Plans::conv2d_tactic`] of every convolution plan a measured search chose so far (every
    /// problem, direction, fusion setting, API and alignment), sorted by signature.
    pub fn conv2d_tactics(&self) -> Vec<(String, Tactic)> {
        self.gpu.lock().libs.dnn.as_ref().map(|d| d.tactics()).unwrap_or_default()
    }
}
