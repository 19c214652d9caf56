//! The launch sequence of one FP8 quantisation on a stream: which of gemmbridge's own kernels
//! (`kernels/fp8.cu`) run, in which order, with which grids and scratch.
//!
//! | scaling | row-major source | `[K, rows]` source |
//! |---|---|---|
//! | tensor | amax, then cast | amax, then fused cast-transpose |
//! | row | cast_rows (one CTA per row, kept in registers up to 16384 columns) | transpose, then as row-major |
//! | 1×128 | cast_vec128 (a half-warp per block, a warp for f32) | transpose, then as row-major |
//! | 128×128 | cast_blk128 (one CTA per block, kept in registers) | transpose, then as row-major |
//!
//! Every kernel but the transposes reads its source once (the row kernel: rows up to 16384
//! columns of a 16-bit source, 8192 of f32) with 16-byte loads where the row allows, keeping
//! what it needs twice in registers as raw 16-byte chunks.

use cudarc::driver::sys::CUstream;

use super::kernels::{arg, suffix};
use super::{Kernels, Scratch};
use crate::cuda::status;
use crate::dtype::DType;
use crate::error::Result;
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

fn ctas(units: u64, per_cta: u64) -> u32 {
    units.div_ceil(per_cta).clamp(1, MAX_CTAS) as u32
}

