//! Running one grouped product on burn's CUDA buffers: the buffers looked up by address on
//! cubecl's device thread and handed to `Gpu::grouped_gemm_raw` (which forks its pool of
//! streams from gemmbridge's stream and joins it back there), the call ordered with the
//! caller's cubecl stream exactly as the adapter's GEMMs are (`order.rs`: device edges by
//! default, host waits where those cannot be correct).

use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::stream_id::StreamId;
use gemmbridge::cuda::{Gpu, RawBuffer};
use gemmbridge::cudarc::driver::sys;

use crate::layout::Fallback;
use crate::order::{self, GemmOrdering};

pub(super) type Cuda = CubeTensor<CudaRuntime>;

/// Enqueues the call on the stream given, with its buffers (in the order they were passed to
/// [`ordered`]).
pub(super) type Launch<'a> = &'a (dyn Fn(&Gpu, sys::CUstream, &[RawBuffer]) -> Result<(), Fallback> + Sync);

/// Runs `launch` on `tensors`' buffers (all on `tensors[0]`'s device) on gemmbridge's stream,
/// ordered with the caller's cubecl stream as the adapter's GEMMs are: device edges unless an
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
                    tracing::debug!(%why, "gemmbridge-burn grouped: host-wait ordering for this call");
                    GemmOrdering::HostWait
                }
            }
        }
        o => o,
    };
    let device_ordered = ordering == GemmOrdering::Device;
    let gpu = crate::cube::gpu(index, device_ordered).ok_or_else(|| Fallback::Problem("no gemmbridge GPU".into()))?;
    let task = Task { gpu: &gpu, client: &client, tensors, launch };
    let thread = |e| Fallback::Problem(format!("cubecl device thread: {e:?}"));
    if device_ordered {
        let run =
            |edge: order::Edge| client.exclusive(|| task.device(edge)).unwrap_or_else(|e| (Err(thread(e)), false));
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
    /// themselves outlive it: borrowed by the caller, the output returned).
    fn enqueue(&self) -> Result<(), Fallback> {
        let mut held = Vec::with_capacity(self.tensors.len());
        for t in self.tensors {
            let r = self.client.get_resource(t.handle.clone());
            held.push(r.map_err(|e| Fallback::Problem(format!("get_resource: {e:?}")))?);
        }
        // (cubecl's resource type is not nameable outside cubecl-cuda; its fields are public)
        let bufs: Vec<RawBuffer> = held
            .iter()
            .map(|r| RawBuffer { address: r.resource().ptr, len_bytes: r.resource().size as usize })
            .collect();
        (self.launch)(self.gpu, self.gpu.stream().cu_stream(), &bufs)
    }

    /// Host waits: the caller's stream drained before, gemmbridge's after.
    fn host_wait(&self) -> Result<(), Fallback> {
        cubecl::future::block_on(self.client.sync()).map_err(|e| Fallback::Problem(format!("cubecl sync: {e:?}")))?;
        let r = self.enqueue();
        let synced = self.gpu.stream().synchronize().map_err(|e| Fallback::Problem(format!("synchronize: {e:?}")));
        r.and(synced)
    }

    /// Device edges: gemmbridge's stream waits for the forward flag, runs the call (its pool
    /// joined back to that stream), writes the back flag; returns whether the back write was
    /// enqueued (else this call waited on the host).
    fn device(&self, edge: order::Edge) -> (Result<(), Fallback>, bool) {
        let s = self.gpu.stream();
        // SAFETY: gemmbridge's stream lives in cubecl's primary context (current on cubecl's
        // device thread, where this runs); the flags live for the process.
        if let Err(why) = unsafe { edge.wait_forward(self.tensors[0].device.index, s.context(), s.cu_stream()) } {
            tracing::debug!(%why, "gemmbridge-burn grouped: host-wait ordering for this call");
            return (self.host_wait(), false);
        }
        let r = self.enqueue();
        // SAFETY: as for wait_forward; the write lands after the call's work, which the engine
        // joins back to this stream (stream order).
        match unsafe { edge.signal_back(s.cu_stream()) } {
            Ok(()) => (r, true),
            Err(why) => {
                tracing::debug!(%why, "gemmbridge-burn grouped: waiting on the host for this call");
                let waited = s.synchronize().map_err(|e| Fallback::Problem(format!("synchronize: {e:?}")));
                (r.and(waited), false)
            }
        }
    }
}
