//! A small ResNet-style CNN built twice: [`BurnCnn`] from burn's modules (`Conv2d`, `Linear`)
//! and [`GemmCnn`] from gemmbridge-burn's (`GemmConv2d`, `GemmLinear`), converted from the
//! first ([`BurnCnn::to_gemm`]); and synthetic images of 10 classes ([`Gratings`]), 32×32×3 by
//! default.
//!
//! The network: a 3×3 convolution and ReLU (the stem), then per stage an optional 3×3 stride-2
//! convolution and ReLU (halving the image, changing the width) and residual blocks
//! `relu(x + conv(relu(conv(x))))` (3×3, padding 1), global average pooling, a linear head.

use std::f32::consts::TAU;

use burn::module::{Module, Param};
use burn::nn::conv::Conv2d;
use burn::nn::{Linear, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use gemmbridge_burn::{ConvOps, GemmConv2d, GemmLinear, GemmOps};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{compare, cross_entropy, linear, uniform, Curves, Objective, Schedule};

/// Classes.
pub const CLASSES: usize = 10;

/// The model's and the batches' sizes.
#[derive(Clone, Copy, Debug)]
pub struct CnnSize {
    /// Channels per stage; each stage after the first starts with a stride-2 convolution.
    pub widths: &'static [usize],
    /// Residual blocks per stage.
    pub blocks: usize,
    /// The stem's stride (2 halves the image before the first stage).
    pub stem_stride: usize,
    /// Images per batch.
    pub batch: usize,
    /// Image side (images are `side × side`, 3 channels).
    pub side: usize,
}

impl CnnSize {
    /// The CUDA default: stages of 32, 64 and 128 channels (32², 16², 8²), two blocks each,
    /// batches of 64.
    pub const CUDA: CnnSize = CnnSize { widths: &[32, 64, 128], blocks: 2, stem_stride: 1, batch: 64, side: 32 };
    /// The CPU (NdArray) default: small enough for a debug build (where NdArray's convolutions
    /// are slow): a stride-4 stem (8² images after it), stages of 4 and 8 channels, one block
    /// each, batches of 4.
    pub const CPU: CnnSize = CnnSize { widths: &[4, 8], blocks: 1, stem_stride: 4, batch: 4, side: 32 };
    /// ResNet-50's 3×3 convolution shapes at batch 32: 112×112 images, a stride-2 stem into 64
    /// channels at 56², then 128 at 28², 256 at 14², 512 at 7², one residual block (two 3×3
    /// convolutions) per stage.
    pub const RESNET50_3X3: CnnSize =
        CnnSize { widths: &[64, 128, 256, 512], blocks: 1, stem_stride: 2, batch: 32, side: 112 };

    /// Multiply-adds ×2 of one forward pass over a batch: every 3×3 convolution
    /// (`2·9·c_in·c_out` per output pixel) and the head; a training step is about 3× this.
    pub fn forward_flops(&self) -> f64 {
        let mut side = self.side.div_ceil(self.stem_stride);
        let mut c = self.widths[0];
        let mut flops = 2.0 * 9.0 * (3 * c * side * side) as f64;
        for (i, &w) in self.widths.iter().enumerate() {
            if i > 0 {
                side = side.div_ceil(2);
                flops += 2.0 * 9.0 * (c * w * side * side) as f64;
            }
            c = w;
            flops += 2.0 * self.blocks as f64 * 2.0 * 9.0 * (c * c * side * side) as f64;
        }
        (flops + 2.0 * (c * CLASSES) as f64) * self.batch as f64
    }
}

/// burn's `Conv2d`, 3×3, padding 1, with burn's default initialisation (Kaiming uniform,
/// bound `1/√(9·c_in)`, weight and bias) drawn from `rng`.
fn conv<B: Backend>(
    rng: &mut StdRng,
    [c_in, c_out]: [usize; 2],
    stride: usize,
    dtype: FloatDType,
    device: &B::Device,
) -> Conv2d<B> {
    let bound = 1.0 / ((9 * c_in) as f32).sqrt();
    Conv2d {
        weight: Param::from_tensor(uniform(rng, [c_out, c_in, 3, 3], bound, dtype, device)),
        bias: Some(Param::from_tensor(uniform(rng, [c_out], bound, dtype, device))),
        stride: [stride; 2],
        kernel_size: [3, 3],
        dilation: [1, 1],
        groups: 1,
        padding: PaddingConfig2d::Explicit(1, 1, 1, 1),
    }
}

/// A 3×3 convolution of either model: burn's `Conv2d` or gemmbridge-burn's `GemmConv2d`.
trait ConvLayer<B: Backend> {
    /// The convolution plus its bias, then ReLU if `relu`.
    fn apply(&self, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4>;
}

impl<B: Backend> ConvLayer<B> for Conv2d<B> {
    fn apply(&self, x: Tensor<B, 4>, with_relu: bool) -> Tensor<B, 4> {
        let y = self.forward(x);
        if with_relu {
            relu(y)
        } else {
            y
        }
    }
}

/// The ReLU fused into the convolution where gemmbridge serves (cuDNN).
impl<B: ConvOps> ConvLayer<B> for GemmConv2d<B> {
    fn apply(&self, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
        if relu {
            self.forward_relu(x)
        } else {
            self.forward(x)
        }
    }
}

/// The convolutions of [`CnnSize`] in the order the network applies them: the stem, then per
/// stage its stride-2 convolution (not in the first stage) and each block's two convolutions.
fn convs<B: Backend>(size: &CnnSize, rng: &mut StdRng, dtype: FloatDType, device: &B::Device) -> Vec<Conv2d<B>> {
    let mut c = size.widths[0];
    let mut convs = vec![conv(rng, [3, c], size.stem_stride, dtype, device)];
    for (i, &w) in size.widths.iter().enumerate() {
        if i > 0 {
            convs.push(conv(rng, [c, w], 2, dtype, device));
        }
        c = w;
        for _ in 0..2 * size.blocks {
            convs.push(conv(rng, [c, c], 1, dtype, device));
        }
    }
    convs
}

/// `images [n, 3, side, side]` → pooled features `[n, channels]` through `convs` (as [`convs`]
/// orders them, `blocks` residual blocks per stage): `relu(stem)`, per stage `relu(down)` and
/// blocks `relu(x + conv2(relu(conv1(x))))`, global average pooling.
fn features<B: Backend, C: ConvLayer<B>>(convs: &[C], blocks: usize, images: Tensor<B, 4>) -> Tensor<B, 2> {
    let stages = convs.len() / (1 + 2 * blocks);
    let mut next = convs.iter();
    let mut layer = || next.next().expect("one convolution per layer of the plan");
    let mut x = layer().apply(images, true);
    for stage in 0..stages {
        if stage > 0 {
            x = layer().apply(x, true);
        }
        for _ in 0..blocks {
            let (c1, c2) = (layer(), layer());
            x = relu(x.clone() + c2.apply(c1.apply(x, true), false));
        }
    }
    let [n, c, _, _] = x.dims();
    x.mean_dim(3).mean_dim(2).reshape([n, c])
}

/// The CNN in burn's modules.
#[derive(Module, Debug)]
pub struct BurnCnn<B: Backend> {
    convs: Vec<Conv2d<B>>,
    blocks: usize,
    head: Linear<B>,
}

/// The CNN in gemmbridge-burn's modules: on burn's CUDA backend the convolutions run in cuDNN
/// (bias and ReLU fused) and the head in cuBLASLt (bias fused); burn's ops on NdArray.
#[derive(Module, Debug)]
pub struct GemmCnn<B: Backend> {
    convs: Vec<GemmConv2d<B>>,
    blocks: usize,
    head: GemmLinear<B>,
}

impl<B: Backend> BurnCnn<B> {
    /// A new model of `size` in `dtype`, its weights drawn from `rng`.
    pub fn new(size: &CnnSize, rng: &mut StdRng, dtype: FloatDType, device: &B::Device) -> Self {
        let convs = convs(size, rng, dtype, device);
        let last = *size.widths.last().expect("at least one stage");
        BurnCnn { convs, blocks: size.blocks, head: linear(rng, [last, CLASSES], true, dtype, device) }
    }

    /// The same model in gemmbridge-burn's modules (`GemmConv2d::from`, `GemmLinear::from`),
    /// these weights (a copy).
    pub fn to_gemm(&self) -> GemmCnn<B> {
        let m = self.clone();
        GemmCnn { convs: m.convs.into_iter().map(GemmConv2d::from).collect(), blocks: m.blocks, head: m.head.into() }
    }
}

/// Images `[n, 3, side, side]` and their classes `[n]`.
#[derive(Clone, Debug)]
pub struct ImageBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub labels: Tensor<B, 1, Int>,
}

impl<B: Backend> Objective<B> for BurnCnn<B> {
    type Batch = ImageBatch<B>;
    fn loss(&self, batch: &ImageBatch<B>) -> Tensor<B, 1> {
        let logits = self.head.forward(features(&self.convs, self.blocks, batch.images.clone()));
        cross_entropy(logits, batch.labels.clone())
    }
}

impl<B: GemmOps + ConvOps> Objective<B> for GemmCnn<B> {
    type Batch = ImageBatch<B>;
    fn loss(&self, batch: &ImageBatch<B>) -> Tensor<B, 1> {
        let logits = self.head.forward(features(&self.convs, self.blocks, batch.images.clone()));
        cross_entropy(logits, batch.labels.clone())
    }
}

/// A sinusoidal grating: spatial frequency (cycles per image, x and y) and colour.
#[derive(Clone, Copy, Debug)]
struct Grating {
    freq: (f32, f32),
    colour: [f32; 3],
}

/// Synthetic classes: each class is two gratings of its own frequencies and colours; an image
/// is its class's gratings with random amplitudes and phases, plus uniform noise.
pub struct Gratings {
    classes: Vec<[Grating; 2]>,
}

impl Gratings {
    /// Noise amplitude (uniform in ±this), against gratings of amplitude 0.5–1.5.
    const NOISE: f32 = 1.0;

    /// The 10 classes, drawn from `rng`; no two gratings share a frequency.
    pub fn new(rng: &mut StdRng) -> Self {
        let mut used = Vec::new();
        let mut grating = |rng: &mut StdRng| loop {
            let freq = (rng.random_range(-4i32..=4), rng.random_range(1i32..=4));
            if !used.contains(&freq) {
                used.push(freq);
                let colour = std::array::from_fn(|_| rng.random_range(-1.0..1.0));
                return Grating { freq: (freq.0 as f32, freq.1 as f32), colour };
            }
        };
        Gratings { classes: (0..CLASSES).map(|_| [grating(rng), grating(rng)]).collect() }
    }

    /// `n` images `side × side` of uniformly drawn classes.
    pub fn batch<B: Backend>(
        &self,
        rng: &mut StdRng,
        (n, side): (usize, usize),
        dtype: FloatDType,
        device: &B::Device,
    ) -> ImageBatch<B> {
        let (mut pixels, mut labels) = (Vec::with_capacity(n * 3 * side * side), Vec::with_capacity(n));
        for _ in 0..n {
            let class = rng.random_range(0..CLASSES);
            labels.push(class as i64);
            let waves = self.classes[class].map(|g| (g, rng.random_range(0.5..1.5f32), rng.random_range(0.0..TAU)));
            for ch in 0..3 {
                for y in 0..side {
                    for x in 0..side {
                        let at = |(g, amp, phase): &(Grating, f32, f32)| {
                            let t = TAU * (g.freq.0 * x as f32 + g.freq.1 * y as f32) / side as f32;
                            amp * g.colour[ch] * (t + phase).sin()
                        };
                        let noise = rng.random_range(-Self::NOISE..Self::NOISE);
                        pixels.push(waves.iter().map(at).sum::<f32>() + noise);
                    }
                }
            }
        }
        ImageBatch {
            images: Tensor::<B, 4>::from_data(TensorData::new(pixels, [n, 3, side, side]), device).cast(dtype),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

/// Trains the CNN of `size` both ways from `seed` (classes and initial weights from
/// `StdRng::seed_from_u64(seed)`, the batches from a second generator derived from it); see
/// [`compare`].
pub fn train_both<B>(size: &CnnSize, dtype: FloatDType, seed: u64, s: &Schedule, device: &B::Device) -> Curves
where
    B: AutodiffBackend + GemmOps + ConvOps,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let data = Gratings::new(&mut rng);
    let burn = BurnCnn::<B>::new(size, &mut rng, dtype, device);
    let gemm = burn.to_gemm();
    let mut batches = StdRng::seed_from_u64(seed ^ 0x5eed_da7a);
    compare(burn, gemm, s, |_| data.batch(&mut batches, (size.batch, size.side), dtype, device))
}
