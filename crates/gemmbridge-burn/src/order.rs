//! How a GEMM on gemmbridge's stream is ordered with the caller's cubecl stream.
//!
//! cubecl 0.10 does not expose the `CUstream` its kernels run on, so gemmbridge cannot enqueue
//! on it or record an event there. Two orderings work with its public API:
//!
//! - **host wait** ([`GemmOrdering::HostWait`]): before the GEMM the host waits for the
//!   caller's cubecl stream (`client.sync()`), after it for gemmbridge's stream. Correct
//!   everywhere; the GPU idles while the host turns around, twice per call, and the host
//!   cannot run ahead.
//! - **device** ([`GemmOrdering::Device`], the default): per call a sequence number `s` and a
//!   pair of 32-bit flags in device memory (one pair per cubecl stream, a cubecl allocation):
//!   1. *forward edge*: a one-thread cubecl kernel on the caller's stream stores `s` in the
//!      forward flag — it runs after everything queued before it there (the producers of the
//!      inputs); on gemmbridge's stream a one-thread kernel of this crate (NVRTC) spins until
//!      the flag equals `s`, then the GEMM runs;
//!   2. *back edge*: gemmbridge's stream sets the back flag to `s` after the GEMM
//!      (`cuMemsetD32Async`: stream-ordered, so it lands after the GEMM's writes are done); a
//!      one-thread cubecl kernel on the caller's stream spins on an atomic load until it sees
//!      `s`, so everything cubecl queues after the call (readers of C, kernels reusing the
//!      inputs' memory, which cubecl hands out again only on that stream) runs after the GEMM.
//!
//!   CUDA's own cross-stream waits on memory (`cuStreamWaitValue32`, `cuStreamWriteValue32`)
//!   would replace the spin on gemmbridge's stream, but the driver refuses them on memory
//!   from the stream-ordered allocator, which is where cubecl 0.10 allocates
//!   (`CUDA_ERROR_INVALID_VALUE`; measured on the H200 with driver 580, while `cuMemAlloc`
//!   memory was accepted): so the flags, which the cubecl kernels must address, are waited
//!   for by a kernel.
//!
//!   The host enqueues in the order forward kernel, spin kernel, GEMM, back write, wait
//!   kernel — a valid serial order — so no wait can depend on work enqueued after it, and the
//!   wait kernel is never launched before the write it waits for is enqueued. Flags compare
//!   for equality: a flag cannot move past `s` before its waiter has seen it (the next
//!   forward store sits behind this call's wait kernel; the next back write behind the next
//!   forward edge), so the 32-bit sequence may wrap. One lock per cubecl stream keeps two
//!   threads that share a stream id from interleaving their sequences.
//!
//!   A call falls back to the host wait (and says so in the debug log) where the device
//!   ordering cannot be correct or cannot run: an operand created on another cubecl stream
//!   (cubecl keeps such memory from reuse only until its own work on this stream is done,
//!   which does not cover gemmbridge's stream), or the spin kernel cannot be compiled or
//!   launched (then for the rest of the process).
//!
//! Cost: two one-thread kernels on the caller's stream, one on gemmbridge's and a 4-byte
//! memset; the wait kernel shares an SM with the GEMM's CTAs while it spins
//! (`gemmbridge-burn bench` reports the GEMM's time with and without it beside it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering as Mem};
use std::sync::{Arc, Mutex, OnceLock};

use std::ffi::c_void;

use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cubecl::server::Handle;
use gemmbridge::cudarc;
use gemmbridge::cudarc::driver::{sys, CudaContext, CudaFunction};
use gemmbridge::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

