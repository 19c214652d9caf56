//! The soak's fixed problem set: shapes from 1×1×1 to 4096³ (batched, padded leading
//! dimensions, transposed operands, m not a multiple of 8, odd K and N large enough to run on
//! aligned copies) in every precision, plain, and a smaller set of shapes with each read-only
//! fused epilogue.

use gemmbridge::epilogue::{AuxUse, VectorUse};
use gemmbridge::{Epilogue, GemmProblem, MatrixLayout, Op, Operand, Precision};

/// A shape: `op(A)[m,k]·op(B)[k,n]`, stored row-major with `ld = cols + pad`, in a strided
/// batch of `batch`.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub op_a: Op,
    pub op_b: Op,
    /// Extra elements per row of stored A, B and C.
    pub pad: [usize; 3],
    pub batch: usize,
}

const fn shape(m: usize, n: usize, k: usize, op_a: Op, op_b: Op) -> Shape {
    Shape { m, n, k, op_a, op_b, pad: [0; 3], batch: 1 }
}

const fn padded(s: Shape, pad: [usize; 3]) -> Shape {
    Shape { pad, ..s }
}

const fn batched(s: Shape, batch: usize) -> Shape {
    Shape { batch, ..s }
}

use Op::{N, T};

/// Shapes run without an epilogue, in every precision (matmul is N·N, linear N·T).
pub const PLAIN: [Shape; 16] = [
    shape(1, 1, 1, N, N),
    shape(7, 13, 5, N, N),
    shape(64, 64, 64, N, N),
    shape(100, 37, 129, N, T),
    shape(128, 4096, 4096, N, T),
    shape(256, 512, 1024, N, N),
    shape(1000, 1000, 1000, N, N),
    shape(2048, 3, 1024, N, T),
    shape(4096, 4096, 4096, N, N),
    batched(shape(64, 96, 80, N, N), 8),
    batched(padded(shape(33, 72, 17, N, T), [3, 5, 1]), 4),
    padded(shape(33, 72, 17, T, N), [5, 3, 1]),
    padded(shape(96, 80, 64, T, T), [8, 8, 8]),
    padded(shape(129, 257, 65, N, N), [1, 2, 3]),
    // odd K and N above the padding thresholds (f16/bf16 from 2^29, tf32 from 2^31
    // multiply-adds): these run on aligned copies from the stream-ordered pool
    shape(2048, 2047, 2047, N, N),
    shape(1536, 1029, 2047, N, T),
];

/// Shapes run with each epilogue of [`epilogues`], in every precision (leading dimensions
/// padded by multiples of 8 only).
pub const FUSED: [Shape; 6] = [
    shape(64, 128, 256, N, T),
    shape(33, 72, 17, N, T),
    batched(shape(40, 48, 32, N, T), 3),
    padded(shape(128, 64, 96, T, N), [8, 8, 8]),
    // odd N and K, f16/bf16 on aligned copies (N extended with the bias; aux epilogues direct)
    shape(1024, 1023, 1031, N, T),
    shape(256, 1024, 512, N, T),
];

/// The epilogues the soak runs: every one that reads at most a bias and writes at most aux
/// (all but none, the bias gradients and DGelu).
pub fn epilogues() -> impl Iterator<Item = Epilogue> {
    use gemmbridge::epilogue::{AuxUse, VectorUse};
    Epilogue::ALL
        .into_iter()
        .filter(|e| *e != Epilogue::None && e.vector() != VectorUse::WritesGrad && e.aux() != AuxUse::Reads)
}

/// One problem of the set.
#[derive(Clone, Debug)]
pub struct Case {
    /// Short name for messages, e.g. `linear 33x72x17 batch 3 bf16:f32 gelu_aux`.
    pub label: String,
    pub problem: GemmProblem,
}

impl Case {
    /// Elements of A, B, C, the bias and aux buffers (0 where unused).
    pub fn elems(&self) -> [usize; 5] {
        let p = &self.problem;
        let req = |l: MatrixLayout| l.required_elems(p.batch()).unwrap_or(0);
        let bias = if p.epilogue().vector() == VectorUse::ReadsBias { p.vector_len() } else { 0 };
        let aux = if p.epilogue().aux() == AuxUse::Writes { req(p.aux()) } else { 0 };
        [req(p.a().layout), req(p.b().layout), req(p.c()), bias, aux]
    }

    /// Bytes of device memory the case's buffers take.
    pub fn bytes(&self) -> usize {
        let [a, b, c, bias, aux] = self.elems();
        let prec = self.problem.precision();
        (a + b) * prec.input().size_bytes() + (c + bias + aux) * prec.output().size_bytes()
    }
}

