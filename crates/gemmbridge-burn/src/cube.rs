//! The CUDA backend: burn's buffers handed to gemmbridge by address.
//!
//! `GemmOps` is implemented for every `CubeBackend<R, …>`; a call is served when `R` is
//! `CudaRuntime` (checked at run time by type), and runs burn's own op for the other cubecl
//! runtimes (wgpu, cpu, rocm).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::cuda::CudaRuntime;
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale};
use gemmbridge::{Epilogue, Precision};

use cubecl::stream_id::StreamId;
use gemmbridge::cuda::tactics::TacticDb;
use gemmbridge::cudarc::driver::sys;

use crate::layout::{after_epilogue, plan, plan_linear, Fallback, MatmulPlan};
use crate::order::{self, GemmOrdering};
use crate::{activate, burn_linear, Activation, GemmOps};

type Cuda = CubeTensor<CudaRuntime>;

type Slot = Option<(Arc<Gpu>, u32)>;

/// The `Gpu`s [`gpu`] opened, by (device index, device-ordered), with their SM counts.
fn gpus() -> &'static Mutex<HashMap<(usize, bool), Slot>> {
    static GPUS: OnceLock<Mutex<HashMap<(usize, bool), Slot>>> = OnceLock::new();
    GPUS.get_or_init(Default::default)
}

/// The tactic database [`crate::load_tactics`] gave, for `Gpu`s opened later.
fn tactics() -> &'static Mutex<Option<TacticDb>> {
    static DB: OnceLock<Mutex<Option<TacticDb>>> = OnceLock::new();
    DB.get_or_init(Default::default)
}

/// Gives every `Gpu` of the adapter, open or opened later, the entries of `db`.
pub(crate) fn load_tactics(db: &TacticDb) {
    *tactics().lock().unwrap_or_else(|p| p.into_inner()) = Some(db.clone());
    for (g, _) in gpus().lock().unwrap_or_else(|p| p.into_inner()).values().flatten() {
        g.plans().load_tactics(db);
    }
}

/// gemmbridge `Gpu`s per device index, opened on first use (None when one cannot be): one for
/// host-wait ordering, on the whole GPU, and one for device ordering, whose GEMMs leave
/// [`crate::sm_reserve`] SMs to the wait kernel that spins on the caller's stream meanwhile
/// (`order.rs`; [`GpuOptions::sm_count_target`](gemmbridge::cuda::GpuOptions::sm_count_target) says
/// why).
pub(crate) fn gpu(index: usize, device_ordered: bool) -> Option<Arc<Gpu>> {
    let (g, sms) = gpus()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((index, device_ordered))
        .or_insert_with(|| match Gpu::new(index) {
            Ok(g) => {
                let sms = g.info().map(|i| i.sm_count.max(1) as u32).unwrap_or(1);
                if let Some(db) = tactics().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    g.plans().load_tactics(db);
                }
                Some((Arc::new(g), sms))
            }
            Err(e) => {
                tracing::warn!("gemmbridge-burn: no gemmbridge GPU {index} ({e}); using burn's ops");
                None
            }
        })
        .clone()?;
    if device_ordered {
        let reserve = crate::sm_reserve();
        if reserve >= sms {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!("gemmbridge-burn: SM reserve {reserve} is not below the GPU's {sms} SMs; all SMs used")
            });
        }
        let want = (reserve > 0 && reserve < sms).then(|| sms - reserve);
        if g.options().sm_count_target != want {
            if let Err(e) = g.update_options(|o| o.sm_count_target = want) {
                tracing::warn!("gemmbridge-burn: SM count target {want:?} refused ({e}); all SMs used");
            }
        }
    }
    Some(g)
}

fn precision(dtype: DType) -> Option<Precision> {
    match dtype {
        DType::F32 if crate::tf32() => Some(Precision::TF32),
        DType::F32 => Some(Precision::F32),
        DType::F16 => Some(Precision::F16),
        DType::BF16 => Some(Precision::BF16),
        _ => None,
    }
}

fn same_precision(ts: &[&Cuda]) -> Result<Precision, Fallback> {
    let dtype = ts[0].dtype;
    precision(dtype)
        .filter(|_| ts.iter().all(|t| t.dtype == dtype))
        .ok_or_else(|| Fallback::Problem(format!("dtypes {:?}", ts.iter().map(|t| t.dtype).collect::<Vec<_>>())))
}

