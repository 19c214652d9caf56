// gemmbridge's own kernels: FP8 quantisation (amax, cast per recipe, cast-transpose) and a
// plain transpose. Compiled at run time with NVRTC for the device's architecture (sm_89+:
// the cvt.rn.satfinite FP8 instructions). The rounding they implement is specified, and
// tested bit for bit, by src/fp8/quant.rs:
//   group scale s = amax / fmax, multiplier inv = fmax / amax (1 and 1 for amax == 0),
//   q = cvt.rn.satfinite(x * inv): round to nearest even, saturate to +-fmax, NaN stays NaN.
// Operands are row-major [rows, cols] sources written into [rows_alloc, ld] FP8 buffers whose
// padding (rows >= rows, cols >= cols) is written as zeros.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

struct F16 { u16 b; };
struct BF16 { u16 b; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(F16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.b));
    return f;
}
__device__ __forceinline__ float to_f(BF16 v) { return __uint_as_float(((u32)v.b) << 16); }

// Two values to two FP8 bytes, packed little-endian: lo in the low byte.
__device__ __forceinline__ u16 pack2(float lo, float hi, int e5m2) {
    u16 r;
    if (e5m2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

__device__ __forceinline__ u32 pack4(const float* v, float inv, int e5m2) {
    u32 a = pack2(__fmul_rn(v[0], inv), __fmul_rn(v[1], inv), e5m2);
    u32 b = pack2(__fmul_rn(v[2], inv), __fmul_rn(v[3], inv), e5m2);
    return a | (b << 16);
}

__device__ __forceinline__ void scale_of(float amax, float fmax, float* s, float* inv) {
    if (amax == 0.0f) {
        *s = 1.0f;
        *inv = 1.0f;
    } else {
        *s = __fdiv_rn(amax, fmax);
        *inv = __fdiv_rn(fmax, amax);
    }
}

__device__ __forceinline__ float warp_max(float m) {
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// The block's largest value, in every thread (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float block_max(float m) {
    __shared__ float part[32];
    m = warp_max(m);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = m;
    __syncthreads();
    m = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
    return warp_max(m);
}

// Loads n (<= 8) consecutive elements from p into v; the rest 0. `vec`: p is 16-byte aligned
// and n == 8 (f16/bf16: one 16-byte load; f32: two).
template <typename T>
__device__ __forceinline__ void load(const T* p, int n, bool vec, float* v) {
    if (vec && sizeof(T) == 2) {
        uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
        for (int j = 0; j < 8; j++) v[j] = to_f(e[j]);
    } else if (vec) {
        float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        for (int j = 0; j < 8; j++) v[j] = j < n ? to_f(p[j]) : 0.0f;
    }
}

// Largest magnitude of x[0..n) into *out (u32 bits of a non-negative float; zeroed before).
template <typename T>
__device__ void amax_impl(const T* x, long n, u32* out) {
    float m = 0.0f;
    bool vec = ((unsigned long)x & 15) == 0;
    long n8 = vec ? n / 8 : 0;
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    for (long i = tid; i < n8; i += stride) {
        float v[8];
        load(x + i * 8, 8, true, v);
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
    }
    for (long i = n8 * 8 + tid; i < n; i += stride) m = fmaxf(m, fabsf(to_f(x[i])));
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(out, __float_as_uint(m));
}

// Writes the 8 FP8 bytes at columns [c0, c0 + 8) of row r (zeros past cols or rows).
template <typename T>
__device__ __forceinline__ void cast8(const T* x, long rows, long cols, u8* q, long ld, long r, long c0, float inv, int e5m2) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < rows && c0 < cols) {
        const T* p = x + r * cols + c0;
        int n = cols - c0 < 8 ? (int)(cols - c0) : 8;
        bool vec = n == 8 && ((unsigned long)p & 15) == 0;
        load(p, n, vec, v);
    }
    uint2 o;
    o.x = pack4(v, inv, e5m2);
    o.y = pack4(v + 4, inv, e5m2);
    *reinterpret_cast<uint2*>(q + r * ld + c0) = o;
}

