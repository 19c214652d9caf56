//! The CUDA backend: cuBLAS, cuBLASLt and cuDNN through cudarc, loaded at run time (nothing
//! needs CUDA at build time; without a driver, [`Gpu::new`] is an error naming the files tried —
//! point `LD_LIBRARY_PATH` at the libraries if they are installed elsewhere).
//!
//! A [`Gpu`] is one engine on one device: context, stream, library handles, a workspace per
//! stream it is used on (32 MiB on Hopper) and plan caches. Its entries, one capability each:
//! dense GEMMs ([`Gpu::gemm`], [`Gpu::gemm_fused`], [`Gpu::gemm_raw`]), FP8 ([`GpuFp8::quantize`],
//! [`GpuFp8::gemm`]; [`crate::fp8`]), convolutions ([`GpuConv::forward`] and the rest;
//! [`crate::conv`]), attention ([`GpuAttention::forward`] and the rest; [`crate::attention`]),
//! RMSNorm ([`Gpu::rms_norm_forward`], [`Gpu::rms_norm_backward`]; [`crate::norm`]),
//! RoPE and SwiGLU on gemmbridge's own kernels ([`Gpu::rope`], [`Gpu::swiglu`],
//! [`Gpu::swiglu_backward`]; [`crate::layer_ops`]),
//! grouped GEMMs ([`Gpu::grouped_gemm`]; [`crate::grouped`]), training layers ([`train::Mlp`]),
//! a LLaMA-style decoder layer built from these entries ([`layer::GpuDecoderLayer`];
//! [`crate::layer`]).
//! Settings are one value, [`GpuOptions`], given at creation ([`Gpu::with_options`]) and
//! changed on a live engine with [`Gpu::update_options`]; [`Plans`] ([`Gpu::plans`]) holds the
//! plan and replay caches and the tactic database.
//!
//! # Two ways in
//! - Safe: cudarc buffers (`CudaSlice`, views) on the engine's stream ([`Gpu::stream`]), outputs
//!   through `&mut`.
//! - Raw: `unsafe` [`Gpu::gemm_raw`] with [`RawOperands`] of [`RawBuffer`]s
//!   (`{ address, len_bytes }`; `RawOperands::with_bias` / `with_aux` for an epilogue's
//!   operands) on the caller's [`CUstream`], for other frameworks' buffers: enqueued in order,
//!   never synchronised. The engine can also check every raw address with the driver first (an
//!   unregistered host pointer then is an error instead of a fault); that costs about 0.5 µs a
//!   call, so it is off by default.
//!
//! ```no_run
//! use gemmbridge::cuda::{Extras, Gpu, Scale};
//! use gemmbridge::half::bf16;
//! use gemmbridge::{Epilogue, GemmProblem, Precision};
//!
//! let gpu = Gpu::new(0)?;
//! // y[64, 256] = relu(x[64, 128]·w[256, 128]ᵀ + b[256]), f32 accumulation, bf16 in and out
//! let p = GemmProblem::linear(64, 256, 128, Precision::BF16)?.with_epilogue(Epilogue::ReluBias)?;
//! let s = gpu.stream();
//! let (x, w) = (s.alloc_zeros::<bf16>(64 * 128)?, s.alloc_zeros::<bf16>(256 * 128)?);
//! let b = s.alloc_zeros::<bf16>(256)?;
//! let mut y = s.alloc_zeros::<bf16>(64 * 256)?;
//! gpu.gemm_fused(&p, Scale::PRODUCT, &x, &w, &mut y, Extras { bias: Some(&b), ..Extras::default() })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Which library serves
//! [`Backend::Auto`] (the default) runs cuBLASLt wherever it has an algorithm and cuBLAS
//! otherwise (`k = 0`, `α = 0`, no libcublasLt); [`Backend::Lt`] and [`Backend::Blas`] force one.
//! cuBLASLt plans (descriptors, layouts, algorithm) are cached per problem signature, and fuse
//! the epilogues of [`crate::Epilogue`]: bias, ReLU, GELU, GELU saving its pre-activation, dGELU
//! and bias gradients.
//!
//! # Misaligned operands
//! A leading dimension, base address or batch stride that is not a multiple of 16 bytes (for
//! f16/bf16: K or N not a multiple of 8) drops cuBLASLt to slow kernels. Above a size threshold
//! per precision ([`Padding`], measured on the H200) such a call runs on aligned, zero-padded
//! copies made on the GPU in stream order (K extended with zeros in both inputs, N in B and the
//! bias, C staged); `Padding::off()` calls the library directly. Strict f32 is not slowed and
//! never padded.
//!
//! # Sharing the GPU with a resident kernel
//! An SM count target plans dense GEMMs for `n` SMs (cuBLASLt's `SM_COUNT_TARGET`,
//! `cublasSetSmCountTarget` for cuBLAS), leaving the rest to kernels that run beside them; by
//! default every SM is used. On the H200 a one-thread kernel spinning beside a bf16 4096³ GEMM
//! made it 1.46× slower, 1.14× with one SM left free (the burn adapter's device ordering does
//! this). A tactic database entry applies only under the target it was tuned with.
//!
//! # Prewarm, tuning and the tactic database
//! [`Gpu::prewarm`] builds plans, workspaces and kernels before the first call (which otherwise
//! costs tens of milliseconds). `gemmbridge tune --db FILE` autotunes the benchmark's problems
//! and stores an entry only where its choice ran at least 2 % faster than the library's own in
//! short bursts after idle time, as real calls run ([`GpuTuning::gemm_raw`] and
//! [`GpuTuning::fp8`] tune one problem). A database is loaded for this machine:
//!
//! ```no_run
//! use gemmbridge::cuda::{tactics::TacticDb, Gpu};
//!
//! let gpu = Gpu::new(0)?;
//! let (db, warnings) = TacticDb::load(std::path::Path::new("tactics.json"), &gpu.info()?.tactic_identity());
//! for w in &warnings {
//!     eprintln!("left out: {w}"); // another GPU's file, a damaged one, another library version's entries
//! }
//! gpu.plans().load_tactics(&db);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same database holds cuDNN's convolution and attention plans (entries of another cuDNN
//! version are left out with a warning and kept in the file); [`Plans::applied_tactics`] lists the
//! entries an engine has built plans with; [`tactics`] documents the file format (2; format-1
//! files are still read). `tune --verify FILE` re-checks that each entry still wins.
//!
//! # Threads, streams and CUDA graphs
//! A `Gpu` is `Send + Sync`; calls serialise on its handles for the microseconds it takes to
//! enqueue, and each stream it is used on gets its own workspace. Graph capture: a call whose
//! plan or workspace does not exist yet fails with [`crate::Error::NotCapturable`] instead of
//! doing forbidden work during a capture — call it once (or prewarm) before capturing. Graph
//! replay ([`GraphReplay`], on by default): eagerly, a call of at most 1024³ multiply-adds made a
//! second time with the same addresses, α, β and stream is captured once into a CUDA graph and
//! from then on launched with `cuGraphLaunch`, which costs the host less than `cublasLtMatmul`;
//! the result is the direct call's. Creating and dropping engines on many threads beside other
//! threads' captures is safe: nothing context-wide is synchronised at creation or drop.
//!
//! # Inside
//! In floors (docs/DESIGN.md): the API (`api/`: one `impl` block per capability, on [`Gpu`] or
//! on its view such as [`GpuConv`]) builds one
//! call value (`call.rs`) per GEMM and hands it to the routing floor (`route/`: which library
//! serves, misaligned operands on padded copies), which calls one room per library side by side
//! (`blas/`, `lt/` with FP8 as a mode of it, `dnn/`), all on the device layer (`device/`:
//! context, streams, workspaces, graph capture and replay, gemmbridge's own kernels), which
//! sits on cudarc's bindings; `library.rs` and `status.rs` are the ground. [`DeviceInfo`] is what
//! `gemmbridge info` prints; [`library`] checks that the shared libraries load.

