// gemmbridge's pitched copy with zero fill, for the misaligned-operand path (cuda/padded.rs):
//   pad_copy_bN(src, src_ld, src_slice, dst, dst_ld, dst_slice, rows, cols, dst_rows, dst_cols, depth)
// For every matrix z < depth, row r < dst_rows and column c < dst_cols:
//   dst[z·dst_slice + r·dst_ld + c] = (r < rows && c < cols) ? src[z·src_slice + r·src_ld + c] : 0
// with N-byte elements (b2: f16/bf16, b4: f32), moved as raw bits. Strides are in elements.
// It replaces a cuMemcpy3DAsync plus a cuMemsetD2D8Async: with a source pitch that is not a
// multiple of 16 bytes (the case this path exists for) the driver's copy ran at a fraction of
// the bandwidth of an aligned one (docs/DESIGN.md, Design rationale).
//
// Grid: x = column segments of THREADS·UNROLL elements; y = rows of all matrices, in steps of
// gridDim.y. Each thread moves UNROLL elements THREADS apart (every load and store of a warp
// is one contiguous run), loading all of them before storing any.

typedef unsigned short u16;
typedef unsigned int u32;

#define THREADS 256
#define UNROLL 8

template <typename T>
__device__ __forceinline__ void pad_copy(const T* __restrict__ src, long long src_ld, long long src_slice,
                                         T* __restrict__ dst, long long dst_ld, long long dst_slice,
                                         long long rows, long long cols, long long dst_rows, long long dst_cols,
                                         long long depth) {
    const long long c0 = (long long)blockIdx.x * (THREADS * UNROLL) + threadIdx.x;
    const long long all_rows = dst_rows * depth;
    for (long long zr = blockIdx.y; zr < all_rows; zr += gridDim.y) {
        const long long z = zr / dst_rows;
        const long long r = zr - z * dst_rows;
        const T* s = src + z * src_slice + r * src_ld;
        T* d = dst + z * dst_slice + r * dst_ld;
        const long long live = r < rows ? cols : 0; // columns of this row that come from src
        T v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const long long c = c0 + j * THREADS;
            v[j] = c < live ? s[c] : (T)0;
        }
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const long long c = c0 + j * THREADS;
            if (c < dst_cols) d[c] = v[j];
        }
    }
}

#define INSTANCE(name, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        name(const T* src, long long src_ld, long long src_slice, T* dst, long long dst_ld, long long dst_slice, \
             long long rows, long long cols, long long dst_rows, long long dst_cols, long long depth) {        \
        pad_copy<T>(src, src_ld, src_slice, dst, dst_ld, dst_slice, rows, cols, dst_rows, dst_cols, depth);   \
    }

INSTANCE(pad_copy_b2, u16)
INSTANCE(pad_copy_b4, u32)