// Tensor-wise: one scale from the amax pass.
template <typename T>
__device__ void cast_tensor_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 const u32* amax, float* scale, float fmax, int e5m2) {
    float s, inv;
    scale_of(__uint_as_float(*amax), fmax, &s, &inv);
    long chunks = ld / 8, total = rows_alloc * chunks;
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    if (tid == 0) scale[0] = s;
    for (long i = tid; i < total; i += stride) cast8(x, rows, cols, q, ld, i / chunks, (i % chunks) * 8, inv, e5m2);
}

// Row-wise: one block per row; the row is read twice (the second time from L2).
template <typename T>
__device__ void cast_rows_impl(const T* x, long rows, long cols, u8* q, long ld, float* scale, float fmax, int e5m2) {
    long r = blockIdx.x;
    float m = 0.0f;
    if (r < rows) {
        const T* row = x + r * cols;
        for (long c = threadIdx.x * 8L; c < cols; c += blockDim.x * 8L) {
            float v[8];
            int n = cols - c < 8 ? (int)(cols - c) : 8;
            load(row + c, n, n == 8 && ((unsigned long)(row + c) & 15) == 0, v);
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
        }
    }
    m = block_max(m);
    float s, inv;
    scale_of(m, fmax, &s, &inv);
    if (threadIdx.x == 0) scale[r] = s;
    for (long c = threadIdx.x * 8L; c < ld; c += blockDim.x * 8L) cast8(x, rows, cols, q, ld, r, c, inv, e5m2);
}

// Four elements at columns [c, c + 4) of row r (zeros outside the source).
template <typename T>
__device__ __forceinline__ void load4(const T* x, long rows, long cols, long r, long c, float* v) {
    for (int j = 0; j < 4; j++) v[j] = (r < rows && c + j < cols) ? to_f(x[r * cols + c + j]) : 0.0f;
}

// 1x128 blocks: one warp per (row, K block); lane l holds columns kb*128 + 4l .. +3.
template <typename T>
__device__ void cast_vec128_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 float* scale, float fmax, int e5m2) {
    long kblocks = (cols + 127) / 128;
    long g = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (g >= rows_alloc * kblocks) return;  // whole warps leave together
    long r = g / kblocks, kb = g % kblocks;
    int lane = threadIdx.x & 31;
    long c = kb * 128 + lane * 4;
    float v[4];
    load4(x, rows, cols, r, c, v);
    float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    m = warp_max(m);
    float s, inv;
    scale_of(m, fmax, &s, &inv);
    if (lane == 0) scale[kb * rows_alloc + r] = s;
    if (c < ld) *reinterpret_cast<u32*>(q + r * ld + c) = pack4(v, inv, e5m2);
}

// 128x128 blocks: one block of 256 threads per (row block, K block); warp w holds rows
// w, w + 8, ..., lane l columns 4l .. 4l + 3 of the block. Read twice (the second from L1/L2).
template <typename T>
__device__ void cast_blk128_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 float* scale, long scale_ld, float fmax, int e5m2) {
    long rb = blockIdx.y, kb = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long c = kb * 128 + lane * 4;
    float m = 0.0f;
    for (int i = warp; i < 128; i += 8) {
        float v[4];
        load4(x, rows, cols, rb * 128 + i, c, v);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    }
    m = block_max(m);
    float s, inv;
    scale_of(m, fmax, &s, &inv);
    if (threadIdx.x == 0) scale[rb * scale_ld + kb] = s;
    for (int i = warp; i < 128; i += 8) {
        long r = rb * 128 + i;
        if (r >= rows_alloc || c >= ld) continue;
        float v[4];
        load4(x, rows, cols, r, c, v);
        *reinterpret_cast<u32*>(q + r * ld + c) = pack4(v, inv, e5m2);
    }
}

