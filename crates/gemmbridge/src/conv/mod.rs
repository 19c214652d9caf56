//! 2-D convolution as data: [`Conv2d`] (PyTorch's `F.conv2d`: cross-correlation, stride,
//! zero padding, dilation, groups), its tensors' layouts ([`ConvLayout`]), the output shape and
//! every rule a problem must meet, checked on the CPU before anything is launched. The GPU
//! runs it on cuDNN ([`crate::cuda::GpuConv::forward`] and the backwards); the module
//! [`self::reference`] holds the float64 definitions the tests check against.
//!
//! Shapes, in PyTorch's names (logical NCHW order whatever the layout):
//! - input `x[N, C, H, W]`;
//! - filter `w[K, C/groups, R, S]`;
//! - output `y[N, K, P, Q]` with `P = (H + 2·pad_h − dil_h·(R − 1) − 1) / stride_h + 1` (floor),
//!   `Q` likewise;
//! - bias (fused forward) `b[K]`.
//!
//! `y[n, k, p, q] = Σ_{c, r, s} x[n, g·C/groups + c, p·stride_h − pad_h + r·dil_h,
//! q·stride_w − pad_w + s·dil_w] · w[k, c, r, s]` where `g = k / (K/groups)` is the group of
//! output channel k and out-of-range input positions read 0.
//!
//! Precisions: f32 (strict: no TF32), tf32, f16, bf16. [`Conv2d::validate`] and every call
//! check shapes and buffers first, each failure a named error with the numbers
//! ([`crate::Error::ConvShape`], [`crate::Error::BufferTooSmall`], …).
//!
//! ```no_run
//! use gemmbridge::conv::{Conv2d, ConvActivation, ConvLayout};
//! use gemmbridge::cuda::Gpu;
//! use gemmbridge::half::bf16;
//! use gemmbridge::Precision;
//!
//! let gpu = Gpu::new(0)?;
//! // F.conv2d(x, w, b, stride=1, padding=1) on x[32, 64, 56, 56], w[64, 64, 3, 3], channels last
//! let p = Conv2d::new([32, 64, 56, 56], [64, 3, 3], Precision::BF16).with_pad(1, 1).with_layout(ConvLayout::Nhwc);
//! gpu.conv().prewarm(&[p])?; // every direction planned now: later calls can be captured into a CUDA graph
//! let ([lx, lw, ly], s) = (p.lens(), gpu.stream());
//! let (x, w, b) = (s.alloc_zeros::<bf16>(lx)?, s.alloc_zeros::<bf16>(lw)?, s.alloc_zeros::<bf16>(p.k)?);
//! let mut y = s.alloc_zeros::<bf16>(ly)?;
//! gpu.conv().fused(&p, &x, &w, &b, ConvActivation::Relu, &mut y)?; // relu(conv(x, w) + b)
//! let (mut dx, mut dw) = (s.alloc_zeros::<bf16>(lx)?, s.alloc_zeros::<bf16>(lw)?);
//! gpu.conv().backward_data(&p, &w, &y, &mut dx)?; // y standing in for dy
//! gpu.conv().backward_filter(&p, &x, &y, &mut dw)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # On cuDNN
//! - **The graph (backend) API, as PyTorch uses it**: an execution plan per problem,
//!   direction and buffer alignment, made on the first call and kept. Engines come from cuDNN's
//!   heuristic by default; the measured search ([`crate::cuda::ConvSearch::Measured`], PyTorch's
//!   `cudnn.benchmark = True`) times up to 10 plans of each of cuDNN's heuristic lists on a
//!   problem's first call. Strict f32 takes no tensor-core (TF32) engine. cuDNN's older API
//!   ([`crate::cuda::ConvApi::Legacy`]) is the fallback where no graph engine qualifies.
//! - **Fused forward**: bias + ReLU (or identity) as one cuDNN operation graph where an engine
//!   takes it, else the convolution, the bias add and the activation as separate calls
//!   (`gpu.plans().conv2d(&p, "fused")` then says `unfused`).
//! - **Workspace**: a plan may use up to 1 GiB (a setting of the engine): the stream's workspace
//!   where it fits, else one of the cuDNN room's own, made when the plan is. No allocation per
//!   call.
//! - **Plans in the tactic database**: after a measured search, `Plans::conv2d_tactic` (or
//!   `conv2d_tactics` for all) gives the plan as a `(signature, Tactic)` pair — the graph API's
//!   engine index, knob choices and workspace, for the whole problem signature and the cuDNN
//!   version. `Plans::load_tactics` takes the entries of the cuDNN version loaded: a problem with
//!   an entry is planned from it without a search (a warning, and the usual planning, where
//!   cuDNN refuses it). `gemmbridge tune --ops conv` runs the search on ResNet-50's
//!   convolutions and stores the plans that beat a fresh search in the benchmark's bursts.
//! - **Capture and replay**: a first call plans (and a measured search synchronises), so it is
//!   [`crate::Error::NotCapturable`] inside a capture: prewarm first. A convolution repeated with
//!   the same buffers is replayed as a CUDA graph from its second call on, as small GEMMs are.
//! - **Loading**: libcudnn (9.x) is loaded on the first convolution; without it the call is
//!   [`crate::Error::LibraryNotFound`], naming the files tried. A GEMM-only program creates no
//!   cuDNN handle.

