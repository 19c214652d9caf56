//! Tensor parallelism for the MLP block, Megatron-LM's split, as data and CPU arithmetic: how
//! a block's parameters are sharded over `world` ranks and gathered back ([`shard_mlp`],
//! [`gather_mlp`]), and [`cpu::TpMlp`], the block run rank by rank with an in-process
//! all-reduce — the arithmetic a multi-GPU run must reproduce; [`overlap`] the chunked schedule
//! that hides a row-parallel layer's all-reduce behind its GEMM, and its order check.
//!
//! The block is two layers, `h = act(x·W1ᵀ + b1)` (up, `in → f`) and `y = h·W2ᵀ + b2`
//! (down, `f → out`), as [`crate::train`] defines them. Over `world` ranks (Shoeybi et al.,
//! "Megatron-LM", 2019, section 3):
//! - the up layer is **column-parallel**: rank r holds rows `[r·f/world, (r+1)·f/world)` of
//!   `W1` and of `b1`, and computes its slice `h_r` of `h` from the whole `x` (the activation
//!   is elementwise, so it applies to the slice);
//! - the down layer is **row-parallel**: rank r holds the same columns of `W2` and computes the
//!   partial `y_r = h_r·W2_rᵀ`; `y = Σ_r y_r + b2` (one all-reduce; `b2` added once, after it);
//! - backward: `dh_r = dy·W2_r` needs no communication; `dW2_r = dyᵀ·h_r`,
//!   `db2 = Σ_tokens dy` (the same on every rank); `dW1_r`, `db1_r` from `dpre_r`; and the
//!   input gradient `dx = Σ_r dpre_r·W1_r`, the conjugate all-reduce.
//!
//! `f` must be a multiple of `world`, so every rank holds the same shapes.

pub mod cpu;
pub mod overlap;

use crate::error::{Error, Result};
use crate::train::{check_layers, check_params, LayerParams, LinearSpec, Params};

/// Checks that `layers` is an MLP block that splits over `world` ranks: two layers that
/// chain, the first with a bias or not, the second with no activation, and the hidden size a
/// multiple of `world` (at least 1).
///
/// # Errors
/// [`Error::TensorParallel`] naming the rule; the layers' own errors ([`check_layers`]).
pub fn check_block(layers: &[LinearSpec], world: usize) -> Result<()> {
    check_layers(layers)?;
    let bad = |what: &'static str, detail: String| Err(Error::TensorParallel { what, detail });
    if layers.len() != 2 {
        return bad("a tensor-parallel MLP block has two layers", format!("{} layers", layers.len()));
    }
    if layers[1].activation != crate::train::Activation::None {
        return bad(
            "the down layer of a block has no activation (it is applied after the all-reduce)",
            format!("{}", layers[1].activation),
        );
    }
    let f = layers[0].out_features;
    if world == 0 || !f.is_multiple_of(world) {
        return bad("the hidden size is not a multiple of the world size", format!("f = {f}, world = {world}"));
    }
    Ok(())
}

/// One rank's share of a block: its layers (`in → f/world` with the up layer's bias and
/// activation, then `f/world → out` without a bias) and their parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// This rank.
    pub rank: usize,
    /// The two local layers.
    pub layers: [LinearSpec; 2],
    /// Their parameters (`W1_r`, `b1_r`; `W2_r`, no bias).
    pub params: Params,
}

/// Splits a block's parameters over `world` ranks (module documentation); `b2` is returned
/// apart (every rank adds it once, after the all-reduce; empty without a bias).
///
/// # Errors
/// As [`check_block`]; [`Error::LayerShape`] for parameters of the wrong shapes.
pub fn shard_mlp(layers: &[LinearSpec], params: &[LayerParams], world: usize) -> Result<(Vec<Shard>, Vec<f32>)> {
    check_block(layers, world)?;
    check_params(layers, params)?;
    let (up, down) = (layers[0], layers[1]);
    let (f, fr) = (up.out_features, up.out_features / world);
    let local = [LinearSpec { out_features: fr, ..up }, LinearSpec { in_features: fr, ..down }.without_bias()];
    let shards = (0..world)
        .map(|r| {
            let rows = r * fr..(r + 1) * fr;
            let w1 = params[0].w[rows.start * up.in_features..rows.end * up.in_features].to_vec();
            let b1 = if up.bias { params[0].b[rows.clone()].to_vec() } else { Vec::new() };
            let w2: Vec<f32> = params[1].w.chunks(f).flat_map(|row| row[rows.clone()].iter().copied()).collect();
            let params = vec![LayerParams { w: w1, b: b1 }, LayerParams { w: w2, b: Vec::new() }];
            Shard { rank: r, layers: local, params }
        })
        .collect();
    Ok((shards, params[1].b.clone()))
}

/// The block's full parameters from its shards (in rank order) and `b2`: the inverse of
/// [`shard_mlp`], also for gradients laid out as parameters.
///
/// # Errors
/// [`Error::TensorParallel`] when there is no shard, the shards are not ranks `0..world` in
/// order, their layers differ or are not a shard's (a down layer with a bias or an
/// activation), or `b2` is neither empty nor `out` long; the layers' and parameters' own
/// errors ([`check_layers`], [`check_params`]).
pub fn gather_mlp(shards: &[Shard], b2: &[f32]) -> Result<Params> {
    let bad = |what: &'static str, detail: String| Err(Error::TensorParallel { what, detail });
    let Some(first) = shards.first() else { return bad("there is no shard", String::new()) };
    if let Some(s) = shards.iter().enumerate().find(|(r, s)| s.rank != *r || s.layers != first.layers) {
        return bad(
            "the shards are not ranks 0.. in order with equal shapes",
            format!("shard {} has rank {}", s.0, s.1.rank),
        );
    }
    check_layers(&first.layers)?;
    if first.layers[1].bias || first.layers[1].activation != crate::train::Activation::None {
        return bad("a shard's down layer has no bias and no activation", format!("{:?}", first.layers[1]));
    }
    for s in shards {
        check_params(&s.layers, &s.params)?;
    }
    let want_b2 = first.layers[1].out_features;
    if !b2.is_empty() && b2.len() != want_b2 {
        return bad("b2 is not one value per output feature", format!("{} values for {want_b2} outputs", b2.len()));
    }
    let ([up, down], fr) = (first.layers, first.layers[0].out_features);
    let f = fr * shards.len();
    let mut w1 = Vec::with_capacity(f * up.in_features);
    let mut b1 = Vec::new();
    let mut w2 = vec![0.0f32; down.out_features * f];
    for (r, s) in shards.iter().enumerate() {
        w1.extend_from_slice(&s.params[0].w);
        b1.extend_from_slice(&s.params[0].b);
        for (o, row) in s.params[1].w.chunks(fr).enumerate() {
            w2[o * f + r * fr..o * f + (r + 1) * fr].copy_from_slice(row);
        }
    }
    Ok(vec![LayerParams { w: w1, b: b1 }, LayerParams { w: w2, b: b2.to_vec() }])
}

#[cfg(test)]
mod tests;
