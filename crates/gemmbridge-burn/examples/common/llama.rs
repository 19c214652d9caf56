//! A small LLaMA-style decoder built twice: [`BurnLlama`] from burn's modules (`Embedding`,
//! `RmsNorm`, `Linear`, `SwiGlu`, attention in burn's tensor ops) and [`GemmLlama`] from
//! gemmbridge-burn's (`GemmRmsNorm`, `GemmAttention`, `GemmSwiGluMlp`, `GemmLinear`; the
//! embedding stays burn's), converted from the first ([`BurnLlama::to_gemm`]); and next-token
//! data from a fixed random Markov chain ([`MarkovChain`]).
//!
//! Per layer: RMSNorm → causal self-attention (grouped-query heads, no positional encoding: the
//! chain's next token depends on the current one only) → residual → RMSNorm → SwiGLU MLP →
//! residual; then a final RMSNorm and the LM head. No biases, as in LLaMA.
//!
//! burn's `MultiHeadAttention` has no grouped key/value heads, so burn's side computes the
//! attention as that module does (`softmax(q·kᵀ/√d_k + mask)·v`, hidden scores filled with
//! −10⁴), with each key/value head repeated for its group of query heads; its four `Linear`
//! projections become [`GemmAttention`]'s through `GemmLinear::from`.

use burn::module::{Module, Param};
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::{Embedding, Linear, RmsNorm, SwiGlu};
use burn::tensor::activation::softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, FloatDType, Int, Tensor, TensorData};
use gemmbridge_burn::{
    AttentionOps, AttnMask, GemmAttention, GemmLinear, GemmOps, GemmRmsNorm, GemmSwiGluMlp, LayerOps,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{compare, constant, cross_entropy, linear, uniform, Curves, Objective, Schedule};

/// The model's and the batches' sizes.
#[derive(Clone, Copy, Debug)]
pub struct LlamaSize {
    /// Decoder layers.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention; `heads` a multiple of it).
    pub kv_heads: usize,
    /// Vocabulary (and Markov chain states).
    pub vocab: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences per batch.
    pub batch: usize,
}

impl LlamaSize {
    /// The CUDA default: 4 layers, d 512, 8 query / 2 key-value heads (d_k 64), vocabulary
    /// 4096, batches of 8 sequences of 128 tokens.
    pub const CUDA: LlamaSize =
        LlamaSize { layers: 4, d_model: 512, heads: 8, kv_heads: 2, vocab: 4096, seq: 128, batch: 8 };
    /// The CPU (NdArray) default: small enough for a debug build.
    pub const CPU: LlamaSize =
        LlamaSize { layers: 2, d_model: 64, heads: 4, kv_heads: 2, vocab: 256, seq: 32, batch: 4 };

    /// One decoder layer at LLaMA-3-8B's width: d 4096, 32 query / 8 key-value heads (d_k 128),
    /// the MLP at the 8/3 rule (10 944; LLaMA-3-8B's is 14 336), vocabulary 4096, batches of 2
    /// sequences of 2048 tokens.
    pub const LAYER_4096: LlamaSize =
        LlamaSize { layers: 1, d_model: 4096, heads: 32, kv_heads: 8, vocab: 4096, seq: 2048, batch: 2 };

    /// Multiply-adds ×2 of one forward pass over a batch: every projection and the LM head
    /// (`2·tokens` per weight), and the causal attention's two products (`2·b·heads·s²·d_k` a
    /// layer: half of the full `s²`, twice); a training step is about 3× this.
    pub fn forward_flops(&self) -> f64 {
        let d = self.d_model;
        let matmul_params = self.params() - self.vocab * d - d - self.layers * 2 * d;
        let tokens = (self.batch * self.seq) as f64;
        let attention = (self.layers * 2 * self.batch * self.heads * self.seq * self.seq * self.d_k()) as f64;
        2.0 * matmul_params as f64 * tokens + attention
    }

    /// The MLP's hidden size: LLaMA's `8/3·d_model`, rounded up to a multiple of 32.
    pub fn d_hidden(&self) -> usize {
        (8 * self.d_model / 3).div_ceil(32) * 32
    }

    /// The head dimension.
    pub fn d_k(&self) -> usize {
        self.d_model / self.heads
    }

    /// The model's parameters.
    pub fn params(&self) -> usize {
        let (d, f, d_k) = (self.d_model, self.d_hidden(), self.d_k());
        let attn = d * (self.heads + 2 * self.kv_heads) * d_k + self.heads * d_k * d;
        2 * self.vocab * d + d + self.layers * (2 * d + attn + 3 * d * f)
    }
}

/// burn's side of the attention: four `Linear` projections and burn's tensor ops.
#[derive(Module, Debug)]
pub struct BurnAttention<B: Backend> {
    /// `[d_model, heads·d_k]`.
    pub query: Linear<B>,
    /// `[d_model, kv_heads·d_k]`.
    pub key: Linear<B>,
    /// `[d_model, kv_heads·d_k]`.
    pub value: Linear<B>,
    /// `[heads·d_k, d_model]`.
    pub output: Linear<B>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
}

impl<B: Backend> BurnAttention<B> {
    /// `x [b, s, d_model]` → `[b, s, d_model]`; `hidden [b, 1, s, s]` true where a score is
    /// masked.
    fn forward(&self, x: Tensor<B, 3>, hidden: Tensor<B, 4, Bool>) -> Tensor<B, 3> {
        let [b, s, d] = x.dims();
        let (h, kv, d_k) = (self.heads, self.kv_heads, d / self.heads);
        let split = |t: Tensor<B, 3>, n: usize| t.reshape([b, s, n, d_k]).swap_dims(1, 2);
        // key/value head i serves query heads i·g … i·g + g − 1
        let repeat = |t: Tensor<B, 4>| t.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, s, d_k]).reshape([b, h, s, d_k]);
        let q = split(self.query.forward(x.clone()), h);
        let k = repeat(split(self.key.forward(x.clone()), kv));
        let v = repeat(split(self.value.forward(x), kv));
        let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((d_k as f64).sqrt()).mask_fill(hidden, -1.0e4);
        let o = softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([b, s, h * d_k]);
        self.output.forward(o)
    }
}