pub mod reference;

use crate::error::{Error, Result};
use crate::precision::Precision;

/// How a convolution's tensors are stored in memory (every tensor of a problem alike).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvLayout {
    /// Channels last: `x[N][H][W][C]`, `w[K][R][S][C/groups]`, `y[N][P][Q][K]` (PyTorch's
    /// `channels_last` memory format; the one the tensor cores read directly).
    #[default]
    Nhwc,
    /// Channels first: `x[N][C][H][W]`, `w[K][C/groups][R][S]`, `y[N][K][P][Q]` (PyTorch's
    /// default contiguous tensors).
    Nchw,
}

impl ConvLayout {
    /// `nhwc` or `nchw`.
    pub const fn name(self) -> &'static str {
        match self {
            ConvLayout::Nhwc => "nhwc",
            ConvLayout::Nchw => "nchw",
        }
    }

    /// Element strides of a tensor with logical dims `[d0, d1, d2, d3]` (N, C, H, W order),
    /// in the same order (saturating at `usize::MAX` for dims no tensor can have).
    pub const fn strides(self, [_, d1, d2, d3]: [usize; 4]) -> [usize; 4] {
        let d123 = d1.saturating_mul(d2).saturating_mul(d3);
        match self {
            ConvLayout::Nchw => [d123, d2.saturating_mul(d3), d3, 1],
            ConvLayout::Nhwc => [d123, 1, d3.saturating_mul(d1), d1],
        }
    }
}

