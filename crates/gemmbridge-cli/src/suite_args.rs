//! The arguments `bench` and `tune` share (suite, dtypes, FP8 recipes, convolution settings),
//! and the parsing of the lists both take: `--dtypes` and `--ops`.

use anyhow::bail;
use gemmbridge::conv::ConvLayout;
use gemmbridge::cuda::ConvApi;
use gemmbridge::Precision;

use crate::bench::{attn, conv, decode, decoder, fp8, grouped, layer, moe, norm};
use crate::lists::entries;
use crate::ops::{precision_of, OPS};
use crate::suites::{self, Shape};

/// What GEMMs and convolutions a `bench` or `tune` run covers.
#[derive(clap::Args, Debug)]
pub struct SuiteArgs {
    /// Shape suite: default (square + llm + small), square, llm, small, misaligned (leading
    /// dimensions off 16 bytes), deepgemm (4096×7168×16384, the block-scaled FP8 shape DeepGEMM
    /// reports), cpu.
    #[arg(long, default_value = "default")]
    pub suite: String,
    /// Comma-separated dtypes, as bench/peer.py names them: f32, tf32, f16, bf16, fp8_e4m3
    /// (FP8: `scaled_mm` problems, one per --scalings recipe, E4M3 operands quantised from
    /// random bf16, bf16 output; GPU only; --ops does not apply to them).
    #[arg(long, default_value = "f32,tf32,f16,bf16")]
    pub dtypes: String,
    /// FP8 recipes for fp8_e4m3: tensorwise, rowwise, block (x 1×128, w 128×128),
    /// block_1x128, block_128x128_1x128.
    #[arg(long, default_value = "tensorwise,rowwise,block")]
    pub scalings: String,
    /// Convolutions: the layouts, nhwc and/or nchw.
    #[arg(long, default_value = "nhwc,nchw")]
    pub conv_layouts: String,
    /// Convolutions: the batch sizes N.
    #[arg(long, default_value = "32,1")]
    pub conv_batches: String,
    /// Convolutions: the cuDNN API they run on (and are tuned for), "graph" (the backend API
    /// with execution plans, the library's default) or "legacy" (cudnnConvolutionForward and
    /// the like).
    #[arg(long, default_value = "graph")]
    pub conv_api: String,
    /// Attention: the shapes of bench/attention.json to run, by name (comma-separated; default
    /// every shape).
    #[arg(long, default_value = "")]
    pub attn_shapes: String,
}

/// `--dtypes` parsed: the dense precisions, in order, each once, and the FP8 recipes.
#[derive(Debug, PartialEq)]
pub struct Dtypes {
    /// f32, tf32, f16, bf16 as listed (bench/peer.py's names), each once.
    pub dense: Vec<(String, Precision)>,
    /// The `--scalings` recipes when fp8_e4m3 is listed, else empty.
    pub scalings: Vec<String>,
}

/// `--ops` parsed: GEMM ops, convolution ops and attention ops in the order given, each once
/// (`conv` stands for every convolution op), and whether the launch row was asked for.
#[derive(Debug, PartialEq)]
pub struct OpList {
    pub gemm: Vec<String>,
    pub conv: Vec<String>,
    pub attn: Vec<String>,
    pub grouped: Vec<String>,
    /// RMSNorm ops (benchmark only: nothing to tune).
    pub norm: Vec<String>,
    /// The layer ops ([`layer::OPS`]; `bench` only).
    pub layer: Vec<String>,
    /// The decoder-layer ops ([`decoder::OPS`]; `bench` only).
    pub decoder: Vec<String>,
    /// The paged decode-attention ops ([`decode::OPS`]; `bench` only).
    pub decode: Vec<String>,
    /// The mixture-of-experts layer ops ([`moe::OPS`]; `bench` only).
    pub moe: Vec<String>,
    pub launch: bool,
}

/// The convolution settings both commands take.
pub struct ConvSettings {
    pub layouts: Vec<ConvLayout>,
    pub batches: Vec<usize>,
    pub api: ConvApi,
}

impl SuiteArgs {
    /// The suite's shapes.
    pub fn shapes(&self) -> anyhow::Result<Vec<Shape>> {
        suites::shapes(&self.suite)
    }