/// Runs a planned GEMM on burn's buffers: `out = epilogue(a·b [+ bias])`; `bias` is the
/// epilogue's vector, read (a bias) or written (a bias gradient, `BiasGradB`).
///
/// Ordering with the caller's cubecl stream (cubecl 0.10 exposes no CUstream): the
/// [`GemmOrdering`] set, device ordering by default (`order.rs` explains both; the debug log
/// names the ordering each call used). The address lookups and the enqueue run in one task on
/// cubecl's device thread (`client.exclusive`), where cubecl's own calls execute inline.
fn run(p: &MatmulPlan, a: &Cuda, b: &Cuda, bias: Option<&Cuda>) -> Result<Cuda, Fallback> {
    if b.device != a.device || bias.is_some_and(|t| t.device != a.device) {
        return Err(Fallback::Problem("operands on different devices".into()));
    }
    let client = a.client.clone();
    // the output, from burn's allocator on the calling thread's cubecl stream (queued, no wait)
    let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        client.clone(),
        a.device.clone(),
        Shape::from(p.out_shape.clone()),
        a.dtype,
    );
    let current = StreamId::current().value;
    let ordering = match order::get() {
        GemmOrdering::Device => {
            let streams: Vec<u64> = [a, b, &out].into_iter().chain(bias).map(|t| t.handle.stream.value).collect();
            match order::device_refusal(current, &streams) {
                None => GemmOrdering::Device,
                Some(why) => {
                    tracing::debug!(%why, "gemmbridge-burn: host-wait ordering for this call");
                    GemmOrdering::HostWait
                }
            }
        }
        o => o,
    };
    let gpu = gpu(a.device.index, ordering == GemmOrdering::Device)
        .ok_or_else(|| Fallback::Problem("no gemmbridge GPU".into()))?;
    let call = Call { gpu: &gpu, client: &client, p, a, b, bias, out: &out };
    match ordering {
        GemmOrdering::Device => {
            let task = |edge: order::Edge| {
                let (r, back) = client
                    .exclusive(|| call.device_task(edge))
                    .unwrap_or_else(|e| (Err(Fallback::Problem(format!("cubecl device thread: {e:?}"))), false));
                ((r, back), back)
            };
            let (r, on_device) =
                order::device_ordered(&client, a.device.index, current, task).map_err(Fallback::Problem)?;
            r?;
            crate::count_ordering(on_device);
            let used = if on_device { "device" } else { "host-wait" };
            tracing::debug!(cubecl_stream = current, "gemmbridge-burn: {used} ordering");
        }
        _ => {
            client
                .exclusive(|| call.host_wait_task())
                .map_err(|e| Fallback::Problem(format!("cubecl device thread: {e:?}")))??;
            crate::count_ordering(false);
            tracing::debug!(cubecl_stream = current, "gemmbridge-burn: host-wait ordering");
        }
    }
    Ok(out)
}

/// One adapter GEMM's operands, for the tasks that run on cubecl's device thread.
struct Call<'a> {
    gpu: &'a Gpu,
    client: &'a cubecl::client::ComputeClient<CudaRuntime>,
    p: &'a MatmulPlan,
    a: &'a Cuda,
    b: &'a Cuda,
    bias: Option<&'a Cuda>,
    out: &'a Cuda,
}

