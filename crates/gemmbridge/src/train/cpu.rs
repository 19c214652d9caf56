//! The CPU backend of the training layers: f32, unfused (every GEMM through [`crate::cpu::gemm`],
//! bias, activation and their gradients as loops). Same conventions and call order as the
//! GPU's [`crate::cuda::train::Mlp`]; it runs where there is no GPU.

use std::time::{Duration, Instant};

use super::{check_layers, check_len, check_params, Activation, GradMode, LayerParams, LinearSpec, Params};
use crate::error::{Error, Result};
use crate::layout::{MatrixLayout, Operand};
use crate::precision::Precision;
use crate::problem::GemmProblem;

/// What a training forward keeps for the backward.
struct Saved {
    tokens: usize,
    /// The input's address and length, to check the backward gets the same one.
    x: (usize, usize),
    /// Per layer: the output `act(pre)` `[tokens, out]`, and `pre` where the activation's
    /// derivative needs it.
    outs: Vec<Vec<f32>>,
    pres: Vec<Vec<f32>>,
}

/// A sequence of linear layers on the CPU, f32.
///
/// ```
/// use gemmbridge::train::{cpu::Mlp, init_params, Activation, GradMode, LinearSpec};
/// let layers = [LinearSpec::new(4, 8).with_activation(Activation::Relu), LinearSpec::new(8, 2)];
/// let mut mlp = Mlp::new(&layers, init_params(&layers, 1))?;
/// let x = vec![0.5f32; 3 * 4]; // 3 tokens
/// let y = mlp.forward(&x, 3, true)?.to_vec(); // [3, 2]
/// let dy = vec![1.0f32; y.len()];
/// mlp.backward(&x, &dy, None, GradMode::Overwrite)?;
/// mlp.sgd_step(0.1);
/// # Ok::<(), gemmbridge::Error>(())
/// ```
pub struct Mlp {
    layers: Vec<LinearSpec>,
    params: Params,
    grads: Params,
    saved: Option<Saved>,
    /// The last forward's output.
    y: Vec<f32>,
    gemm_time: Duration,
}

impl Mlp {
    /// Layers with their parameters ([`super::init_params`] gives PyTorch's initialisation).
    ///
    /// # Errors
    /// [`Error::LayerShape`] when the layers do not chain or a parameter has the wrong length.
    pub fn new(layers: &[LinearSpec], params: Params) -> Result<Mlp> {
        check_layers(layers)?;
        check_params(layers, &params)?;
        let grads = params.iter().map(|p| LayerParams { w: vec![0.0; p.w.len()], b: vec![0.0; p.b.len()] }).collect();
        Ok(Mlp { layers: layers.to_vec(), params, grads, saved: None, y: Vec::new(), gemm_time: Duration::ZERO })
    }

    /// The layers.
    pub fn layers(&self) -> &[LinearSpec] {
        &self.layers
    }

    /// The parameters (`w[out, in]`, `b[out]` per layer).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The gradients of the last backward (same shapes as the parameters).
    pub fn grads(&self) -> &Params {
        &self.grads
    }

    /// Wall time spent in GEMMs since creation.
    pub fn gemm_time(&self) -> Duration {
        self.gemm_time
    }

    /// `y[tokens, out] = layers(x[tokens, in])`. With `train`, keeps what the backward needs
    /// (every layer's output and, for GELU, its pre-activation).
    ///
    /// # Errors
    /// [`Error::LayerShape`] when `x.len() != tokens × in_features` of the first layer.
    pub fn forward(&mut self, x: &[f32], tokens: usize, train: bool) -> Result<&[f32]> {
        check_len(0, "input length (tokens × in_features)", x.len(), tokens, self.layers[0].in_features)?;
        self.saved = None;
        let (mut outs, mut pres) = (Vec::new(), Vec::new());
        let mut input = x.to_vec();
        for (l, p) in self.layers.iter().zip(&self.params) {
            let mut pre = vec![0.0f32; tokens * l.out_features];
            let prob = GemmProblem::linear(tokens, l.out_features, l.in_features, Precision::F32)?;
            let t = Instant::now();
            crate::cpu::gemm(&prob, 1.0, &input, &p.w, 0.0, &mut pre)?;
            self.gemm_time += t.elapsed();
            if l.bias {
                for row in pre.chunks_mut(l.out_features) {
                    row.iter_mut().zip(&p.b).for_each(|(v, b)| *v += b);
                }
            }
            let out: Vec<f32> = pre.iter().map(|&v| act_f32(l.activation, v)).collect();
            if train {
                outs.push(out.clone());
                pres.push(if l.activation.saves_pre() { pre } else { Vec::new() });
            }
            input = out;
        }
        if train {
            self.saved = Some(Saved { tokens, x: (x.as_ptr() as usize, x.len()), outs, pres });
        }
        self.y = input;
        Ok(&self.y)
    }