/// Enqueues `job` on `stream`.
///
/// # Safety
/// The addresses are device memory of the current context valid for the sizes above, `data`
/// and `scales` not overlapping anything else; `stream` is live; the layout's sizes fit the
/// kernels' 64-bit indices and its row count a grid dimension (checked by the caller).
pub(crate) unsafe fn enqueue_cast(k: &Kernels, job: &CastJob, stream: CUstream) -> Result<()> {
    let l = &job.layout;
    let name = |kernel: &str| format!("{kernel}_{}", suffix(job.dtype));
    let mut x = job.src;
    let (mut rows, mut rows_alloc, mut cols, mut ld) = (l.rows as i64, l.rows_alloc as i64, l.cols as i64, l.ld as i64);
    let (mut q, mut sc) = (job.data, job.scales);
    let mut fmax = job.format.max();
    let mut e5m2 = i32::from(job.format == Fp8Format::E5M2);
    // A [K, rows] source for anything but tensor-wise scales: transposed into scratch first.
    let mut _transposed = None;
    if job.source == Source::Transposed && l.scaling != Scaling::Tensor {
        // SAFETY: the caller's contract (live stream of the current context).
        let t = unsafe { Scratch::alloc(l.rows * l.cols * job.dtype.size_bytes(), stream)? };
        let mut dst = t.ptr;
        let grid = ((l.cols as u32).div_ceil(64), (l.rows as u32).div_ceil(64), 1);
        // SAFETY: transpose_T(const T* src, long rows, long cols, T* dst); src holds
        // rows·cols elements (caller), dst was just allocated for as many.
        unsafe {
            k.launch(
                &name("transpose"),
                grid,
                THREADS,
                stream,
                &mut [arg(&mut x), arg(&mut rows), arg(&mut cols), arg(&mut dst)],
            )?
        };
        x = t.ptr;
        _transposed = Some(t); // freed in stream order after the cast below
    }
    match l.scaling {
        Scaling::Tensor => {
            // SAFETY: as above; 4 bytes for the amax, zeroed before the amax kernel.
            let amax = unsafe { Scratch::alloc(4, stream)? };
            unsafe { cudarc::driver::result::memset_d8_async(amax.ptr, 0, 4, stream) }
                .map_err(status::driver("cuMemsetD8Async"))?;
            let mut a = amax.ptr;
            let mut n = rows * cols;
            let grid = (ctas(n as u64, 8 * THREADS as u64), 1, 1);
            // SAFETY: amax_T(const T* x, long n, u32* out).
            unsafe { k.launch(&name("amax"), grid, THREADS, stream, &mut [arg(&mut x), arg(&mut n), arg(&mut a)])? };
            let mut args = [
                arg(&mut x),
                arg(&mut rows),
                arg(&mut rows_alloc),
                arg(&mut cols),
                arg(&mut q),
                arg(&mut ld),
                arg(&mut a),
                arg(&mut sc),
                arg(&mut fmax),
                arg(&mut e5m2),
            ];
            if job.source == Source::Transposed {
                let grid = ((l.ld as u32).div_ceil(64), (l.rows_alloc as u32).div_ceil(64), 1);
                // SAFETY: cast_transpose_T(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2).
                unsafe { k.launch(&name("cast_transpose"), grid, THREADS, stream, &mut args) }
            } else {
                let grid = (ctas((l.rows_alloc * l.ld / 8) as u64, THREADS as u64), 1, 1);
                // SAFETY: cast_tensor_T(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2).
                unsafe { k.launch(&name("cast_tensor"), grid, THREADS, stream, &mut args) }
            }
        }
        Scaling::Row => {
            let grid = (l.rows_alloc as u32, 1, 1);
            // SAFETY: cast_rows_T(x, rows, cols, q, ld, scale, fmax, e5m2); one CTA per row.
            unsafe {
                k.launch(
                    &name("cast_rows"),
                    grid,
                    THREADS,
                    stream,
                    &mut [
                        arg(&mut x),
                        arg(&mut rows),
                        arg(&mut cols),
                        arg(&mut q),
                        arg(&mut ld),
                        arg(&mut sc),
                        arg(&mut fmax),
                        arg(&mut e5m2),
                    ],
                )
            }
        }
        Scaling::Block1x128 => {
            let groups = (l.rows_alloc * l.k_blocks()) as u64;
            // 128 / E lanes per group, E = 16 / element size (kernels/fp8.cu, `Chunk`)
            let per_cta = u64::from(THREADS) * (16 / job.dtype.size_bytes()) as u64 / 128;
            let ctas = u32::try_from(groups.div_ceil(per_cta)).map_err(|_| crate::error::Error::DimensionTooLarge {
                what: "1×128 groups of an FP8 quantisation",
                value: groups as usize,
                max: u32::MAX as usize,
            })?;
            let grid = (ctas, 1, 1);
            // SAFETY: cast_vec128_T(x, rows, rows_alloc, cols, q, ld, scale, fmax, e5m2); 128 / E lanes per group.
            unsafe {
                k.launch(
                    &name("cast_vec128"),
                    grid,
                    THREADS,
                    stream,
                    &mut [
                        arg(&mut x),
                        arg(&mut rows),
                        arg(&mut rows_alloc),
                        arg(&mut cols),
                        arg(&mut q),
                        arg(&mut ld),
                        arg(&mut sc),
                        arg(&mut fmax),
                        arg(&mut e5m2),
                    ],
                )
            }
        }
        Scaling::Block128x128 => {
            // the scale tensor's K padding (to a multiple of 4) is never written by the kernel
            // SAFETY: `scales` holds scale_len() f32s (caller).
            unsafe { cudarc::driver::result::memset_d8_async(sc, 0, l.scale_len() * 4, stream) }
                .map_err(status::driver("cuMemsetD8Async"))?;
            let mut scale_ld = l.scale_ld() as i64;
            let grid = (l.k_blocks() as u32, l.rows_alloc.div_ceil(128) as u32, 1);
            // SAFETY: cast_blk128_T(x, rows, rows_alloc, cols, q, ld, scale, scale_ld, fmax, e5m2).
            unsafe {
                k.launch(
                    &name("cast_blk128"),
                    grid,
                    THREADS,
                    stream,
                    &mut [
                        arg(&mut x),
                        arg(&mut rows),
                        arg(&mut rows_alloc),
                        arg(&mut cols),
                        arg(&mut q),
                        arg(&mut ld),
                        arg(&mut sc),
                        arg(&mut scale_ld),
                        arg(&mut fmax),
                        arg(&mut e5m2),
                    ],
                )
            }
        }
    }
}