impl Call<'_> {
    /// Looks the buffers up and enqueues the GEMM on gemmbridge's stream `s`.
    ///
    /// # Safety
    /// The caller orders the GEMM after the inputs' producers and before any reader of the
    /// output or reuse of the inputs' memory (host waits or device edges).
    unsafe fn enqueue(&self, s: sys::CUstream) -> Result<(), Fallback> {
        let resource = |t: &Cuda| {
            self.client.get_resource(t.handle.clone()).map_err(|e| Fallback::Problem(format!("get_resource: {e:?}")))
        };
        // the bindings keep the memory from being handed out again until they drop (and the
        // tensors themselves outlive the call: borrowed by `run`, the output returned)
        let (ra, rb, rc) = (resource(self.a)?, resource(self.b)?, resource(self.out)?);
        let rbias = self.bias.map(resource).transpose()?;
        // (cubecl's GpuResource type is not nameable outside cubecl-cuda; its fields are public)
        let raw = |ptr: u64, size: u64| RawBuffer { address: ptr, len_bytes: size as usize };
        let (ba, bb, bc) = (
            raw(ra.resource().ptr, ra.resource().size),
            raw(rb.resource().ptr, rb.resource().size),
            raw(rc.resource().ptr, rc.resource().size),
        );
        let bias = rbias.as_ref().map(|r| raw(r.resource().ptr, r.resource().size));
        // SAFETY: the addresses are live cubecl allocations of the primary context (which
        // gemmbridge's Gpu shares), held by the bindings above and by the tensors; ordering is
        // the caller's contract; gemmbridge checks their lengths and alignment against the
        // layouts.
        let r = unsafe {
            self.gpu.gemm_raw(
                &self.p.problem,
                Scale::PRODUCT,
                RawOperands { a: ba, b: bb, c: bc, c_in: None, bias, aux: None },
                s,
            )
        };
        r.map_err(|e| Fallback::Problem(e.to_string()))
    }

    /// Host-wait ordering: waits for the caller's cubecl stream, enqueues, waits for the GEMM.
    fn host_wait_task(&self) -> Result<(), Fallback> {
        let s = self.gpu.stream();
        cubecl::future::block_on(self.client.sync()).map_err(|e| Fallback::Problem(format!("cubecl sync: {e:?}")))?;
        // SAFETY: the sync above drained the caller's stream, C is fresh, this task holds
        // cubecl's device thread, and the synchronize below ends the GEMM before the task does.
        let r = unsafe { self.enqueue(s.cu_stream()) };
        s.synchronize().map_err(|e| Fallback::Problem(format!("stream synchronize: {e:?}")))?;
        r
    }

    /// Device ordering: gemmbridge's stream waits for the forward flag, runs the GEMM and
    /// writes the back flag. Returns the GEMM's result and whether the back write was enqueued
    /// (where the spin kernel or the flag write fails, this call waits on the host instead).
    fn device_task(&self, edge: order::Edge) -> (Result<(), Fallback>, bool) {
        let s = self.gpu.stream();
        // SAFETY: gemmbridge's stream lives in the flags' context (cubecl's primary context,
        // current on cubecl's device thread, where this task runs); the flags live for the
        // process.
        if let Err(why) = unsafe { edge.wait_forward(self.a.device.index, s.context(), s.cu_stream()) } {
            tracing::debug!(%why, "gemmbridge-burn: host-wait ordering for this call");
            return (self.host_wait_task(), false);
        }
        // SAFETY: the wait above orders the GEMM after the forward kernel (after every producer
        // on the caller's stream); the back edge below orders it before the caller's later work.
        let r = unsafe { self.enqueue(s.cu_stream()) };
        // SAFETY: as for wait_forward.
        match unsafe { edge.signal_back(s.cu_stream()) } {
            Ok(()) => (r, true),
            Err(why) => {
                tracing::debug!(%why, "gemmbridge-burn: waiting on the host for this call's GEMM");
                let waited = s.synchronize().map_err(|e| Fallback::Problem(format!("stream synchronize: {e:?}")));
                (r.and(waited), false)
            }
        }
    }
}

fn try_matmul(lhs: &Cuda, rhs: &Cuda) -> Result<Cuda, Fallback> {
    let prec = same_precision(&[lhs, rhs])?;
    let p = plan(lhs.meta.shape(), lhs.meta.strides(), rhs.meta.shape(), rhs.meta.strides(), prec)?;
    run(&p, lhs, rhs, None)
}

/// `(xᵀ·dy, Σ_rows dy)` for 2-D `x[m, d_in]` and `dy[m, d_out]`: one GEMM with the bias
/// gradient epilogue (`BiasGradB`: the column sums of op(B) = dy over k = m), both outputs
/// from burn's allocator.
fn try_param_grads(x: &Cuda, dy: &Cuda) -> Result<(Cuda, Cuda), Fallback> {
    let prec = same_precision(&[x, dy])?;
    let (xs, xst) = (x.meta.shape(), x.meta.strides());
    if xs.len() != 2 || dy.meta.shape().len() != 2 {
        return Err(Fallback::Shape(format!("ranks {xs:?} and {:?} (2-D expected)", dy.meta.shape())));
    }
    // xᵀ as a view: shape [d_in, m], strides swapped
    let mut p = plan(&[xs[1], xs[0]], &[xst[1], xst[0]], dy.meta.shape(), dy.meta.strides(), prec)?;
    p.problem = p.problem.with_epilogue(Epilogue::BiasGradB).map_err(|e| Fallback::Problem(e.to_string()))?;
    let d_out = dy.meta.shape()[1];
    let db = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        dy.client.clone(),
        dy.device.clone(),
        Shape::from([d_out]),
        dy.dtype,
    );
    let dw = run(&p, x, dy, Some(&db))?;
    Ok((dw, db))
}

