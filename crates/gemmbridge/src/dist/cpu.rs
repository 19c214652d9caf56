//! The tensor-parallel MLP block on the CPU: every rank's share run by the CPU training layers
//! ([`crate::train::cpu::Mlp`], f32) in one process, the all-reduces an in-process sum
//! ([`all_reduce_sum`]). It is the arithmetic a multi-GPU run over NCCL must reproduce, and the
//! reference its tests hold it against.

use super::{gather_mlp, shard_mlp, Shard};
use crate::error::Result;
use crate::train::cpu::Mlp;
use crate::train::{GradMode, LayerParams, LinearSpec, Params};

/// The reference all-reduce: the element-wise sum of every rank's buffer, in rank order (each
/// rank then holds the same result).
///
/// # Panics
/// When the buffers differ in length.
pub fn all_reduce_sum(bufs: &[&[f32]]) -> Vec<f32> {
    let mut out = vec![0.0f32; bufs.first().map_or(0, |b| b.len())];
    for b in bufs {
        assert_eq!(b.len(), out.len(), "all_reduce_sum: buffers of different lengths");
        out.iter_mut().zip(b.iter()).for_each(|(o, v)| *o += v);
    }
    out
}

/// An MLP block split over `world` ranks (Megatron's split, [`super`]), run on the CPU.
pub struct TpMlp {
    ranks: Vec<Mlp>,
    layers: [LinearSpec; 2],
    b2: Vec<f32>,
    db2: Vec<f32>,
    y: Vec<f32>,
}

impl TpMlp {
    /// The block `layers` with `params`, split over `world` ranks.
    ///
    /// # Errors
    /// As [`shard_mlp`].
    pub fn new(layers: &[LinearSpec], params: &[LayerParams], world: usize) -> Result<TpMlp> {
        let (shards, b2) = shard_mlp(layers, params, world)?;
        let ranks = shards.into_iter().map(|s| Mlp::new(&s.layers, s.params)).collect::<Result<Vec<_>>>()?;
        let db2 = vec![0.0; b2.len()];
        Ok(TpMlp { ranks, layers: [layers[0], layers[1]], b2, db2, y: Vec::new() })
    }

    /// The world size.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// `y[tokens, out]`: every rank's partial output, all-reduced, plus `b2`.
    ///
    /// # Errors
    /// As [`Mlp::forward`].
    pub fn forward(&mut self, x: &[f32], tokens: usize, train: bool) -> Result<&[f32]> {
        let partials = self
            .ranks
            .iter_mut()
            .map(|m| m.forward(x, tokens, train).map(<[f32]>::to_vec))
            .collect::<Result<Vec<_>>>()?;
        let mut y = all_reduce_sum(&partials.iter().map(Vec::as_slice).collect::<Vec<_>>());
        if !self.b2.is_empty() {
            y.chunks_mut(self.b2.len()).for_each(|row| row.iter_mut().zip(&self.b2).for_each(|(v, b)| *v += b));
        }
        self.y = y;
        Ok(&self.y)
    }

    /// The backward of the last training forward: every rank's parameter gradients, `db2`
    /// (replicated), and with `dx` the input gradient, all-reduced from the ranks' partials.
    ///
    /// # Errors
    /// As [`Mlp::backward`].
    pub fn backward(&mut self, x: &[f32], dy: &[f32], dx: Option<&mut [f32]>, mode: GradMode) -> Result<()> {
        if let Some(dx) = dx.as_deref() {
            // checked before any rank changes its gradients
            let (got, want) = (dx.len(), x.len());
            if got != want {
                return Err(crate::Error::LayerShape {
                    layer: 0,
                    what: "dx length (the input's)",
                    got,
                    expected: want,
                });
            }
        }
        let want_dx = dx.is_some();
        let mut partials = Vec::with_capacity(self.ranks.len());
        for m in &mut self.ranks {
            let mut part = vec![0.0f32; if want_dx { x.len() } else { 0 }];
            m.backward(x, dy, want_dx.then_some(&mut part[..]), mode)?;
            partials.push(part);
        }
        if !self.db2.is_empty() {
            if mode == GradMode::Overwrite {
                self.db2.iter_mut().for_each(|v| *v = 0.0);
            }
            for row in dy.chunks(self.db2.len()) {
                self.db2.iter_mut().zip(row).for_each(|(d, v)| *d += v);
            }
        }
        if let Some(dx) = dx {
            dx.copy_from_slice(&all_reduce_sum(&partials.iter().map(Vec::as_slice).collect::<Vec<_>>()));
        }
        Ok(())
    }

    fn gather(&self, pick: impl Fn(&Mlp) -> &Params, b2: &[f32]) -> Result<Params> {
        let shards: Vec<Shard> = self
            .ranks
            .iter()
            .enumerate()
            .map(|(rank, m)| Shard { rank, layers: [m.layers()[0], m.layers()[1]], params: pick(m).clone() })
            .collect();
        gather_mlp(&shards, b2)
    }

    /// The block's full parameters, gathered from the ranks.
    ///
    /// # Errors
    /// Never for a block made by [`TpMlp::new`] ([`crate::Error::TensorParallel`] otherwise).
    pub fn params(&self) -> Result<Params> {
        self.gather(Mlp::params, &self.b2)
    }

    /// The block's full gradients of the last backward, gathered from the ranks.
    ///
    /// # Errors
    /// As [`TpMlp::params`].
    pub fn grads(&self) -> Result<Params> {
        self.gather(Mlp::grads, &self.db2)
    }

    /// Plain SGD on every rank's share and on `b2`.
    pub fn sgd_step(&mut self, lr: f32) {
        self.ranks.iter_mut().for_each(|m| m.sgd_step(lr));
        self.b2.iter_mut().zip(&self.db2).for_each(|(b, d)| *b -= lr * d);
    }

    /// The unsharded layers.
    pub fn layers(&self) -> [LinearSpec; 2] {
        self.layers
    }
}
