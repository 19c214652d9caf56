//! GPU tests of FP8: the quantisation kernels against the CPU specification bit for bit, and
//! the FP8 GEMM of every recipe against the float64 product of the dequantised operands, with
//! the shapes Hopper cannot take directly (K, M, N off 16; a `[K, N]` weight; β ≠ 0).

mod common;

use common::{gpu, normal, rng};
use cudarc::driver::{CudaSlice, DeviceRepr};
use gemmbridge::cuda::{Fp8Options, Fp8Out, Fp8Tensor, Gpu};
use gemmbridge::fp8::{dequantize, fp8_to_f32, quantize, Fp8Format, Fp8Rule, Quantized, Scaling, Source};
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::{Element, Error};
use rand::Rng;

/// The capture test takes this exclusively, the others share it: another thread's first kernel
/// launch or module load (CUDA's lazy loading synchronises the device) invalidates a capture.
static CAPTURE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|p| p.into_inner())
}

const SCALINGS: [Scaling; 4] = [Scaling::Tensor, Scaling::Row, Scaling::Block1x128, Scaling::Block128x128];

/// The (x, w) scalings cuBLASLt pairs.
const RECIPES: [(Scaling, Scaling); 5] = gemmbridge::fp8::SCALING_PAIRS;

fn upload<T: DeviceRepr + Clone>(gpu: &Gpu, v: &[T]) -> CudaSlice<T> {
    gpu.stream().clone_htod(v).expect("upload")
}

fn download<T: DeviceRepr + Clone + Default>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<T> {
    let out = gpu.stream().clone_dtoh(v).expect("download");
    gpu.stream().synchronize().expect("sync");
    out
}

/// Random values with a spread of magnitudes per row (so that row and block scales differ),
/// some rows all zero.
fn spread<T: Element>(rng: &mut rand::rngs::StdRng, rows: usize, cols: usize) -> Vec<T> {
    let base: Vec<f32> = normal(rng, rows * cols);
    (0..rows * cols)
        .map(|i| {
            let r = i / cols;
            let mag = if r % 7 == 3 { 0.0 } else { 2f32.powi((r % 9) as i32 - 4) * (1.0 + (i % 300) as f32 / 100.0) };
            T::from_f32(base[i] * mag)
        })
        .collect()
}