    /// `--dtypes` and `--scalings` parsed (the recipes kept when `--dtypes` names fp8_e4m3,
    /// checked either way). An unknown name or an empty entry is an error; an empty selection
    /// is not (each command says what it needs).
    pub fn dtypes(&self) -> anyhow::Result<Dtypes> {
        let mut dense: Vec<(String, Precision)> = Vec::new();
        let mut fp8 = false;
        for d in entries("--dtypes", &self.dtypes)? {
            match precision_of(d) {
                Some(_) if dense.iter().any(|(n, _)| n == d) => {} // listed twice
                Some(p) => dense.push((d.to_string(), p)),
                None if d == "fp8_e4m3" => fp8 = true,
                None => bail!("unknown dtype {d:?}; choose from f32, tf32, f16, bf16, fp8_e4m3"),
            }
        }
        let scalings = fp8::parse_scalings("--scalings", &self.scalings)?;
        let scalings = if fp8 { scalings } else { Vec::new() };
        Ok(Dtypes { dense, scalings })
    }

    /// `--conv-layouts`, `--conv-batches` and `--conv-api` parsed, in that order.
    pub fn conv(&self) -> anyhow::Result<ConvSettings> {
        Ok(ConvSettings {
            layouts: conv::parse_layouts(&self.conv_layouts)?,
            batches: conv::parse_batches(&self.conv_batches)?,
            api: conv::parse_api(&self.conv_api)?,
        })
    }
}

