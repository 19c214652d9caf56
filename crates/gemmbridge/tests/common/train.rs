//! The training tests' shared parts: one step of an [`Mlp`] and the float64 definition of a
//! step.

use std::collections::HashMap;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::train::Mlp;
use gemmbridge::cuda::Gpu;
use gemmbridge::train::{GradMode, LinearSpec, Params};
use gemmbridge::Element;

/// A device buffer widened to f64.
pub fn download<T: Element + DeviceRepr>(gpu: &Gpu, v: &CudaSlice<T>) -> Vec<f64> {
    gpu.stream().clone_dtoh(v).unwrap().iter().map(|x| x.to_f64()).collect()
}

/// One training step of `mlp` on `x` and `dy`, dx into a NaN-poisoned buffer: y, dx and every
/// layer's dw (and db, for a layer with a bias) as f64, and the gradients as the layers hold
/// them.
pub fn step<T: Element + DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    mlp: &mut Mlp<T>,
    x: &CudaSlice<T>,
    dy: &CudaSlice<T>,
    tokens: usize,
) -> (HashMap<String, Vec<f64>>, Params) {
    let mut dx = gpu.stream().clone_htod(&super::poison::<T>(x.len())).unwrap();
    mlp.forward(gpu, x, tokens, true).unwrap();
    let y: Vec<f64> = gpu.stream().clone_dtoh(&mlp.output().unwrap()).unwrap().iter().map(|v: &T| v.to_f64()).collect();
    mlp.backward(gpu, x, dy, Some(&mut dx), GradMode::Overwrite).unwrap();
    let grads = mlp.grads_to_host(gpu).unwrap();
    let mut out = HashMap::from([("y".to_string(), y), ("dx".to_string(), download(gpu, &dx))]);
    for (i, g) in grads.iter().enumerate() {
        out.insert(format!("dw{i}"), g.w.iter().map(|&v| v as f64).collect());
        if !g.b.is_empty() {
            out.insert(format!("db{i}"), g.b.iter().map(|&v| v as f64).collect());
        }
    }
    (out, grads)
}

/// Float64 forward and backward of `layers` (the definition, no tricks): y, dx, dw, db.
pub fn reference(layers: &[LinearSpec], p: &Params, x: &[f64], dy: &[f64], tokens: usize) -> HashMap<String, Vec<f64>> {
    let mut inputs = vec![x.to_vec()];
    let mut pres = Vec::new();
    for (l, lp) in layers.iter().zip(p) {
        let (i_f, o_f) = (l.in_features, l.out_features);
        let h = inputs.last().unwrap();
        let mut pre = vec![0.0; tokens * o_f];
        for t in 0..tokens {
            for o in 0..o_f {
                let s: f64 = (0..i_f).map(|i| h[t * i_f + i] * lp.w[o * i_f + i] as f64).sum();
                pre[t * o_f + o] = s + lp.b.get(o).map_or(0.0, |&b| b as f64);
            }
        }
        inputs.push(pre.iter().map(|&v| l.activation.apply(v)).collect());
        pres.push(pre);
    }
    let mut out = HashMap::from([("y".to_string(), inputs.last().unwrap().clone())]);
    let mut g = dy.to_vec();
    for (li, l) in layers.iter().enumerate().rev() {
        let (i_f, o_f) = (l.in_features, l.out_features);
        g.iter_mut().zip(&pres[li]).for_each(|(v, &pre)| *v *= l.activation.grad(pre));
        let h = &inputs[li];
        let mut dw = vec![0.0; o_f * i_f];
        for o in 0..o_f {
            for i in 0..i_f {
                dw[o * i_f + i] = (0..tokens).map(|t| g[t * o_f + o] * h[t * i_f + i]).sum();
            }
        }
        out.insert(format!("dw{li}"), dw);
        if l.bias {
            out.insert(format!("db{li}"), (0..o_f).map(|o| (0..tokens).map(|t| g[t * o_f + o]).sum()).collect());
        }
        let mut next = vec![0.0; tokens * i_f];
        for t in 0..tokens {
            for i in 0..i_f {
                next[t * i_f + i] = (0..o_f).map(|o| g[t * o_f + o] * p[li].w[o * i_f + i] as f64).sum();
            }
        }
        g = next;
    }
    out.insert("dx".into(), g);
    out
}
