//! Stream-ordered scratch and copies: memory from the context's stream-ordered pool
//! (`cuMemAllocAsync` / `cuMemFreeAsync` on the call's stream, so that it is freed after the
//! work that uses it with no host wait), pitched 3-D copies and 2-D zero fills.

use cudarc::driver::sys::{self as drv, CUmemorytype, CUstream};

use crate::cuda::status;
use crate::error::Result;

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
}
