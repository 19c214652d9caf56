//! Stream-ordered scratch and copies: memory from the context's stream-ordered pool
//! (`cuMemAllocAsync` / `cuMemFreeAsync` on the call's stream, so that it is freed after the
//! work that uses it with no host wait), pitched 3-D copies and 2-D zero fills (the driver's),
//! and gemmbridge's own pitched copy with zero fill (`kernels/copy.cu`), which is much faster
//! where a pitch is not a multiple of 16 bytes.

use cudarc::driver::sys::{self as drv, CUmemorytype, CUstream};

use super::kernels::{arg, Kernels, GRID_X_MAX, GRID_Y_MAX};
use crate::cuda::status;
use crate::error::Result;

/// Threads per CTA and elements per thread of `kernels/copy.cu` (its `THREADS`, `UNROLL`).
const COPY_THREADS: usize = 256;
const COPY_UNROLL: usize = 8;

/// `depth` matrices of `rows × cols` elements of `esize` bytes copied into a destination of
/// `dst_rows × dst_cols` per matrix (at least as large), everything beyond the source's
/// extent written as zeros (all bits 0). Strides are in elements; row `r` of matrix `z`
/// starts at `base + (z·slice + r·ld)·esize` on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PadCopy {
    pub src: u64,
    pub src_ld: usize,
    pub src_slice: usize,
    pub dst: u64,
    pub dst_ld: usize,
    pub dst_slice: usize,
    pub rows: usize,
    pub cols: usize,
    pub dst_rows: usize,
    pub dst_cols: usize,
    pub depth: usize,
    /// Bytes per element: 2 or 4 (the kernel's instances).
    pub esize: usize,
}

impl PadCopy {
    /// The kernel instance and grid for this copy; `None` for an element size without an
    /// instance or a grid beyond the limits (the caller copies with the driver instead).
    /// An empty destination gives a grid with a zero dimension (nothing to launch).
    pub fn launch(&self) -> Option<(&'static str, (u32, u32, u32))> {
        let name = match self.esize {
            2 => "pad_copy_b2",
            4 => "pad_copy_b4",
            _ => return None,
        };
        let x = self.dst_cols.div_ceil(COPY_THREADS * COPY_UNROLL);
        // more rows than a grid's y holds: the kernel loops over the rest
        let y = self.dst_rows.checked_mul(self.depth)?.min(GRID_Y_MAX as usize);
        (x as u64 <= GRID_X_MAX).then_some((name, (x as u32, y as u32, 1)))
    }
}

/// Enqueues `c` on `stream` with `k` (the copy kernels); `false` (nothing enqueued) where
/// [`PadCopy::launch`] has no launch for it.
///
/// # Safety
/// Both regions are device memory of the current context valid for what `c` describes, and
/// do not overlap; `stream` is a live stream of `k`'s context.
pub(crate) unsafe fn pad_copy(k: &Kernels, c: &PadCopy, stream: CUstream) -> Result<bool> {
    let Some((name, grid)) = c.launch() else { return Ok(false) };
    if grid.0 == 0 || grid.1 == 0 {
        return Ok(true);
    }
    let (mut src, mut dst) = (c.src, c.dst);
    let [mut src_ld, mut src_slice, mut dst_ld, mut dst_slice, mut rows, mut cols, mut dst_rows, mut dst_cols, mut depth] =
        [c.src_ld, c.src_slice, c.dst_ld, c.dst_slice, c.rows, c.cols, c.dst_rows, c.dst_cols, c.depth]
            .map(|v| v as i64);
    let mut args = [
        arg(&mut src),
        arg(&mut src_ld),
        arg(&mut src_slice),
        arg(&mut dst),
        arg(&mut dst_ld),
        arg(&mut dst_slice),
        arg(&mut rows),
        arg(&mut cols),
        arg(&mut dst_rows),
        arg(&mut dst_cols),
        arg(&mut depth),
    ];
    // SAFETY: the arguments match copy.cu's signature (two pointers, nine long longs); the
    // regions are the caller's contract; the grid covers the destination's columns and rows.
    unsafe { k.launch(name, grid, COPY_THREADS as u32, stream, &mut args) }?;
    Ok(true)
}

