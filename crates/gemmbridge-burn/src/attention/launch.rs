//! Running one cuDNN attention call on burn's CUDA buffers: the buffers looked up by address
//! on cubecl's device thread and handed to gemmbridge as [`Raw`] buffers, the call ordered with
//! the caller's cubecl stream exactly as the adapter's GEMMs are (`order.rs`: device edges by
//! default, host waits where those cannot be correct).

use std::marker::PhantomData;
use std::sync::Arc;

use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::stream_id::StreamId;
use gemmbridge::cuda::Gpu;
use gemmbridge::cudarc::driver::{sys, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use crate::layout::Fallback;
use crate::order::{self, GemmOrdering};

type Cuda = CubeTensor<CudaRuntime>;

/// A cubecl buffer by address, as gemmbridge's entry points take buffers. Its `device_ptr`
/// enqueues no waits: the ordering with cubecl's stream is this adapter's (`order.rs`).
pub(super) struct Raw<T> {
    addr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
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
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.addr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<T> {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.addr, SyncOnDrop::Sync(None))
    }
}

/// One buffer's address and length in bytes.
#[derive(Clone, Copy)]
pub(super) struct Addr {
    ptr: u64,
    bytes: usize,
}

impl Addr {
    /// As a buffer of `T` on `gpu`'s stream (whose context, cubecl's primary one, holds it).
    pub(super) fn raw<T>(self, gpu: &Gpu) -> Raw<T> {
        Raw { addr: self.ptr, len: self.bytes / size_of::<T>(), stream: gpu.stream().clone(), _t: PhantomData }
    }
}

/// Enqueues the call on gemmbridge's stream given its buffers' addresses (in the order they
/// were passed to [`ordered`]).
pub(super) type Launch<'a> = &'a (dyn Fn(&Gpu, &[Addr]) -> Result<(), Fallback> + Sync);

/// Runs `launch` on `tensors`' buffers (all on `tensors[0]`'s device) ordered with the caller's
/// cubecl stream, as the adapter's GEMMs are (`cube.rs`, `order.rs`): device edges unless an
/// operand was made on another cubecl stream or the spin kernel is unavailable, then host
/// waits. The address lookups and the enqueue run on cubecl's device thread.
pub(super) fn ordered(tensors: &[&Cuda], launch: Launch) -> Result<(), Fallback> {
    let first = tensors[0];
    if tensors.iter().any(|t| t.device != first.device) {
        return Err(Fallback::Problem("operands on different devices".into()));
    }
    let (client, index) = (first.client.clone(), first.device.index);
    let current = StreamId::current().value;
    let ordering = match order::get() {
        GemmOrdering::Device => {
            let streams: Vec<u64> = tensors.iter().map(|t| t.handle.stream.value).collect();
            match order::device_refusal(current, &streams) {
                None => GemmOrdering::Device,
                Some(why) => {
                    tracing::debug!(%why, "gemmbridge-burn attention: host-wait ordering for this call");
                    GemmOrdering::HostWait
                }
            }
        }
        o => o,
    };
    let gpu = crate::cube::gpu(index, ordering == GemmOrdering::Device)
        .ok_or_else(|| Fallback::Problem("no gemmbridge GPU".into()))?;
    let task = Task { gpu: &gpu, client: &client, tensors, launch };
    let thread = |e| Fallback::Problem(format!("cubecl device thread: {e:?}"));
    if ordering == GemmOrdering::Device {
        let run = |edge: order::Edge| {
            let (r, back) = client.exclusive(|| task.device(edge)).unwrap_or_else(|e| (Err(thread(e)), false));
            (r, back)
        };
        order::device_ordered(&client, index, current, run).map_err(Fallback::Problem)?
    } else {
        client.exclusive(|| task.host_wait()).map_err(thread)?
    }
}

/// One call's buffers and launch, for the tasks on cubecl's device thread.
struct Task<'a> {
    gpu: &'a Gpu,
    client: &'a cubecl::client::ComputeClient<CudaRuntime>,
    tensors: &'a [&'a Cuda],
    launch: Launch<'a>,
}

impl Task<'_> {
    /// Looks the buffers up and enqueues the call on gemmbridge's stream. The bindings keep
    /// the memory from being handed out again until the call is enqueued (the tensors
    /// themselves outlive it: borrowed by the caller, the outputs returned).
    fn enqueue(&self) -> Result<(), Fallback> {
        let mut held = Vec::with_capacity(self.tensors.len());
        for t in self.tensors {
            let r = self.client.get_resource(t.handle.clone());
            held.push(r.map_err(|e| Fallback::Problem(format!("get_resource: {e:?}")))?);
        }
        let addrs: Vec<Addr> =
            held.iter().map(|r| Addr { ptr: r.resource().ptr, bytes: r.resource().size as usize }).collect();
        (self.launch)(self.gpu, &addrs)
    }

    /// Host waits: the caller's stream drained before, gemmbridge's after.
    fn host_wait(&self) -> Result<(), Fallback> {
        cubecl::future::block_on(self.client.sync()).map_err(|e| Fallback::Problem(format!("cubecl sync: {e:?}")))?;
        let r = self.enqueue();
        let synced = self.gpu.stream().synchronize().map_err(|e| Fallback::Problem(format!("synchronize: {e:?}")));
        r.and(synced)
    }

    /// Device edges: gemmbridge's stream waits for the forward flag, runs the call, writes the
    /// back flag; returns whether the back write was enqueued (else this call waited on the host).
    fn device(&self, edge: order::Edge) -> (Result<(), Fallback>, bool) {
        let s = self.gpu.stream();
        // SAFETY: gemmbridge's stream lives in cubecl's primary context (current on cubecl's
        // device thread, where this runs); the flags live for the process.
        if let Err(why) = unsafe { edge.wait_forward(self.tensors[0].device.index, s.context(), s.cu_stream()) } {
            tracing::debug!(%why, "gemmbridge-burn attention: host-wait ordering for this call");
            return (self.host_wait(), false);
        }
        let r = self.enqueue();
        // SAFETY: as for wait_forward; the write lands after the call's kernels (stream order).
        match unsafe { edge.signal_back(s.cu_stream()) } {
            Ok(()) => (r, true),
            Err(why) => {
                tracing::debug!(%why, "gemmbridge-burn attention: waiting on the host for this call");
                let waited = s.synchronize().map_err(|e| Fallback::Problem(format!("synchronize: {e:?}")));
                (r.and(waited), false)
            }
        }
    }
}
