//! The split's rules, sharding round trips, and the block run over 1 to 8 ranks against the
//! unsharded CPU layers: output, input gradient, every parameter gradient, and a step after.

use super::cpu::{all_reduce_sum, TpMlp};
use super::*;
use crate::reference::rel_error;
use crate::train::cpu::Mlp;
use crate::train::{init_params, Activation, GradMode};

fn block(act: Activation, f: usize) -> [LinearSpec; 2] {
    [LinearSpec::new(16, f).with_activation(act), LinearSpec::new(f, 12)]
}

fn rule(r: Result<()>) -> &'static str {
    match r {
        Err(Error::TensorParallel { what, .. }) => what,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_rule_is_a_named_error() {
    let b = block(Activation::GeluTanh, 24);
    check_block(&b, 8).unwrap();
    assert_eq!(rule(check_block(&b, 5)), "the hidden size is not a multiple of the world size");
    assert_eq!(rule(check_block(&b, 0)), "the hidden size is not a multiple of the world size");
    assert_eq!(rule(check_block(&[b[0]], 1)), "a tensor-parallel MLP block has two layers");
    let down_act = [b[0], b[1].with_activation(Activation::Relu)];
    assert!(rule(check_block(&down_act, 2)).starts_with("the down layer of a block has no activation"));
    assert!(matches!(check_block(&[b[0], LinearSpec::new(7, 12)], 2), Err(Error::LayerShape { .. })));
    assert!(gather_mlp(&[], &[]).is_err());
    // shards whose parameters do not fit their layers, or a b2 of the wrong length
    let params = init_params(&b, 3);
    let (shards, b2) = shard_mlp(&b, &params, 2).unwrap();
    let mut cut = shards.clone();
    cut[1].params[1].w.pop();
    assert!(matches!(gather_mlp(&cut, &b2), Err(Error::LayerShape { .. })));
    assert_eq!(
        match gather_mlp(&shards, &[1.0]) {
            Err(Error::TensorParallel { what, .. }) => what,
            other => panic!("{other:?}"),
        },
        "b2 is not one value per output feature"
    );
    // a dx of the wrong length is refused before any rank's gradients change
    let mut tp = TpMlp::new(&b, &params, 2).unwrap();
    let x = vec![0.5f32; 2 * 16];
    tp.forward(&x, 2, true).unwrap();
    let before = tp.grads().unwrap();
    let r = tp.backward(&x, &[1.0; 24], Some(&mut [0.0; 5]), GradMode::Overwrite);
    assert!(matches!(r, Err(Error::LayerShape { .. })), "{r:?}");
    assert_eq!(tp.grads().unwrap(), before);
}

#[test]
fn sharding_and_gathering_give_back_the_parameters() {
    for world in [1, 2, 3, 4, 6, 8] {
        let b = block(Activation::Relu, 24);
        let params = init_params(&b, world as u64);
        let (shards, b2) = shard_mlp(&b, &params, world).unwrap();
        assert_eq!(shards.len(), world);
        assert_eq!(shards[0].layers[0].out_features, 24 / world);
        assert!(!shards[0].layers[1].bias, "the down layer's bias is added once, after the all-reduce");
        assert_eq!(gather_mlp(&shards, &b2).unwrap(), params, "world {world}");
        // rank 1's share of W2 is its columns: W2[o][f/world..2·f/world]
        if world > 1 {
            let fr = 24 / world;
            assert_eq!(shards[1].params[1].w[..fr], params[1].w[fr..2 * fr]);
        }
    }
}

#[test]
fn the_split_block_computes_the_unsplit_block() {
    assert_eq!(all_reduce_sum(&[&[1.0, 2.0], &[3.0, 4.0]]), [4.0, 6.0]);
    let (tokens, f) = (9, 840); // 840: a multiple of every world size 1..8
    for act in [Activation::GeluTanh, Activation::Relu] {
        let b = block(act, f);
        let params = init_params(&b, 11);
        let x: Vec<f32> = (0..tokens * 16).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let dy: Vec<f32> = (0..tokens * 12).map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0).collect();
        let mut whole = Mlp::new(&b, params.clone()).unwrap();
        let y_want = whole.forward(&x, tokens, true).unwrap().to_vec();
        let mut dx_want = vec![0.0f32; x.len()];
        whole.backward(&x, &dy, Some(&mut dx_want), GradMode::Overwrite).unwrap();
        whole.sgd_step(0.1);
        let y2_want = whole.forward(&x, tokens, false).unwrap().to_vec();
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        for world in 1..=8 {
            let mut tp = TpMlp::new(&b, &params, world).unwrap();
            let y = tp.forward(&x, tokens, true).unwrap().to_vec();
            assert!(rel_error(&f64s(&y), &f64s(&y_want)) < 1e-6, "{act} world {world}: y");
            let mut dx = vec![f32::NAN; x.len()];
            tp.backward(&x, &dy, Some(&mut dx), GradMode::Overwrite).unwrap();
            assert!(rel_error(&f64s(&dx), &f64s(&dx_want)) < 1e-6, "{act} world {world}: dx");
            let (g, g_want) = (tp.grads().unwrap(), whole.grads());
            for (l, (gl, wl)) in g.iter().zip(g_want).enumerate() {
                assert!(rel_error(&f64s(&gl.w), &f64s(&wl.w)) < 1e-6, "{act} world {world}: dW{}", l + 1);
                assert!(rel_error(&f64s(&gl.b), &f64s(&wl.b)) < 1e-6, "{act} world {world}: db{}", l + 1);
            }
            tp.sgd_step(0.1);
            let y2 = tp.forward(&x, tokens, false).unwrap().to_vec();
            assert!(rel_error(&f64s(&y2), &f64s(&y2_want)) < 1e-6, "{act} world {world}: y after a step");
            assert!(rel_error(&f64s(&tp.params().unwrap()[0].w), &f64s(&whole.params()[0].w)) < 1e-6);
        }
    }
}