/// Device memory from the stream-ordered pool, freed on the stream it was allocated on.
pub(crate) struct Scratch {
    pub ptr: u64,
    stream: CUstream,
}

impl Scratch {
    /// `bytes` (> 0) allocated in stream order on `stream` (usable by work enqueued on it
    /// from now on).
    ///
    /// # Safety
    /// `stream` is a live stream of the current context.
    pub unsafe fn alloc(bytes: usize, stream: CUstream) -> Result<Scratch> {
        // SAFETY: the caller's contract.
        let ptr = unsafe { cudarc::driver::result::malloc_async(stream, bytes.max(1)) }
            .map_err(status::driver("cuMemAllocAsync"))?;
        Ok(Scratch { ptr, stream })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Freed in stream order: after everything enqueued on the stream so far has run.
        // SAFETY: allocated on this stream in `alloc`, freed once.
        let _ = unsafe { cudarc::driver::result::free_async(self.ptr, self.stream) };
    }
}

/// A pitched copy of `depth` matrices of `height` rows of `width_bytes` each, between device
/// buffers: row `i` of matrix `z` starts at `base + z·slice + i·pitch` on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pitched {
    pub src: u64,
    pub src_pitch: usize,
    /// Bytes from one matrix to the next (a multiple of `src_pitch`).
    pub src_slice: usize,
    pub dst: u64,
    pub dst_pitch: usize,
    /// Bytes from one matrix to the next (a multiple of `dst_pitch`).
    pub dst_slice: usize,
    pub width_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

impl Pitched {
    /// The same copy the other way (destination to source).
    pub fn reversed(self) -> Pitched {
        Pitched {
            src: self.dst,
            src_pitch: self.dst_pitch,
            src_slice: self.dst_slice,
            dst: self.src,
            dst_pitch: self.src_pitch,
            dst_slice: self.src_slice,
            ..self
        }
    }
}

/// Enqueues `c` on `stream` (one `cuMemcpy3DAsync`).
///
/// # Safety
/// Both regions are device memory of the current context valid for what `c` describes, and
/// do not overlap; `stream` is live.
pub(crate) unsafe fn copy_pitched(c: &Pitched, stream: CUstream) -> Result<()> {
    if c.width_bytes == 0 || c.height == 0 || c.depth == 0 {
        return Ok(());
    }
    let p = descriptor(c);
    // SAFETY: the caller's contract; `p` describes only those regions.
    unsafe { drv::cuMemcpy3DAsync_v2(&p, stream) }.result().map_err(status::driver("cuMemcpy3DAsync"))
}

/// The `CUDA_MEMCPY3D` of `c`: device to device, every field named (CUmemorytype has no zero
/// value, so the struct cannot be zeroed); the slice heights are the slice strides in rows.
fn descriptor(c: &Pitched) -> drv::CUDA_MEMCPY3D {
    let null = std::ptr::null_mut();
    let device = CUmemorytype::CU_MEMORYTYPE_DEVICE;
    drv::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: c.src,
        srcArray: null as _,
        reserved0: null,
        srcPitch: c.src_pitch,
        srcHeight: c.src_slice.checked_div(c.src_pitch).unwrap_or(0).max(c.height),
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: null,
        dstDevice: c.dst,
        dstArray: null as _,
        reserved1: null,
        dstPitch: c.dst_pitch,
        dstHeight: c.dst_slice.checked_div(c.dst_pitch).unwrap_or(0).max(c.height),
        WidthInBytes: c.width_bytes,
        Height: c.height,
        Depth: c.depth,
    }
}

