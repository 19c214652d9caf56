//! One shape and dtype of `gemmbridge-burn bench`: its inputs, every variant timed, and the
//! adapter's path step by step.

use std::time::Instant;

use burn::tensor::{Distribution, FloatDType, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::ComputeClient;
use gemmbridge::cuda::{Gpu, RawBuffer, RawOperands, Scale};
use gemmbridge::Precision;

use super::rounds::{time_rounds, Variant};
use super::{BenchArgs, Plain, Row, Steps};

/// The cubecl tensor under a burn tensor (plain backend: no fusion queue to drain).
fn cube(t: &Tensor<Plain, 2>) -> CubeTensor<CudaRuntime> {
    match t.clone().into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => unreachable!("the bench creates float tensors"),
    }
}

/// ‖a − b‖ / ‖b‖, computed on the GPU in f32.
fn rel(a: Tensor<Plain, 2>, b: Tensor<Plain, 2>) -> f64 {
    let (a, b) = (a.cast(FloatDType::F32), b.cast(FloatDType::F32));
    let num = (a - b.clone()).powi_scalar(2).sum().into_scalar();
    let den = b.powi_scalar(2).sum().into_scalar();
    f64::from((num / den).sqrt())
}

pub struct Case<'a> {
    pub dev: &'a CudaDevice,
    pub gpu: &'a Gpu,
    pub shape: (usize, usize, usize),
    pub dtype: FloatDType,
    pub precision: Precision,
}