/// One decoder layer of [`BurnLlama`].
#[derive(Module, Debug)]
pub struct BurnBlock<B: Backend> {
    attn_norm: RmsNorm<B>,
    attn: BurnAttention<B>,
    mlp_norm: RmsNorm<B>,
    swiglu: SwiGlu<B>,
    down: Linear<B>,
}

/// The decoder in burn's modules.
#[derive(Module, Debug)]
pub struct BurnLlama<B: Backend> {
    embed: Embedding<B>,
    blocks: Vec<BurnBlock<B>>,
    norm: RmsNorm<B>,
    head: Linear<B>,
}

/// burn's `RmsNorm` over `d` (γ ones, ε 1e-5).
fn rms_norm<B: Backend>(d: usize, dtype: FloatDType, device: &B::Device) -> RmsNorm<B> {
    RmsNorm { gamma: constant([d], 1.0, dtype, device), epsilon: 1e-5 }
}

impl<B: Backend> BurnLlama<B> {
    /// A new model of `size` in `dtype`, its weights drawn from `rng` (burn's default
    /// initialisations: Kaiming uniform for the linear layers, γ ones; the embedding uniform
    /// in ±√3, unit variance).
    pub fn new(size: &LlamaSize, rng: &mut StdRng, dtype: FloatDType, device: &B::Device) -> Self {
        let (d, f, d_k) = (size.d_model, size.d_hidden(), size.d_k());
        let mut lin = |shape| linear::<B>(rng, shape, false, dtype, device);
        let mut blocks = Vec::with_capacity(size.layers);
        for _ in 0..size.layers {
            let attn = BurnAttention {
                query: lin([d, size.heads * d_k]),
                key: lin([d, size.kv_heads * d_k]),
                value: lin([d, size.kv_heads * d_k]),
                output: lin([size.heads * d_k, d]),
                heads: size.heads,
                kv_heads: size.kv_heads,
            };
            let swiglu = SwiGlu { linear_inner: lin([d, f]), linear_outer: lin([d, f]) };
            let (attn_norm, mlp_norm) = (rms_norm(d, dtype, device), rms_norm(d, dtype, device));
            blocks.push(BurnBlock { attn_norm, attn, mlp_norm, swiglu, down: lin([f, d]) });
        }
        let head = lin([d, size.vocab]);
        let embed = Embedding { weight: Param::from_tensor(uniform(rng, [size.vocab, d], 3f32.sqrt(), dtype, device)) };
        BurnLlama { embed, blocks, norm: rms_norm(d, dtype, device), head }
    }

