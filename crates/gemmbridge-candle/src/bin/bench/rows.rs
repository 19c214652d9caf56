//! The rows and how one is measured: [`Bench::row`] times one side of a [`Case`] and writes
//! its row in `gemmbridge bench`'s fields. The families of rows that `--ops` picks from call it
//! ([`crate::FAMILIES`] lists them).
//!
//! A new family is a function `fn(&mut Bench, &BenchArgs) -> Result<()>` that makes its inputs
//! and calls [`Bench::row`] once per shape with the adapter's call and candle's, plus one entry
//! in [`crate::FAMILIES`].

use std::io::Write;
use std::sync::Arc;

use candle_core::cuda::cudarc::driver::CudaStream;
use candle_core::{DType, Device, Result, Tensor};
use gemmbridge_candle::Served;
use serde::Serialize;

use crate::timing::{time_gpu, Sampling, Timing};

/// Which side this process times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// the adapter's operations (`gemmbridge_candle::*`)
    Ours,
    /// candle's own operations (the peer)
    Candle,
}

/// What a row's rate counts.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    /// Floating-point operations of one call (the row's `tflops`).
    Flops(f64),
    /// Bytes one call must move (the row's `tbps`; its `tflops` is 0).
    Bytes(f64),
}

/// One row's problem: `op`, `dtype`, `[m, n, k, batch]` and the `layout` label, as `gemmbridge
/// compare` pairs rows (op/layout, dtype, m, n, k, batch).
pub struct Case {
    pub op: &'static str,
    /// The inputs' dtype name as `gemmbridge bench` writes it (bf16, f16, fp8_e4m3, …).
    pub dtype: &'static str,
    pub dims: [usize; 4],
    pub layout: String,
    pub work: Work,
}

/// One output of a call: the tensors compared for `rel_diff` (the output, and for a backward
/// row the gradients).
pub type Outputs = Vec<Tensor>;

/// One of candle's ways of running a case: the label suffix of its row (`""`: the case's own
/// label; `"bf16_scores"`: `layout+bf16_scores`, which `gemmbridge compare` pairs with our
/// plain row, as it does every suffix in its list of peer variants, where a new one goes),
/// and the call.
pub type Variant<'a> = (&'static str, &'a mut dyn FnMut() -> Result<Outputs>);

/// One row in `gemmbridge bench`'s fields (those of `gemmbridge-cli`'s `Row`, which
/// `gemmbridge compare` reads; it ignores the fields after `tbps`).
#[derive(Serialize)]
struct Row<'a> {
    op: &'a str,
    dtype: &'a str,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    median_ms: f64,
    min_ms: f64,
    tflops: f64,
    layout: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tbps: Option<f64>,
    /// The side timed: "ours" or "candle".
    #[serde(rename = "impl")]
    side: &'a str,
    /// Our rows: ‖ours − candle's‖/‖candle's‖ in f32 (the largest over the outputs compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    rel_diff: Option<f64>,
    /// Our rows: which path ran the adapter's call.
    #[serde(skip_serializing_if = "Option::is_none")]
    served: Option<String>,
}

/// The device, the side, the sampling and where rows go.
pub struct Bench {
    pub dev: Device,
    pub side: Side,
    pub sampling: Sampling,
    /// Whether our rows get `rel_diff` (one call of candle's reference way beside ours).
    pub check: bool,
    stream: Arc<CudaStream>,
    out: Option<std::fs::File>,
}

impl Bench {
    /// On CUDA device `ordinal`, writing to stdout and to `out` where given.
    pub fn new(
        ordinal: usize,
        side: Side,
        sampling: Sampling,
        check: bool,
        out: Option<std::fs::File>,
    ) -> Result<Self> {
        let dev = Device::new_cuda(ordinal)?;
        let stream = dev.as_cuda_device()?.cuda_stream();
        Ok(Bench { dev, side, sampling, check, stream, out })
    }

    /// The run's first line (`"op": "env"`): the device, the side and the sampling, as
    /// `gemmbridge compare` reads them (it refuses runs of other devices or other gaps).
    pub fn env(&mut self) -> Result<()> {
        let device = self.stream.context().name().map_err(candle_core::Error::wrap)?;
        let backend = match self.side {
            Side::Ours => "gemmbridge-candle",
            Side::Candle => "candle",
        };
        let line = serde_json::json!({"op": "env", "backend": backend, "device": device,
            "candle": "0.11", "cudnn": gemmbridge::cuda::cudnn_version(), "reps": self.sampling.reps,
            "warmup": self.sampling.warmup, "heat_ms": 0.0, "gap_ms": self.sampling.gap_ms});
        self.emit(&line.to_string())
    }

    /// Measures one row of `case` on this process's side: ours (with `rel_diff` against the
    /// first of `candle`'s ways unless `--no-check`), or each of `candle`'s ways under its own
    /// label. A row that fails (candle's scores not fitting in memory, say) is written as a
    /// row with an `error` field, which `gemmbridge compare` skips, and the run goes on.
    pub fn row(
        &mut self,
        case: &Case,
        ours: &mut dyn FnMut() -> Result<(Outputs, Served)>,
        candle: &mut [Variant],
    ) -> Result<()> {
        match self.side {
            Side::Ours => {
                let measured = self.measure_ours(ours, candle.first_mut());
                self.write(case, "", measured)
            }
            Side::Candle => {
                for (suffix, f) in candle.iter_mut() {
                    let t = time_gpu(&self.stream, self.sampling, &mut || f().map(drop));
                    self.write(case, suffix, t.map(|t| (t, None, None)))?;
                }
                Ok(())
            }
        }
    }