    /// The backward of the last training forward: parameter gradients (into [`Mlp::grads`],
    /// overwritten or accumulated per `mode`) and, if `dx` is given, the input gradient
    /// `dx[tokens, in]`. `x` is the forward's input, `dy[tokens, out]` the gradient of its
    /// output.
    ///
    /// # Errors
    /// [`Error::TrainingOrder`] without a training forward, or when `x` is not the slice that
    /// forward read; [`Error::LayerShape`] for a `dy` or `dx` of the wrong length.
    pub fn backward(&mut self, x: &[f32], dy: &[f32], dx: Option<&mut [f32]>, mode: GradMode) -> Result<()> {
        let saved = self.saved.as_ref().ok_or_else(|| Error::TrainingOrder {
            problem: "backward needs a forward with train = true first".into(),
        })?;
        if saved.x != (x.as_ptr() as usize, x.len()) {
            return Err(Error::TrainingOrder {
                problem: "backward was given another input than the training forward read".into(),
            });
        }
        let tokens = saved.tokens;
        let last = self.layers.len() - 1;
        check_len(last, "dy length (tokens × out_features)", dy.len(), tokens, self.layers[last].out_features)?;
        if let Some(dx) = dx.as_deref() {
            check_len(0, "dx length (tokens × in_features)", dx.len(), tokens, self.layers[0].in_features)?;
        }
        let beta = if mode == GradMode::Accumulate { 1.0 } else { 0.0 };
        let mut g = dy.to_vec();
        for i in (0..self.layers.len()).rev() {
            let l = self.layers[i];
            // dpre = g ⊙ act'(pre)   (ReLU: from the output)
            let act = l.activation;
            match act {
                Activation::None => {}
                Activation::Relu => {
                    g.iter_mut().zip(&saved.outs[i]).for_each(|(v, &y)| *v *= f32::from(u8::from(y > 0.0)))
                }
                _ => g.iter_mut().zip(&saved.pres[i]).for_each(|(v, &p)| *v = (*v as f64 * act.grad(p as f64)) as f32),
            }
            let input: &[f32] = if i == 0 { x } else { &saved.outs[i - 1] };
            // dw[out, in] = dpreᵀ·x
            let pw = GemmProblem::new(
                Operand::t(MatrixLayout::row_major(tokens, l.out_features)),
                Operand::n(MatrixLayout::row_major(tokens, l.in_features)),
                MatrixLayout::row_major(l.out_features, l.in_features),
                1,
                Precision::F32,
            )?;
            let t = Instant::now();
            crate::cpu::gemm(&pw, 1.0, &g, input, beta, &mut self.grads[i].w)?;
            self.gemm_time += t.elapsed();
            if l.bias {
                let db = &mut self.grads[i].b;
                if mode == GradMode::Overwrite {
                    db.iter_mut().for_each(|v| *v = 0.0);
                }
                for row in g.chunks(l.out_features) {
                    db.iter_mut().zip(row).for_each(|(d, v)| *d += v);
                }
            }
            if i == 0 && dx.is_none() {
                break;
            }
            // dx[tokens, in] = dpre·w
            let px = GemmProblem::matmul(tokens, l.in_features, l.out_features, Precision::F32)?;
            let mut next = vec![0.0f32; tokens * l.in_features];
            let t = Instant::now();
            crate::cpu::gemm(&px, 1.0, &g, &self.params[i].w, 0.0, &mut next)?;
            self.gemm_time += t.elapsed();
            g = next;
        }
        if let Some(dx) = dx {
            dx.copy_from_slice(&g);
        }
        Ok(())
    }

