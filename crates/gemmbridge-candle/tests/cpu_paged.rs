//! [`gemmbridge_candle::PagedKvCache`] on the CPU (gemmbridge's CPU backend): the append bit
//! for bit, decode attention against float64, RoPE at the sequences' positions bit for bit
//! against `rope`, and bad calls named.

mod common;
#[path = "common/paged.rs"]
mod paged;

use candle_core::{DType, Device, Result};

#[test]
fn append_and_decode_attention_on_the_cpu() -> Result<()> {
    let mut rng = common::rng("append_and_decode_attention_on_the_cpu");
    for dtype in [DType::BF16, DType::F16] {
        paged::append_and_attend(&mut rng, &Device::Cpu, dtype, 1e-2)?;
    }
    Ok(())
}

#[test]
fn rope_at_the_sequences_positions_on_the_cpu() -> Result<()> {
    let mut rng = common::rng("rope_at_the_sequences_positions_on_the_cpu");
    for dtype in [DType::BF16, DType::F16] {
        paged::rope_at_positions(&mut rng, &Device::Cpu, dtype)?;
    }
    Ok(())
}

#[test]
fn bad_paged_calls_are_named_on_the_cpu() -> Result<()> {
    paged::bad_calls(&Device::Cpu)
}
