//! The launch sequence of one FP8 quantisation on a stream: which of gemmbridge's own kernels
//! (`kernels/fp8.cu`) run, in which order, with which grids and scratch.
//!
//! | scaling | row-major source | `[K, rows]` source |
//! |---|---|---|
//! | tensor | amax, then cast | amax, then fused cast-transpose |
//! | row | cast_rows_short / cast_rows (one CTA per row, kept in registers up to 8192 / 16384 columns of a 16-bit source) | transpose, then as row-major |
//! | 1×128 | cast_vec128 (a half-warp per block, a warp for f32) | transpose, then as row-major |
//! | 128×128 | cast_blk128 (one CTA per block, kept in registers) | transpose, then as row-major |
//!
//! Every kernel but the transposes reads its source once (the row kernel: rows up to 16384
//! columns of a 16-bit source, 8192 of f32) with 16-byte loads where the row allows, keeping
//! what it needs twice in registers as raw 16-byte chunks.
//!
//! Reads plan → launch: [`cast_scratch`] says what scratch a job needs, [`cast_launches`]
//! (pure, CPU-tested) lists the launches for the scratch's addresses, [`enqueue_cast`]
//! allocates, zeroes and launches them.

use std::ffi::c_void;

use cudarc::driver::sys::CUstream;

use super::kernels::{suffix, GRID_X_MAX, GRID_Y_MAX};
use super::{Kernels, Scratch};
use crate::cuda::status;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fp8::{Fp8Format, Fp8Layout, Scaling, Source};

/// Threads per CTA for every kernel here.
const THREADS: u32 = 256;
/// Most CTAs of the grid-stride kernels (8 per SM of a 132-SM H200; enough for any GPU).
const MAX_CTAS: u64 = 1056;

/// One quantisation: a `layout.rows × layout.cols` source of `dtype` at `src` stored as
/// `source` says, into `data` (`layout.data_len()` bytes) and `scales` (`layout.scale_len()`
/// f32s), both device addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CastJob {
    pub src: u64,
    pub dtype: DType,
    pub source: Source,
    pub format: Fp8Format,
    pub layout: Fp8Layout,
    pub data: u64,
    pub scales: u64,
}

/// One kernel argument, by value (its C type in the comment).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Arg {
    /// A device address (`T*`).
    Ptr(u64),
    /// `long`.
    Long(i64),
    /// `float`.
    F32(f32),
    /// `int`.
    Int(i32),
}

/// One launch of a kernel of `kernels/fp8.cu`: the instance's name, its grid (CTAs of
/// [`THREADS`] threads) and its arguments in the kernel's order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Launch {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub args: Vec<Arg>,
}

/// Scratch one job needs: a transposed copy of the source (bytes; 0 for none) and an amax
/// word (tensor-wise scales), and whether the scales must be zeroed first (128×128 blocks:
/// the scale tensor's K padding is never written by the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CastScratch {
    pub transposed_bytes: usize,
    pub amax: bool,
    pub zero_scales: bool,
}

fn ctas(units: u64, per_cta: u64) -> u32 {
    units.div_ceil(per_cta).clamp(1, MAX_CTAS) as u32
}

/// What scratch `job` needs.
pub(crate) fn cast_scratch(job: &CastJob) -> CastScratch {
    let l = &job.layout;
    let transposed = job.source == Source::Transposed && l.scaling != Scaling::Tensor;
    CastScratch {
        transposed_bytes: if transposed { l.rows * l.cols * job.dtype.size_bytes() } else { 0 },
        amax: l.scaling == Scaling::Tensor,
        zero_scales: l.scaling == Scaling::Block128x128,
    }
}

/// What every launch of one job shares: its sizes and common arguments.
struct Common {
    suffix: &'static str,
    /// Bytes per source element.
    size: u64,
    rows: i64,
    rows_alloc: i64,
    cols: i64,
    ld: i64,
    fmax: Arg,
    e5m2: Arg,
    q: Arg,
    sc: Arg,
}

impl Common {
    fn new(job: &CastJob) -> Common {
        let l = &job.layout;
        let size = job.dtype.size_bytes() as u64;
        Common {
            suffix: suffix(job.dtype),
            size,
            rows: l.rows as i64,
            rows_alloc: l.rows_alloc as i64,
            cols: l.cols as i64,
            ld: l.ld as i64,
            fmax: Arg::F32(job.format.max()),
            e5m2: Arg::Int(i32::from(job.format == Fp8Format::E5M2)),
            q: Arg::Ptr(job.data),
            sc: Arg::Ptr(job.scales),
        }
    }

