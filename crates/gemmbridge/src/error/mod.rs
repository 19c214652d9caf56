//! The library's one error type.
//!
//! Every variant carries the numbers that explain it (shapes, leading dimensions, lengths in
//! bytes or elements as named, addresses, dtypes, the status name and the operation), so that a
//! failure can be understood from its message alone. Validation errors are returned before
//! anything is launched and leave every buffer untouched.

mod names;

pub use names::{Fp8Rule, Which};

use crate::dtype::{Compute, DType};

/// Everything that can go wrong in gemmbridge.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The operands' shapes do not agree: `op(A)` must be `[m, k]`, `op(B)` `[k, n]`, `C` `[m, n]`.
    #[error(
        "shape mismatch: op(A) is [{a_rows}, {a_cols}], op(B) is [{b_rows}, {b_cols}], C is \
         [{c_rows}, {c_cols}]; GEMM needs op(A) [m, k], op(B) [k, n], C [m, n]"
    )]
    ShapeMismatch {
        /// Rows of `op(A)` (m).
        a_rows: usize,
        /// Columns of `op(A)` (k).
        a_cols: usize,
        /// Rows of `op(B)` (k).
        b_rows: usize,
        /// Columns of `op(B)` (n).
        b_cols: usize,
        /// Rows of `C` (m).
        c_rows: usize,
        /// Columns of `C` (n).
        c_cols: usize,
    },

    /// A row-major leading dimension (elements from one row to the next) is smaller than the
    /// number of columns, so rows would overlap. For an operand built with
    /// [`Operand::col_major`](crate::Operand::col_major), `cols` is its column-major row count.
    #[error(
        "leading dimension of {operand} is {ld} elements, less than the {cols} elements of one stored row \
         (for a column-major operand: one column, i.e. its row count)"
    )]
    LeadingDimTooSmall {
        /// The operand.
        operand: Which,
        /// The leading dimension given, in elements.
        ld: usize,
        /// The stored matrix's column count, in elements.
        cols: usize,
    },

    /// A dimension, leading dimension or batch count exceeds cuBLAS's 32-bit `int`, a batch
    /// stride exceeds its 64-bit `long long`, or a buffer extent would not fit in memory
    /// addresses.
    #[error("{what} is {value}, above the largest accepted value, {max}")]
    DimensionTooLarge {
        /// Which quantity (e.g. "m", "lda of B", "batch count").
        what: &'static str,
        /// The value given.
        value: usize,
        /// The largest value accepted.
        max: usize,
    },

    /// The batch stride of `C` lets outputs write the same element: it is smaller than one
    /// output matrix's extent, and the outputs do not sit side by side within each row either
    /// ([`crate::GemmProblem::new`] says which layouts are accepted).
    #[error(
        "batch stride of C is {batch_stride} elements but one [{rows}, {cols}] output with ld \
         {ld} spans {extent}: the {batch} outputs could overlap (C's batch stride must be at least one output's extent, \
         or the outputs must sit side by side in each row: stride >= {cols} and (batch - 1)·stride + {cols} <= ld)"
    )]
    OutputBatchesOverlap {
        /// The batch stride of `C`, in elements.
        batch_stride: usize,
        /// Rows of `C`.
        rows: usize,
        /// Columns of `C`.
        cols: usize,
        /// Leading dimension of `C`, in elements.
        ld: usize,
        /// Elements one output matrix spans: `(rows - 1)·ld + cols`.
        extent: usize,
        /// The batch count.
        batch: usize,
    },

    /// The storage dtype / compute type / output dtype combination is not one cuBLAS offers
    /// (cuBLAS documentation, `cublasGemmEx`, table of supported type combinations).
    #[error(
        "unsupported precision: inputs {input}, compute {compute}, output {output}; supported: \
         f32→f32 (32F or FAST_TF32), f16→f16|f32 (32F), bf16→bf16|f32 (32F)"
    )]
    UnsupportedPrecision {
        /// Storage dtype of A and B.
        input: DType,
        /// Compute type.
        compute: Compute,
        /// Storage dtype of C.
        output: DType,
    },

    /// A buffer's element type does not match what the problem needs (its precision or its
    /// dtype).
    #[error("{operand} holds {got} elements but the problem needs {expected}")]
    DTypeMismatch {
        /// The operand.
        operand: Which,
        /// The dtype the problem needs.
        expected: DType,
        /// The dtype of the buffer given.
        got: DType,
    },

    /// A buffer is shorter than the last element its layout addresses.
    #[error(
        "{operand} buffer holds {len_bytes} bytes but its layout addresses {needed_bytes} \
         ({needed_elems} elements of {elem_bytes} bytes)"
    )]
    BufferTooSmall {
        /// The operand.
        operand: Which,
        /// Length given, in bytes.
        len_bytes: usize,
        /// Bytes the layout needs: `needed_elems · elem_bytes`.
        needed_bytes: usize,
        /// Elements the layout needs: `(batch-1)·stride + (rows-1)·ld + cols`.
        needed_elems: usize,
        /// Size of one element, in bytes.
        elem_bytes: usize,
    },

    /// A buffer that must hold exactly what its layout addresses is longer (the CPU
    /// quantiser's source, [`crate::fp8::quantize`]: extra elements would be ignored silently).
    #[error(
        "{operand} buffer holds {len_bytes} bytes but its layout addresses exactly {needed_bytes} \
         ({needed_elems} elements of {elem_bytes} bytes)"
    )]
    BufferTooLarge {
        /// The operand.
        operand: Which,
        /// Length given, in bytes.
        len_bytes: usize,
        /// Bytes the layout addresses: `needed_elems · elem_bytes`.
        needed_bytes: usize,
        /// Elements the layout addresses.
        needed_elems: usize,
        /// Size of one element, in bytes.
        elem_bytes: usize,
    },

    /// A device address is not a multiple of the element size.
    #[error("{operand} address {address:#x} is not aligned to its {align}-byte elements")]
    Misaligned {
        /// The operand.
        operand: Which,
        /// The device address given.
        address: u64,
        /// The alignment needed, in bytes.
        align: usize,
    },

    /// A null device address was given for an operand the problem reads or writes.
    #[error("{operand} device address is null but the problem addresses {needed_bytes} bytes")]
    NullPointer {
        /// The operand.
        operand: Which,
        /// Bytes the layout needs.
        needed_bytes: usize,
    },

    /// An output's byte range overlaps an input's: cuBLAS would read what it is writing.
    #[error("{output}'s bytes [{out_start:#x}, {out_end:#x}) overlap {input}'s bytes [{in_start:#x}, {in_end:#x})")]
    OutputOverlapsInput {
        /// The output written (C, or the epilogue's aux or bias gradient).
        output: Which,
        /// The other operand overlapped (A, B, C, bias or aux).
        input: Which,
        /// First byte address of the output's extent.
        out_start: u64,
        /// One past the output's last byte.
        out_end: u64,
        /// First byte address of the input's extent.
        in_start: u64,
        /// One past the input's last byte.
        in_end: u64,
    },

    /// A bias-gradient epilogue was asked for on a strided batch (the gradient has no batch
    /// stride in cuBLASLt).
    #[error("epilogue {epilogue} cannot be used on a batch of {batch}; run the batch entries one by one")]
    EpilogueBatch {
        /// The epilogue.
        epilogue: crate::epilogue::Epilogue,
        /// The batch count.
        batch: usize,
    },

    /// The aux layout does not fit the problem.
    #[error(
        "aux layout [{rows}, {cols}] ld {ld} batch stride {batch_stride} does not fit C [{m}, {n}]: it must be \
         [m, n] with ld ≥ n, ld a multiple of 8, and batch stride ≥ one matrix's extent"
    )]
    AuxLayout {
        /// Rows given.
        rows: usize,
        /// Columns given.
        cols: usize,
        /// Leading dimension given, in elements.
        ld: usize,
        /// Batch stride given, in elements.
        batch_stride: usize,
        /// m of the problem.
        m: usize,
        /// n of the problem.
        n: usize,
    },

    /// An epilogue operand was missing, or given to an epilogue that does not use it.
    #[error("epilogue {epilogue}: {operand} {problem}")]
    EpilogueOperand {
        /// The epilogue.
        epilogue: crate::epilogue::Epilogue,
        /// "bias" (also the bias-gradient output) or "aux".
        operand: &'static str,
        /// "is required but missing" or "was given but is not used".
        problem: &'static str,
    },

    /// The backend asked for cannot run this problem.
    #[error("{backend} cannot run {what}")]
    Unsupported {
        /// The backend, e.g. "the CPU backend", "cuBLAS (Backend::Blas)".
        backend: &'static str,
        /// What it cannot run.
        what: String,
    },

    /// A setting or count outside the range it accepts (e.g. an SM count target of 0, or above
    /// the device's SM count; a repetition count of 0). Nothing was changed or launched.
    #[error("{what} = {value} is out of range: it must be {expected}")]
    OutOfRange {
        /// The setting or argument.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The range it accepts, with the numbers (e.g. "1 to 132, the device's SMs").
        expected: String,
    },

    /// A call that would have to create something (a plan, a workspace) was made while its
    /// stream is being captured into a CUDA graph, where creating it is not allowed.
    #[error("cannot {action} during CUDA graph capture: run the same call (or Gpu::prewarm) once before capturing ({problem})")]
    NotCapturable {
        /// What would have been needed.
        action: &'static str,
        /// The problem.
        problem: String,
    },

    /// A convolution's description breaks a rule ([`crate::conv::Conv2d::validate`]).
    #[error("convolution: {what} ({detail})")]
    ConvShape {
        /// The rule broken, e.g. "channels are not a multiple of the groups".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// An attention problem breaks a rule ([`crate::attention::Attention::validate`],
    /// [`crate::attention::Attention::check_lengths`]).
    #[error("attention: {what} ({detail})")]
    AttentionShape {
        /// The rule broken, e.g. "query heads are not a multiple of the key/value heads".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// An RMSNorm problem or call breaks a rule ([`crate::norm::RmsNorm::validate`]; a call's
    /// buffers that do not go together, such as a residual without its sum).
    #[error("RMSNorm: {what} ({detail})")]
    NormShape {
        /// The rule broken, e.g. "epsilon is not finite and positive".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A grouped GEMM's description breaks a rule ([`crate::grouped::GroupedProblem`]).
    #[error("grouped GEMM: {what} ({detail})")]
    GroupedShape {
        /// The rule broken, e.g. "the offsets are not monotone".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A transformer layer's elementwise operation (RoPE, SwiGLU) breaks a rule
    /// ([`crate::layer_ops::Rope::validate`], [`crate::layer_ops::SwiGlu::validate`], the
    /// positions and tables of a call).
    #[error("{op}: {what} ({detail})")]
    LayerOp {
        /// The operation: "RoPE" or "SwiGLU".
        op: &'static str,
        /// The rule broken, e.g. "the rotary dimension is not even, from 2 to the head dimension".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A paged KV cache, its page tables or lengths, or an append into it breaks a rule
    /// ([`crate::paged::PagedCache::validate`], [`crate::paged::PagedAppend::validate`], the
    /// checks of host tables and lengths such as [`crate::paged::PagedAppend::check_index`]).
    #[error("paged KV cache: {what} ({detail})")]
    PagedCache {
        /// The rule broken, e.g. "a page-table entry is past the container".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A decoder layer's description breaks a rule ([`crate::layer::DecoderLayer::validate`]),
    /// or a buffer handed to it has the wrong length.
    #[error("decoder layer: {what} ({detail})")]
    DecoderShape {
        /// The rule broken, e.g. "query heads are not a multiple of the key/value heads".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A tensor-parallel split breaks a rule (`dist::check_block`, with the `dist` feature).
    #[cfg_attr(feature = "dist", doc = "")]
    #[cfg_attr(feature = "dist", doc = "The rules: [`crate::dist::check_block`].")]
    #[error("tensor parallelism: {what} ({detail})")]
    TensorParallel {
        /// The rule broken, e.g. "the hidden size is not a multiple of the world size".
        what: &'static str,
        /// The values that broke it.
        detail: String,
    },

    /// A cuDNN call returned a status other than success.
    #[error("{operation} failed with {status} ({problem})")]
    Cudnn {
        /// The cuDNN function called.
        operation: &'static str,
        /// The status's name, e.g. `CUDNN_STATUS_NOT_SUPPORTED`.
        status: String,
        /// The problem it was called for.
        problem: String,
    },

    /// A cuBLAS call returned a status other than success.
    #[error("{operation} failed with {status} ({problem})")]
    Cublas {
        /// The cuBLAS function called.
        operation: &'static str,
        /// The status's name, e.g. `CUBLAS_STATUS_INVALID_VALUE`.
        status: String,
        /// The problem it was called for (shapes, lds, dtypes).
        problem: String,
    },

    /// A cudarc buffer belongs to another CUDA context (device) than the [`Gpu`](crate::cuda::Gpu)
    /// it was passed to.
    #[error("{operand} was allocated in the context of device {ordinal}, but this Gpu runs on device {expected}")]
    WrongContext {
        /// The operand.
        operand: Which,
        /// The device ordinal of the buffer's context.
        ordinal: usize,
        /// The device ordinal of the Gpu's context.
        expected: usize,
    },

    /// A plan made on one [`Gpu`](crate::cuda::Gpu) was run on another (its library objects
    /// and chosen algorithm belong to the engine that made it). Nothing was launched.
    #[error("this {plan} was made on another Gpu than the one it was run on: make it on this Gpu")]
    ForeignPlan {
        /// The plan type, e.g. "GemmPlan".
        plan: &'static str,
    },

    /// A raw address is not memory this GPU can access over the extent the problem addresses
    /// (checked with `cuPointerGetAttributes` before anything is enqueued; see
    /// [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses)).
    #[error("{operand} address {address:#x} (+{len_bytes} bytes) is not memory this GPU can access: {why}")]
    NotDeviceMemory {
        /// The operand.
        operand: Which,
        /// The address given.
        address: u64,
        /// Bytes from it the problem reads or writes.
        len_bytes: usize,
        /// What the driver reported.
        why: String,
    },

    /// A CUDA driver call returned an error.
    #[error("{operation} failed with {status}")]
    Driver {
        /// The driver function called.
        operation: &'static str,
        /// The error's name, e.g. `CUDA_ERROR_NO_DEVICE`.
        status: String,
    },

    /// A shared library could not be loaded.
    #[error("{library} could not be loaded (tried {tried}); {hint}")]
    LibraryNotFound {
        /// The library, e.g. "cuBLAS (libcublas)".
        library: &'static str,
        /// The file names tried, comma-separated.
        tried: String,
        /// How to point the loader at it.
        hint: &'static str,
    },

    /// An FP8 GEMM or quantisation broke one of the hardware's or cuBLASLt's FP8 rules
    /// ([`crate::fp8`] lists them, with where each comes from).
    #[error("FP8 rule broken ({rule}): {detail}")]
    Fp8 {
        /// The rule.
        rule: Fp8Rule,
        /// The values that broke it, and what would not.
        detail: String,
    },

    /// A training layer's shapes or buffers do not agree ([`crate::train`]).
    #[error("layer {layer}: {what} is {got}, expected {expected}")]
    LayerShape {
        /// The layer's index in its sequence (0 first).
        layer: usize,
        /// What was wrong, e.g. "input length (tokens × in_features)".
        what: &'static str,
        /// The value given.
        got: usize,
        /// The value required.
        expected: usize,
    },

    /// A training call that does not follow the previous one, e.g. a backward without a
    /// training forward, or with another input than that forward's ([`crate::train`]).
    #[error("{problem}")]
    TrainingOrder {
        /// What was out of order, and what is required.
        problem: String,
    },

    /// The machine has no CUDA device.
    #[error("no CUDA device found ({detail}); the CPU backend (gemmbridge::cpu) works without one")]
    NoDevice {
        /// What the driver said.
        detail: String,
    },
}

impl Error {
    /// Whether a buffer of `have_bytes` bytes holds the `needed` elements of `elem_bytes`
    /// bytes that `operand` needs (a device buffer's length, or a host slice's in bytes).
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] with both lengths in bytes and the elements needed.
    pub(crate) fn check_bytes(operand: Which, have_bytes: usize, needed: usize, elem_bytes: usize) -> Result<()> {
        let needed_bytes = needed.saturating_mul(elem_bytes);
        if have_bytes < needed_bytes {
            return Err(Error::BufferTooSmall {
                operand,
                len_bytes: have_bytes,
                needed_bytes,
                needed_elems: needed,
                elem_bytes,
            });
        }
        Ok(())
    }

    /// Whether a host slice of `have` elements of `elem_bytes` bytes holds the `needed`
    /// elements `operand` needs.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] with both lengths in bytes and the elements needed.
    pub(crate) fn check_len(operand: Which, have: usize, needed: usize, elem_bytes: usize) -> Result<()> {
        Error::check_bytes(operand, have.saturating_mul(elem_bytes), needed, elem_bytes)
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
