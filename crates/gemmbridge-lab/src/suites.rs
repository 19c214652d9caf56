//! The benchmark suites: the same shapes as `bench/peer.py` (copied from its
//! SUITES), so every row can be set beside PyTorch's. Used by the `gemmbridge` and
//! `gemmbridge-burn` benchmark commands.

/// `(m, n, k)`, row-major: `out[m, n] = x[m, k]·w`.
pub type Shape = (usize, usize, usize);

/// Square GEMMs, 1024³ to 8192³.
pub const SQUARE: [Shape; 4] = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)];

/// Projection shapes of transformer training and serving.
pub const LLM: [Shape; 6] = [
    (5120, 2048, 768),   // a production shape (m=5120 k=768 n=2048)
    (5120, 8192, 2048),  // a production shape (m=5120 k=2048 n=8192)
    (3537, 12288, 2048), // odd-M projection shape (m not a multiple of 8)
    (4096, 6144, 4096),  // 8B-class attention QKV projection, 4096 tokens
    (4096, 28672, 4096), // 8B-class gate+up projection
    (4096, 4096, 14336), // 8B-class down projection
];

/// Small and weight-bound shapes (M ≤ 128, tiny GEMMs), where host cost matters.
pub const SMALL: [Shape; 5] = [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (64, 64, 64), (256, 256, 256)];

/// Shapes whose row-major leading dimensions are off 16 bytes (for 16-bit types: K or N not a
/// multiple of 8), largest first: the misaligned-operand path and the direct call beside it.
pub const MISALIGNED: [Shape; 9] = [
    (4096, 4096, 2047),
    (4096, 4096, 4095),
    (4096, 4095, 4096),
    (8192, 8192, 8191),
    (4095, 4096, 4096), // odd M alone: aligned (a control row)
    (2048, 2048, 2047),
    (1024, 1024, 1023),
    (512, 512, 511),
    (256, 256, 255),
];

/// DeepSeek-V3's block-scaled FP8 projection that DeepGEMM publishes a figure for.
pub const DEEPGEMM: [Shape; 1] = [(4096, 7168, 16384)];

/// For the CPU backend, where the GPU suites would take hours.
pub const CPU: [Shape; 4] = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512)];

/// The suite names `--suite` accepts.
pub const NAMES: [&str; 7] = ["default", "square", "llm", "small", "misaligned", "deepgemm", "cpu"];

/// Shapes of a suite; `default` is square + llm + small, as in bench/peer.py. `None` for a
/// name not in [`NAMES`].
pub fn shapes(name: &str) -> Option<Vec<Shape>> {
    Some(match name {
        "square" => SQUARE.to_vec(),
        "llm" => LLM.to_vec(),
        "small" => SMALL.to_vec(),
        "misaligned" => MISALIGNED.to_vec(),
        "deepgemm" => DEEPGEMM.to_vec(),
        "cpu" => CPU.to_vec(),
        "default" => [&SQUARE[..], &LLM[..], &SMALL[..]].concat(),
        _ => return None,
    })
}

/// Whether a shape belongs to the square or llm suites (the ones the acceptance ratio is
/// taken over).
pub fn is_square_or_llm(s: Shape) -> bool {
    SQUARE.contains(&s) || LLM.contains(&s)
}
