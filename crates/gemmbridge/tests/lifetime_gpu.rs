//! An engine created and dropped beside a capture in global mode, and the raw path's address
//! check. A teardown or creation race shows as a crash of this executable or as a failure.
//! (The churn — engines created, used and dropped on many threads beside captures in every
//! mode — is `gemmbridge_lab::churn`, run by `crates/gemmbridge-lab/tests/churn_gpu.rs`.)

mod common;

use std::sync::mpsc;

use cudarc::driver::sys as drv;
use cudarc::driver::DevicePtr;
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale};
use gemmbridge::reference::{gemm_rowmajor, rel_error};
use gemmbridge::{Error, GemmProblem, Precision, Which};

/// The tests of this file one at a time: one of them captures in global mode, which makes the
/// plain CUDA calls of any other thread of the process (the tests' own allocations) fail.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// An engine created, used and dropped (work in flight) on one thread while another thread
/// holds a capture in global mode open: every call of the first succeeds, and the capture is
/// not broken (it ends in a graph that runs and computes the right product).
#[test]
#[ignore = "needs a CUDA GPU"]
fn an_engine_comes_and_goes_beside_a_global_capture() {
    let _alone = alone();
    let gpu = common::gpu();
    // SAFETY: this test's buffers are used on this Gpu's stream alone.
    unsafe { gpu.context().disable_event_tracking() };
    let mut rng = common::rng();
    let p = GemmProblem::linear(96, 80, 64, Precision::F32).unwrap();
    let (x, w) = (common::normal::<f32>(&mut rng, 96 * 64), common::normal::<f32>(&mut rng, 80 * 64));
    let s = gpu.stream().clone();
    let (dx, dw) = (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap());
    let mut dy = s.clone_htod(&common::poison::<f32>(96 * 80)).unwrap();
    gpu.prewarm(&[p]).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
    gpu.gemm(&p, 1.0, &dx, &dw, 0.0, &mut dy).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let run = || -> Result<(), Error> {
            let other = Gpu::new(0)?;
            let q = GemmProblem::linear(128, 128, 128, Precision::BF16)?;
            let s = other.stream();
            let n = 128 * 128;
            // the plumbing of this thread's own buffers is not the library's: relaxed here
            let mut mode = drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: swaps this thread's capture mode (an in/out pointer to a local).
            unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
            let (a, b) = (
                s.alloc_zeros::<gemmbridge::half::bf16>(n).unwrap(),
                s.alloc_zeros::<gemmbridge::half::bf16>(n).unwrap(),
            );
            let mut c = s.alloc_zeros::<gemmbridge::half::bf16>(n).unwrap();
            // SAFETY: puts the mode back.
            unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
            for _ in 0..3 {
                other.gemm(&q, 1.0, &a, &b, 0.0, &mut c)?;
            }
            drop(other); // with its GEMMs in flight
                         // SAFETY: as above.
            unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
            drop((a, b, c));
            Ok(())
        };
        tx.send(run()).unwrap();
    });
    let other = rx.recv().unwrap();
    let graph = s.end_capture(drv::CUgraphInstantiate_flags(0));
    other.expect("an engine created, used and dropped beside a global capture");
    let graph = graph.expect("the capture was not broken").expect("a graph");
    graph.launch().unwrap();
    let got = s.clone_dtoh(&dy).unwrap();
    let mut want = vec![0.0; 96 * 80];
    let wide = |v: &[f32]| v.iter().map(|&e| e as f64).collect::<Vec<_>>();
    gemm_rowmajor(&p, 1.0, &wide(&x), &wide(&w), 0.0, &mut want);
    let err = rel_error(&wide(&got), &want);
    assert!(err <= 1e-5, "the captured graph's product: error {err:.3e}");
}