fn try_linear(x: &Cuda, w: &Cuda, bias: Option<&Cuda>, act: Activation) -> Result<Cuda, Fallback> {
    let prec = same_precision(&[x, w].into_iter().chain(bias).collect::<Vec<_>>())?;
    let bias_layout = bias.map(|b| (b.meta.shape().iter().product(), b.meta.strides().last().copied().unwrap_or(1)));
    let p = plan_linear(x.meta.shape(), x.meta.strides(), w.meta.shape(), w.meta.strides(), bias_layout, act, prec)?;
    run(&p, x, w, bias)
}

/// The tensor as a CUDA tensor when the runtime `R` is `CudaRuntime`.
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Option<&Cuda> {
    (t as &dyn Any).downcast_ref::<Cuda>()
}

/// A CUDA tensor back as `CubeTensor<R>` (`R` is `CudaRuntime` whenever `as_cuda` succeeded).
fn from_cuda<R: CubeRuntime>(t: Cuda) -> CubeTensor<R> {
    *(Box::new(t) as Box<dyn Any>).downcast::<CubeTensor<R>>().expect("as_cuda succeeded, so R is CudaRuntime")
}

/// The result of `attempt` when the adapter is on and gemmbridge can serve, `None` when the
/// caller should run burn's op; counts and logs which path the shape took.
pub(crate) fn served<T>(what: &str, shapes: &[&[usize]], attempt: impl FnOnce() -> Result<T, Fallback>) -> Option<T> {
    if !crate::enabled() {
        crate::count(false);
        tracing::debug!(?shapes, "{what}: burn (adapter disabled)");
        return None;
    }
    match attempt() {
        Ok(out) => {
            crate::count(true);
            tracing::debug!(?shapes, "{what}: gemmbridge");
            Some(out)
        }
        Err(why) => {
            crate::count(false);
            tracing::debug!(?shapes, ?why, "{what}: burn (fallback)");
            None
        }
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GemmOps for CubeBackend<R, F, I, BT> {
    fn gemm_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [lhs.meta.shape(), rhs.meta.shape()];
        let attempt = || match (as_cuda(&lhs), as_cuda(&rhs)) {
            (Some(l), Some(r)) => try_matmul(l, r).map(from_cuda::<R>),
            _ => Err(Fallback::Problem("not a CUDA backend".into())),
        };
        served("matmul", &shapes, attempt).unwrap_or_else(|| <Self as FloatTensorOps<Self>>::float_matmul(lhs, rhs))
    }

    fn gemm_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        act: Activation,
    ) -> FloatTensor<Self> {
        let shapes: [&[usize]; 2] = [x.meta.shape(), weight.meta.shape()];
        let attempt = || match (as_cuda(&x), as_cuda(&weight), bias.as_ref().map(as_cuda)) {
            (Some(x), Some(w), None) => try_linear(x, w, None, act).map(from_cuda::<R>),
            (Some(x), Some(w), Some(Some(b))) => try_linear(x, w, Some(b), act).map(from_cuda::<R>),
            _ => Err(Fallback::Problem("not a CUDA backend".into())),
        };
        // what the epilogue cannot apply (GELU-erf) follows as burn's op on the GEMM's output
        served("linear", &shapes, attempt)
            .map(|y| activate::<Self>(y, after_epilogue(act)))
            .unwrap_or_else(|| burn_linear::<Self>(x, weight, bias, act))
    }

    fn gemm_linear_param_grads(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes: [&[usize]; 2] = [x.meta.shape(), dy.meta.shape()];
        let attempt = || match (as_cuda(&x), as_cuda(&dy)) {
            (Some(x), Some(g)) => try_param_grads(x, g).map(|(w, b)| (from_cuda::<R>(w), from_cuda::<R>(b))),
            _ => Err(Fallback::Problem("not a CUDA backend".into())),
        };
        served("linear weight and bias gradients", &shapes, attempt).unwrap_or_else(|| {
            let dw = Self::gemm_matmul(<Self as FloatTensorOps<Self>>::float_transpose(x), dy.clone());
            (dw, <Self as burn::tensor::ops::ModuleOps<Self>>::linear_bias_backward(dy))
        })
    }
}
