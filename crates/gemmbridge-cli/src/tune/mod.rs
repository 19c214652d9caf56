//! `gemmbridge tune`: a tactic database that holds only what wins where it is used.
//!
//! For each problem of the selection (the dense GEMMs of a suite, the FP8 recipes over it,
//! the convolutions, the attention rows), the search (`gemm.rs`: cuBLASLt's candidates timed
//! at the sustained clock; `conv.rs`, `attn.rs`: cuDNN's measured search) gives finalists; each is then confirmed against
//! the library's own choice in `bench`'s protocol (`confirm.rs`), and stored only where it
//! wins by at least 2 %. `--verify` re-runs the confirmation for a database's entries,
//! `--noise` measures the protocol's own spread.

mod attn;
mod confirm;
mod conv;
mod gemm;
mod grouped;
mod items;
mod run;

use anyhow::bail;
use gemmbridge::{DType, Precision};

use crate::ops::op_applies;
use crate::suite_args::{parse_ops, ConvSettings, Dtypes, SuiteArgs};
use items::Item;

pub use run::run;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub shared: SuiteArgs,
    /// Comma-separated ops: matmul, linear, linear_bias, linear_bias_gelu, bmm (a strided batch
    /// of 4 matmuls, as `bench --ops bmm`; not tuned by default). Convolutions (cuDNN's measured
    /// search on ResNet-50's 11 convolutions per dtype, --conv-layouts and --conv-batches, as
    /// `bench` times them; not tuned by default; --suite does not apply to them): conv_fwd,
    /// conv_bias_relu, conv_bias_relu_unfused, conv_dgrad, conv_wgrad, or conv for all five.
    /// Attention (cuDNN's measured search on the shapes of bench/attention.json, --attn-shapes,
    /// f16/bf16; not tuned by default): attn_fwd (the forward), attn_fwd_bwd (the backward,
    /// judged in the forward-and-backward row), attn_fwd_fp8 (the FP8 forward). Grouped GEMM
    /// (every way of running it measured on the shapes of bench/grouped.json, f16/bf16; not
    /// tuned by default): grouped, grouped_dx, grouped_dw.
    #[arg(long, default_value = "matmul,linear,linear_bias,linear_bias_gelu")]
    ops: String,
    /// The tactic database to fill (created, or merged into: a problem tuned again gets the
    /// new verdict, and loses its entry where nothing wins).
    #[arg(long, required_unless_present_any = ["verify", "noise", "prune"], conflicts_with_all = ["verify", "noise"])]
    db: Option<String>,
    /// Candidates to ask cuBLASLt's heuristic for.
    #[arg(long, default_value_t = 16)]
    candidates: usize,
    /// Timed samples per candidate in the search (at the sustained clock).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Finalists of the search to confirm per problem (fastest first; the first that wins is
    /// stored), 1 to 3.
    #[arg(long, default_value_t = 2)]
    finalists: usize,
    /// Idle GPU time before each burst of the confirmation, ms (bench's --gap-ms; the
    /// published tables are timed with 200).
    #[arg(long, default_value_t = 200.0, allow_negative_numbers = true)]
    confirm_gap_ms: f64,
    /// Rounds of the confirmation (odd; each times the baseline and the candidate once, in
    /// alternating order). The default separates a 2 % difference at the median round-to-round
    /// spread measured on the H200 (0.9–1.3 %, `--noise`); the longest problems' spread (up to
    /// 2.8 %) needs 13 (docs/DESIGN.md, "Design rationale").
    #[arg(long, default_value_t = 3)]
    confirm_rounds: usize,
    /// Re-run the confirmation for every entry of this database that the selection's calls
    /// use, and report each entry's ratio (heuristic time / entry's time); nothing is tuned.
    /// An entry loses where its median ratio is below 1 on any problem that uses it; the exit
    /// status is 1 while a loser remains in the file.
    #[arg(long, value_name = "DB")]
    verify: Option<String>,
    /// With --verify: remove the entries that lose from the database file.
    #[arg(long)]
    prune: bool,
    /// Measure the confirmation's noise: the baseline against itself (two engines, same
    /// plan) for every problem of the selection, with the spread of a round's ratio and the
    /// rounds a 2 % bar needs; nothing is tuned or stored.
    #[arg(long, conflicts_with = "verify")]
    noise: bool,
    /// Tune dense GEMMs planned for this many SMs (`GpuOptions::sm_count_target`): the entries
    /// serve only calls made under the same target, as the burn adapter's device-ordered GEMMs
    /// are (the GPU's SM count less its SM reserve, e.g. 131 on a 132-SM H200); the
    /// confirmation's two engines run under it too. Default: all SMs.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    sm_count_target: Option<u32>,
}

/// The selection: every problem, in order (dense jobs over the suite, FP8 recipes over it,
/// the convolutions, then the attention rows), and the convolution settings.
pub(crate) struct Plan {
    pub items: Vec<Item>,
    pub conv: ConvSettings,
}