/// A 16³ f32 `C = A·B` through the raw path on `a`, `b`, `c` (each at least 1 KiB), checked.
fn raw_product(gpu: &Gpu, a: u64, b: u64, c: u64) -> Result<f64, Error> {
    let p = GemmProblem::matmul(16, 16, 16, Precision::F32)?;
    let s = gpu.stream();
    let mut rng = common::rng();
    let (ha, hb) = (common::normal::<f32>(&mut rng, 256), common::normal::<f32>(&mut rng, 256));
    let bytes = 256 * 4;
    // SAFETY: each address holds `bytes` (the caller's contract); stream-ordered copies.
    unsafe {
        cudarc::driver::result::memcpy_htod_async(a, &ha, s.cu_stream()).unwrap();
        cudarc::driver::result::memcpy_htod_async(b, &hb, s.cu_stream()).unwrap();
        cudarc::driver::result::memcpy_htod_async(c, &common::poison::<f32>(256), s.cu_stream()).unwrap();
    }
    let buf = |address| RawBuffer { address, len_bytes: bytes };
    // SAFETY: as above; the call is checked (GpuOptions::check_raw_addresses) by the caller.
    unsafe { gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(buf(a), buf(b), buf(c)), s.cu_stream()) }?;
    let mut got = vec![0f32; 256];
    // SAFETY: `c` holds `bytes`; the stream is synchronised before `got` is read.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut got, c, s.cu_stream()).unwrap() };
    s.synchronize().unwrap();
    let wide = |v: &[f32]| v.iter().map(|&e| e as f64).collect::<Vec<_>>();
    let mut want = vec![0.0; 256];
    gemm_rowmajor(&p, 1.0, &wide(&ha), &wide(&hb), 0.0, &mut want);
    Ok(rel_error(&wide(&got), &want))
}

