//! RMSNorm on cuDNN's norm graph (`CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR` and
//! `…_BACKWARD_DESCRIPTOR` in `CUDNN_RMS_NORM` mode, cuDNN 8.9.6 and later on Ampere and later):
//! the call ([`NormOp`], [`NormBuffers`], [`NormCall`]), the plan kept per problem (rows,
//! features, types, leading dimensions), direction and buffer alignment ([`NormKey`]), and its
//! launch. The graphs are built in `graphs.rs` with the room's graph builder (`builder.rs`), the
//! plan is cuDNN's best-ranked engine configuration that finalizes and fits the workspace limit
//! (`plan.rs`), the call's way through the room is `run.rs`.
//!
//! What the graphs are, as cudnn-frontend's RMSNorm node lowers them (its
//! `samples/cpp/norm/rmsnorm.cpp`; the FP8 output as Transformer Engine's cuDNN normalization
//! builds it): x `[N, C, 1, 1]` with strides `{ld, 1, ld, ld}` (`ld = C` for contiguous rows),
//! the scale `[1, C, 1, 1]`, ε a by-value f32, y as x; in the training phase the inverse RMS
//! f32 `[N, 1, 1, 1]`. The backward reads x, dy, the scale and the inverse RMS and writes dx
//! and the scale's gradient `[1, C, 1, 1]`. Options of the forward, each served where the loaded
//! cuDNN has an engine for the graph (else [`crate::error::Error::Unsupported`] naming it): a
//! pointwise ADD of a residual before the norm, its sum written; y in FP8 E4M3 — the norm's
//! output kept virtual in f32, multiplied by a device scale into E4M3, and its absolute maximum
//! reduced (AMAX) into a device f32.
//!
//! cuDNN's release notes (9.9.0 to 9.18.1, "Known Issues") say that compute-sanitizer's
//! synccheck may report barrier errors in the Layer and RMS norm forward (training and
//! inference), and that the runtime compilation of their execution plans may be protracted on
//! compute capability 12.0: both inside cuDNN, the second paid once per plan (the first call).

mod graphs;
mod plan;
mod run;

use cudarc::driver::sys::CUstream;

use crate::dtype::DType;
use crate::norm::{GradType, NormTensor, RmsNorm};

pub(crate) use run::Planned;

/// The first cuDNN with the RMS norm mode (8.9.6: cudnn-frontend's samples skip before it).
pub(crate) const RMS_NORM_VERSION: usize = 8906;

/// One RMSNorm direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NormOp {
    /// The forward; `training`: the inverse RMS is written; `residual`: `x + residual` is
    /// written to `sum` and normalised; `fp8`: y in E4M3 with its scale and amax.
    Forward { training: bool, residual: bool, fp8: bool },
    /// The backward: dx and dw.
    Backward,
}

impl NormOp {
    /// The tensors whose leading dimensions the direction's graph uses.
    fn tensors(self) -> &'static [NormTensor] {
        use NormTensor::*;
        match self {
            NormOp::Forward { residual: true, .. } => &[X, Y, Residual, Sum],
            NormOp::Forward { .. } => &[X, Y],
            NormOp::Backward => &[X, Dy, Dx],
        }
    }
}

/// Device addresses of one call (0 where the direction has no such tensor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NormBuffers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub inv_rms: u64,
    pub residual: u64,
    pub sum: u64,
    /// FP8 output: y's scale (one f32, read) and amax (one f32, written).
    pub scale: u64,
    pub amax: u64,
    pub dy: u64,
    pub dx: u64,
    pub dw: u64,
}

impl NormBuffers {
    /// Every address, in a fixed order.
    fn all(&self) -> [u64; 11] {
        [
            self.x,
            self.w,
            self.y,
            self.inv_rms,
            self.residual,
            self.sum,
            self.scale,
            self.amax,
            self.dy,
            self.dx,
            self.dw,
        ]
    }

    /// The largest power of two ≤ 16 bytes dividing every address (cuDNN's BYTE_ALIGNMENT).
    pub fn alignment(&self) -> u8 {
        let all = self.all().iter().fold(0u64, |a, b| a | b);
        1u8 << all.trailing_zeros().min(4)
    }
}

/// One RMSNorm call, carried as one value from the entry point to its launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormCall<'a> {
    pub problem: &'a RmsNorm,
    pub op: NormOp,
    pub buffers: NormBuffers,
    /// The stream's workspace (address, bytes).
    pub workspace: (u64, usize),
    pub stream: CUstream,
}