    /// Plain SGD: `w -= lr·dw`, `b -= lr·db` for every layer.
    pub fn sgd_step(&mut self, lr: f32) {
        for (p, g) in self.params.iter_mut().zip(&self.grads) {
            p.w.iter_mut().zip(&g.w).for_each(|(w, d)| *w -= lr * d);
            p.b.iter_mut().zip(&g.b).for_each(|(b, d)| *b -= lr * d);
        }
    }
}

/// The activation in f32 (through f64; the CPU path is the reference-like fallback).
fn act_f32(a: Activation, v: f32) -> f32 {
    match a {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        _ => a.apply(v as f64) as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Float64 gradients of `0.5·Σ y²` by central differences against the backward.
    #[test]
    fn backward_matches_finite_differences() {
        for act in Activation::ALL {
            let layers = [LinearSpec::new(3, 5).with_activation(act), LinearSpec::new(5, 2).with_activation(act)];
            let params = super::super::init_params(&layers, 3);
            let tokens = 4;
            let x: Vec<f32> = (0..tokens * 3).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
            let loss = |p: &Params| {
                let mut m = Mlp::new(&layers, p.clone()).unwrap();
                m.forward(&x, tokens, false).unwrap().iter().map(|v| 0.5 * (*v as f64).powi(2)).sum::<f64>()
            };
            let mut m = Mlp::new(&layers, params.clone()).unwrap();
            let y = m.forward(&x, tokens, true).unwrap().to_vec();
            let mut dx = vec![0.0; x.len()];
            m.backward(&x, &y, Some(&mut dx), GradMode::Overwrite).unwrap();
            let h = 1e-2f32;
            for (li, which, idx) in [(0, 'w', 4), (0, 'b', 1), (1, 'w', 7), (1, 'b', 0)] {
                let bump = |d: f32| {
                    let mut p = params.clone();
                    let v = if which == 'w' { &mut p[li].w[idx] } else { &mut p[li].b[idx] };
                    *v += d;
                    loss(&p)
                };
                let fd = (bump(h) - bump(-h)) / (2.0 * h as f64);
                let g = if which == 'w' { m.grads()[li].w[idx] } else { m.grads()[li].b[idx] } as f64;
                assert!((fd - g).abs() < 2e-3 * (1.0 + g.abs()), "{act} layer {li} {which}[{idx}]: {fd} vs {g}");
            }
            // accumulate adds the same gradients again
            let g1 = m.grads().clone();
            m.backward(&x, &y, None, GradMode::Accumulate).unwrap();
            for (a, b) in m.grads()[0].w.iter().zip(&g1[0].w) {
                assert!((a - 2.0 * b).abs() <= 1e-5 * (1.0 + b.abs()));
            }
        }
    }

    #[test]
    fn order_and_shape_errors() {
        let layers = [LinearSpec::new(2, 3)];
        let mut m = Mlp::new(&layers, super::super::init_params(&layers, 1)).unwrap();
        let x = [1.0f32; 4];
        let e = m.backward(&x, &[0.0; 6], None, GradMode::Overwrite).unwrap_err();
        assert!(matches!(e, Error::TrainingOrder { .. }), "{e}");
        let e = m.forward(&x, 3, true).unwrap_err();
        assert!(matches!(e, Error::LayerShape { got: 4, expected: 6, .. }), "{e}");
        m.forward(&x, 2, true).unwrap();
        let other = [1.0f32; 4];
        let e = m.backward(&other, &[0.0; 6], None, GradMode::Overwrite).unwrap_err();
        assert!(matches!(e, Error::TrainingOrder { .. }), "{e}");
        let e = m.backward(&x, &[0.0; 5], None, GradMode::Overwrite).unwrap_err();
        assert!(matches!(e, Error::LayerShape { got: 5, expected: 6, .. }), "{e}");
    }
}
