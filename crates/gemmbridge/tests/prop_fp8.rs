//! Property tests of the FP8 quantisation shapes ([`Fp8Layout`] for every scaling, `quantize`
//! and `dequantize`, the scaling and output rules of `check_pair`) and of the MLP layer
//! shapes of `gemmbridge::train` (`check_layers`, `check_params`, and the CPU MLP on layers
//! small enough to run): nothing panics or overflows, every scale index lies inside its
//! scales, and finite inputs round-trip to finite values.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::fp8::{check_pair, dequantize, quantize, Fp8Format, Fp8Layout, OutputKind, Scaling, Source};
use gemmbridge::train::cpu::Mlp;
use gemmbridge::train::{check_layers, check_params, init_params, Activation, GradMode, LinearSpec};
use gemmbridge::DType;
use proptest::prelude::*;
use shared::{config, dtype, size, RUN_ELEMS};

fn scaling() -> impl Strategy<Value = Scaling> {
    prop::sample::select(vec![Scaling::Tensor, Scaling::Row, Scaling::Block1x128, Scaling::Block128x128])
}

fn format() -> impl Strategy<Value = Fp8Format> {
    prop::sample::select(vec![Fp8Format::E4M3, Fp8Format::E5M2])
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![2 => 1usize..=40, 1 => 120usize..=260, 2 => size()]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fp8_layout(rows in dim(), cols in dim(), scaling in scaling(), format in format(), transposed in any::<bool>(), seed in any::<u64>()) {
        let l = Fp8Layout::new(rows, cols, scaling);
        let _ = (l.data_len(), l.k_blocks(), l.scale_ld(), l.scale_len());
        if rows > 0 && cols > 0 && l.data_len() < usize::MAX {
            prop_assert!(l.rows_alloc >= rows && l.ld >= cols && l.data_len() >= rows * cols);
            prop_assert!(l.scale_index(rows - 1, cols - 1) < l.scale_len(), "{l:?}");
        }
        if rows.saturating_mul(cols) <= RUN_ELEMS && rows > 0 && cols > 0 {
            let src = shared::values(rows * cols, seed);
            let source = if transposed { Source::Transposed } else { Source::RowMajor };
            let q = quantize(&src, rows, cols, source, format, scaling).unwrap();
            prop_assert_eq!(q.data.len(), q.layout.data_len());
            let back = dequantize(&q).unwrap();
            prop_assert!(back.len() == rows * cols && back.iter().all(|v| v.is_finite()));
            // one element too many or too few is a named error
            prop_assert!(quantize(&src[1..], rows, cols, source, format, scaling).is_err());
        } else {
            // sizes no source can have are refused before anything is allocated
            prop_assert!(quantize::<f32>(&[], rows, cols, Source::RowMajor, format, scaling).is_err());
        }
    }

    #[test]
    fn hand_built_layouts(rows in dim(), cols in dim(), rows_alloc in size(), ld in size(), scaling in scaling(), format in format()) {
        // a layout built by hand, not by Fp8Layout::new, with empty buffers: refused, never an overflow
        let layout = Fp8Layout { rows, rows_alloc, cols, ld, scaling };
        let q = gemmbridge::fp8::Quantized { layout, format, data: Vec::new(), scales: Vec::new() };
        prop_assert!(dequantize(&q).is_err());
    }

    #[test]
    fn pairs(x in (format(), scaling()), w in (format(), scaling()), out in prop_oneof![dtype().prop_map(OutputKind::Dense), format().prop_map(OutputKind::Fp8)],
             bias in prop::option::of(dtype()), fast in any::<bool>()) {
        let _ = check_pair(x, w, out, bias, fast);
    }

    #[test]
    fn mlp_layers(dims in prop::collection::vec(prop_oneof![3 => 1usize..=6, 1 => size()], 1..4), bias in any::<bool>(), seed in any::<u64>()) {
        let layers: Vec<LinearSpec> = dims.windows(2).map(|w| {
            let l = LinearSpec::new(w[0], w[1]).with_activation(Activation::GeluTanh);
            if bias { l } else { l.without_bias() }
        }).collect();
        if check_layers(&layers).is_err() {
            return Ok(());
        }
        let elems = layers.iter().map(|l| l.in_features.saturating_mul(l.out_features)).fold(0usize, usize::saturating_add);
        if elems > RUN_ELEMS || layers.iter().any(|l| l.in_features.max(l.out_features) > 64) {
            return Ok(());
        }
        // init_params allocates what the layers hold: only called on layers that small
        let params = init_params(&layers, seed);
        check_params(&layers, &params).unwrap();
        let mut mlp = Mlp::new(&layers, params).unwrap();
        let tokens = 3;
        let x = shared::values(tokens * layers[0].in_features, seed);
        let y = mlp.forward(&x, tokens, true).unwrap().to_vec();
        prop_assert!(y.iter().all(|v| v.is_finite()));
        let dy = shared::values(y.len(), seed + 1);
        let mut dx = vec![0f32; x.len()];
        mlp.backward(&x, &dy, Some(&mut dx), GradMode::Overwrite).unwrap();
        prop_assert!(dx.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn f32_is_a_dense_output() {
    assert!(check_pair(
        (Fp8Format::E4M3, Scaling::Tensor),
        (Fp8Format::E4M3, Scaling::Tensor),
        OutputKind::Dense(DType::F32),
        None,
        false
    )
    .is_ok());
}