mod api;
mod blas;
mod call;
mod device;
mod dnn;
pub mod library;
mod lt;
mod route;
mod status;

pub use api::layer;
pub use api::train;
pub use api::{
    cuda_version_string, Applied, AttnSaved, AttnSavedFp8, Change, DeviceInfo, Extras, GemmPlan, Gpu, GpuAttention,
    GpuConv, GpuFp8, GpuMoe, GpuOptions, GpuPaged, GpuTuning, MoeCombineGrads, MoeRouting, NormServed, PageIndex,
    Plans, RawBuffer, RawOperands, Reach, RmsNormDw, RmsNormIn, RmsNormOut, RmsNormSaved, RmsNormY, SeqLens,
};
pub use call::Scale;
pub use device::GraphReplay;
pub use dnn::{cudnn_version, ConvApi, ConvSearch};
pub use lt::launch::Algorithm;
pub use lt::tune::{TuneOptions, TuneReport};
pub use route::{Backend, Fp8Options, Fp8Out, Fp8Tensor, Padding, Served};

/// The tactic database (also at [`crate::tactics`]), kept at its former path.
pub use crate::tactics;

/// The raw CUDA stream type [`Gpu::gemm_raw`] takes (`CUstream`, a pointer).
pub use cudarc::driver::sys::CUstream;