impl Plan {
    fn parse(args: &Args) -> anyhow::Result<Plan> {
        let shapes = args.shared.shapes()?;
        // the ops are checked first, once, whatever --dtypes holds
        let ops = parse_ops(&args.ops, false)?;
        let attn_names = crate::bench::attn::parse_shapes(&args.shared.attn_shapes)?;
        let Dtypes { dense, scalings } = args.shared.dtypes()?;
        let mut items = Vec::new();
        for (d, prec) in &dense {
            for op in ops.gemm.iter().filter(|op| op_applies(op, d)) {
                items.extend(shapes.iter().map(|&shape| Item::Gemm {
                    op: op.clone(),
                    dtype: d.clone(),
                    precision: *prec,
                    shape,
                }));
            }
        }
        for sc in &scalings {
            items.extend(shapes.iter().map(|&shape| Item::Fp8 { scaling: sc.clone(), shape }));
        }
        if !ops.conv.is_empty() && dense.is_empty() {
            bail!(
                "--ops names convolutions but --dtypes names none of f32, tf32, f16, bf16 (fp8_e4m3 has no convolutions)"
            );
        }
        if !ops.attn.is_empty() && !dense.iter().any(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
            bail!("--ops names attention but --dtypes names neither f16 nor bf16 (attention's input types)");
        }
        let conv = args.shared.conv()?;
        if !ops.conv.is_empty() {
            items.extend(conv::items(&ops.conv, &dense, &conv)?);
        }
        if !ops.attn.is_empty() {
            items.extend(attn::items(&ops.attn, &dense, &attn_names)?);
        }
        if !ops.grouped.is_empty() && !dense.iter().any(|(_, p)| matches!(p.input(), DType::F16 | DType::BF16)) {
            bail!("--ops names grouped GEMMs but --dtypes names neither f16 nor bf16 (their input types)");
        }
        items.extend(grouped::items(&ops.grouped, &dense)?);
        if items.is_empty() {
            bail!("nothing to tune: --dtypes and --ops select no problem");
        }
        check_numbers(args)?;
        Ok(Plan { items, conv })
    }

    /// Whether any problem is a GEMM (dense or FP8): those need cuBLASLt.
    fn has_gemms(&self) -> bool {
        self.items.iter().any(|i| matches!(i, Item::Gemm { .. } | Item::Fp8 { .. }))
    }
}

/// The numeric flags, checked before the GPU is opened.
fn check_numbers(args: &Args) -> anyhow::Result<()> {
    if args.candidates == 0 || args.candidates > 32 {
        bail!("--candidates {} is not between 1 and 32", args.candidates);
    }
    if args.reps == 0 {
        bail!("--reps 0: at least one timed sample per candidate");
    }
    if args.prune && args.verify.is_none() {
        bail!("--prune needs --verify DB (it removes the entries that lose there)");
    }
    if let Some(path) = &args.verify {
        if !std::path::Path::new(path).is_file() {
            bail!("--verify {path:?}: no such file");
        }
        crate::db::check_readable("--verify", path)?;
    }
    if !(1..=3).contains(&args.finalists) {
        bail!("--finalists {} is not between 1 and 3", args.finalists);
    }
    if args.confirm_rounds.is_multiple_of(2) || args.confirm_rounds > 99 {
        bail!("--confirm-rounds {} must be odd, 1 to 99 (the median of the rounds decides)", args.confirm_rounds);
    }
    crate::timing::check_ms("--confirm-gap-ms", args.confirm_gap_ms)?;
    Ok(())
}

/// A dense dtype's name and precision, as `--dtypes` lists them.
pub(crate) type Dense = (String, Precision);

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::Args,
    }

    /// The error `tune ARGS` stops at before any GPU is opened.
    fn refused(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(std::iter::once("tune").chain(args.iter().copied())).expect("parses");
        super::Plan::parse(&cli.args).err().expect("refused").to_string()
    }

    #[test]
    fn bad_settings_are_refused_before_the_gpu_with_their_values() {
        assert!(refused(&["--db", "t.json", "--confirm-rounds", "4"]).contains("--confirm-rounds 4 must be odd"));
        assert!(refused(&["--db", "t.json", "--finalists", "4"]).contains("--finalists 4"));
        assert!(refused(&["--db", "t.json", "--candidates", "33"]).contains("--candidates 33"));
        assert!(refused(&["--db", "t.json", "--confirm-gap-ms", "-1"]).contains("--confirm-gap-ms -1"));
        assert!(refused(&["--db", "t.json", "--prune"]).contains("--prune needs --verify"));
        assert!(refused(&["--verify", "/no/such/file.json"]).contains("no such file"));
        let e = refused(&["--db", "t.json", "--ops", "attn_fwd", "--dtypes", "f32,tf32"]);
        assert!(e.contains("neither f16 nor bf16"), "{e}");
        let e = refused(&["--db", "t.json", "--ops", "attn_fwd", "--attn-shapes", "h7"]);
        assert!(e.contains("unknown shape \"h7\""), "{e}");
        let cli = Cli::try_parse_from(["tune", "--verify", "a.json", "--db", "b.json"]);
        assert!(cli.is_err(), "--verify and --db are two modes");
    }
}