    /// `tokens [b, s]` → logits `[b, s, vocab]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, s] = tokens.dims();
        let hidden = generate_autoregressive_mask::<B>(b, s, &tokens.device()).reshape([b, 1, s, s]);
        let mut x = self.embed.forward(tokens);
        for l in &self.blocks {
            let h = x.clone() + l.attn.forward(l.attn_norm.forward(x), hidden.clone());
            x = h.clone() + l.down.forward(l.swiglu.forward(l.mlp_norm.forward(h)));
        }
        self.head.forward(self.norm.forward(x))
    }

    /// The same model in gemmbridge-burn's modules, with these weights (a copy: this model is
    /// left as it is); under `Autodiff` every parameter stays trainable.
    pub fn to_gemm(&self) -> GemmLlama<B> {
        let m = self.clone();
        let blocks = m.blocks.into_iter().map(|l| GemmBlock {
            attn_norm: l.attn_norm.into(),
            attn: GemmAttention {
                query: l.attn.query.into(),
                key: l.attn.key.into(),
                value: l.attn.value.into(),
                output: l.attn.output.into(),
                n_heads: l.attn.heads,
            },
            mlp_norm: l.mlp_norm.into(),
            mlp: GemmSwiGluMlp::from_burn(l.swiglu, l.down),
        });
        GemmLlama { embed: m.embed, blocks: blocks.collect(), norm: m.norm.into(), head: m.head.into() }
    }
}

/// One decoder layer of [`GemmLlama`].
#[derive(Module, Debug)]
pub struct GemmBlock<B: Backend> {
    attn_norm: GemmRmsNorm<B>,
    attn: GemmAttention<B>,
    mlp_norm: GemmRmsNorm<B>,
    mlp: GemmSwiGluMlp<B>,
}

/// The decoder in gemmbridge-burn's modules: on burn's CUDA backend its GEMMs run in
/// cuBLASLt/cuBLAS, its norms in cuDNN's norm graph, its SwiGLU in gemmbridge's kernel and its
/// attention in cuDNN (f16/bf16); on other backends (NdArray) every op is burn's.
#[derive(Module, Debug)]
pub struct GemmLlama<B: Backend> {
    embed: Embedding<B>,
    blocks: Vec<GemmBlock<B>>,
    norm: GemmRmsNorm<B>,
    head: GemmLinear<B>,
}

impl<B: GemmOps + LayerOps + AttentionOps> GemmLlama<B> {
    /// `tokens [b, s]` → logits `[b, s, vocab]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mut x = self.embed.forward(tokens);
        for l in &self.blocks {
            let h = x.clone() + l.attn.self_attention(l.attn_norm.forward(x), AttnMask::Causal);
            x = h.clone() + l.mlp.forward(l.mlp_norm.forward(h));
        }
        self.head.forward(self.norm.forward(x))
    }
}

/// A batch of sequences: `inputs [b, s]` and the next tokens, flattened, `targets [b·s]`.
#[derive(Clone, Debug)]
pub struct TokenBatch<B: Backend> {
    pub inputs: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 1, Int>,
}

/// Next-token cross-entropy over every position.
fn next_token_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let [b, s, v] = logits.dims();
    cross_entropy(logits.reshape([b * s, v]), targets)
}