/// How the adapter's GEMMs are ordered with burn's work on the caller's cubecl stream, or
/// whether burn runs its own op instead ([`set_ordering`](crate::set_ordering); README.md,
/// "Ordering", has the cost of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GemmOrdering {
    /// burn's own matmul and linear; gemmbridge is not called.
    Burn,
    /// gemmbridge's GEMM, ordered by host waits: the host waits for the caller's cubecl stream
    /// before the GEMM and for gemmbridge's stream after it.
    HostWait,
    /// gemmbridge's GEMM, ordered on the device by flags in device memory, one-thread kernels
    /// that store and wait for them and a stream-ordered flag write, with no host wait (the
    /// default). Calls where that cannot be correct fall back
    /// to [`GemmOrdering::HostWait`] (debug log).
    #[default]
    Device,
}

impl GemmOrdering {
    fn code(self) -> u8 {
        match self {
            GemmOrdering::Burn => 0,
            GemmOrdering::HostWait => 1,
            GemmOrdering::Device => 2,
        }
    }

    fn from_code(code: u8) -> GemmOrdering {
        match code {
            0 => GemmOrdering::Burn,
            1 => GemmOrdering::HostWait,
            _ => GemmOrdering::Device,
        }
    }

    /// The name the CLI and the debug log use: "burn", "host-wait", "device".
    pub fn name(self) -> &'static str {
        match self {
            GemmOrdering::Burn => "burn",
            GemmOrdering::HostWait => "host-wait",
            GemmOrdering::Device => "device",
        }
    }
}

impl std::fmt::Display for GemmOrdering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses [`GemmOrdering::name`]'s names ("burn", "host-wait", "device"); "off" and "host"
/// are accepted for "burn" and "host-wait".
impl std::str::FromStr for GemmOrdering {
    type Err = String;

    fn from_str(s: &str) -> Result<GemmOrdering, String> {
        match s {
            "burn" | "off" => Ok(GemmOrdering::Burn),
            "host-wait" | "host" => Ok(GemmOrdering::HostWait),
            "device" => Ok(GemmOrdering::Device),
            _ => Err(format!("unknown ordering {s:?}; choose burn (or off), host-wait (or host) or device")),
        }
    }
}

static ORDERING: AtomicU8 = AtomicU8::new(2);
/// Set once the spin kernel on gemmbridge's stream could not be compiled or launched.
static NO_SPIN: AtomicBool = AtomicBool::new(false);

/// The last ordering set other than `Burn` (what `set_enabled(true)` returns to).
static LAST_ON: AtomicU8 = AtomicU8::new(2);

pub(crate) fn set(o: GemmOrdering) {
    if o != GemmOrdering::Burn {
        LAST_ON.store(o.code(), Mem::Relaxed);
    }
    ORDERING.store(o.code(), Mem::Relaxed);
}

/// `set_enabled`: off is `Burn`; on leaves an ordering that is on alone and otherwise returns
/// to the last one set.
pub(crate) fn enable(on: bool) {
    if !on {
        ORDERING.store(GemmOrdering::Burn.code(), Mem::Relaxed);
    } else if get() == GemmOrdering::Burn {
        ORDERING.store(LAST_ON.load(Mem::Relaxed), Mem::Relaxed);
    }
}

pub(crate) fn get() -> GemmOrdering {
    GemmOrdering::from_code(ORDERING.load(Mem::Relaxed))
}

/// Stores `value` in `flags[index]` (one thread).
#[cube(launch)]
fn store_flag(flags: &mut Array<Atomic<u32>>, index: usize, value: u32) {
    if ABSOLUTE_POS == 0 {
        flags[index].store(value);
    }
}

/// Returns once `flags[index] == value` (one thread; the atomic load reads L2, where the
/// back edge's memset lands).
#[cube(launch)]
fn wait_flag(flags: &mut Array<Atomic<u32>>, index: usize, value: u32) {
    if ABSOLUTE_POS == 0 {
        loop {
            if flags[index].load() == value {
                break;
            }
        }
    }
}

/// Index of the forward flag (written by cubecl, waited for by gemmbridge's stream).
const FORWARD: usize = 0;
/// Index of the back flag (written by gemmbridge's stream, waited for by cubecl).
const BACK: usize = 1;
/// Flags per buffer (four u32: 16 bytes, the two flags and padding).
const FLAGS: usize = 4;