    /// The kernel's instance for the job's source dtype.
    fn name(&self, kernel: &str) -> String {
        format!("{kernel}_{}", self.suffix)
    }
}

/// `v` as a grid dimension, or the named error past `max`.
fn grid_dim(what: &'static str, v: u64, max: u64) -> Result<u32> {
    if v > max {
        return Err(Error::DimensionTooLarge { what, value: v as usize, max: max as usize });
    }
    Ok(v.max(1) as u32)
}

/// The launches of `job`, in order, given the scratch addresses [`cast_scratch`] asked for
/// (`transposed`: the transposed copy, `amax`: the zeroed amax word; 0 where not needed).
///
/// # Errors
/// [`Error::DimensionTooLarge`] when a grid dimension would pass its limit (the caller
/// checks the row limits first; this is the last guard).
pub(crate) fn cast_launches(job: &CastJob, transposed: u64, amax: u64) -> Result<Vec<Launch>> {
    let c = Common::new(job);
    let mut out = Vec::with_capacity(2);
    let mut x = job.src;
    if transposed != 0 {
        out.push(transpose_launch(job, &c, x, transposed)?);
        x = transposed;
    }
    match job.layout.scaling {
        Scaling::Tensor => tensor_launches(job, &c, x, amax, &mut out)?,
        Scaling::Row => out.push(row_launch(job, &c, x)?),
        Scaling::Block1x128 => out.push(vec128_launch(job, &c, x)?),
        Scaling::Block128x128 => out.push(blk128_launch(job, &c, x)?),
    }
    Ok(out)
}

/// The transpose of a `[cols, rows]` source into `transposed` (row-wise and block scales of a
/// transposed source).
fn transpose_launch(job: &CastJob, c: &Common, x: u64, transposed: u64) -> Result<Launch> {
    let l = &job.layout;
    let grid = (
        grid_dim("CTAs of an FP8 transpose", (l.cols as u64).div_ceil(64), GRID_X_MAX)?,
        grid_dim("rows of an FP8 transpose's grid", (l.rows as u64).div_ceil(64), GRID_Y_MAX)?,
        1,
    );
    // transpose_T(const T* src, long rows, long cols, T* dst)
    let args = vec![Arg::Ptr(x), Arg::Long(c.rows), Arg::Long(c.cols), Arg::Ptr(transposed)];
    Ok(Launch { kernel: c.name("transpose"), grid, args })
}

/// Tensor-wise scales: the amax pass, then the cast (or the fused cast-transpose of a
/// transposed source).
fn tensor_launches(job: &CastJob, c: &Common, x: u64, amax: u64, out: &mut Vec<Launch>) -> Result<()> {
    let l = &job.layout;
    let n = c.rows * c.cols;
    let grid = (ctas(n as u64, 8 * THREADS as u64), 1, 1);
    // amax_T(const T* x, long n, u32* out)
    let args = vec![Arg::Ptr(x), Arg::Long(n), Arg::Ptr(amax)];
    out.push(Launch { kernel: c.name("amax"), grid, args });
    // cast_tensor_T / cast_transpose_T(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2)
    let args = vec![
        Arg::Ptr(x),
        Arg::Long(c.rows),
        Arg::Long(c.rows_alloc),
        Arg::Long(c.cols),
        c.q,
        Arg::Long(c.ld),
        Arg::Ptr(amax),
        c.sc,
        c.fmax,
        c.e5m2,
    ];
    if job.source == Source::Transposed {
        // tiles of 64 output columns by 64 output rows (f32) or 128 (16-bit sources)
        let tile_rows = if c.size == 4 { 64 } else { 128 };
        let grid = (
            grid_dim("CTAs of an FP8 cast-transpose", (l.ld as u64).div_ceil(64), GRID_X_MAX)?,
            grid_dim("rows of an FP8 cast-transpose's grid", (l.rows_alloc as u64).div_ceil(tile_rows), GRID_Y_MAX)?,
            1,
        );
        out.push(Launch { kernel: c.name("cast_transpose"), grid, args });
    } else {
        // CAST_UNROLL (2) chunks of 16 / size elements per thread per pass (kernels/fp8.cu)
        let per_cta = u64::from(THREADS) * 2 * (16 / c.size);
        let grid = (ctas(l.rows_alloc as u64 * l.ld as u64, per_cta), 1, 1);
        out.push(Launch { kernel: c.name("cast_tensor"), grid, args });
    }
    Ok(())
}

