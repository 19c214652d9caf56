//! Device ordering on a CUDA GPU (ignored elsewhere). The ordering is process-wide and the tests
//! count ordered calls exactly, so each runs alone ([`crate::exclusive`]).
//!
//! The stress test chains adapter GEMMs with burn's own kernels on the same tensors, with no
//! host wait between them, so that every ordering edge matters: burn writes the GEMM's input
//! just before it (forward edge), reads and overwrites its output right after it and reuses
//! the memory of the tensors it drops (back edge). The GEMM multiplies by a permutation
//! matrix and burn adds and subtracts integers, so with integer-valued data every step is
//! exact in f32 and the float64 reference is exact too: one stale or early read anywhere
//! shows as a wrong value at the next checkpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::{Distribution, FloatDType, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{matmul, ordering_counts, set_ordering, GemmOps, GemmOrdering};

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;
type Fused = burn_fusion::Fusion<Plain>;

/// Aborts the process (a hang is a failure, not a stuck CI job) unless dropped within `secs`.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn new(what: &'static str, secs: u64) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(secs) {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("{what}: no progress after {secs} s: hung (device ordering deadlock?)");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Steps of the stress chain: `GEMMBRIDGE_STRESS_STEPS` (a short run under compute-sanitizer),
/// else 10,000.
fn stress_steps() -> usize {
    std::env::var("GEMMBRIDGE_STRESS_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000)
}

/// A seeded permutation of `0..n` (splitmix64-driven Fisher–Yates).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    p
}

/// The chain `x ← ((x·P) + c) − c` for `steps` steps on backend `B` in `dtype`, with
/// checkpoints every `check` steps against the exact float64 chain. `x[m, n]` holds integers
/// in [−64, 64] (exact in f16 and bf16 too); `P[n, n]` is a permutation matrix, so
/// `(x·P)[i, j] = x[i, π(j)]` with `P[π(j), j] = 1`.
fn chain<B: GemmOps>(steps: usize, check: usize, (m, n): (usize, usize), dtype: FloatDType, seed: u64) {
    let dev = Default::default();
    let pi = permutation(n, seed);
    let mut p = vec![0f32; n * n];
    for (j, &src) in pi.iter().enumerate() {
        p[src * n + j] = 1.0;
    }
    let x0: Vec<f64> = (0..m * n).map(|i| ((i as u64 * 2_654_435_761 + seed) % 129) as f64 - 64.0).collect();
    let pm = Tensor::<B, 2>::from_data(TensorData::new(p, [n, n]), &dev).cast(dtype);
    let mut x =
        Tensor::<B, 2>::from_data(TensorData::new(x0.iter().map(|&v| v as f32).collect(), [m, n]), &dev).cast(dtype);
    // x after t steps is x0[i, σ_t(j)], σ_t = π applied t times: σ_{t+1}(j) = σ_t(π(j))
    let mut sigma: Vec<usize> = (0..n).collect();
    for step in 1..=steps {
        let y = matmul(x, pm.clone());
        // burn's kernels: read the GEMM's output, write new tensors (often in place, into y's
        // memory), drop the old ones (their memory goes straight back to cubecl's pool)
        let c = ((step % 17) as f64) - 8.0;
        x = (y + c) - c;
        sigma = (0..n).map(|j| sigma[pi[j]]).collect();
        if step % check == 0 || step == steps {
            let want: Vec<f64> = (0..m * n).map(|idx| x0[(idx / n) * n + sigma[idx % n]]).collect();
            let got: Vec<f64> = x
                .clone()
                .cast(FloatDType::F32)
                .into_data()
                .to_vec::<f32>()
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect();
            let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(wrong, 0, "{dtype:?} step {step}: {wrong} of {} values differ from the exact chain", m * n);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stress_chain_device_ordering_plain_and_fused() {
    let _alone = crate::exclusive();
    set_ordering(GemmOrdering::Device);
    let steps = stress_steps();
    let _dog = Watchdog::new("stress chain", 600);
    let before = ordering_counts();
    // 1024×1024 f32: each GEMM takes ~tens of µs on the GPU, longer than the host needs to
    // queue burn's kernels behind it, so the queues really run ahead of the GEMMs
    chain::<Plain>(steps, 1000, (1024, 1024), FloatDType::F32, 1);
    let after = ordering_counts();
    assert_eq!(after.0 - before.0, steps, "every call ordered on the device ({before:?} → {after:?})");
    assert_eq!(after.1, before.1, "no call fell back to host waits");
    chain::<Plain>(steps / 10, 100, (512, 768), FloatDType::BF16, 2);
    chain::<Fused>(steps / 10, 100, (512, 512), FloatDType::F16, 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn orderings_agree_bit_for_bit() {
    let _alone = crate::exclusive();
    let _dog = Watchdog::new("orderings agree", 300);
    let dev = Default::default();
    let a = Tensor::<Plain, 2>::random([333, 517], Distribution::Normal(0.0, 1.0), &dev).cast(FloatDType::BF16);
    let b = Tensor::<Plain, 2>::random([517, 260], Distribution::Normal(0.0, 1.0), &dev).cast(FloatDType::BF16);
    let run = |o: GemmOrdering| {
        set_ordering(o);
        matmul(a.clone(), b.clone()).cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap()
    };
    let (host, device) = (run(GemmOrdering::HostWait), run(GemmOrdering::Device));
    set_ordering(GemmOrdering::Device);
    assert!(device.iter().all(|v| v.is_finite()));
    assert_eq!(host, device, "the same GEMM under both orderings");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn operand_from_another_thread_waits_on_the_host() {
    let _alone = crate::exclusive();
    let _dog = Watchdog::new("cross-stream", 300);
    set_ordering(GemmOrdering::Device);
    let dev: cubecl::cuda::CudaDevice = Default::default();
    let other = dev.clone();
    // made on another thread: another cubecl stream id
    let a = std::thread::spawn(move || {
        let dev = other;
        Tensor::<Plain, 2>::from_data(TensorData::new((0..64 * 32).map(|i| (i % 7) as f32).collect(), [64, 32]), &dev)
    })
    .join()
    .unwrap();
    let b =
        Tensor::<Plain, 2>::from_data(TensorData::new((0..32 * 16).map(|i| (i % 5) as f32).collect(), [32, 16]), &dev);
    let before = ordering_counts();
    let got = matmul(a.clone(), b.clone()).into_data().to_vec::<f32>().unwrap();
    let after = ordering_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 1), "one host-wait call, no device-ordered one");
    let (av, bv) = (a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
    let want: Vec<f32> =
        (0..64 * 16).map(|idx| (0..32).map(|l| av[(idx / 16) * 32 + l] * bv[l * 16 + idx % 16]).sum()).collect();
    assert_eq!(got, want, "small integers: exact");
}
