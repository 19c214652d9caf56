//! Property tests of the 2-D convolution problem ([`Conv2d`]: sizes, strides, padding,
//! dilation, groups, layouts, precisions): nothing panics or overflows, a valid problem's
//! element counts fit cuDNN's `int` and every index lands inside its tensor, and the float64
//! reference (run only on valid problems: it panics on others, as documented) gives finite
//! outputs on finite inputs.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::conv::{self, Conv2d, ConvLayout, MAX_DIM};
use gemmbridge::Precision;
use proptest::prelude::*;
use shared::{config, size, RUN_ELEMS, RUN_WORK};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=3, 1 => size()]
}

prop_compose! {
    fn problem()(x in [dim(), dim(), dim(), dim()], f in [dim(), dim(), dim()], stride in [dim(), dim()],
                 pad in [prop_oneof![0usize..=2, size()], prop_oneof![0usize..=2, size()]], dil in [dim(), dim()],
                 groups in prop_oneof![Just(1usize), dim()], nchw in any::<bool>(),
                 precision in prop::sample::select(Precision::ALL.to_vec())) -> Conv2d {
        let layout = if nchw { ConvLayout::Nchw } else { ConvLayout::Nhwc };
        Conv2d::new(x, f, precision)
            .with_stride(stride[0], stride[1])
            .with_pad(pad[0], pad[1])
            .with_dilation(dil[0], dil[1])
            .with_groups(groups)
            .with_layout(layout)
    }
}

fn small(p: &Conv2d) -> bool {
    p.lens().iter().all(|&n| n <= RUN_ELEMS) && p.macs() <= RUN_WORK as f64
}

#[test]
fn problems_run() {
    let n = shared::runnable(problem(), |p| p.validate().is_ok() && small(p));
    assert!(n >= 10, "{n} of 1000 problems run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn conv_problem(p in problem(), seed in any::<u64>()) {
        let _ = (p.describe(), p.output_hw(), p.c_per_group(), p.x_dims(), p.w_dims(), p.y_dims(), p.lens(), p.macs());
        if p.validate().is_err() {
            return Ok(());
        }
        let [p_, q_] = p.output_hw().expect("a valid problem has an output");
        prop_assert!(p_ >= 1 && q_ >= 1);
        let lens = p.lens();
        prop_assert!(lens.iter().all(|&n| (1..=MAX_DIM).contains(&n)), "{}: {lens:?}", p.describe());
        // the last element of each tensor is its last index
        let last = |d: [usize; 4]| d.map(|x| x - 1);
        prop_assert!(p.x_index(last(p.x_dims())) < lens[0], "{}", p.describe());
        prop_assert!(p.w_index(last(p.w_dims())) < lens[1], "{}", p.describe());
        prop_assert!(p.y_index(last(p.y_dims())) < lens[2], "{}", p.describe());
        prop_assert!(p.macs().is_finite());
        if small(&p) {
            let x: Vec<f64> = shared::values(lens[0], seed).into_iter().map(f64::from).collect();
            let w: Vec<f64> = shared::values(lens[1], seed + 1).into_iter().map(f64::from).collect();
            let y = conv::reference::forward(&p, &x, &w);
            prop_assert_eq!(y.len(), lens[2]);
            prop_assert!(y.iter().all(|v| v.is_finite()), "{}", p.describe());
            let dx = conv::reference::backward_data(&p, &w, &y);
            let dw = conv::reference::backward_filter(&p, &x, &y);
            prop_assert!(dx.len() == lens[0] && dw.len() == lens[1]);
            prop_assert!(dx.iter().chain(&dw).all(|v| v.is_finite()), "{}", p.describe());
        }
    }
}
