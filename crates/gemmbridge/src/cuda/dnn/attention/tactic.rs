//! Attention plans in the tactic database ([`crate::tactics`], kind "attention"): a plan key's
//! stable text and a measured search's choice as a [`Tactic`]. A stored plan is rebuilt from
//! its engine and knobs without a search (`plan.rs`, `Choose::Tuned`).

use super::{AttnKey, AttnOp, AttnPlan};
use crate::attention::AttnMask;
use crate::fp8::Fp8Format;
use crate::tactics::{Choice, Tactic};

/// The database key of a plan key: `attention`, the direction (`fwd`, `fwd_stats`, `bwd`,
/// `fp8_fwd`, `fp8_fwd_stats`, `fp8_bwd_e4m3`, `fp8_bwd_e5m2`, `paged_decode`), the sizes
/// (`b hq hkv sq skv d`), the dtype, the mask (`none`, `causal`, `causal_bottom_right`),
/// `var_len` or `fixed`, the scale (the f32 as `{:?}` writes it: the shortest decimal that reads
/// back as the same f32), the strides of q, k, v and o (batch, head, row, in elements), the
/// buffers' byte alignment class (`al16` … `al1`), and for a paged decode the containers' pages
/// and page size (`pages4096 page_size16`; `skv` is the table's capacity, bucketed by the
/// caller: [`crate::paged::bucket_width`]). Nothing else is bucketed: a tactic serves exactly
/// that problem.
pub(crate) fn key_text(k: &AttnKey) -> String {
    let dir = match k.op {
        AttnOp::Forward { stats: false } => "fwd",
        AttnOp::Forward { stats: true } => "fwd_stats",
        AttnOp::Backward => "bwd",
        AttnOp::ForwardFp8 { stats: false } => "fp8_fwd",
        AttnOp::ForwardFp8 { stats: true } => "fp8_fwd_stats",
        AttnOp::BackwardFp8 { grad: Fp8Format::E4M3 } => "fp8_bwd_e4m3",
        AttnOp::BackwardFp8 { grad: Fp8Format::E5M2 } => "fp8_bwd_e5m2",
        AttnOp::PagedDecode(_) => "paged_decode",
    };
    let paged = match k.op {
        AttnOp::PagedDecode(s) => format!(" pages{} page_size{}", s.pages, s.page_size),
        _ => String::new(),
    };
    let mask = match k.mask {
        AttnMask::None => "none",
        AttnMask::Causal => "causal",
        AttnMask::CausalBottomRight => "causal_bottom_right",
    };
    let [b, hq, hkv, sq, skv, d] = k.sizes;
    let lens = if k.var_len { "var_len" } else { "fixed" };
    let strides: Vec<String> = ["q", "k", "v", "o"]
        .iter()
        .zip(k.layouts)
        .map(|(name, l)| format!("{name}{},{},{}", l.batch, l.head, l.seq))
        .collect();
    format!(
        "attention {dir} b{b} hq{hq} hkv{hkv} sq{sq} skv{skv} d{d} {} {mask} {lens} scale{:?} {} al{}{paged}",
        k.dtype,
        f32::from_bits(k.scale),
        strides.join(" "),
        k.align
    )
}

/// The tactic of a plan a measured search chose (`None` for the heuristic's plan or one from
/// the database), tuned with cuDNN `version`.
pub(super) fn export(plan: &AttnPlan, version: usize) -> Option<Tactic> {
    let (c, m) = (plan.config.clone()?, plan.measured?);
    let choice = Choice::CudnnEngine { engine: c.engine, knobs: c.knobs, workspace: plan.extra.total, unfused: false };
    Some(Tactic::cudnn_attention(choice, version, m.heuristic_ms, m.tuned_ms))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::attention::Attention;
    use crate::cuda::dnn::attention::PagedShape;
    use crate::dtype::DType;

    #[test]
    fn key_text_is_the_documented_format() {
        let p = Attention::new(4, (32, 8), (4096, 4096), 128, DType::BF16).with_mask(AttnMask::Causal);
        assert_eq!(
            key_text(&AttnKey::new(&p, AttnOp::Forward { stats: true }, 16)),
            "attention fwd_stats b4 hq32 hkv8 sq4096 skv4096 d128 bf16 causal fixed scale0.088388346 \
             q16777216,128,4096 k4194304,128,1024 v4194304,128,1024 o16777216,128,4096 al16"
        );
    }

    #[test]
    fn every_part_of_the_plan_key_changes_the_text() {
        let p = Attention::new(2, (8, 2), (129, 7), 64, DType::F16);
        let mut keys = vec![AttnKey::new(&p, AttnOp::Backward, 16), AttnKey::new(&p, AttnOp::Backward, 8)];
        for op in [
            AttnOp::Forward { stats: false },
            AttnOp::Forward { stats: true },
            AttnOp::ForwardFp8 { stats: false },
            AttnOp::ForwardFp8 { stats: true },
            AttnOp::PagedDecode(PagedShape { pages: 10, page_size: 16 }),
            AttnOp::PagedDecode(PagedShape { pages: 11, page_size: 16 }),
            AttnOp::PagedDecode(PagedShape { pages: 10, page_size: 32 }),
        ] {
            keys.push(AttnKey::new(&p, op, 16));
        }
        for q in [
            Attention::new(3, (8, 2), (129, 7), 64, DType::F16),
            Attention::new(2, (8, 8), (129, 7), 64, DType::F16),
            Attention::new(2, (16, 2), (129, 7), 64, DType::F16),
            Attention::new(2, (8, 2), (128, 7), 64, DType::F16),
            Attention::new(2, (8, 2), (129, 8), 64, DType::F16),
            Attention::new(2, (8, 2), (129, 7), 128, DType::F16),
            Attention::new(2, (8, 2), (129, 7), 64, DType::BF16),
            p.with_mask(AttnMask::Causal),
            p.with_mask(AttnMask::CausalBottomRight),
            p.with_var_len(true),
            p.with_scale(0.5),
            p.bhsd(),
        ] {
            keys.push(AttnKey::new(&q, AttnOp::Backward, 16));
        }
        let texts: HashSet<String> = keys.iter().map(key_text).collect();
        assert_eq!(texts.len(), keys.len(), "two plan keys share a text");
        assert!(texts.iter().all(|t| t.starts_with("attention ") && !t.contains("  ")));
    }
}