// Fused cast-transpose, tensor-wise: the source is [cols, rows] row-major (src[c*rows + r]);
// q[r, c] = fp8(src[c, r] * inv). 64x64 tiles through shared memory; grid (ld/64, rows_alloc/64).
template <typename T>
__device__ void cast_transpose_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                    const u32* amax, float* scale, float fmax, int e5m2) {
    __shared__ float tile[64][65];
    float s, inv;
    scale_of(__uint_as_float(*amax), fmax, &s, &inv);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = s;
    long c0 = blockIdx.x * 64L, r0 = blockIdx.y * 64L;
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int cc = ty; cc < 64; cc += 8) {
        for (int rr = tx; rr < 64; rr += 32) {
            long c = c0 + cc, r = r0 + rr;
            tile[cc][rr] = (c < cols && r < rows) ? to_f(x[c * rows + r]) : 0.0f;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
        int rr = i / 16, cc = (i % 16) * 4;
        long r = r0 + rr, c = c0 + cc;
        if (r >= rows_alloc || c >= ld) continue;
        float v[4] = {tile[cc][rr], tile[cc + 1][rr], tile[cc + 2][rr], tile[cc + 3][rr]};
        *reinterpret_cast<u32*>(q + r * ld + c) = pack4(v, inv, e5m2);
    }
}

// dst[r, c] = src[c, r] for a [cols, rows] row-major source; 32x32 tiles, grid (cols/32, rows/32).
template <typename T>
__device__ void transpose_impl(const T* src, long rows, long cols, T* dst) {
    __shared__ T tile[32][33];
    long c0 = blockIdx.x * 32L, r0 = blockIdx.y * 32L;
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int cc = ty; cc < 32; cc += 8) {
        long c = c0 + cc, r = r0 + tx;
        if (c < cols && r < rows) tile[cc][tx] = src[c * rows + r];
    }
    __syncthreads();
    for (int rr = ty; rr < 32; rr += 8) {
        long r = r0 + rr, c = c0 + tx;
        if (c < cols && r < rows) dst[r * cols + c] = tile[tx][rr];
    }
}

#define GB_INSTANTIATE(T, SUFFIX)                                                                       \
    extern "C" __global__ void amax_##SUFFIX(const T* x, long n, u32* out) { amax_impl(x, n, out); }    \
    extern "C" __global__ void cast_tensor_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, const u32* amax, float* scale,        \
                                                    float fmax, int e5m2) {                               \
        cast_tensor_impl(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);                     \
    }                                                                                                     \
    extern "C" __global__ void cast_rows_##SUFFIX(const T* x, long rows, long cols, u8* q, long ld,      \
                                                  float* scale, float fmax, int e5m2) {                   \
        cast_rows_impl(x, rows, cols, q, ld, scale, fmax, e5m2);                                          \
    }                                                                                                     \
    extern "C" __global__ void cast_vec128_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, float* scale, float fmax, int e5m2) { \
        cast_vec128_impl(x, rows, rows_alloc, cols, q, ld, scale, fmax, e5m2);                           \
    }                                                                                                     \
    extern "C" __global__ void cast_blk128_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, float* scale, long scale_ld,          \
                                                    float fmax, int e5m2) {                               \
        cast_blk128_impl(x, rows, rows_alloc, cols, q, ld, scale, scale_ld, fmax, e5m2);                 \
    }                                                                                                     \
    extern "C" __global__ void cast_transpose_##SUFFIX(const T* x, long rows, long rows_alloc,           \
                                                       long cols, u8* q, long ld, const u32* amax,        \
                                                       float* scale, float fmax, int e5m2) {              \
        cast_transpose_impl(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);                  \
    }                                                                                                     \
    extern "C" __global__ void transpose_##SUFFIX(const T* src, long rows, long cols, T* dst) {          \
        transpose_impl(src, rows, cols, dst);                                                             \
    }

GB_INSTANTIATE(float, f32)
GB_INSTANTIATE(F16, f16)
GB_INSTANTIATE(BF16, bf16)