/// A comma-separated `--ops` list parsed; `launch` and [`attn::BENCH_ONLY`] (`attn_fp8_cast`,
/// `attn_fwd_bwd_fp8`) are accepted only where `bench_only` (they are `bench`'s, not `tune`'s).
pub fn parse_ops(list: &str, bench_only: bool) -> anyhow::Result<OpList> {
    let with_launch = bench_only;
    let mut out = OpList {
        gemm: Vec::new(),
        conv: Vec::new(),
        attn: Vec::new(),
        grouped: Vec::new(),
        norm: Vec::new(),
        layer: Vec::new(),
        decoder: Vec::new(),
        decode: Vec::new(),
        moe: Vec::new(),
        launch: false,
    };
    let push = |v: &mut Vec<String>, o: &str| {
        if !v.iter().any(|x| x == o) {
            v.push(o.to_string());
        }
    };
    for o in entries("--ops", list)? {
        if with_launch && o == "launch" {
            out.launch = true;
        } else if o == "conv" {
            conv::OPS.iter().for_each(|c| push(&mut out.conv, c));
        } else if conv::OPS.contains(&o) {
            push(&mut out.conv, o);
        } else if OPS.contains(&o) {
            push(&mut out.gemm, o);
        } else if attn::OPS.contains(&o) && (bench_only || !attn::BENCH_ONLY.contains(&o)) {
            push(&mut out.attn, o);
        } else if grouped::OPS.contains(&o) && (bench_only || !grouped::is_fp8(o)) {
            push(&mut out.grouped, o);
        } else if norm::OPS.contains(&o) && bench_only {
            push(&mut out.norm, o);
        } else if bench_only && layer::OPS.contains(&o) {
            push(&mut out.layer, o);
        } else if bench_only && decoder::OPS.contains(&o) {
            push(&mut out.decoder, o);
        } else if bench_only && decode::OPS.contains(&o) {
            push(&mut out.decode, o);
        } else if bench_only && moe::OPS.contains(&o) {
            push(&mut out.moe, o);
        } else {
            let launch = if with_launch { "launch, " } else { "" };
            let attn: Vec<&str> =
                attn::OPS.iter().copied().filter(|a| bench_only || !attn::BENCH_ONLY.contains(a)).collect();
            let grouped: Vec<&str> =
                grouped::OPS.iter().copied().filter(|g| bench_only || !grouped::is_fp8(g)).collect();
            let norm = if bench_only {
                let more = [&norm::OPS[..], &layer::OPS, &decoder::OPS, &decode::OPS, &moe::OPS].concat();
                format!(", {}", more.join(", "))
            } else {
                String::new()
            };
            let grouped = format!(", {}{norm}", grouped.join(", "));
            let attn = format!(", {}{grouped}", attn.join(", "));
            bail!("unknown op {o:?}; choose from {}, {launch}{}, conv{attn}", OPS.join(", "), conv::OPS.join(", "));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        suite: SuiteArgs,
    }

    fn parse(args: &[&str]) -> SuiteArgs {
        Cmd::try_parse_from(std::iter::once("cmd").chain(args.iter().copied())).expect("parses").suite
    }

    #[test]
    fn defaults() {
        let a = parse(&[]);
        assert_eq!(
            (a.suite.as_str(), a.dtypes.as_str(), a.scalings.as_str()),
            ("default", "f32,tf32,f16,bf16", "tensorwise,rowwise,block")
        );
        assert_eq!(
            (a.conv_layouts.as_str(), a.conv_batches.as_str(), a.conv_api.as_str()),
            ("nhwc,nchw", "32,1", "graph")
        );
        let d = a.dtypes().unwrap();
        let names: Vec<&str> = d.dense.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["f32", "tf32", "f16", "bf16"]);
        assert!(d.scalings.is_empty(), "no fp8_e4m3, so no recipes");
        let c = a.conv().unwrap();
        assert_eq!(
            (c.layouts, c.batches, c.api),
            (vec![ConvLayout::Nhwc, ConvLayout::Nchw], vec![32, 1], ConvApi::Graph)
        );
    }

    /// A typo in a list is refused by its flag's name, whether or not the list is used: an empty
    /// entry anywhere, and an unknown recipe even where no fp8_e4m3 row runs.
    #[test]
    fn empty_entries_and_unused_unknown_names_are_refused() {
        assert_eq!(entries("--x", " a , b ").unwrap(), ["a", "b"]);
        assert!(entries("--x", "  ").unwrap().is_empty());
        for list in ["a,,b", "a,", ",a", " , "] {
            let e = entries("--x", list).unwrap_err().to_string();
            assert_eq!(e, format!("--x {list:?} has an empty entry: give comma-separated names"));
        }
        let e = parse(&["--dtypes", "f32,,f16"]).dtypes().unwrap_err().to_string();
        assert!(e.starts_with("--dtypes \"f32,,f16\" has an empty entry"), "{e}");
        let e = parse(&["--scalings", "bogus"]).dtypes().unwrap_err().to_string();
        assert!(e.starts_with("--scalings: unknown scaling \"bogus\""), "{e}");
        assert!(parse(&["--conv-batches", "32,,1"]).conv().is_err());
        assert!(parse(&["--conv-layouts", "nhwc,"]).conv().is_err());
        assert!(parse_ops("matmul,", true).unwrap_err().to_string().contains("--ops \"matmul,\""));
    }

    #[test]
    fn dtypes_once_each_and_fp8_recipes() {
        let d =
            parse(&["--dtypes", " bf16,f16,bf16, fp8_e4m3", "--scalings", "rowwise,block,rowwise"]).dtypes().unwrap();
        assert_eq!(d.dense, vec![("bf16".to_string(), Precision::BF16), ("f16".to_string(), Precision::F16)]);
        assert_eq!(d.scalings, ["rowwise", "block"]);
        // recipes are kept only when fp8_e4m3 is asked for, and checked either way
        assert!(parse(&["--dtypes", "f32", "--scalings", "rowwise"]).dtypes().unwrap().scalings.is_empty());
        assert!(parse(&["--dtypes", "f32", "--scalings", "bogus"]).dtypes().is_err());
        let e = parse(&["--dtypes", "fp8_e4m3", "--scalings", "bogus"]).dtypes().unwrap_err().to_string();
        assert!(e.contains("unknown scaling \"bogus\""), "{e}");
        let e = parse(&["--dtypes", "f32,f17"]).dtypes().unwrap_err().to_string();
        assert_eq!(e, "unknown dtype \"f17\"; choose from f32, tf32, f16, bf16, fp8_e4m3");
        assert_eq!(parse(&["--dtypes", ""]).dtypes().unwrap(), Dtypes { dense: vec![], scalings: vec![] });
    }

    #[test]
    fn conv_settings_checked() {
        assert!(parse(&["--conv-layouts", "nhwc,xyz"]).conv().is_err());
        assert!(parse(&["--conv-batches", "0"]).conv().is_err());
        assert!(parse(&["--conv-api", "new"]).conv().is_err());
        let c = parse(&["--conv-layouts", "nchw", "--conv-batches", "8,8,2", "--conv-api", "legacy"]).conv().unwrap();
        assert_eq!((c.layouts, c.batches, c.api), (vec![ConvLayout::Nchw], vec![8, 2], ConvApi::Legacy));
    }

    #[test]
    fn ops_in_order_once_each() {
        let o = parse_ops("linear,matmul,linear,conv_dgrad,conv,launch", true).unwrap();
        assert_eq!(o.gemm, ["linear", "matmul"]);
        assert_eq!(o.conv, ["conv_dgrad", "conv_fwd", "conv_bias_relu", "conv_bias_relu_unfused", "conv_wgrad"]);
        assert!(o.launch);
        assert_eq!(
            parse_ops(" ", true).unwrap(),
            OpList {
                gemm: vec![],
                conv: vec![],
                attn: vec![],
                grouped: vec![],
                norm: vec![],
                layer: vec![],
                decoder: vec![],
                decode: vec![],
                moe: vec![],
                launch: false
            }
        );
        assert_eq!(parse_ops("moe_fwd_bwd,moe_fwd", true).unwrap().moe, ["moe_fwd_bwd", "moe_fwd"]);
        assert!(parse_ops("moe_fwd", false).is_err(), "a MoE step has nothing to tune");
        assert_eq!(parse_ops("attn_fwd_bwd,attn_fwd", true).unwrap().attn, ["attn_fwd_bwd", "attn_fwd"]);
        assert_eq!(parse_ops("attn_fwd", false).unwrap().attn, ["attn_fwd"]);
        assert!(parse_ops("attn_fp8_cast", false).is_err(), "a cast has no plan to tune");
        assert!(parse_ops("attn_fwd_bwd_fp8", false).is_err(), "the FP8 backward is not tuned");
        assert_eq!(parse_ops("attn_fwd_bwd_fp8", true).unwrap().attn, ["attn_fwd_bwd_fp8"]);
        assert_eq!(parse_ops("rmsnorm_fwd_bwd,rmsnorm", true).unwrap().norm, ["rmsnorm_fwd_bwd", "rmsnorm"]);
        assert!(parse_ops("rmsnorm", false).is_err(), "RMSNorm has nothing to tune");
    }

    #[test]
    fn launch_only_where_offered() {
        let e = parse_ops("matmul,launch", false).unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown op \"launch\"; choose from matmul, linear, linear_bias, linear_bias_gelu, bmm, conv_fwd, \
             conv_bias_relu, conv_bias_relu_unfused, conv_dgrad, conv_wgrad, conv, attn_fwd, attn_fwd_bwd, attn_fwd_fp8, \
             grouped, grouped_dx, grouped_dw"
        );
        assert_eq!(parse_ops("grouped_dw", false).unwrap().grouped, ["grouped_dw"]);
        assert!(parse_ops("grouped_fp8", false).is_err(), "FP8 groups have no way to choose");
        assert!(parse_ops("grouped_fp8_dw", false).is_err(), "FP8 groups have no way to choose");
        let e = parse_ops("foo", true).unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown op \"foo\"; choose from matmul, linear, linear_bias, linear_bias_gelu, bmm, launch, conv_fwd, \
             conv_bias_relu, conv_bias_relu_unfused, conv_dgrad, conv_wgrad, conv, attn_fwd, attn_fwd_bwd, attn_fwd_fp8, attn_fwd_bwd_fp8, attn_fp8_cast, grouped, \
             grouped_dx, grouped_dw, grouped_fp8, grouped_fp8_dx, grouped_fp8_dw, rmsnorm, rmsnorm_fwd_bwd, \
             rope, swiglu, swiglu_bwd, layer_fwd, layer_fwd_bwd, decode_attn, decode_step, moe_fwd, moe_fwd_bwd"
        );
        assert_eq!(parse_ops("swiglu_bwd,rope,swiglu,rope", true).unwrap().layer, ["swiglu_bwd", "rope", "swiglu"]);
        assert!(parse_ops("rope", false).is_err(), "layer ops have nothing to tune");
        assert_eq!(parse_ops("layer_fwd_bwd,layer_fwd", true).unwrap().decoder, ["layer_fwd_bwd", "layer_fwd"]);
        assert!(parse_ops("layer_fwd", false).is_err(), "the decoder layer is not tuned");
        assert_eq!(parse_ops("decode_attn", true).unwrap().decode, ["decode_attn"]);
        assert!(parse_ops("decode_attn", false).is_err(), "the paged decode is not tuned");
        assert_eq!(parse_ops("decode_step,decode_attn", true).unwrap().decode, ["decode_step", "decode_attn"]);
    }
}
