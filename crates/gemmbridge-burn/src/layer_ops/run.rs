//! Running one gemmbridge call on burn's CUDA buffers — the layer operations', and attention's,
//! the convolutions' and the grouped products' launches too: the buffers by address (as the
//! GEMMs are, `cube.rs`), ordered with the caller's cubecl stream by the ordering
//! [`crate::set_ordering`] chose (`order.rs`); and the served / fell-back counts of
//! [`crate::layer_counts`].

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::stream_id::StreamId;
use gemmbridge::cuda::Gpu;
use gemmbridge::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use crate::layout::Fallback;
use crate::order::{self, GemmOrdering};

pub(crate) type Cuda = CubeTensor<CudaRuntime>;

static SERVED: AtomicUsize = AtomicUsize::new(0);
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

/// `(served, fell back)` of the layer operations; see [`crate::layer_counts`].
pub(crate) fn counts() -> (usize, usize) {
    (SERVED.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

/// The result of `attempt` when the adapter is on and gemmbridge can serve, `None` when the
/// caller should run burn's ops; counts and logs which path the call took.
pub(crate) fn served<T>(what: &str, shapes: &[&[usize]], attempt: impl FnOnce() -> Result<T, Fallback>) -> Option<T> {
    let r = if crate::enabled() { attempt() } else { Err(Fallback::Problem("adapter disabled".into())) };
    match r {
        Ok(out) => {
            SERVED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, "{what}: gemmbridge");
            Some(out)
        }
        Err(why) => {
            FELL_BACK.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?shapes, ?why, "{what}: burn");
            None
        }
    }
}

/// One cubecl buffer by address, as gemmbridge's entry points take buffers: `len` elements of
/// `T` from `address`, attributed to gemmbridge's stream (for its context checks). Its
/// `device_ptr` records nothing and waits for nothing: ordering is [`run`]'s.
pub(crate) struct Raw<T> {
    address: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> Raw<T> {
    /// The buffer `(address, bytes)` as elements of `T` (a partial element at the end is not
    /// counted), on `gpu`'s stream.
    pub(crate) fn new(gpu: &Gpu, (address, bytes): (u64, usize)) -> Raw<T> {
        let len = bytes / std::mem::size_of::<T>().max(1);
        Raw { address, len, stream: gpu.stream().clone(), _t: PhantomData }
    }
}

impl<T> DeviceSlice<T> for Raw<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Raw<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.address, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.address, SyncOnDrop::Sync(None))
    }
}

/// The launch of one call: given the `Gpu` and the buffers `(address, bytes)` of the tensors
/// passed to [`run`], in their order, it enqueues on `gpu.stream()`.
pub(crate) type Launch<'a> = dyn FnOnce(&Gpu, &[(u64, usize)]) -> gemmbridge::Result<()> + Send + 'a;