/// One cubecl stream's flags: the buffer (kept alive here), its device address, the last
/// sequence number used.
pub(crate) struct Flags {
    handle: Handle,
    address: u64,
    seq: u32,
}

type Slot = Arc<Mutex<Option<Flags>>>;

/// The flags of (device index, cubecl stream id), created on first use.
fn slot(device: usize, stream: u64) -> Slot {
    static SLOTS: OnceLock<Mutex<HashMap<(usize, u64), Slot>>> = OnceLock::new();
    let mut map = SLOTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.entry((device, stream)).or_default().clone()
}

/// The spin kernel gemmbridge's stream runs for the forward edge: one thread, returns once
/// `*flag == value` (the atomic reads L2, where the cubecl kernel's store lands).
const SPIN_SOURCE: &str = r#"
extern "C" __global__ void gemmbridge_burn_wait_flag(unsigned int* flag, unsigned int value) {
    while (atomicAdd(flag, 0u) != value) {
    }
    __threadfence();
}
"#;

/// The spin kernel, compiled (NVRTC) and loaded into `ctx` once per device; `None` where that
/// failed (logged once; device ordering then waits on the host).
fn spin_kernel(device: usize, ctx: &Arc<CudaContext>) -> Option<CudaFunction> {
    static KERNELS: OnceLock<Mutex<HashMap<usize, Option<CudaFunction>>>> = OnceLock::new();
    let mut map = KERNELS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.entry(device)
        .or_insert_with(|| {
            let made = compile_ptx_with_opts(
                SPIN_SOURCE,
                CompileOptions { name: Some("order.cu".into()), ..Default::default() },
            )
            .map_err(|e| format!("NVRTC: {e:?}"))
            .and_then(|ptx| ctx.load_module(ptx).map_err(|e| format!("cuModuleLoadData: {e:?}")))
            .and_then(|m| {
                m.load_function("gemmbridge_burn_wait_flag").map_err(|e| format!("cuModuleGetFunction: {e:?}"))
            });
            made.map_err(|e| {
                NO_SPIN.store(true, Mem::Relaxed);
                tracing::warn!("gemmbridge-burn: no device ordering ({e}); the adapter waits on the host");
            })
            .ok()
        })
        .clone()
}

/// Why a call that asked for device ordering runs with host waits instead (None: it can use
/// device ordering). `streams`: the cubecl stream ids of the call's operands.
pub(crate) fn device_refusal(current: u64, streams: &[u64]) -> Option<String> {
    if let Some(other) = streams.iter().find(|&&s| s != current) {
        return Some(format!("an operand was created on cubecl stream {other}, this call runs on {current}"));
    }
    if NO_SPIN.load(Mem::Relaxed) {
        return Some("the device ordering's spin kernel could not be compiled or launched".into());
    }
    None
}

/// One call's sequence number and its stream's flags (device address): what gemmbridge's
/// stream waits for and writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Edge {
    address: u64,
    seq: u32,
}