fn same_bits(a: &Quantized, b: &Quantized) -> Result<(), String> {
    if a.data != b.data {
        let i = a.data.iter().zip(&b.data).position(|(x, y)| x != y).unwrap_or(0);
        return Err(format!("data differs first at byte {i}: gpu {:#04x} cpu {:#04x}", a.data[i], b.data[i]));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if bits(&a.scales) != bits(&b.scales) {
        let i = a.scales.iter().zip(&b.scales).position(|(x, y)| x.to_bits() != y.to_bits()).unwrap_or(0);
        return Err(format!("scale {i} differs: gpu {} cpu {}", a.scales[i], b.scales[i]));
    }
    Ok(())
}

fn kernels_match<T: Element + DeviceRepr>(gpu: &Gpu, rng: &mut rand::rngs::StdRng) {
    // 2050 × 2100 is larger than one pass of the grid-stride kernels (1056 CTAs), so their
    // loops run more than once; 5 × 17000 has rows longer than the row-wise kernels keep in
    // registers (their second read of the row) and picks the long-row instance
    // 136 × 72: a transposed 16-bit source whose rows take the cast-transpose's 16-byte loads,
    // on a partial tile of 128 output rows
    for (rows, cols) in
        [(1, 1), (3, 130), (70, 200), (129, 257), (256, 384), (136, 72), (33, 8), (2050, 2100), (5, 17000)]
    {
        let mut host: Vec<T> = spread(rng, rows, cols);
        if rows * cols > 100 {
            host[17] = T::from_f32(1e30); // saturates in f32 sources; inf in the half types
        }
        if rows > 2 {
            // a row of tiny values (zero in f16): fmax / amax overflows, the clamped path
            for c in 0..cols {
                host[2 * cols + c] = T::from_f32(1e-38 * (1.0 + (c % 5) as f32));
            }
        }
        let dev = upload(gpu, &host);
        for source in [Source::RowMajor, Source::Transposed] {
            // a transposed source holds the same values as the [K, rows] matrix
            for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                for scaling in SCALINGS {
                    let got = gpu
                        .fp8()
                        .quantize(&dev, rows, cols, source, format, scaling)
                        .expect("quantize")
                        .to_host()
                        .unwrap();
                    let want = quantize(&host, rows, cols, source, format, scaling).unwrap();
                    if let Err(e) = same_bits(&got, &want) {
                        panic!("{:?} [{rows}, {cols}] {source:?} {format} {scaling}: {e}", T::DTYPE);
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantisation_kernels_match_the_cpu_specification_bit_for_bit() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    kernels_match::<f32>(&gpu, &mut rng);
    kernels_match::<f16>(&gpu, &mut rng);
    kernels_match::<bf16>(&gpu, &mut rng);
}

/// `y = α·x·wᵀ (+ β·y0) (+ bias)` in f64 from the dequantised operands.
fn reference(x: &Quantized, w: &Quantized, alpha: f64, beta: f64, y0: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let (xd, wd) = (dequantize(x).unwrap(), dequantize(w).unwrap());
    let (m, n, k) = (x.layout.rows, w.layout.rows, x.layout.cols);
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| xd[i * k + p] * wd[j * k + p]).sum();
            y[i * n + j] = alpha * dot + beta * y0[i * n + j] + bias.map_or(0.0, |b| b[j]);
        }
    }
    y
}

/// One FP8 GEMM against the dequantised reference: the relative error.
#[allow(clippy::too_many_arguments)]
fn gemm_case<O: Element + DeviceRepr>(
    gpu: &Gpu,
    rng: &mut rand::rngs::StdRng,
    (m, n, k): (usize, usize, usize),
    (xs, ws): (Scaling, Scaling),
    w_source: Source,
    beta: f32,
    with_bias: bool,
) -> Result<f64, Error> {
    let xh: Vec<bf16> = spread(rng, m, k);
    let wh: Vec<bf16> = normal(rng, n * k); // [N, K] or, transposed, [K, N]
    let (xd, wd) = (upload(gpu, &xh), upload(gpu, &wh));
    let x = gpu.fp8().quantize(&xd, m, k, Source::RowMajor, Fp8Format::E4M3, xs)?;
    let w = gpu.fp8().quantize(&wd, n, k, w_source, Fp8Format::E4M3, ws)?;
    let y0: Vec<O> = if beta != 0.0 { normal(rng, m * n) } else { vec![O::from_f32(f32::NAN); m * n] };
    let bias: Vec<O> = normal(rng, n);
    let mut yd = upload(gpu, &y0);
    let bd = upload(gpu, &bias);
    let opts = Fp8Options { alpha: 0.75, beta, fast_accum: false };
    gpu.fp8().gemm(&x, &w, &mut yd, with_bias.then_some(&bd as _), opts)?;
    let got: Vec<f64> = download(gpu, &yd).iter().map(|v| v.to_f64()).collect();
    let y0w: Vec<f64> = y0.iter().map(|v| if beta != 0.0 { v.to_f64() } else { 0.0 }).collect();
    let bw: Vec<f64> = bias.iter().map(|v| v.to_f64()).collect();
    let want = reference(&x.to_host()?, &w.to_host()?, 0.75, beta as f64, &y0w, with_bias.then_some(&bw[..]));
    Ok(rel_error(&got, &want))
}

/// f32 output: the FP8 tensor cores' accumulation (measured 1.3e-4 at K = 8192, where an
/// operand layout or scale mix-up gives errors of order 1); 16-bit outputs: their rounding.
fn band<O: Element>() -> f64 {
    if O::DTYPE == gemmbridge::DType::F32 {
        1e-3
    } else {
        1e-2
    }
}

fn every_recipe<O: Element + DeviceRepr>(gpu: &Gpu, rng: &mut rand::rngs::StdRng) {
    // aligned; K off 16 and M off 16; N off 8; one row; M off 4 with N off 16
    let shapes = [(256, 512, 384), (70, 264, 200), (64, 260, 256), (1, 256, 128), (130, 136, 1000)];
    for recipe in RECIPES {
        for shape in shapes {
            for (beta, bias) in [(0.0, false), (0.5, false), (0.0, true)] {
                let r = gemm_case::<O>(gpu, rng, shape, recipe, Source::RowMajor, beta, bias);
                if bias && O::DTYPE == gemmbridge::DType::F32 {
                    assert!(matches!(r, Err(Error::Fp8 { rule: Fp8Rule::Bias, .. })), "f32 output with a bias: {r:?}");
                    continue;
                }
                let e = r.unwrap_or_else(|e| panic!("{:?} {recipe:?} {shape:?} β {beta} bias {bias}: {e}", O::DTYPE));
                eprintln!("{:?} {recipe:?} {shape:?} β {beta} bias {bias}: error {e:.2e}", O::DTYPE);
                assert!(e <= band::<O>(), "{:?} {recipe:?} {shape:?} β {beta} bias {bias}: error {e:.2e}", O::DTYPE);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_recipe_matches_the_dequantised_product_on_awkward_shapes() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    every_recipe::<bf16>(&gpu, &mut rng);
    every_recipe::<f16>(&gpu, &mut rng);
    every_recipe::<f32>(&gpu, &mut rng);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_weight_given_k_by_n_is_transposed_while_it_is_quantised() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    let (n, k) = (136, 200);
    let w_kn: Vec<bf16> = normal(&mut rng, k * n);
    let mut w_nk = vec![bf16::ZERO; n * k];
    for r in 0..n {
        for c in 0..k {
            w_nk[r * k + c] = w_kn[c * n + r];
        }
    }
    let (a, b) = (upload(&gpu, &w_kn), upload(&gpu, &w_nk));
    for scaling in SCALINGS {
        let t = gpu.fp8().quantize(&a, n, k, Source::Transposed, Fp8Format::E4M3, scaling).unwrap().to_host().unwrap();
        let r = gpu.fp8().quantize(&b, n, k, Source::RowMajor, Fp8Format::E4M3, scaling).unwrap().to_host().unwrap();
        assert_eq!(t, r, "{scaling}");
    }
    for recipe in RECIPES {
        let e = gemm_case::<bf16>(&gpu, &mut rng, (96, n, k), recipe, Source::Transposed, 0.0, false).unwrap();
        assert!(e <= 1e-2, "{recipe:?}: {e:.2e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_fp8_output_has_its_d_scale_and_amax() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    let (m, n, k) = (70, 144, 256);
    let xh: Vec<f32> = normal(&mut rng, m * k);
    let wh: Vec<f32> = normal(&mut rng, n * k);
    let x = gpu.fp8().quantize(&upload(&gpu, &xh), m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).unwrap();
    let w = gpu.fp8().quantize(&upload(&gpu, &wh), n, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor).unwrap();
    let want = reference(&x.to_host().unwrap(), &w.to_host().unwrap(), 1.0, 0.0, &vec![0.0; m * n], None);
    let amax_want = want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let d_scale = (448.0 / amax_want) as f32;
    let ds = upload(&gpu, &[d_scale]);
    let mut amax = upload(&gpu, &[f32::NAN]);
    let mut y = upload(&gpu, &vec![0xffu8; m * n]);
    gpu.fp8()
        .gemm_to_fp8(&x, &w, &mut y, Fp8Out { d_scale: &ds, amax: &mut amax }, None, Fp8Options::default())
        .unwrap();
    let amax_got = download(&gpu, &amax)[0] as f64;
    // within the FP8 tensor cores' accumulation error (1.3e-4 measured at K = 8192)
    assert!((amax_got - amax_want).abs() <= 1e-3 * amax_want, "amax {amax_got} vs {amax_want}");
    let got: Vec<f64> =
        download(&gpu, &y).iter().map(|&b| fp8_to_f32(b, Fp8Format::E4M3) as f64 / d_scale as f64).collect();
    let e = rel_error(&got, &want);
    assert!(e <= 0.05, "E4M3 output error {e:.2e}"); // E4M3's own rounding: 2^-4 per element at worst
    eprintln!("E4M3 output: error {e:.2e}, amax {amax_got}");
}

fn rule_of(e: Error) -> Fp8Rule {
    match e {
        Error::Fp8 { rule, .. } => rule,
        other => panic!("expected an FP8 rule error, got {other}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn broken_rules_are_named_errors_and_the_engine_stays_usable() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    let (m, n, k) = (64, 128, 256);
    let xh = upload(&gpu, &normal::<bf16>(&mut rng, m * k));
    let wh = upload(&gpu, &normal::<bf16>(&mut rng, n * k));
    let q = |d: &CudaSlice<bf16>, rows, f, s| gpu.fp8().quantize(d, rows, k, Source::RowMajor, f, s).unwrap();
    let mut y: CudaSlice<bf16> = upload(&gpu, &vec![bf16::NAN; m * n]);
    let (x5, w5) = (q(&xh, m, Fp8Format::E5M2, Scaling::Tensor), q(&wh, n, Fp8Format::E5M2, Scaling::Tensor));
    let e = gpu.fp8().gemm(&x5, &w5, &mut y, None, Fp8Options::default()).unwrap_err();
    assert_eq!(rule_of(e), Fp8Rule::NoE5m2Pair);
    let (xb, wb) = (q(&xh, m, Fp8Format::E4M3, Scaling::Block1x128), q(&wh, n, Fp8Format::E4M3, Scaling::Block128x128));
    let fast = Fp8Options { fast_accum: true, ..Fp8Options::default() };
    assert_eq!(rule_of(gpu.fp8().gemm(&xb, &wb, &mut y, None, fast).unwrap_err()), Fp8Rule::FastAccum);
    let wt = q(&wh, n, Fp8Format::E4M3, Scaling::Tensor);
    assert_eq!(
        rule_of(gpu.fp8().gemm(&xb, &wt, &mut y, None, Fp8Options::default()).unwrap_err()),
        Fp8Rule::ScalingPair
    );
    let short: Vec<bf16> = vec![bf16::ZERO; 10];
    let w_short = gpu
        .fp8()
        .quantize(
            &upload(&gpu, &normal::<bf16>(&mut rng, n * 128)),
            n,
            128,
            Source::RowMajor,
            Fp8Format::E4M3,
            Scaling::Block1x128,
        )
        .unwrap();
    assert_eq!(
        rule_of(gpu.fp8().gemm(&xb, &w_short, &mut y, None, Fp8Options::default()).unwrap_err()),
        Fp8Rule::InnerDimension
    );
    let mut small = upload(&gpu, &short);
    assert!(matches!(
        gpu.fp8().gemm(&xb, &wb, &mut small, None, Fp8Options::default()),
        Err(Error::BufferTooSmall { .. })
    ));
    assert!(matches!(
        gpu.fp8().quantize(&upload(&gpu, &short), 4, 4, Source::RowMajor, Fp8Format::E4M3, Scaling::Tensor),
        Err(Error::BufferTooSmall { .. })
    ));
    // nothing was written, and the engine still runs a correct call
    assert!(download(&gpu, &y).iter().all(|v| v.is_nan()));
    gpu.fp8().gemm(&xb, &wb, &mut y, None, Fp8Options::default()).unwrap();
    assert!(download(&gpu, &y).iter().all(|v| v.is_finite()));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fast_accumulation_costs_little_accuracy_where_it_is_offered() {
    let _lock = shared();
    let gpu = gpu();
    let mut rng = rng();
    let (m, n, k) = (256, 256, 8192);
    for scaling in [Scaling::Tensor, Scaling::Row] {
        let mut errs = Vec::new();
        for fast in [false, true] {
            let xh: Vec<f32> = normal(&mut rng, m * k);
            let wh: Vec<f32> = normal(&mut rng, n * k);
            let x: Fp8Tensor =
                gpu.fp8().quantize(&upload(&gpu, &xh), m, k, Source::RowMajor, Fp8Format::E4M3, scaling).unwrap();
            let w = gpu.fp8().quantize(&upload(&gpu, &wh), n, k, Source::RowMajor, Fp8Format::E4M3, scaling).unwrap();
            let mut y = upload(&gpu, &vec![f32::NAN; m * n]);
            gpu.fp8().gemm(&x, &w, &mut y, None, Fp8Options { fast_accum: fast, ..Fp8Options::default() }).unwrap();
            let got: Vec<f64> = download(&gpu, &y).iter().map(|&v| v as f64).collect();
            let want = reference(&x.to_host().unwrap(), &w.to_host().unwrap(), 1.0, 0.0, &vec![0.0; m * n], None);
            errs.push(rel_error(&got, &want));
        }
        eprintln!(
            "{scaling}: K = {k}, error vs the dequantised product: exact accumulation {:.2e}, fast {:.2e}",
            errs[0], errs[1]
        );
        assert!(errs[0] <= 1e-3 && errs[1] <= 1e-2, "{scaling}: {errs:?}");
        let _ = rng.random::<u8>();
    }
}

/// Before the kernels exist a quantisation inside a capture is a named error; after
/// `GpuFp8::prepare` and one eager call (the plan), a quantisation and an FP8 GEMM captured into one
/// graph and launched give the eager result, bit for bit. cudarc's event tracking is off on
/// this context, as capturing cudarc buffers needs: with it on, using a buffer last written
/// before the capture waits on that write's event, which a capture refuses
/// (CUDA_ERROR_STREAM_CAPTURE_ISOLATION, seen on the H200).
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantisation_and_fp8_gemm_are_capturable_once_prepared() {
    let _lock = CAPTURE.write().unwrap_or_else(|p| p.into_inner());
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let mut rng = rng();
    let (m, n, k) = (128, 256, 512);
    let xh: Vec<bf16> = normal(&mut rng, m * k);
    let wh: Vec<bf16> = normal(&mut rng, n * k);
    // a fresh Gpu: its kernels are not compiled yet
    let fresh = gpu();
    // SAFETY: every buffer of this test is used on `s` only, in order.
    unsafe { fresh.context().disable_event_tracking() };
    let s = fresh.stream().clone();
    let xd = upload(&fresh, &xh);
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let e = fresh.fp8().quantize(&xd, m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap_err();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(e, Error::NotCapturable { .. }), "{e}");

    fresh.fp8().prepare().unwrap();
    let wd = upload(&fresh, &wh);
    let w = fresh.fp8().quantize(&wd, n, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap();
    let x = fresh.fp8().quantize(&xd, m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row).unwrap();
    let mut eager: CudaSlice<bf16> = upload(&fresh, &vec![bf16::NAN; m * n]);
    fresh.fp8().gemm(&x, &w, &mut eager, None, Fp8Options::default()).unwrap();
    let want = download(&fresh, &eager);

    let mut y: CudaSlice<bf16> = upload(&fresh, &vec![bf16::NAN; m * n]);
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let x2 = fresh.fp8().quantize(&xd, m, k, Source::RowMajor, Fp8Format::E4M3, Scaling::Row);
    let r = x2.as_ref().map(|x2| fresh.fp8().gemm(x2, &w, &mut y, None, Fp8Options::default()));
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    r.unwrap().unwrap();
    let x2 = x2.unwrap();
    graph.unwrap().expect("a graph").launch().unwrap();
    let got = download(&fresh, &y);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    drop(x2);
}