impl std::fmt::Display for ConvLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The activation of a fused convolution: `y = act(conv(x, w) + b)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvActivation {
    /// `conv(x, w) + b`.
    #[default]
    Identity,
    /// `max(conv(x, w) + b, 0)`.
    Relu,
}

/// One 2-D convolution (see the module documentation for shapes and the definition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2d {
    /// Batch size N.
    pub n: usize,
    /// Input channels C.
    pub c: usize,
    /// Input height H.
    pub h: usize,
    /// Input width W.
    pub w: usize,
    /// Output channels K (filters).
    pub k: usize,
    /// Filter height R.
    pub r: usize,
    /// Filter width S.
    pub s: usize,
    /// `[stride_h, stride_w]`.
    pub stride: [usize; 2],
    /// `[pad_h, pad_w]`: zeros added on each side.
    pub pad: [usize; 2],
    /// `[dil_h, dil_w]`: the filter taps' spacing.
    pub dilation: [usize; 2],
    /// Groups: C and K are split into this many independent convolutions (C = K = groups is
    /// a depthwise convolution).
    pub groups: usize,
    /// The tensors' memory layout.
    pub layout: ConvLayout,
    /// Storage and arithmetic: [`Precision::F32`] (strict f32: no TF32), [`Precision::TF32`],
    /// [`Precision::F16`] or [`Precision::BF16`] (f32 accumulation); inputs and output of
    /// the precision's input dtype.
    pub precision: Precision,
}

/// The largest value cuDNN's descriptors take for a dimension, stride or element count (C
/// `int`).
pub const MAX_DIM: usize = i32::MAX as usize;

impl Conv2d {
    /// `x[n, c, h, w] ⋆ w[k, c, r, s]` from the input's `[n, c, h, w]` and the filters'
    /// `[k, r, s]`: stride 1, no padding, dilation 1, one group, NHWC.
    pub const fn new([n, c, h, w]: [usize; 4], [k, r, s]: [usize; 3], precision: Precision) -> Self {
        Conv2d {
            n,
            c,
            h,
            w,
            k,
            r,
            s,
            stride: [1, 1],
            pad: [0, 0],
            dilation: [1, 1],
            groups: 1,
            layout: ConvLayout::Nhwc,
            precision,
        }
    }

    /// The same with strides `[stride_h, stride_w]`.
    #[must_use]
    pub const fn with_stride(self, stride_h: usize, stride_w: usize) -> Self {
        Conv2d { stride: [stride_h, stride_w], ..self }
    }

    /// The same with zero padding `[pad_h, pad_w]`.
    #[must_use]
    pub const fn with_pad(self, pad_h: usize, pad_w: usize) -> Self {
        Conv2d { pad: [pad_h, pad_w], ..self }
    }

    /// The same with dilation `[dil_h, dil_w]`.
    #[must_use]
    pub const fn with_dilation(self, dil_h: usize, dil_w: usize) -> Self {
        Conv2d { dilation: [dil_h, dil_w], ..self }
    }

    /// The same with `groups` groups.
    #[must_use]
    pub const fn with_groups(self, groups: usize) -> Self {
        Conv2d { groups, ..self }
    }

    /// The same with `layout`.
    #[must_use]
    pub const fn with_layout(self, layout: ConvLayout) -> Self {
        Conv2d { layout, ..self }
    }

    /// The same in `precision`.
    #[must_use]
    pub const fn with_precision(self, precision: Precision) -> Self {
        Conv2d { precision, ..self }
    }

    /// The output's spatial size `[P, Q]` (module documentation), or `None` when there is
    /// none: a filter size, stride or dilation of 0, the dilated filter larger than the padded
    /// input, or sizes whose arithmetic overflows.
    pub fn output_hw(&self) -> Option<[usize; 2]> {
        let dim = |i: usize, size: usize, taps: usize| {
            if self.stride[i] == 0 || self.dilation[i] == 0 {
                return None;
            }
            let span = self.dilation[i].checked_mul(taps.checked_sub(1)?)?.checked_add(1)?;
            let padded = size.checked_add(self.pad[i].checked_mul(2)?)?;
            Some(padded.checked_sub(span)? / self.stride[i] + 1)
        };
        Some([dim(0, self.h, self.r)?, dim(1, self.w, self.s)?])
    }

    /// Input channels per group, `C / groups`.
    pub fn c_per_group(&self) -> usize {
        self.c / self.groups.max(1)
    }

    /// The input's logical dims `[N, C, H, W]`.
    pub fn x_dims(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }

    /// The filter's logical dims `[K, C/groups, R, S]`.
    pub fn w_dims(&self) -> [usize; 4] {
        [self.k, self.c_per_group(), self.r, self.s]
    }

    /// The output's logical dims `[N, K, P, Q]` (P = Q = 0 for a problem whose output is
    /// empty; [`Conv2d::validate`] refuses it).
    pub fn y_dims(&self) -> [usize; 4] {
        let [p, q] = self.output_hw().unwrap_or([0, 0]);
        [self.n, self.k, p, q]
    }

    /// Elements of x, of w and of y (saturating at `usize::MAX` for a problem
    /// [`Conv2d::validate`] refuses as too large).
    pub fn lens(&self) -> [usize; 3] {
        [self.x_dims(), self.w_dims(), self.y_dims()].map(|d| d.iter().fold(1usize, |a, &x| a.saturating_mul(x)))
    }

    /// Multiply-adds of the forward (each backward does as many): `N·K·P·Q·(C/groups)·R·S`,
    /// computed in f64 (no overflow).
    pub fn macs(&self) -> f64 {
        let [n, k, p, q] = self.y_dims();
        [n, k, p, q, self.c_per_group(), self.r, self.s].iter().map(|&v| v as f64).product()
    }

    /// A short description: `n32 c64 h56 w56 k64 r3 s3 stride 1,1 pad 1,1 dil 1,1 g1 nhwc bf16`.
    pub fn describe(&self) -> String {
        format!(
            "n{} c{} h{} w{} k{} r{} s{} stride {},{} pad {},{} dil {},{} g{} {} {}",
            self.n,
            self.c,
            self.h,
            self.w,
            self.k,
            self.r,
            self.s,
            self.stride[0],
            self.stride[1],
            self.pad[0],
            self.pad[1],
            self.dilation[0],
            self.dilation[1],
            self.groups,
            self.layout,
            self.precision
        )
    }

    /// Checks every rule: sizes, strides, dilations and groups at least 1; C and K multiples
    /// of the groups; a dilated filter no larger than the padded input; every dimension and
    /// element count within cuDNN's `int` ([`MAX_DIM`]); a precision cuDNN runs here (f32,
    /// tf32, f16, bf16 with output of the input's dtype).
    ///
    /// # Errors
    /// [`Error::ConvShape`] naming the rule and the values; [`Error::Unsupported`] for
    /// another precision.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, detail: String| Err(Error::ConvShape { what, detail });
        for (name, v) in [
            ("N", self.n),
            ("C", self.c),
            ("H", self.h),
            ("W", self.w),
            ("K", self.k),
            ("R", self.r),
            ("S", self.s),
            ("stride_h", self.stride[0]),
            ("stride_w", self.stride[1]),
            ("dil_h", self.dilation[0]),
            ("dil_w", self.dilation[1]),
            ("groups", self.groups),
        ] {
            if v == 0 {
                return bad("a size is zero", format!("{name} = 0 ({})", self.describe()));
            }
            if v > MAX_DIM {
                return bad("a size is too large", format!("{name} = {v} > {MAX_DIM} ({})", self.describe()));
            }
        }
        if self.pad.iter().any(|&p| p > MAX_DIM) {
            return bad("padding is too large", format!("pad {:?} > {MAX_DIM} ({})", self.pad, self.describe()));
        }
        // cuDNN computes the padded input and the dilated filter in C int too
        for (axis, size, taps, i) in [("height", self.h, self.r, 0), ("width", self.w, self.s, 1)] {
            let padded = size as u128 + 2 * self.pad[i] as u128;
            let span = self.dilation[i] as u128 * (taps as u128 - 1) + 1;
            if padded > MAX_DIM as u128 || span > MAX_DIM as u128 {
                return bad(
                    "a padded or dilated size is too large",
                    format!(
                        "{axis}: padded input {padded}, dilated filter {span}, at most {MAX_DIM} ({})",
                        self.describe()
                    ),
                );
            }
        }
        if !self.c.is_multiple_of(self.groups) || !self.k.is_multiple_of(self.groups) {
            return bad(
                "channels are not a multiple of the groups",
                format!("C = {}, K = {}, groups = {}", self.c, self.k, self.groups),
            );
        }
        if self.output_hw().is_none() {
            let axis = |name, size: usize, pad: usize, dil: usize, taps: usize| {
                let (padded, span) = (size + 2 * pad, dil * (taps - 1) + 1);
                (padded < span).then(|| format!("{name}: padded input {padded} < dilated filter {span}"))
            };
            let h = axis("height", self.h, self.pad[0], self.dilation[0], self.r);
            let w = axis("width", self.w, self.pad[1], self.dilation[1], self.s);
            let which: Vec<String> = [h, w].into_iter().flatten().collect();
            return bad(
                "the dilated filter is larger than the padded input",
                format!("{} ({})", which.join("; "), self.describe()),
            );
        }
        for (name, dims) in [("x", self.x_dims()), ("w", self.w_dims()), ("y", self.y_dims())] {
            let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if count.is_none_or(|c| c > MAX_DIM) {
                return bad("a tensor has too many elements", format!("{name} {dims:?}: more than {MAX_DIM}"));
            }
        }
        let ok = matches!(self.precision, Precision::F32 | Precision::TF32 | Precision::F16 | Precision::BF16);
        if !ok {
            return Err(Error::Unsupported {
                backend: "the convolutions",
                what: format!("precision {} (f32, tf32, f16 or bf16, output of the input's dtype)", self.precision),
            });
        }
        Ok(())
    }

    /// The offset of input element `[n, c, h, w]` in the layout. For a valid problem
    /// ([`Conv2d::validate`]) and indices within the dims: no bounds check (an index past its
    /// dim lands on another element).
    pub fn x_index(&self, [n, c, h, w]: [usize; 4]) -> usize {
        dot(self.layout.strides(self.x_dims()), [n, c, h, w])
    }

    /// The offset of filter element `[k, c, r, s]` (c within the group) in the layout; as
    /// [`Conv2d::x_index`], unchecked.
    pub fn w_index(&self, [k, c, r, s]: [usize; 4]) -> usize {
        dot(self.layout.strides(self.w_dims()), [k, c, r, s])
    }

    /// The offset of output element `[n, k, p, q]` in the layout; as [`Conv2d::x_index`],
    /// unchecked.
    pub fn y_index(&self, [n, k, p, q]: [usize; 4]) -> usize {
        dot(self.layout.strides(self.y_dims()), [n, k, p, q])
    }
}

fn dot(a: [usize; 4], b: [usize; 4]) -> usize {
    a.iter().zip(b).fold(0usize, |acc, (x, y)| acc.saturating_add(x.saturating_mul(y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_shapes_match_pytorch() {
        // ResNet-50's stem: 224 → 112 (F.conv2d(x, w, stride=2, padding=3))
        let p = Conv2d::new([32, 3, 224, 224], [64, 7, 7], Precision::BF16).with_stride(2, 2).with_pad(3, 3);
        assert_eq!(p.output_hw(), Some([112, 112]));
        p.validate().unwrap();
        // dilation 2, 3×3, pad 0 on 9×10: P = 9 − 4 = 5, Q = 6
        let d = Conv2d::new([1, 4, 9, 10], [8, 3, 3], Precision::F32).with_dilation(2, 2);
        assert_eq!(d.output_hw(), Some([5, 6]));
        // stride 2 on an odd size floors: (7 + 2 − 3) / 2 + 1 = 4
        let s = Conv2d::new([1, 1, 7, 7], [1, 3, 3], Precision::F32).with_stride(2, 2).with_pad(1, 1);
        assert_eq!(s.output_hw(), Some([4, 4]));
        assert_eq!(s.macs(), 16.0 * 9.0);
    }

    #[test]
    fn rules_are_named() {
        let ok = Conv2d::new([2, 8, 5, 5], [4, 3, 3], Precision::F16);
        let what = |p: Conv2d| match p.validate() {
            Err(Error::ConvShape { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(what(Conv2d { n: 0, ..ok }), "a size is zero");
        assert_eq!(what(ok.with_stride(0, 1)), "a size is zero");
        assert_eq!(what(ok.with_groups(3)), "channels are not a multiple of the groups");
        assert_eq!(what(Conv2d { r: 7, ..ok }), "the dilated filter is larger than the padded input");
        assert_eq!(what(ok.with_dilation(3, 3)), "the dilated filter is larger than the padded input");
        ok.with_dilation(3, 3).with_pad(2, 2).validate().unwrap();
        assert_eq!(what(Conv2d { h: 1 << 31, ..ok }), "a size is too large");
        assert_eq!(what(Conv2d { n: 1 << 20, c: 1 << 12, ..ok }), "a tensor has too many elements");
        let huge = Conv2d::new([1, 1, 2, 1], [1, 3, 1], Precision::F32).with_dilation(1 << 30, 1).with_pad(1 << 30, 0);
        assert_eq!(what(huge), "a padded or dilated size is too large");
        // no panic and no wrap on problems validate refuses
        let wild = Conv2d { h: usize::MAX, n: 1 << 40, c: 1 << 40, ..ok };
        assert_eq!(wild.lens()[0], usize::MAX);
        assert!(wild.macs().is_finite() && wild.x_index([1, 7, 0, 0]) == usize::MAX);
        assert_eq!(ok.with_stride(0, 0).output_hw(), None);
        assert_eq!(ok.with_dilation(0, 1).output_hw(), None);
        let e = Conv2d { r: 7, ..ok }.validate().unwrap_err().to_string();
        assert!(e.contains("height: padded input 5 < dilated filter 7"), "{e}");
        let e = ok.with_precision(Precision::F16_F32OUT).validate().unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        // the message carries the numbers
        let e = ok.with_groups(3).validate().unwrap_err().to_string();
        assert!(e.contains("C = 8, K = 4, groups = 3"), "{e}");
    }

    #[test]
    fn layouts_index_as_pytorch_stores_them() {
        let p = Conv2d::new([2, 6, 4, 5], [4, 3, 2], Precision::F32).with_groups(2);
        assert_eq!(p.w_dims(), [4, 3, 3, 2]);
        // NHWC: x[n][h][w][c]
        assert_eq!(p.x_index([1, 2, 3, 4]), ((4 + 3) * 5 + 4) * 6 + 2);
        // KRSC filter: w[k][r][s][c]
        assert_eq!(p.w_index([1, 2, 1, 0]), 26); // ((k·R + r)·S + s)·C/g + c = ((3 + 1)·2 + 0)·3 + 2
        let q = p.with_layout(ConvLayout::Nchw);
        assert_eq!(q.x_index([1, 2, 3, 4]), ((6 + 2) * 4 + 3) * 5 + 4);
        assert_eq!(q.w_index([1, 2, 1, 0]), ((3 + 2) * 3 + 1) * 2);
        assert_eq!(q.lens(), [2 * 6 * 4 * 5, 4 * 3 * 3 * 2, 2 * 4 * 2 * 4]);
    }
}