impl Edge {
    /// Enqueues on `stream` (gemmbridge's) the spin kernel that waits for this call's forward
    /// edge. `ctx`: gemmbridge's context (cubecl's primary context, current on this thread).
    ///
    /// # Safety
    /// `stream` is a live stream of `ctx`, and the flags are alive (they live for the process).
    pub(crate) unsafe fn wait_forward(
        &self,
        device: usize,
        ctx: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<(), String> {
        let f = spin_kernel(device, ctx).ok_or("no spin kernel")?;
        let (mut flag, mut value) = (self.address, self.seq);
        let mut args = [&mut flag as *mut u64 as *mut c_void, &mut value as *mut u32 as *mut c_void];
        // SAFETY: the kernel takes (unsigned int*, unsigned int): `flag` is the forward flag's
        // device address (a live 4-byte aligned cubecl allocation), `value` a u32; one thread.
        let r = unsafe {
            cudarc::driver::result::launch_kernel(f.cu_function(), (1, 1, 1), (1, 1, 1), 0, stream, &mut args)
        };
        r.map_err(|e| {
            NO_SPIN.store(true, Mem::Relaxed);
            format!("cuLaunchKernel (spin kernel): {e:?} (device ordering off for this process)")
        })
    }

    /// Enqueues on `stream` (gemmbridge's), after the GEMM, the back edge's write.
    ///
    /// # Safety
    /// `stream` is a live stream of the flags' context, which is current.
    pub(crate) unsafe fn signal_back(&self, stream: sys::CUstream) -> Result<(), String> {
        let back = self.address + (BACK * 4) as u64;
        // SAFETY: `back` is 4-byte aligned inside the live 16-byte flags allocation; one u32.
        let r = unsafe { sys::cuMemsetD32Async(back, self.seq, 1, stream) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            _ => Err(format!("cuMemsetD32Async (back flag): {r:?}")),
        }
    }
}

/// The stream's flags (created on first use) with the next sequence number taken.
fn next_seq<'a>(flags: &'a mut Option<Flags>, client: &ComputeClient<CudaRuntime>) -> Result<&'a mut Flags, String> {
    if flags.is_none() {
        // zero-filled on the caller's stream: ordered before the first forward kernel
        let handle = client.create_from_slice(&[0u8; FLAGS * 4]);
        let address =
            client.get_resource(handle.clone()).map_err(|e| format!("flags: get_resource: {e:?}"))?.resource().ptr;
        *flags = Some(Flags { handle, address, seq: 0 });
    }
    let f = flags.as_mut().expect("set above");
    // 0 is the buffer's initial value: never a sequence number
    f.seq = match f.seq.wrapping_add(1) {
        0 => 1,
        s => s,
    };
    Ok(f)
}

/// Runs `enqueue` between the two device edges of one call on the caller's cubecl stream
/// `stream` of device `device`: launches the forward kernel, calls `enqueue` with the call's
/// [`Edge`] (which enqueues the wait, the GEMM and the back write on gemmbridge's stream, and
/// returns whether the back write was enqueued), then — only if it was — the wait kernel.
/// The stream's flags stay locked throughout, so calls on one stream id never interleave.
///
/// `Err` when the flags cannot be made; otherwise `enqueue`'s result, whether or not the
/// back edge was enqueued (where it was not, `enqueue` has waited on the host instead).
pub(crate) fn device_ordered<T>(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    stream: u64,
    enqueue: impl FnOnce(Edge) -> (T, bool),
) -> Result<T, String> {
    let slot = slot(device, stream);
    let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
    let flags = next_seq(&mut guard, client)?;
    let edge = Edge { address: flags.address, seq: flags.seq };
    launch_flag_kernel(client, &flags.handle, FORWARD, edge.seq, false);
    let (out, back_enqueued) = enqueue(edge);
    if back_enqueued {
        launch_flag_kernel(client, &flags.handle, BACK, edge.seq, true);
    }
    Ok(out)
}

/// Runs `enqueue` (work on `gpu_stream`, gemmbridge's) between the device ordering's two
/// edges on the calling thread's cubecl stream `stream` of `device`, exactly as an adapter
/// call does but without its output allocation and address lookups: for
/// `gemmbridge-burn bench`, which times the edges' cost on the GPU apart from the adapter's
/// host cost. Binds `gpu_stream`'s context to this thread.
#[doc(hidden)]
pub fn with_device_edges<T>(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    stream: u64,
    gpu_stream: &Arc<cudarc::driver::CudaStream>,
    enqueue: impl FnOnce() -> T,
) -> Result<T, String> {
    gpu_stream.context().bind_to_thread().map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    let (ctx, s) = (gpu_stream.context(), gpu_stream.cu_stream());
    device_ordered(client, device, stream, |edge| {
        // SAFETY: `s` is a live stream of `ctx`, bound above; the flags live for the process.
        if let Err(e) = unsafe { edge.wait_forward(device, ctx, s) } {
            return (Err(e), false);
        }
        let out = enqueue();
        // SAFETY: as above.
        match unsafe { edge.signal_back(s) } {
            Ok(()) => (Ok(out), true),
            Err(e) => (Err(e), false),
        }
    })?
}

