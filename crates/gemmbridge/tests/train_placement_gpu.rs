//! GPU tests of where the training layers place GELU-tanh ([`GeluPlacement`]): every placement
//! of the forward and the backward (cuBLASLt epilogue or gemmbridge's kernel), and of the bias
//! gradient (the layer's weight-gradient GEMM or `DGeluBiasGrad`), overwriting and
//! accumulating, gives the
//! float64 result of the step within the precision's band, in tf32, f16 and bf16, on widths
//! the 8-wide kernels take (multiples of 8) and odd ones (the scalar kernels, and a kernel
//! backward where an epilogue cannot read a 65-wide pre-activation); outputs poisoned with NaN
//! first; each placement given at creation ([`MlpOptions::gelu`]) and read back.

mod common;

use common::train::{reference, step};
use common::{gpu, normal, rng};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::train::{Mlp, MlpOptions};
use gemmbridge::cuda::Gpu;
use gemmbridge::half::{bf16, f16};
use gemmbridge::reference::rel_error;
use gemmbridge::train::{
    init_params, Activation, GeluBiasGrad, GeluPlacement, GradMode, LayerParams, LinearSpec, Params, Placement,
};
use gemmbridge::{Element, Precision};

const PLACES: [Placement; 2] = [Placement::Epilogue, Placement::Kernel];

fn placements<T: Element + DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, prec: Precision, rng: &mut rand::rngs::StdRng) {
    for (d, f, out, tokens) in [(64usize, 256usize, 64usize, 37usize), (33, 65, 24, 19)] {
        let layers = [LinearSpec::new(d, f).with_activation(Activation::GeluTanh), LinearSpec::new(f, out)];
        let seed: u64 = rand::Rng::random(rng);
        let round = |v: &[f32]| v.iter().map(|&x| T::from_f32(x).to_f32()).collect::<Vec<_>>();
        let params: Params =
            init_params(&layers, seed).into_iter().map(|p| LayerParams { w: round(&p.w), b: round(&p.b) }).collect();
        let (x, dy): (Vec<T>, Vec<T>) = (normal(rng, tokens * d), normal(rng, tokens * out));
        let wide = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let exact = reference(&layers, &params, &wide(&x), &wide(&dy), tokens);
        let (xd, dyd) = (gpu.stream().clone_htod(&x).unwrap(), gpu.stream().clone_htod(&dy).unwrap());
        // each rounding of pre or of a gradient in T adds one band; three GEMMs deep
        let tol = prec.tolerance() * 3.0;
        let backwards = [
            (Placement::Epilogue, GeluBiasGrad::WeightGrad),
            (Placement::Epilogue, GeluBiasGrad::DataGrad),
            (Placement::Kernel, GeluBiasGrad::WeightGrad),
        ];
        for forward in PLACES {
            for (backward, bias_grad) in backwards {
                let g = GeluPlacement { forward, backward, bias_grad };
                let options = MlpOptions::default().gelu(g);
                let mut mlp = Mlp::<T>::with_options(gpu, &layers, prec, &params, options).unwrap();
                assert_eq!(mlp.options().gelu, g);
                let (got, first) = step(gpu, &mut mlp, &xd, &dyd, tokens);
                for (what, v) in &got {
                    let e = rel_error(v, &exact[what]);
                    assert!(e <= tol, "{prec} {d}→{f}→{out}, {tokens} tokens, {g:?}: {what} rel error {e:e} > {tol:e}");
                }
                // a second backward accumulating doubles every gradient (a fused bias gradient
                // goes through the layer's temporary and axpy)
                mlp.backward(gpu, &xd, &dyd, None::<&mut CudaSlice<T>>, GradMode::Accumulate).unwrap();
                let twice = mlp.grads_to_host(gpu).unwrap();
                let scaled = |v: &[f32], s: f64| v.iter().map(|&x| s * x as f64).collect::<Vec<_>>();
                for (i, (a, b)) in twice.iter().zip(&first).enumerate() {
                    for (name, a, b) in [("dw", &a.w, &b.w), ("db", &a.b, &b.b)] {
                        let e = rel_error(&scaled(a, 1.0), &scaled(b, 2.0));
                        assert!(e <= tol, "{prec} {g:?}: accumulated {name}{i} rel error {e:e}");
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gelu_placement_matches_float64() {
    let gpu = gpu();
    let mut rng = rng();
    placements::<f32>(&gpu, Precision::TF32, &mut rng);
    placements::<f16>(&gpu, Precision::F16, &mut rng);
    placements::<bf16>(&gpu, Precision::BF16, &mut rng);
    // f32 keeps its kernels whatever is asked: the same check holds
    placements::<f32>(&gpu, Precision::F32, &mut rng);
}