/// Row-wise scales: one CTA per row, the short instance (4 chunks of 16 bytes cached per
/// thread) for rows it holds.
fn row_launch(job: &CastJob, c: &Common, x: u64) -> Result<Launch> {
    let l = &job.layout;
    let grid = (grid_dim("rows of a row-wise FP8 cast", l.rows_alloc as u64, GRID_X_MAX)?, 1, 1);
    // cast_rows[_short]_T(x, rows, cols, q, ld, scale, fmax, e5m2)
    let args = vec![Arg::Ptr(x), Arg::Long(c.rows), Arg::Long(c.cols), c.q, Arg::Long(c.ld), c.sc, c.fmax, c.e5m2];
    let short = l.ld as u64 <= u64::from(THREADS) * 4 * (16 / c.size);
    let kernel = c.name(if short { "cast_rows_short" } else { "cast_rows" });
    Ok(Launch { kernel, grid, args })
}

/// 1×128 block scales: 128 / E lanes per group, E = 16 / element size (kernels/fp8.cu,
/// `Chunk`), each thread serving two groups' lanes.
fn vec128_launch(job: &CastJob, c: &Common, x: u64) -> Result<Launch> {
    let l = &job.layout;
    let groups = l.rows_alloc as u64 * l.k_blocks() as u64;
    let per_cta = 2 * u64::from(THREADS) * (16 / c.size) / 128;
    let grid = (grid_dim("1×128 groups of an FP8 quantisation", groups.div_ceil(per_cta), GRID_X_MAX)?, 1, 1);
    // cast_vec128_T(x, rows, rows_alloc, cols, q, ld, scale, fmax, e5m2)
    let args = vec![
        Arg::Ptr(x),
        Arg::Long(c.rows),
        Arg::Long(c.rows_alloc),
        Arg::Long(c.cols),
        c.q,
        Arg::Long(c.ld),
        c.sc,
        c.fmax,
        c.e5m2,
    ];
    Ok(Launch { kernel: c.name("cast_vec128"), grid, args })
}

/// 128×128 block scales: one CTA per block.
fn blk128_launch(job: &CastJob, c: &Common, x: u64) -> Result<Launch> {
    let l = &job.layout;
    let grid = (
        grid_dim("K blocks of a 128×128 FP8 cast", l.k_blocks() as u64, GRID_X_MAX)?,
        grid_dim("row blocks of a 128×128 FP8 cast", (l.rows_alloc as u64).div_ceil(128), GRID_Y_MAX)?,
        1,
    );
    // cast_blk128_T(x, rows, rows_alloc, cols, q, ld, scale, scale_ld, fmax, e5m2)
    let args = vec![
        Arg::Ptr(x),
        Arg::Long(c.rows),
        Arg::Long(c.rows_alloc),
        Arg::Long(c.cols),
        c.q,
        Arg::Long(c.ld),
        c.sc,
        Arg::Long(l.scale_ld() as i64),
        c.fmax,
        c.e5m2,
    ];
    Ok(Launch { kernel: c.name("cast_blk128"), grid, args })
}

/// [`cast_launches`]' checks, before anything is allocated or launched for `job` (the scratch
/// addresses do not change a grid, so stand-ins serve).
pub(crate) fn check_cast(job: &CastJob) -> Result<()> {
    let need = cast_scratch(job);
    cast_launches(job, u64::from(need.transposed_bytes > 0), u64::from(need.amax)).map(drop)
}

/// Enqueues one launch on `stream`.
///
/// # Safety
/// `launch` came from [`cast_launches`] for a job whose contract ([`enqueue_cast`]) holds,
/// with its scratch still allocated; `stream` is a live stream of the current context.
pub(crate) unsafe fn launch_one(k: &Kernels, launch: &Launch, stream: CUstream) -> Result<()> {
    let mut values = launch.args.clone();
    let mut ptrs: Vec<*mut c_void> = values
        .iter_mut()
        .map(|a| match a {
            Arg::Ptr(v) => v as *mut u64 as *mut c_void,
            Arg::Long(v) => v as *mut i64 as *mut c_void,
            Arg::F32(v) => v as *mut f32 as *mut c_void,
            Arg::Int(v) => v as *mut i32 as *mut c_void,
        })
        .collect();
    // SAFETY: `ptrs` point into `values`, which outlives the launch call; the argument types
    // follow the kernel's signature (`cast_launches`); the rest is the caller's contract.
    unsafe { k.launch(&launch.kernel, launch.grid, THREADS, stream, &mut ptrs) }
}