/// With the check on, a host pointer, an extent past its allocation and an unknown address
/// are named errors before anything is enqueued, and the next call works; device memory of
/// every kind the check accepts (plain, stream-ordered pool, virtual-memory-managed, managed,
/// pinned host) runs and computes the right product.
#[test]
#[ignore = "needs a CUDA GPU"]
fn raw_addresses_are_checked_against_the_driver() {
    let _alone = alone();
    let gpu = common::gpu();
    assert!(!gpu.options().check_raw_addresses, "off by default");
    gpu.update_options(|o| o.check_raw_addresses = true).unwrap();
    let s = gpu.stream().clone();
    const KIB: usize = 1024;
    // SAFETY (every allocation below): plain driver allocations of this context, freed at the end.
    let plain: Vec<u64> = (0..3).map(|_| unsafe { cudarc::driver::result::malloc_sync(KIB) }.unwrap()).collect();
    let err = raw_product(&gpu, plain[0], plain[1], plain[2]).unwrap();
    assert!(err <= 1e-5, "plain device memory: {err:.3e}");
    // a host pointer as A: a named error, the engine usable afterwards
    let host = vec![0f32; 256];
    let p = GemmProblem::matmul(16, 16, 16, Precision::F32).unwrap();
    let buf = |address| RawBuffer { address, len_bytes: KIB };
    let cs = s.cu_stream();
    // SAFETY: the check refuses the host address before anything is enqueued.
    let e = unsafe {
        gpu.gemm_raw(&p, Scale::PRODUCT, RawOperands::new(buf(host.as_ptr() as u64), buf(plain[1]), buf(plain[2])), cs)
    };
    assert!(matches!(e, Err(Error::NotDeviceMemory { operand: Which::A, .. })), "{e:?}");
    // an extent past its allocation: B claims 2 KiB of a 1 KiB allocation, and the problem
    // reads 2 KiB (C is a separate 2 KiB allocation, so nothing overlaps)
    let q = GemmProblem::matmul(16, 32, 16, Precision::F32).unwrap();
    // SAFETY: a plain allocation, freed at the end.
    let wide_c = unsafe { cudarc::driver::result::malloc_sync(2 * KIB) }.unwrap();
    let (b2, c2) =
        (RawBuffer { address: plain[1], len_bytes: 2 * KIB }, RawBuffer { address: wide_c, len_bytes: 2 * KIB });
    // SAFETY: as above.
    let e = unsafe { gpu.gemm_raw(&q, Scale::PRODUCT, RawOperands::new(buf(plain[0]), b2, c2), cs) };
    assert!(matches!(e, Err(Error::NotDeviceMemory { operand: Which::B, .. })), "{e:?}");
    assert!(raw_product(&gpu, plain[0], plain[1], plain[2]).unwrap() <= 1e-5, "usable after the errors");
    // stream-ordered pool memory
    let pool: Vec<_> = (0..3).map(|_| s.alloc_zeros::<u8>(KIB).unwrap()).collect();
    let addr = |v: &cudarc::driver::CudaSlice<u8>| v.device_ptr(&s).0;
    assert!(raw_product(&gpu, addr(&pool[0]), addr(&pool[1]), addr(&pool[2])).unwrap() <= 1e-5, "pool memory");
    // managed memory
    let managed: Vec<u64> = (0..3)
        .map(|_| {
            unsafe { cudarc::driver::result::malloc_managed(KIB, drv::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
                .unwrap()
        })
        .collect();
    assert!(raw_product(&gpu, managed[0], managed[1], managed[2]).unwrap() <= 1e-5, "managed memory");
    // pinned host memory (the device reads it through the address space it shares)
    let pinned: Vec<u64> =
        (0..3).map(|_| unsafe { cudarc::driver::result::malloc_host(KIB, 0) }.unwrap() as u64).collect();
    assert!(raw_product(&gpu, pinned[0], pinned[1], pinned[2]).unwrap() <= 1e-5, "pinned host memory");
    // virtual-memory-managed device memory
    let vmm = Vmm::new(3 * KIB);
    let v = vmm.ptr;
    assert!(raw_product(&gpu, v, v + KIB as u64, v + 2 * KIB as u64).unwrap() <= 1e-5, "VMM memory");
    s.synchronize().unwrap();
    drop(vmm);
    for p in plain.into_iter().chain(managed).chain([wide_c]) {
        // SAFETY: allocated above, idle (synchronised), freed once.
        unsafe { cudarc::driver::result::free_sync(p) }.unwrap();
    }
    for p in pinned {
        // SAFETY: as above.
        unsafe { cudarc::driver::result::free_host(p as *mut std::ffi::c_void) }.unwrap();
    }
}

/// A reserved, mapped and accessible range of device 0's memory (cuMemCreate).
struct Vmm {
    ptr: u64,
    size: usize,
    handle: drv::CUmemGenericAllocationHandle,
}

impl Vmm {
    fn new(bytes: usize) -> Vmm {
        // SAFETY: plain driver calls on out-pointers to locals; the context is current.
        unsafe {
            let mut prop: drv::CUmemAllocationProp = std::mem::zeroed();
            prop.type_ = drv::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location = drv::CUmemLocation { type_: drv::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 };
            let mut gran = 0usize;
            let min = drv::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
            drv::cuMemGetAllocationGranularity(&mut gran, &prop, min).result().unwrap();
            let size = bytes.next_multiple_of(gran);
            let mut ptr = 0u64;
            drv::cuMemAddressReserve(&mut ptr, size, 0, 0, 0).result().unwrap();
            let mut handle = 0;
            drv::cuMemCreate(&mut handle, size, &prop, 0).result().unwrap();
            drv::cuMemMap(ptr, size, 0, handle, 0).result().unwrap();
            let access = drv::CUmemAccessDesc {
                location: prop.location,
                flags: drv::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            drv::cuMemSetAccess(ptr, size, &access, 1).result().unwrap();
            Vmm { ptr, size, handle }
        }
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        // SAFETY: mapped in new, idle (the caller synchronised), undone once.
        unsafe {
            drv::cuMemUnmap(self.ptr, self.size).result().unwrap();
            drv::cuMemRelease(self.handle).result().unwrap();
            drv::cuMemAddressFree(self.ptr, self.size).result().unwrap();
        }
    }
}