/// Runs `launch` on gemmbridge's stream with the buffers of `tensors` (inputs and outputs, the
/// outputs fresh from burn's allocator), ordered with the calling thread's cubecl stream as the
/// adapter's GEMMs are: on the device (forward edge, launch, back edge) or by host waits
/// before and after. The address lookups and the launch run in one task on cubecl's device
/// thread; the bindings hold the memory until the launch is enqueued (and the tensors outlive
/// the call).
pub(crate) fn run(tensors: &[&Cuda], launch: Box<Launch<'_>>) -> Result<(), Fallback> {
    let first = tensors.first().ok_or_else(|| Fallback::Problem("no tensors".into()))?;
    if tensors.iter().any(|t| t.device != first.device) {
        return Err(Fallback::Problem("tensors on different devices".into()));
    }
    let client = first.client.clone();
    let current = StreamId::current().value;
    let ordering = match order::get() {
        GemmOrdering::Device => {
            let streams: Vec<u64> = tensors.iter().map(|t| t.handle.stream.value).collect();
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
    let index = first.device.index;
    let gpu = crate::cube::gpu(index, ordering == GemmOrdering::Device)
        .ok_or_else(|| Fallback::Problem("no gemmbridge GPU".into()))?;
    let call = Call { gpu: &gpu, client: &client, tensors, launch };
    if ordering == GemmOrdering::Device {
        let task = |edge: order::Edge| {
            let (r, back) = client
                .exclusive(|| call.device_task(index, edge))
                .unwrap_or_else(|e| (Err(Fallback::Problem(format!("cubecl device thread: {e:?}"))), false));
            ((r, back), back)
        };
        let (r, _) = order::device_ordered(&client, index, current, task).map_err(Fallback::Problem)?;
        r
    } else {
        client
            .exclusive(|| call.host_wait_task())
            .map_err(|e| Fallback::Problem(format!("cubecl device thread: {e:?}")))?
    }
}

/// One call's operands, for the tasks that run on cubecl's device thread.
struct Call<'a, 'l> {
    gpu: &'a Gpu,
    client: &'a cubecl::client::ComputeClient<CudaRuntime>,
    tensors: &'a [&'a Cuda],
    launch: Box<Launch<'l>>,
}

impl Call<'_, '_> {
    /// Looks the buffers up and runs the launch (on gemmbridge's stream).
    ///
    /// # Safety
    /// The caller orders the launch after the inputs' producers and before any reader of the
    /// outputs or reuse of the inputs' memory (host waits or device edges).
    unsafe fn enqueue(self) -> Result<(), Fallback> {
        let mut bindings = Vec::with_capacity(self.tensors.len());
        for t in self.tensors {
            let r = self.client.get_resource(t.handle.clone()).map_err(|e| Fallback::Problem(format!("{e:?}")))?;
            bindings.push(r);
        }
        // (cubecl's resource type is not nameable outside cubecl-cuda; its fields are public)
        let bufs: Vec<(u64, usize)> = bindings.iter().map(|r| (r.resource().ptr, r.resource().size as usize)).collect();
        // the launch checks every buffer's size, alignment, context and overlaps against its
        // problem before it enqueues anything; the bindings keep the memory from being handed
        // out again until they drop, after the launch is enqueued
        let r = (self.launch)(self.gpu, &bufs).map_err(|e| Fallback::Problem(e.to_string()));
        drop(bindings);
        r
    }

    /// Host-wait ordering: waits for the caller's cubecl stream, launches, waits for the launch.
    fn host_wait_task(self) -> Result<(), Fallback> {
        let s = self.gpu.stream().clone();
        cubecl::future::block_on(self.client.sync()).map_err(|e| Fallback::Problem(format!("cubecl sync: {e:?}")))?;
        // SAFETY: the sync above drained the caller's stream, the outputs are fresh, this task
        // holds cubecl's device thread, and the synchronize below ends the launch before the
        // task does.
        let r = unsafe { self.enqueue() };
        s.synchronize().map_err(|e| Fallback::Problem(format!("stream synchronize: {e:?}")))?;
        r
    }

    /// Device ordering: gemmbridge's stream waits for the forward flag, runs the launch and
    /// writes the back flag. Returns the launch's result and whether the back write was
    /// enqueued (where it was not, this call has waited on the host instead).
    fn device_task(self, device: usize, edge: order::Edge) -> (Result<(), Fallback>, bool) {
        let s = self.gpu.stream().clone();
        // SAFETY: gemmbridge's stream lives in the flags' context (cubecl's primary context,
        // current on cubecl's device thread, where this task runs); the flags live for the
        // process.
        if let Err(why) = unsafe { edge.wait_forward(device, s.context(), s.cu_stream()) } {
            tracing::debug!(%why, "gemmbridge-burn: host-wait ordering for this call");
            return (self.host_wait_task(), false);
        }
        // SAFETY: the wait above orders the launch after every producer on the caller's
        // stream; the back edge below orders it before the caller's later work.
        let r = unsafe { self.enqueue() };
        // SAFETY: as for wait_forward.
        match unsafe { edge.signal_back(s.cu_stream()) } {
            Ok(()) => (r, true),
            Err(why) => {
                tracing::debug!(%why, "gemmbridge-burn: waiting on the host for this call");
                let waited = s.synchronize().map_err(|e| Fallback::Problem(format!("stream synchronize: {e:?}")));
                (r.and(waited), false)
            }
        }
    }
}
