//! `conv2d`'s cases and float64 expectations, shared by the CPU (`cpu_conv.rs`) and GPU
//! (`gpu/conv.rs`) tests (included by `#[path]` from both).

use candle_core::{Result, Tensor};
use gemmbridge::conv::{reference, Conv2d, ConvLayout};
use gemmbridge::Precision;
use gemmbridge_candle::{Conv2dParams, ConvAct};

use crate::common::f64s;

/// One convolution: x `[n, c, h, w]`, `k` filters of `r × s`, the geometry.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub x: [usize; 4],
    pub krs: [usize; 3],
    pub params: Conv2dParams,
}

impl Case {
    pub const fn new(x: [usize; 4], krs: [usize; 3], params: Conv2dParams) -> Case {
        Case { x, krs, params }
    }

    /// w's dims `[k, c/groups, r, s]`.
    pub fn w_dims(&self) -> [usize; 4] {
        let [k, r, s] = self.krs;
        [k, self.x[1] / self.params.groups, r, s]
    }

    /// The same problem for gemmbridge's references (NCHW: candle's contiguous order).
    pub fn problem(&self) -> Conv2d {
        let Conv2dParams { padding, stride, dilation, groups } = self.params;
        Conv2d::new(self.x, self.krs, Precision::F32)
            .with_pad(padding, padding)
            .with_stride(stride, stride)
            .with_dilation(dilation, dilation)
            .with_groups(groups)
            .with_layout(ConvLayout::Nchw)
    }
}

/// `act(x ⋆ w + b)` in float64 (b zero where there is none).
pub fn forward_f64(case: &Case, [x, w]: [&Tensor; 2], b: Option<&Tensor>, act: ConvAct) -> Result<Vec<f64>> {
    let bv = match b {
        Some(b) => f64s(b)?,
        None => vec![0.0; case.krs[0]],
    };
    Ok(reference::forward_fused(&case.problem(), &f64s(x)?, &f64s(w)?, &bv, act == ConvAct::Relu))
}

/// The bias gradient `db[o] = Σ_{n, p, q} g[n, o, p, q]` of `p`'s output gradient `g`.
pub fn db_f64(p: &Conv2d, g: &[f64]) -> Vec<f64> {
    let [n, k, pp, q] = p.y_dims();
    (0..k).map(|o| (0..n).map(|m| g[(m * k + o) * pp * q..][..pp * q].iter().sum::<f64>()).sum()).collect()
}