/// Scratch held for one job's launches (freed in stream order when dropped).
pub(crate) struct HeldScratch {
    pub transposed: Option<Scratch>,
    pub amax: Option<Scratch>,
}

impl HeldScratch {
    /// The scratch addresses for [`cast_launches`] (0 where none).
    pub fn addresses(&self) -> (u64, u64) {
        (self.transposed.as_ref().map_or(0, |s| s.ptr), self.amax.as_ref().map_or(0, |s| s.ptr))
    }
}

/// Allocates `job`'s scratch on `stream` and zeroes what must start at zero (the amax word,
/// the scales of 128×128 blocks).
///
/// # Safety
/// As [`enqueue_cast`].
pub(crate) unsafe fn prepare_cast(job: &CastJob, stream: CUstream) -> Result<HeldScratch> {
    let need = cast_scratch(job);
    // SAFETY: the caller's contract (live stream of the current context).
    let transposed =
        if need.transposed_bytes > 0 { Some(unsafe { Scratch::alloc(need.transposed_bytes, stream)? }) } else { None };
    let amax = if need.amax {
        // SAFETY: as above; 4 bytes for the amax, zeroed before the amax kernel.
        let a = unsafe { Scratch::alloc(4, stream)? };
        unsafe { cudarc::driver::result::memset_d8_async(a.ptr, 0, 4, stream) }
            .map_err(status::driver("cuMemsetD8Async"))?;
        Some(a)
    } else {
        None
    };
    if need.zero_scales {
        // SAFETY: `scales` holds scale_len() f32s (caller).
        unsafe { cudarc::driver::result::memset_d8_async(job.scales, 0, job.layout.scale_len() * 4, stream) }
            .map_err(status::driver("cuMemsetD8Async"))?;
    }
    Ok(HeldScratch { transposed, amax })
}

