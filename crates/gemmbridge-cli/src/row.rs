//! One benchmark row in bench/peer.py's fields: written by `bench`, read back by its report
//! and by `compare`.

use serde::{Deserialize, Serialize};

/// One benchmark row, in bench/peer.py's fields.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// "matmul" (x[m,k]·w[k,n]), "linear" (x[m,k]·w[n,k]ᵀ), the fused linear ops, or
    /// "scaled_mm" (FP8, with [`Row::scaling`]).
    pub op: String,
    /// Input dtype name: f32, tf32, f16, bf16.
    pub dtype: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// Median device time per call, ms.
    pub median_ms: f64,
    /// Minimum device time per call, ms.
    pub min_ms: f64,
    /// 2·m·n·k·batch / median time, in TFLOP/s.
    pub tflops: f64,
    /// FP8 rows: the scaling recipe (tensorwise, rowwise, block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<String>,
    /// Convolution rows: the tensors' layout (nhwc, nchw). Their m is P·Q, n is K, k is
    /// C/groups·R·S and batch is N, so that 2·m·n·k·batch is the convolution's flop count.
    /// Attention and grouped-GEMM rows: the shape's name in their suite file. RMSNorm rows:
    /// `d` and the features (`d4096`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Bandwidth-bound rows (RMSNorm): the bytes a call must move / median time, in TB/s
    /// (their `tflops` is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbps: Option<f64>,
}

impl Row {
    /// A timed row of `op` in `dtype` with the label `layout`: `dims` are `[m, n, k, batch]`,
    /// `flops` the floating-point operations of one call (TFLOP/s from the median).
    pub fn timed(
        op: &str,
        dtype: &str,
        dims: [usize; 4],
        t: &crate::timing::Timing,
        flops: f64,
        layout: String,
    ) -> Row {
        let [m, n, k, batch] = dims;
        Row {
            op: op.to_string(),
            dtype: dtype.to_string(),
            m,
            n,
            k,
            batch,
            median_ms: t.median_ms,
            min_ms: t.min_ms,
            tflops: flops / (t.median_ms * 1e-3) / 1e12,
            scaling: None,
            layout: Some(layout),
            tbps: None,
        }
    }

    /// A timed bandwidth-bound row of `op` in `dtype` with the label `layout`: `dims` as for
    /// [`Row::timed`], `bytes` those one call must move (TB/s from the median; TFLOP/s 0).
    pub fn bandwidth(
        op: &str,
        dtype: &str,
        dims: [usize; 4],
        t: &crate::timing::Timing,
        bytes: f64,
        layout: String,
    ) -> Row {
        let tbps = bytes / (t.median_ms * 1e-3) / 1e12;
        Row { tflops: 0.0, tbps: Some(tbps), ..Row::timed(op, dtype, dims, t, 0.0, layout) }
    }

    /// The op as rows are told apart: `scaled_mm/rowwise` for FP8 rows, `conv_fwd/nhwc` for
    /// convolution rows, the op otherwise.
    pub fn label(&self) -> String {
        match (&self.scaling, &self.layout) {
            (Some(s), _) | (None, Some(s)) => format!("{}/{s}", self.op),
            (None, None) => self.op.clone(),
        }
    }
}

/// A row of an m³ problem (tests).
#[cfg(test)]
pub fn square_row(op: &str, dtype: &str, m: usize, median_ms: f64) -> Row {
    Row {
        op: op.into(),
        dtype: dtype.into(),
        m,
        n: m,
        k: m,
        batch: 1,
        median_ms,
        min_ms: median_ms,
        tflops: 1.0,
        scaling: None,
        layout: None,
        tbps: None,
    }
}