    /// Our call's timing, `rel_diff` against candle's `reference` way (where checked) and its
    /// path.
    fn measure_ours(
        &mut self,
        ours: &mut dyn FnMut() -> Result<(Outputs, Served)>,
        reference: Option<&mut Variant>,
    ) -> Result<(Timing, Option<f64>, Option<Served>)> {
        let (first, served) = ours()?;
        // a reference that fails (candle's f32 scores not fitting in memory) only loses the check
        let rel_diff = match reference.filter(|_| self.check).map(|(_, r)| worst_diff(&first, &r()?)) {
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => {
                eprintln!("no rel_diff: candle's reference failed: {e}");
                None
            }
            None => None,
        };
        drop(first);
        let t = time_gpu(&self.stream, self.sampling, &mut || ours().map(drop))?;
        Ok((t, rel_diff, Some(served)))
    }

    /// Writes `case`'s row under its layout followed by `+suffix` (where not empty).
    fn write(
        &mut self,
        case: &Case,
        suffix: &str,
        measured: Result<(Timing, Option<f64>, Option<Served>)>,
    ) -> Result<()> {
        let layout = if suffix.is_empty() { case.layout.clone() } else { format!("{}+{suffix}", case.layout) };
        let [m, n, k, batch] = case.dims;
        let side = if self.side == Side::Ours { "ours" } else { "candle" };
        let (t, rel_diff, served) = match measured {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{}/{layout} {m}×{n}×{k} (batch {batch}): {e}", case.op);
                // the message without a backtrace (RUST_BACKTRACE) after it
                let error = e.to_string().lines().next().unwrap_or_default().to_string();
                let line = serde_json::json!({"op": case.op, "dtype": case.dtype, "m": m, "n": n, "k": k,
                    "batch": batch, "layout": layout, "impl": side, "error": error});
                return self.emit(&line.to_string());
            }
        };
        let per_s = |work: f64| work / (t.median_ms * 1e-3) / 1e12;
        let (tflops, tbps) = match case.work {
            Work::Flops(f) => (per_s(f), None),
            Work::Bytes(b) => (0.0, Some(per_s(b))),
        };
        let row = Row {
            op: case.op,
            dtype: case.dtype,
            m,
            n,
            k,
            batch,
            median_ms: t.median_ms,
            min_ms: t.min_ms,
            tflops,
            layout: &layout,
            tbps,
            side,
            rel_diff,
            served: served.map(|s| format!("{s:?}")),
        };
        let line = serde_json::to_string(&row).map_err(candle_core::Error::wrap)?;
        self.emit(&line)
    }

    fn emit(&mut self, line: &str) -> Result<()> {
        println!("{line}");
        if let Some(f) = &mut self.out {
            writeln!(f, "{line}").map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    }
}

/// ‖ours − theirs‖ / ‖theirs‖, in f32 on the device: the largest over the outputs.
fn worst_diff(ours: &[Tensor], theirs: &[Tensor]) -> Result<f64> {
    if ours.len() != theirs.len() {
        candle_core::bail!("{} outputs of ours against {} of candle's", ours.len(), theirs.len());
    }
    let mut worst = 0.0f64;
    for (o, t) in ours.iter().zip(theirs) {
        let (o, t) = (o.to_dtype(DType::F32)?, t.to_dtype(DType::F32)?);
        let num = (o - &t)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
        let den = t.sqr()?.sum_all()?.to_scalar::<f32>()?;
        worst = worst.max((f64::from(num) / f64::from(den).max(f64::MIN_POSITIVE)).sqrt());
    }
    Ok(worst)
}

/// A bf16 tensor of normal values with standard deviation `std`.
pub fn randn(dims: &[usize], std: f64, dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, std as f32, dims, dev)?.to_dtype(DType::BF16)
}

/// Input sets to rotate through, as bench/peer.py's `rotation_count`: as many sets of `bytes`
/// as fit 512 MiB, 1 to 8, so that back-to-back calls do not all read one set from L2.
pub fn rotation_count(bytes: usize) -> usize {
    ((512usize << 20) / bytes.max(1)).clamp(1, 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_carry_the_fields_of_gemmbridge_rows() {
        let row = Row {
            op: "sdpa",
            dtype: "bf16",
            m: 4096,
            n: 4096,
            k: 128,
            batch: 1,
            median_ms: 0.5,
            min_ms: 0.45,
            tflops: 275.0,
            layout: "h32:8-causal+bf16_scores",
            tbps: None,
            side: "candle",
            rel_diff: None,
            served: None,
        };
        let v: serde_json::Value = serde_json::to_value(&row).unwrap();
        for f in ["op", "dtype", "m", "n", "k", "batch", "median_ms", "min_ms", "tflops", "layout", "impl"] {
            assert!(v.get(f).is_some(), "{f} missing from {v}");
        }
        assert!(v.get("tbps").is_none() && v.get("rel_diff").is_none());
    }

    #[test]
    fn rotation_fits_512_mib_in_one_to_eight_sets() {
        assert_eq!(rotation_count(1 << 20), 8);
        assert_eq!(rotation_count(200 << 20), 2);
        assert_eq!(rotation_count(1 << 30), 1);
    }
}