impl Shape {
    /// The problem in `precision` with `epilogue`.
    pub fn problem(&self, precision: Precision, epilogue: Epilogue) -> gemmbridge::Result<GemmProblem> {
        let Shape { m, n, k, op_a, op_b, pad, batch } = *self;
        let stored = |op: Op, rows: usize, cols: usize, pad: usize| {
            let (r, c) = if op == Op::N { (rows, cols) } else { (cols, rows) };
            Operand { layout: MatrixLayout::row_major(r, c).with_ld(c + pad), op }
        };
        GemmProblem::new(
            stored(op_a, m, k, pad[0]),
            stored(op_b, k, n, pad[1]),
            MatrixLayout::row_major(m, n).with_ld(n + pad[2]),
            batch,
            precision,
        )?
        .with_epilogue(epilogue)
    }

    fn label(&self, precision: Precision, epilogue: Epilogue) -> String {
        let kind = match (self.op_a, self.op_b) {
            (N, N) => "matmul".to_string(),
            (N, T) => "linear".to_string(),
            (a, b) => format!("{a}·{b}"),
        };
        let mut s = format!("{kind} {}x{}x{}", self.m, self.n, self.k);
        if self.batch > 1 {
            s += &format!(" batch {}", self.batch);
        }
        if self.pad != [0; 3] {
            s += &format!(" pad {:?}", self.pad);
        }
        s += &format!(" {precision}");
        if epilogue != Epilogue::None {
            s += &format!(" {epilogue}");
        }
        s
    }
}

/// Whether the soak runs `shape` in `precision`: everything except tf32 with k < 16, where a
/// row's error is one or a few products of tf32-rounded inputs (up to 2·2⁻¹⁰ off if the
/// tensor cores truncate) and the 1e-3 band, an average over many products, does not apply.
fn runs(shape: &Shape, precision: Precision) -> bool {
    !(precision == Precision::TF32 && shape.k < 16)
}

/// Every case: each plain shape in each precision, then each fused shape with each epilogue
/// in each precision.
///
/// # Errors
/// A shape the library refuses (a bug in the tables above), named.
pub fn all() -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    let jobs =
        PLAIN.iter().map(|s| (s, Epilogue::None)).chain(FUSED.iter().flat_map(|s| epilogues().map(move |e| (s, e))));
    for (shape, epilogue) in jobs {
        for precision in Precision::ALL {
            if !runs(shape, precision) {
                continue;
            }
            let problem = shape
                .problem(precision, epilogue)
                .map_err(|e| anyhow::anyhow!("soak shape {shape:?} {precision} {epilogue}: {e}"))?;
            out.push(Case { label: shape.label(precision, epilogue), problem });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_builds_and_covers_the_brief() {
        let cases = all().unwrap();
        assert_eq!(epilogues().count(), 7, "Bias, Relu, ReluBias, Gelu, GeluBias, GeluAux, GeluAuxBias");
        assert_eq!(cases.len(), (PLAIN.len() + FUSED.len() * epilogues().count()) * Precision::ALL.len() - 2);
        let has = |f: &dyn Fn(&GemmProblem) -> bool| cases.iter().any(|c| f(&c.problem));
        assert!(has(&|p| p.m() == 1 && p.n() == 1 && p.k() == 1));
        assert!(has(&|p| p.m() == 4096 && p.n() == 4096 && p.k() == 4096));
        assert!(has(&|p| p.batch() > 1 && p.epilogue() == Epilogue::GeluAuxBias));
        assert!(has(&|p| p.a().op == Op::T && p.b().op == Op::T));
        assert!(has(&|p| p.c().ld > p.n()));
        assert!(has(&|p| p.m() % 8 != 0 && p.epilogue() != Epilogue::None));
        for e in epilogues() {
            for prec in Precision::ALL {
                assert!(has(&|p| p.epilogue() == e && p.precision() == prec), "{e} {prec}");
            }
        }
        let mut labels: Vec<&str> = cases.iter().map(|c| c.label.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), cases.len(), "labels are unique");
        for c in &cases {
            let [a, b, cc, bias, aux] = c.elems();
            assert!(a > 0 && b > 0 && cc > 0, "{}", c.label);
            assert_eq!(bias > 0, c.problem.epilogue().vector() == VectorUse::ReadsBias, "{}", c.label);
            assert_eq!(aux > 0, c.problem.epilogue().aux() == AuxUse::Writes, "{}", c.label);
        }
        // per thread, all buffers: about 2.0 GiB (eight threads: about 16 GiB of the H200's 141)
        let total: usize = cases.iter().map(Case::bytes).sum();
        assert!(total < 5 << 29, "{total} bytes per thread");
        // the padded path is in the set: odd K or N above the f16/bf16 and tf32 thresholds
        assert!(has(&|p| p.macs() >= 1 << 31 && p.k() % 8 != 0 && p.n() % 8 != 0));
        assert!(has(&|p| p.macs() >= 1 << 29 && p.n() % 8 != 0 && p.epilogue() == Epilogue::Bias));
    }
}