/// A wait kernel spinning on the caller's cubecl stream until [`Spinner::release`]: for
/// `gemmbridge-burn bench`, which times gemmbridge's GEMMs with and without one resident
/// beside them. Not for concurrent use with adapter calls on the same stream.
#[doc(hidden)]
pub struct Spinner(Edge);

impl Spinner {
    /// Launches the spinning kernel on the caller's cubecl stream `stream` of `device`.
    pub fn start(client: &ComputeClient<CudaRuntime>, device: usize, stream: u64) -> Result<Spinner, String> {
        let slot = slot(device, stream);
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        let flags = next_seq(&mut guard, client)?;
        let edge = Edge { address: flags.address, seq: flags.seq };
        launch_flag_kernel(client, &flags.handle, BACK, edge.seq, true);
        Ok(Spinner(edge))
    }

    /// Enqueues on `stream` the write that ends the spinning kernel.
    ///
    /// # Safety
    /// `stream` is a live stream of the context the flags were allocated in, which is current.
    pub unsafe fn release(self, stream: sys::CUstream) -> Result<(), String> {
        // SAFETY: the caller's contract; the flags live for the process.
        unsafe { self.0.signal_back(stream) }
    }
}

/// The forward (`wait` false: store) or back (`wait` true: spin until equal) kernel on the
/// caller's stream, one thread.
fn launch_flag_kernel(client: &ComputeClient<CudaRuntime>, handle: &Handle, index: usize, value: u32, wait: bool) {
    // SAFETY: the buffer holds FLAGS u32 (created with FLAGS * 4 bytes); index < FLAGS.
    let arg = || unsafe { ArrayArg::from_raw_parts(handle.clone(), FLAGS) };
    let (count, dim) = (CubeCount::Static(1, 1, 1), CubeDim::new_1d(1));
    if wait {
        wait_flag::launch(client, count, dim, arg(), index, value);
    } else {
        store_flag::launch(client, count, dim, arg(), index, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for o in [GemmOrdering::Burn, GemmOrdering::HostWait, GemmOrdering::Device] {
            assert_eq!(o.name().parse::<GemmOrdering>(), Ok(o));
            assert_eq!(GemmOrdering::from_code(o.code()), o);
        }
        let err = "sometimes".parse::<GemmOrdering>().unwrap_err();
        assert!(err.contains("burn (or off), host-wait (or host) or device"), "{err}");
        assert_eq!(GemmOrdering::default(), GemmOrdering::Device);
        assert_eq!(GemmOrdering::HostWait.to_string(), "host-wait");
    }

    /// The only test of this binary that touches the process-wide setting.
    #[test]
    fn enabling_keeps_the_ordering_last_set() {
        set(GemmOrdering::HostWait);
        enable(true);
        assert_eq!(get(), GemmOrdering::HostWait, "on while on: unchanged");
        enable(false);
        assert_eq!(get(), GemmOrdering::Burn);
        enable(true);
        assert_eq!(get(), GemmOrdering::HostWait, "back on: the ordering last set");
        set(GemmOrdering::Burn);
        enable(true);
        assert_eq!(get(), GemmOrdering::HostWait, "Burn is not remembered as an ordering to return to");
        set(GemmOrdering::Device);
        assert_eq!(get(), GemmOrdering::Device);
    }

    #[test]
    fn another_stream_refuses_device_ordering() {
        let why = device_refusal(3, &[3, 7, 3]).expect("operand on stream 7");
        assert!(why.contains("stream 7") && why.contains("runs on 3"), "{why}");
    }
}