/// Enqueues zeros into `height` rows of `width_bytes` bytes, `pitch` bytes apart, from `dst`
/// (one `cuMemsetD2D8Async`).
///
/// # Safety
/// The region is device memory of the current context; `stream` is live.
pub(crate) unsafe fn zero_pitched(
    dst: u64,
    pitch: usize,
    width_bytes: usize,
    height: usize,
    stream: CUstream,
) -> Result<()> {
    if width_bytes == 0 || height == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    unsafe { drv::cuMemsetD2D8Async(dst, pitch.max(width_bytes), 0, width_bytes, height, stream) }
        .result()
        .map_err(status::driver("cuMemsetD2D8Async"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pad(rows: usize, cols: usize, dst_rows: usize, dst_cols: usize, depth: usize, esize: usize) -> PadCopy {
        PadCopy {
            src: 0x1000,
            src_ld: cols,
            src_slice: rows * cols,
            dst: 0x100000,
            dst_ld: dst_cols.next_multiple_of(8),
            dst_slice: dst_rows * dst_cols.next_multiple_of(8),
            rows,
            cols,
            dst_rows,
            dst_cols,
            depth,
            esize,
        }
    }

    #[test]
    fn the_copy_grid_covers_every_destination_column_and_row() {
        // x[4096, 2047] f16 into [4096, 2048]: one 2048-column segment per row
        assert_eq!(pad(4096, 2047, 4096, 2048, 1, 2).launch(), Some(("pad_copy_b2", (1, 4096, 1))));
        // 2049 columns need a second segment; f32 picks the 4-byte instance
        assert_eq!(pad(10, 2049, 10, 2049, 3, 4).launch(), Some(("pad_copy_b4", (2, 30, 1))));
        // more rows than a grid's y: capped, the kernel loops over the rest
        assert_eq!(pad(70000, 8, 70001, 8, 2, 2).launch(), Some(("pad_copy_b2", (1, 65535, 1))));
        // empty: a zero dimension (nothing is launched)
        assert_eq!(pad(0, 0, 0, 0, 1, 2).launch().unwrap().1 .1, 0);
        // no instance for 1- or 8-byte elements: the driver copies instead
        assert_eq!(pad(4, 4, 4, 4, 1, 1).launch(), None);
        assert_eq!(pad(4, 4, 4, 4, 1, 8).launch(), None);
    }

    #[test]
    fn the_copy_descriptor_is_device_to_device_with_slice_heights_in_rows() {
        let c = Pitched {
            src: 0x1000,
            src_pitch: 4094,
            src_slice: 4094 * 70,
            dst: 0x9000,
            dst_pitch: 4096,
            dst_slice: 4096 * 64,
            width_bytes: 4094,
            height: 64,
            depth: 3,
        };
        let d = descriptor(&c);
        assert_eq!((d.srcDevice, d.dstDevice), (0x1000, 0x9000));
        assert_eq!(
            (d.srcMemoryType, d.dstMemoryType),
            (CUmemorytype::CU_MEMORYTYPE_DEVICE, CUmemorytype::CU_MEMORYTYPE_DEVICE)
        );
        assert_eq!((d.srcPitch, d.srcHeight, d.dstPitch, d.dstHeight), (4094, 70, 4096, 64));
        assert_eq!((d.WidthInBytes, d.Height, d.Depth), (4094, 64, 3));
        assert!(d.srcArray.is_null() && d.dstArray.is_null() && d.srcHost.is_null() && d.dstHost.is_null());
        // one matrix: a slice stride of 0 (batch stride of a single matrix) still gives height
        let one = descriptor(&Pitched { src_slice: 0, dst_slice: 0, depth: 1, ..c });
        assert_eq!((one.srcHeight, one.dstHeight), (64, 64));
        // reversed: the same rows, from the destination back to the source
        let back = descriptor(&c.reversed());
        assert_eq!((back.srcDevice, back.srcPitch, back.srcHeight), (0x9000, 4096, 64));
        assert_eq!((back.dstDevice, back.dstPitch, back.dstHeight), (0x1000, 4094, 70));
        assert_eq!((back.WidthInBytes, back.Height, back.Depth), (4094, 64, 3));
    }

    /// What `kernels/copy.cu` must write, computed on the CPU: `dst` (poisoned) with every
    /// destination element set to the source's or zero; the pad beyond `dst_cols` untouched.
    fn expected<T: Copy + Default>(c: &PadCopy, src: &[T], dst: &mut [T]) {
        for z in 0..c.depth {
            for r in 0..c.dst_rows {
                for col in 0..c.dst_cols {
                    let v = if r < c.rows && col < c.cols {
                        src[z * c.src_slice + r * c.src_ld + col]
                    } else {
                        T::default()
                    };
                    dst[z * c.dst_slice + r * c.dst_ld + col] = v;
                }
            }
        }
    }

    /// One copy on the GPU against [`expected`], bit for bit, with poisoned destinations.
    fn check_on_gpu<T>(k: &Kernels, stream: &std::sync::Arc<cudarc::driver::CudaStream>, c: PadCopy, poison: T)
    where
        T: Copy + Default + PartialEq + std::fmt::Debug + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
        rand::distr::StandardUniform: rand::distr::Distribution<T>,
    {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        use rand::Rng;
        let src_len = (c.depth - 1) * c.src_slice + c.rows.saturating_sub(1) * c.src_ld + c.cols;
        let dst_len = (c.depth - 1) * c.dst_slice + c.dst_rows.saturating_sub(1) * c.dst_ld + c.dst_ld;
        let mut rng = rand::rng();
        let src: Vec<T> = (0..src_len).map(|_| rng.random()).collect();
        let mut want = vec![poison; dst_len];
        expected(&c, &src, &mut want);
        let d_src = stream.clone_htod(&src).unwrap();
        let mut d_dst = stream.clone_htod(&vec![poison; dst_len]).unwrap();
        {
            let (s, _g) = d_src.device_ptr(stream);
            let (d, _h) = d_dst.device_ptr_mut(stream);
            // SAFETY: both buffers sized for the copy above; our stream.
            let launched = unsafe { pad_copy(k, &PadCopy { src: s, dst: d, ..c }, stream.cu_stream()) }.unwrap();
            assert!(launched, "{c:?}");
        }
        let got = stream.clone_dtoh(&d_dst).unwrap();
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(bad, None, "first difference at {bad:?} for {c:?}");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_copy_kernel_writes_what_the_cpu_says_bit_for_bit() {
        let ctx = cudarc::driver::CudaContext::new(0).expect("a CUDA GPU");
        let stream = ctx.default_stream();
        let cc = ctx.compute_capability().unwrap();
        let k = Kernels::compile(&ctx, cc, super::super::KernelSet::Copy).expect("NVRTC");
        let mut cases = vec![
            // x[300, 2047] (ld off 16 bytes) into [300, 2048] with a zero column
            PadCopy { src_ld: 2047, dst_ld: 2048, ..pad(300, 2047, 300, 2048, 1, 2) },
            // w[2047, 520] into [2048, 520]: a zero row; more than one column segment
            PadCopy { src_ld: 520, dst_ld: 520, ..pad(2047, 520, 2048, 520, 1, 2) },
            // three matrices with slices larger than rows·ld, K and N extended
            PadCopy { src_ld: 37, src_slice: 37 * 50, dst_ld: 40, dst_slice: 40 * 48, ..pad(45, 33, 48, 40, 3, 2) },
            // back out: aligned scratch [64, 4096] into the caller's C[64, 4095] with ld 4095
            PadCopy { src_ld: 4096, src_slice: 0, dst_ld: 4095, dst_slice: 0, ..pad(64, 4095, 64, 4095, 1, 2) },
            // more rows than a grid's y holds (the kernel's row loop)
            PadCopy { src_ld: 3, src_slice: 0, dst_ld: 8, dst_slice: 0, ..pad(70_000, 3, 70_001, 8, 1, 2) },
        ];
        for c in cases.drain(..) {
            check_on_gpu::<u16>(&k, &stream, c, 0xffff);
        }
        // 4-byte elements: f32 with ld 1022 into 1024
        let c = PadCopy { src_ld: 1022, dst_ld: 1024, ..pad(129, 1022, 129, 1024, 2, 4) };
        check_on_gpu::<u32>(&k, &stream, PadCopy { src_slice: 129 * 1022, dst_slice: 129 * 1024, ..c }, u32::MAX);
    }
}