impl Case<'_> {
    pub fn measure(&self, args: &BenchArgs, name: &str) -> anyhow::Result<Row> {
        let (m, n, k) = self.shape;
        let sync = || <Plain as burn::tensor::backend::Backend>::sync(self.dev).expect("cubecl sync");
        let esize = if self.dtype == FloatDType::F32 { 4 } else { 2 };
        let pair_bytes = (m * k + k * n) * esize;
        let pairs = (256usize << 20).div_ceil(pair_bytes).clamp(1, 16);
        let rand =
            |r, c| Tensor::<Plain, 2>::random([r, c], Distribution::Uniform(-1.0, 1.0), self.dev).cast(self.dtype);
        let inputs: Vec<(Tensor<Plain, 2>, Tensor<Plain, 2>)> = (0..pairs).map(|_| (rand(m, k), rand(k, n))).collect();
        gemmbridge_burn::set_enabled(true);
        gemmbridge_burn::set_tf32(self.precision == Precision::TF32);
        let burn_call = |i: usize| drop(inputs[i % pairs].0.clone().matmul(inputs[i % pairs].1.clone()));
        let adapter_call =
            |i: usize| drop(gemmbridge_burn::matmul(inputs[i % pairs].0.clone(), inputs[i % pairs].1.clone()));
        // warm-up: burn's autotuner, gemmbridge's plan cache (Tensor::matmul is always burn's)
        (0..3).for_each(burn_call);
        (0..3).for_each(adapter_call);
        let burn_out = inputs[0].0.clone().matmul(inputs[0].1.clone());
        let rel_vs_burn = rel(gemmbridge_burn::matmul(inputs[0].0.clone(), inputs[0].1.clone()), burn_out);
        let probe = Variant { call: &adapter_call, sync: &sync }.sample(3);
        let iters = ((args.loop_ms / probe.max(1e-3)) as usize).clamp(3, 2000);
        let host_floor_us = {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
            let calls = iters.min(200);
            sync();
            let t = Instant::now();
            (0..calls).for_each(adapter_call);
            let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
            sync();
            us
        };
        let [adapter_ms, adapter_host_wait_ms, burn_ms, raw_ms, raw_wait_ms, raw_spin_ms, raw_edges_ms] =
            self.time_all(&inputs, args.reps, iters, &adapter_call, &burn_call)?;
        let steps_us = if args.steps { Some(self.steps(&inputs, iters)?) } else { None };
        let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
        Ok(Row {
            m,
            n,
            k,
            dtype: name.into(),
            burn_ms,
            adapter_ms,
            adapter_host_wait_ms,
            raw_ms,
            raw_wait_ms,
            raw_spin_ms,
            raw_edges_ms,
            host_floor_us,
            burn_tflops: tflops(burn_ms),
            adapter_tflops: tflops(adapter_ms),
            raw_tflops: tflops(raw_ms),
            speedup_vs_burn: burn_ms / adapter_ms,
            adapter_over_raw: adapter_ms / raw_ms,
            host_wait_over_raw: adapter_host_wait_ms / raw_ms,
            spin_over_raw: raw_spin_ms / raw_ms,
            edges_over_raw: raw_edges_ms / raw_ms,
            host_wait_speedup_vs_burn: burn_ms / adapter_host_wait_ms,
            adapter_cost_us: (adapter_ms - raw_ms) * 1e3,
            wait_cost_us: (raw_wait_ms - raw_ms) * 1e3,
            rel_vs_burn,
            sm_reserve: gemmbridge_burn::sm_reserve(),
            pairs,
            steps_us,
            burn_autotune: cfg!(feature = "burn-autotune"),
        })
    }

    /// The adapter's GEMM plan for `a·b` in this case's precision (the raw variants' problem).
    fn plan(
        &self,
        a: &CubeTensor<CudaRuntime>,
        b: &CubeTensor<CudaRuntime>,
    ) -> anyhow::Result<gemmbridge_burn::layout::MatmulPlan> {
        gemmbridge_burn::layout::plan(
            a.meta.shape(),
            a.meta.strides(),
            b.meta.shape(),
            b.meta.strides(),
            self.precision,
        )
        .map_err(|f| anyhow::anyhow!("no plan: {f:?}"))
    }

    /// The adapter's path (`cube.rs`'s `run`) step by step, with host timestamps around each
    /// step, over `iters` calls: the median of each step, µs.
    fn steps(&self, inputs: &[(Tensor<Plain, 2>, Tensor<Plain, 2>)], iters: usize) -> anyhow::Result<Steps> {
        let (m, n, _) = self.shape;
        let first = cube(&inputs[0].0);
        let client = first.client.clone();
        let plan = self.plan(&first, &cube(&inputs[0].1))?;
        let s = self.gpu.stream().clone();
        let us = |t: Instant| t.elapsed().as_secs_f64() * 1e6;
        let mut all: Vec<[f64; 7]> = Vec::with_capacity(iters);
        for i in 0..iters.max(3) {
            let (a, b) = (cube(&inputs[i % inputs.len()].0), cube(&inputs[i % inputs.len()].1));
            let t = Instant::now();
            let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
                client.clone(),
                a.device.clone(),
                [m, n].into(),
                a.dtype,
            );
            let alloc = us(t);
            let t = Instant::now();
            let inner = client
                .exclusive(|| -> anyhow::Result<[f64; 5]> {
                    let t = Instant::now();
                    let res = |x: &CubeTensor<CudaRuntime>| {
                        client.get_resource(x.handle.clone()).map_err(|e| anyhow::anyhow!("{e:?}"))
                    };
                    let (ra, rb, rc) = (res(&a)?, res(&b)?, res(&out)?);
                    let lookups = us(t);
                    let t = Instant::now();
                    cubecl::future::block_on(client.sync()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    let cubecl_sync = us(t);
                    let raw = |r: u64, size: u64| RawBuffer { address: r, len_bytes: size as usize };
                    let t = Instant::now();
                    // SAFETY: as in the adapter (cube.rs run): live cubecl allocations held by
                    // the bindings until after the synchronize below, cubecl's stream drained
                    // and its device thread held by this task.
                    unsafe {
                        self.gpu.gemm_raw(
                            &plan.problem,
                            Scale::PRODUCT,
                            RawOperands::new(
                                raw(ra.resource().ptr, ra.resource().size),
                                raw(rb.resource().ptr, rb.resource().size),
                                raw(rc.resource().ptr, rc.resource().size),
                            ),
                            s.cu_stream(),
                        )
                    }?;
                    let enqueue = us(t);
                    let t = Instant::now();
                    s.synchronize()?;
                    let gemm_wait = us(t);
                    drop((ra, rb, rc));
                    Ok([lookups, cubecl_sync, enqueue, gemm_wait, 0.0])
                })
                .map_err(|e| anyhow::anyhow!("cubecl device thread: {e:?}"))??;
            let exclusive = us(t);
            let t = Instant::now();
            drop(out);
            let dropped = us(t);
            let task: f64 = inner[..4].iter().sum();
            all.push([alloc, inner[0], inner[1], inner[2], inner[3], exclusive - task, dropped]);
        }
        let median = |j: usize| {
            let mut v: Vec<f64> = all.iter().map(|r| r[j]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok(Steps {
            alloc: median(0),
            lookups: median(1),
            cubecl_sync: median(2),
            enqueue: median(3),
            gemm_wait: median(4),
            round_trip: median(5),
            drop: median(6),
        })
    }

    /// Times the variants in interleaved rounds ([`time_rounds`]), ms per call: [adapter
    /// (device ordering), adapter (host-wait ordering), burn, raw (gemmbridge's raw GEMM on the
    /// inputs' own addresses, stream-ordered), raw with a host wait after each call, raw with
    /// the device ordering's wait kernel spinning on cubecl's stream meanwhile].
    fn time_all(
        &self,
        inputs: &[(Tensor<Plain, 2>, Tensor<Plain, 2>)],
        reps: usize,
        iters: usize,
        adapter_call: &dyn Fn(usize),
        burn_call: &dyn Fn(usize),
    ) -> anyhow::Result<[f64; 7]> {
        let (m, n, _) = self.shape;
        let first = cube(&inputs[0].0);
        let client = first.client.clone();
        let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
            client.clone(),
            first.device.clone(),
            [m, n].into(),
            first.dtype,
        );
        let tensors: Vec<[CubeTensor<CudaRuntime>; 2]> = inputs.iter().map(|(a, b)| [cube(a), cube(b)]).collect();
        let plan = self.plan(&first, &tensors[0][1])?;
        let resource =
            |t: &CubeTensor<CudaRuntime>| client.get_resource(t.handle.clone()).map_err(|e| anyhow::anyhow!("{e:?}"));
        let held: Vec<_> =
            tensors.iter().map(|[a, b]| Ok((resource(a)?, resource(b)?))).collect::<anyhow::Result<_>>()?;
        let rc = resource(&out)?;
        let raw = |ptr: u64, size: u64| RawBuffer { address: ptr, len_bytes: size as usize };
        let bufs: Vec<(RawBuffer, RawBuffer)> = held
            .iter()
            .map(|(a, b)| (raw(a.resource().ptr, a.resource().size), raw(b.resource().ptr, b.resource().size)))
            .collect();
        let c = raw(rc.resource().ptr, rc.resource().size);
        <Plain as burn::tensor::backend::Backend>::sync(self.dev).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let device = (&client, first.device.index);
        let ms = self.time_variants(&plan.problem, (&bufs, c), device, (reps, iters), (adapter_call, burn_call));
        drop((held, rc));
        Ok(ms)
    }

    /// [`Case::time_all`]'s variants on the raw buffers `bufs` (inputs, rotated) and `c` (the
    /// output), which the caller holds alive: burn timed in its own block first, then the
    /// others in interleaved rounds; ms per call in [`Case::time_all`]'s order.
    fn time_variants(
        &self,
        problem: &gemmbridge::GemmProblem,
        (bufs, c): (&[(RawBuffer, RawBuffer)], RawBuffer),
        (client, device): (&ComputeClient<CudaRuntime>, usize),
        (reps, iters): (usize, usize),
        (adapter_call, burn_call): (&dyn Fn(usize), &dyn Fn(usize)),
    ) -> [f64; 7] {
        let s = self.gpu.stream().clone();
        let gemm = |i: usize| {
            let (a, b) = bufs[i % bufs.len()];
            // SAFETY: the buffers are live cubecl allocations the caller holds (`time_all`'s
            // `held`/`rc`) until after the last round below; cubecl's stream is idle whenever a raw loop runs (synced above,
            // and every adapter/burn loop ends with a device sync), and nothing else writes
            // them (adapter and burn outputs are their own allocations); gemmbridge checks their
            // lengths against the plan.
            unsafe { self.gpu.gemm_raw(problem, Scale::PRODUCT, RawOperands::new(a, b, c), s.cu_stream()) }
                .expect("raw GEMM");
        };
        let sync = || s.synchronize().expect("stream synchronize");
        let gemm_wait = |i: usize| {
            gemm(i);
            sync();
        };
        let cubecl_sync = || <Plain as burn::tensor::backend::Backend>::sync(self.dev).expect("cubecl sync");
        let device_call = |i: usize| {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
            adapter_call(i)
        };
        let host_wait_call = |i: usize| {
            gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::HostWait);
            adapter_call(i)
        };
        // raw+spin: the first call of a loop starts the wait kernel, the loop's end releases it
        let stream_id = cubecl::stream_id::StreamId::current().value;
        let spinner = std::cell::RefCell::new(None::<gemmbridge_burn::Spinner>);
        let spin_call = |i: usize| {
            if spinner.borrow().is_none() {
                let started = gemmbridge_burn::Spinner::start(client, device, stream_id);
                *spinner.borrow_mut() = Some(started.expect("spin kernel"));
            }
            gemm(i)
        };
        let spin_sync = || {
            if let Some(sp) = spinner.borrow_mut().take() {
                s.context().bind_to_thread().expect("bind gemmbridge's context");
                // SAFETY: gemmbridge's stream is of the context the flags live in, bound above.
                unsafe { sp.release(s.cu_stream()) }.expect("release the spin kernel");
            }
            sync();
            cubecl_sync();
        };
        let edges_call = |i: usize| {
            gemmbridge_burn::with_device_edges(client, device, stream_id, &s, || gemm(i)).expect("device edges")
        };
        (0..3).for_each(gemm);
        // burn's kernels run at a different speed and power than the three gemmbridge variants:
        // interleaved with them, burn would lend the variant after it a cooler, faster-clocked
        // GPU. It is timed in its own block first.
        let burn = time_rounds(reps, iters, &[Variant { call: burn_call, sync: &cubecl_sync }])[0];
        let ms = time_rounds(
            reps,
            iters,
            &[
                Variant { call: &device_call, sync: &cubecl_sync },
                Variant { call: &host_wait_call, sync: &cubecl_sync },
                Variant { call: &gemm, sync: &sync },
                Variant { call: &gemm_wait, sync: &sync },
                Variant { call: &spin_call, sync: &spin_sync },
                Variant { call: &edges_call, sync: &cubecl_sync },
            ],
        );
        gemmbridge_burn::set_ordering(gemmbridge_burn::GemmOrdering::Device);
        [ms[0], ms[1], burn, ms[2], ms[3], ms[4], ms[5]]
    }
}