/// Enqueues `job` on `stream`.
///
/// # Safety
/// The addresses are device memory of the current context valid for the sizes above, `data`
/// and `scales` not overlapping anything else; `stream` is live; the layout's sizes fit the
/// kernels' 64-bit indices and its row count a grid dimension (checked by the caller).
pub(crate) unsafe fn enqueue_cast(k: &Kernels, job: &CastJob, stream: CUstream) -> Result<()> {
    check_cast(job)?;
    // SAFETY: the caller's contract.
    let held = unsafe { prepare_cast(job, stream)? };
    let (transposed, amax) = held.addresses();
    for launch in cast_launches(job, transposed, amax)? {
        // SAFETY: planned for this job and its scratch, which `held` keeps until after the
        // launches (then freed in stream order).
        unsafe { launch_one(k, &launch, stream)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(rows: usize, cols: usize, dtype: DType, source: Source, scaling: Scaling) -> CastJob {
        CastJob {
            src: 0x1000,
            dtype,
            source,
            format: Fp8Format::E4M3,
            layout: Fp8Layout::new(rows, cols, scaling),
            data: 0x2000,
            scales: 0x3000,
        }
    }

    #[test]
    fn kernels_and_scratch_per_recipe() {
        let cases = [
            (Source::RowMajor, Scaling::Tensor, vec!["amax_bf16", "cast_tensor_bf16"], 0, true),
            (Source::Transposed, Scaling::Tensor, vec!["amax_bf16", "cast_transpose_bf16"], 0, true),
            (Source::RowMajor, Scaling::Row, vec!["cast_rows_short_bf16"], 0, false),
            (Source::Transposed, Scaling::Row, vec!["transpose_bf16", "cast_rows_short_bf16"], 300 * 1000 * 2, false),
            (Source::RowMajor, Scaling::Block1x128, vec!["cast_vec128_bf16"], 0, false),
            (Source::Transposed, Scaling::Block128x128, vec!["transpose_bf16", "cast_blk128_bf16"], 600_000, false),
        ];
        for (source, scaling, kernels, transposed_bytes, amax) in cases {
            let j = job(300, 1000, DType::BF16, source, scaling);
            let need = cast_scratch(&j);
            assert_eq!(need.transposed_bytes, transposed_bytes, "{source:?} {scaling:?}");
            assert_eq!(need.amax, amax, "{source:?} {scaling:?}");
            assert_eq!(need.zero_scales, scaling == Scaling::Block128x128);
            let launches = cast_launches(&j, if transposed_bytes > 0 { 0x4000 } else { 0 }, 0x5000).unwrap();
            let names: Vec<&str> = launches.iter().map(|l| l.kernel.as_str()).collect();
            assert_eq!(names, kernels, "{source:?} {scaling:?}");
            if transposed_bytes > 0 {
                // the cast reads the transposed copy, not the source
                assert_eq!(launches[0].args[3], Arg::Ptr(0x4000));
                assert_eq!(launches[1].args[0], Arg::Ptr(0x4000));
            } else {
                assert_eq!(launches[0].args[0], Arg::Ptr(0x1000));
            }
        }
    }

    #[test]
    fn grids_cover_the_tensor() {
        // tensor-wise cast: 256 threads × 2 chunks of 8 bf16 per CTA pass, at most 1056 CTAs
        let j = job(64, 4096, DType::BF16, Source::RowMajor, Scaling::Tensor);
        let l = cast_launches(&j, 0, 0x5000).unwrap();
        assert_eq!(l[1].grid, ((64 * 4096 / (256 * 16)) as u32, 1, 1));
        let big = job(1 << 16, 1 << 14, DType::F32, Source::RowMajor, Scaling::Tensor);
        assert_eq!(cast_launches(&big, 0, 0x5000).unwrap()[1].grid.0, 1056);
        // one CTA per row; 128×128: K blocks × row blocks (rows padded to 128)
        let r = job(300, 1000, DType::F16, Source::RowMajor, Scaling::Row);
        assert_eq!(cast_launches(&r, 0, 0).unwrap()[0].grid, (r.layout.rows_alloc as u32, 1, 1));
        let b = job(300, 1000, DType::F16, Source::RowMajor, Scaling::Block128x128);
        assert_eq!(cast_launches(&b, 0, 0).unwrap()[0].grid, (8, b.layout.rows_alloc.div_ceil(128) as u32, 1));
        // the short row instance holds 256 threads × 4 chunks: 8192 16-bit or 4096 f32 columns
        let kernel = |rows, cols, dtype| {
            cast_launches(&job(rows, cols, dtype, Source::RowMajor, Scaling::Row), 0, 0).unwrap()[0].kernel.clone()
        };
        assert_eq!(kernel(8, 8192, DType::F16), "cast_rows_short_f16");
        assert_eq!(kernel(8, 8200, DType::F16), "cast_rows_f16");
        assert_eq!(kernel(8, 4096, DType::F32), "cast_rows_short_f32");
        assert_eq!(kernel(8, 4100, DType::F32), "cast_rows_f32");
        // cast-transpose: tiles of 64 output columns by 64 (f32) or 128 (16-bit) output rows
        for (dtype, tile_rows) in [(DType::F32, 64), (DType::BF16, 128), (DType::F16, 128)] {
            let t = job(300, 1000, dtype, Source::Transposed, Scaling::Tensor);
            let grid = cast_launches(&t, 0, 0x5000).unwrap()[1].grid;
            assert_eq!(grid, (t.layout.ld.div_ceil(64) as u32, t.layout.rows_alloc.div_ceil(tile_rows) as u32, 1));
        }
        // transpose: 64×64 tiles
        let tr = job(300, 1000, DType::F16, Source::Transposed, Scaling::Row);
        assert_eq!(cast_launches(&tr, 0x4000, 0).unwrap()[0].grid, (16, 5, 1));
    }

    #[test]
    fn grids_past_cuda_limits_are_named_errors() {
        // 1×128 groups of 2³¹ − 16 rows × 40 K blocks: more CTAs than gridDim.x's 2³¹ − 1
        let j = job((1 << 31) - 16, 5120, DType::BF16, Source::RowMajor, Scaling::Block1x128);
        match check_cast(&j) {
            Err(Error::DimensionTooLarge { value, max, what }) => {
                assert!(value > max && max == i32::MAX as usize, "{what}: {value} vs {max}")
            }
            other => panic!("{other:?}"),
        }
        // a transposed source's rows beyond 65535 tiles of 64
        let t = job(65536 * 64, 8, DType::F16, Source::Transposed, Scaling::Row);
        assert!(matches!(check_cast(&t), Err(Error::DimensionTooLarge { max: 65535, .. })));
    }
}