/// A plan's key: what the direction's graph is made of — rows, features, the I/O type, the
/// weight gradient's type (backward), the leading dimensions of the tensors it uses (0 for the
/// others) — the direction and the buffers' common alignment. ε is not part of it: it is
/// passed by value at each launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NormKey {
    rows: usize,
    features: usize,
    dtype: DType,
    dw: GradType,
    lds: [usize; 6],
    op: NormOp,
    align: u8,
}

impl NormKey {
    pub fn new(p: &RmsNorm, op: NormOp, align: u8) -> NormKey {
        let mut lds = [0; 6];
        for &t in op.tensors() {
            lds[t as usize] = p.ld(t);
        }
        let dw = if op == NormOp::Backward { p.dw } else { GradType::Io };
        NormKey { rows: p.rows, features: p.features, dtype: p.dtype, dw, lds, op, align }
    }
}

/// What a direction's graph holds beyond the plain norm, for messages: `training`, `strided
/// rows`, `f32 dw`, `residual add`, `FP8 E4M3 output`.
pub(crate) fn features(p: &RmsNorm, op: NormOp) -> String {
    let mut f = Vec::new();
    match op {
        NormOp::Forward { training, residual, fp8 } => {
            f.push(if training { "training phase" } else { "inference phase" });
            if residual {
                f.push("pre-norm residual add");
            }
            if fp8 {
                f.push("FP8 E4M3 output with scale and amax");
            }
        }
        NormOp::Backward => {
            f.push("backward");
            if p.dw == GradType::F32 && p.dtype != DType::F32 {
                f.push("f32 dw");
            }
        }
    }
    if op.tensors().iter().any(|&t| p.strided(t)) {
        f.push("strided rows (a leading dimension above the features)");
    }
    f.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_holds_what_the_graph_is_made_of_and_nothing_else() {
        let p = RmsNorm::new(7, 64, 1e-5, DType::BF16);
        let fwd = NormOp::Forward { training: true, residual: false, fp8: false };
        let k = NormKey::new(&p, fwd, 16);
        // ε, the backward's leading dimensions and dw do not change a forward plan
        assert_eq!(k, NormKey::new(&RmsNorm { eps: 1e-3, ..p }, fwd, 16));
        assert_eq!(k, NormKey::new(&p.with_ld(NormTensor::Dx, 70).with_dw(GradType::F32), fwd, 16));
        // what they are made of does
        assert_ne!(k, NormKey::new(&p.with_ld(NormTensor::X, 70), fwd, 16));
        assert_ne!(k, NormKey::new(&p, fwd, 8));
        assert_ne!(k, NormKey::new(&RmsNorm { rows: 8, ..p }, fwd, 16));
        assert_ne!(k, NormKey::new(&p, NormOp::Forward { training: false, residual: false, fp8: false }, 16));
        let bwd = NormKey::new(&p, NormOp::Backward, 16);
        assert_ne!(bwd, NormKey::new(&p.with_dw(GradType::F32), NormOp::Backward, 16));
        assert_ne!(bwd, NormKey::new(&p.with_ld(NormTensor::Dy, 65), NormOp::Backward, 16));
        assert_eq!(bwd, NormKey::new(&p.with_ld(NormTensor::Y, 65), NormOp::Backward, 16));
    }

    #[test]
    fn the_alignment_is_the_common_one_and_features_name_the_options() {
        let b = NormBuffers { x: 0x1000, w: 0x2000, y: 0x3010, ..Default::default() };
        assert_eq!(b.alignment(), 16);
        assert_eq!(NormBuffers { dw: 0x4004, ..b }.alignment(), 4);
        let p = RmsNorm::new(7, 64, 1e-5, DType::BF16).with_ld(NormTensor::X, 96).with_dw(GradType::F32);
        let f = features(&p, NormOp::Forward { training: false, residual: true, fp8: true });
        assert_eq!(
            f,
            "inference phase, pre-norm residual add, FP8 E4M3 output with scale and amax, strided rows (a leading \
             dimension above the features)"
        );
        assert_eq!(
            features(&RmsNorm::new(7, 64, 1e-5, DType::BF16).with_dw(GradType::F32), NormOp::Backward),
            "backward, f32 dw"
        );
    }
}
