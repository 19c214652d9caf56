//! `gemmbridge bench`'s flags and the parsers of its engine settings.

use anyhow::bail;
use gemmbridge::cuda::{Backend, Padding};

use crate::suite_args::SuiteArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub shared: SuiteArgs,
    /// Timed samples per row (each ~1 ms of back-to-back calls), median reported. Default 30
    /// on the GPU, 10 on the CPU backend (at most 10 there).
    #[arg(long)]
    pub(super) reps: Option<usize>,
    /// GPU time of back-to-back calls before each row's samples, ms. Default 0: only the 5
    /// warm-up calls, as bench/peer.py, so both sides time a short burst. Heat times the row
    /// at the sustained, power-limited clock instead (f16 linear_bias_gelu 4096×4096×14336
    /// took 1.37× as long; docs/DESIGN.md, Design rationale): do not compare such rows with the
    /// peer's.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(super) heat_ms: f64,
    /// Idle GPU time before each row's warm-up, ms. With a gap every row starts
    /// from the same idle state rather than from whatever the row before it left; give
    /// bench/peer.py the same --gap-ms (`compare` refuses files whose gaps differ).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(super) gap_ms: f64,
    /// Write JSON lines here ("-": stdout, and the table goes to stderr).
    #[arg(long)]
    pub(super) out: Option<String>,
    /// bench/peer.py's JSON lines from the same machine: adds peer time / our time per row
    /// and the geometric mean per dtype. A file without timed rows is refused, before anything
    /// is timed.
    #[arg(long)]
    pub(super) peer: Option<String>,
    /// Library: auto (cuBLASLt where it serves), blas (cuBLAS), lt (cuBLASLt).
    #[arg(long, default_value = "auto")]
    pub(super) backend: String,
    /// Tactic database from `gemmbridge tune` to use: its GEMM entries, and its convolution and
    /// attention entries of the cuDNN version loaded (a convolution or attention call with an
    /// entry runs the stored plan, without a search). A file that cannot be read is an
    /// error, before anything is timed (without a GPU too, where the entries are not used).
    #[arg(long)]
    pub(super) db: Option<String>,
    /// Misaligned operands (leading dimension or address off 16 bytes): "on" runs large such
    /// calls on aligned copies (the default, above measured thresholds), "off" always calls
    /// the library directly, "always" pads every misaligned call whatever its size.
    #[arg(long, default_value = "on")]
    pub(super) padding: String,
    /// Comma-separated ops: matmul, linear, linear_bias, linear_bias_gelu (the last two only
    /// for f16/bf16, as bench/peer.py), bmm (a strided batch of 4 matmuls; not run by
    /// default), launch (tiny-GEMM host cost and graph replay). Convolutions (cuDNN, on
    /// ResNet-50's 11 convolutions, GPU only; not run by default; their peer is
    /// bench/conv_peer.py): conv_fwd, conv_bias_relu (bias and ReLU fused where cuDNN offers
    /// it), conv_bias_relu_unfused (the convolution, then cuDNN's bias add and ReLU),
    /// conv_dgrad, conv_wgrad, or conv for all five. Attention (cuDNN's fused engines, f16 and
    /// bf16, on bench/attention.json's shapes, GPU only; not run by default; their peer is
    /// bench/attn_peer.py): attn_fwd (the forward with its statistics), attn_fwd_bwd (the
    /// forward and the backward); FP8 (no peer): attn_fwd_fp8 (the FP8 forward on q, k, v
    /// quantised beforehand), attn_fwd_bwd_fp8 (the FP8 forward and backward, E5M2 gradients,
    /// do quantised beforehand; rows cuDNN's FP8 backward does not offer are skipped),
    /// attn_fp8_cast (those casts alone). Grouped GEMM (f16 and bf16,
    /// the mixture-of-experts shapes of bench/grouped.json, GPU only; not run by default; their
    /// peer is bench/grouped_peer.py): grouped (the forward), grouped_dx (the backward data),
    /// grouped_dw (the backward weight); grouped_fp8, grouped_fp8_dx, grouped_fp8_dw (the same
    /// in FP8, per recipe of --grouped-scalings, each with rows `<op>_dense`: the dense FP8 GEMM
    /// of the same total size; the peer has row-wise rows for the forward and backward data).
    /// RMSNorm (cuDNN's norm graph, f16 and bf16, 2048 to 32768 rows × 4096, GPU only; not run
    /// by default; its peer is bench/norm_peer.py; rates in TB/s): rmsnorm (the inference
    /// forward), rmsnorm_fwd_bwd (the training forward and the backward).
    /// Layer ops (gemmbridge's own memory-bound kernels on LLaMA 3 8B's shapes, per dtype but
    /// tf32, GPU only; not run by default; reported in TB/s beside a device-to-device copy's;
    /// their peer is bench/layer_ops_peer.py): rope (RoPE in place on the fused QKV output),
    /// swiglu, swiglu_bwd.
    /// Decoder layer (LLaMA-3-8B's, bf16, GPU only; not run by default; its peer is
    /// bench/layer_peer.py): layer_fwd (the forward), layer_fwd_bwd (forward and backward);
    /// with --dtypes fp8_e4m3 also with FP8 forward projections per --scalings recipe
    /// (tensorwise, rowwise).
    /// Paged decode attention (cuDNN's SDPA reading the keys and values through page tables,
    /// f16 and bf16, the shapes of bench/decode.json: one query row per sequence, b 1, 8, 64 at
    /// 4096 keys and a ragged batch of 64; GPU only; not run by default; its peer is
    /// bench/decode_peer.py; rates in TB/s): decode_attn. The decode step (LLaMA-3-8B's layer on
    /// one new token per sequence over that paged cache, bf16, b 1, 8, 64 at 4096 keys, one
    /// captured CUDA graph per call; its peer is bench/decode_step_peer.py; TB/s of the weights
    /// and the keys and values read): decode_step.
    #[arg(long, default_value = "matmul,linear,linear_bias,linear_bias_gelu,launch")]
    pub(super) ops: String,
    /// Decoder-layer rows: the token batches, BxS comma-separated (b sequences of s tokens).
    #[arg(long, default_value = "2x4096,8x1024")]
    pub(super) layer_shapes: String,
    /// Convolution rows: how cuDNN's algorithm is chosen, "measured" (timed on the first call,
    /// as PyTorch's cudnn.benchmark = True, the peer's setting) or "heuristic" (the library's
    /// default). Either way a convolution with an entry in --db runs that entry's plan.
    #[arg(long, default_value = "measured")]
    pub(super) conv_search: String,
    /// Grouped rows: how the engine runs them — auto (a measured choice from --db, else its
    /// rule: one strided batch for equal groups, cuBLAS's grouped call for small unequal ones,
    /// a pool of streams otherwise), strided,
    /// cublas-grouped (cuBLAS's grouped batched call), cudnn (cuDNN's MoE grouped matmul) or
    /// pool (in order with --grouped-streams 1); shapes a forced backend does not apply to
    /// are skipped.
    #[arg(long, default_value = "auto")]
    pub(super) grouped_backend: String,
    /// MoE rows: where the expert products' rows sit, "auto" (the capacity layout, every
    /// expert padded to the largest group, where gemmbridge::moe::capacity says it pays: equal
    /// groups of one strided batch; the sorted layout otherwise) or "sorted" (always the sorted
    /// layout, ragged groups).
    #[arg(long, default_value = "auto")]
    pub(super) moe_layout: String,
    /// Grouped rows: streams of the pool (1 to 16).
    #[arg(long, default_value_t = 4)]
    pub(super) grouped_streams: usize,
    /// The FP8 grouped rows: comma-separated FP8 recipes (as --scalings names them).
    #[arg(long, default_value = "tensorwise,rowwise,block")]
    pub(super) grouped_scalings: String,
}

/// `--padding` parsed.
pub fn parse_padding(s: &str) -> anyhow::Result<Padding> {
    Ok(match s {
        "on" => Padding::default(),
        "off" => Padding::off(),
        "always" => Padding::default().with_min_macs(0, 0, 0),
        other => bail!("unknown padding setting {other:?}; choose on, off or always"),
    })
}

/// `--backend` parsed.
pub fn parse_backend(s: &str) -> anyhow::Result<Backend> {
    Ok(match s {
        "auto" => Backend::Auto,
        "blas" => Backend::Blas,
        "lt" => Backend::Lt,
        other => bail!("unknown backend {other:?}; choose auto, blas or lt"),
    })
}