impl<B: Backend> Objective<B> for BurnLlama<B> {
    type Batch = TokenBatch<B>;
    fn loss(&self, batch: &TokenBatch<B>) -> Tensor<B, 1> {
        next_token_loss(self.forward(batch.inputs.clone()), batch.targets.clone())
    }
}

impl<B: GemmOps + LayerOps + AttentionOps> Objective<B> for GemmLlama<B> {
    type Batch = TokenBatch<B>;
    fn loss(&self, batch: &TokenBatch<B>) -> Tensor<B, 1> {
        next_token_loss(self.forward(batch.inputs.clone()), batch.targets.clone())
    }
}

/// Successors per token of [`MarkovChain`].
const SUCCESSORS: usize = 4;

/// A fixed random Markov chain over the vocabulary: each token has [`SUCCESSORS`] possible next
/// tokens with random probabilities, so the best achievable loss is the chain's entropy.
pub struct MarkovChain {
    /// Per token: its successors and their cumulative probabilities.
    next: Vec<[(usize, f64); SUCCESSORS]>,
}

impl MarkovChain {
    /// The chain over `vocab` tokens, drawn from `rng`.
    pub fn new(vocab: usize, rng: &mut StdRng) -> Self {
        let next = (0..vocab)
            .map(|_| {
                let w: [f64; SUCCESSORS] = std::array::from_fn(|_| rng.random_range(0.1..1.0));
                let total: f64 = w.iter().sum();
                let mut acc = 0.0;
                std::array::from_fn(|i| {
                    acc += w[i] / total;
                    (rng.random_range(0..vocab), acc)
                })
            })
            .collect();
        MarkovChain { next }
    }

    /// The mean over tokens of the next token's entropy (nats): about the lowest loss a model
    /// can reach (successors drawn twice for a token merge, which lowers it slightly).
    pub fn entropy(&self) -> f64 {
        let per_token = |s: &[(usize, f64); SUCCESSORS]| {
            let mut below = 0.0;
            let mut h = 0.0;
            for &(_, c) in s {
                let p: f64 = c - below;
                below = c;
                h -= p * p.ln();
            }
            h
        };
        self.next.iter().map(per_token).sum::<f64>() / self.next.len() as f64
    }

    /// `batch` walks of `seq + 1` tokens from uniform random starts: the first `seq` tokens are
    /// the inputs, the last `seq` the targets.
    pub fn batch<B: Backend>(&self, rng: &mut StdRng, batch: usize, seq: usize, device: &B::Device) -> TokenBatch<B> {
        let (mut inputs, mut targets) = (Vec::with_capacity(batch * seq), Vec::with_capacity(batch * seq));
        for _ in 0..batch {
            let mut t = rng.random_range(0..self.next.len());
            for _ in 0..seq {
                inputs.push(t as i64);
                let u: f64 = rng.random();
                let succ = &self.next[t];
                t = succ.iter().find(|&&(_, c)| u < c).unwrap_or(&succ[SUCCESSORS - 1]).0;
                targets.push(t as i64);
            }
        }
        TokenBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, [batch, seq]), device),
            targets: Tensor::from_data(TensorData::new(targets, [batch * seq]), device),
        }
    }
}

/// Trains the decoder of `size` both ways from `seed`: the chain and the initial weights from
/// `StdRng::seed_from_u64(seed)`, the batches from a second generator derived from it; see
/// [`compare`]. Returns the curves and the chain's entropy (the loss floor).
pub fn train_both<B>(size: &LlamaSize, dtype: FloatDType, seed: u64, s: &Schedule, device: &B::Device) -> (Curves, f64)
where
    B: AutodiffBackend + GemmOps + LayerOps + AttentionOps,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let chain = MarkovChain::new(size.vocab, &mut rng);
    let burn = BurnLlama::<B>::new(size, &mut rng, dtype, device);
    let gemm = burn.to_gemm();
    let mut data = StdRng::seed_from_u64(seed ^ 0x5eed_da7a);
    let curves = compare(burn, gemm, s, |_| chain.batch(&mut data, size.batch, size.seq, device));
    (curves, chain.entropy())
}
