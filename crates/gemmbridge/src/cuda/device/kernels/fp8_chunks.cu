// gemmbridge's own kernels: FP8 quantisation (amax, cast per recipe, cast-transpose) and a
// plain transpose — this file their types and helpers, fp8.cu the kernels (one NVRTC
// source). Compiled at run time with NVRTC for the device's architecture (sm_89+:
// the cvt.rn.satfinite FP8 instructions). The rounding they implement is specified, and
// tested bit for bit, by src/fp8/quant.rs:
//   group scale s = amax / fmax, multiplier inv = fmax / amax (1 and 1 for amax == 0; inv
//   = FLT_MAX and s = 1 / FLT_MAX where the division overflows),
//   q = cvt.rn.satfinite(x * inv): round to nearest even, saturate to +-fmax, NaN stays NaN.
// Operands are row-major [rows, cols] sources written into [rows_alloc, ld] FP8 buffers whose
// padding (rows >= rows, cols >= cols) is written as zeros.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

struct F16 { u16 b; };
struct BF16 { u16 b; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float f16_to_f32(u32 h);
__device__ __forceinline__ float to_f(F16 v) { return f16_to_f32(v.b); }
__device__ __forceinline__ float to_f(BF16 v) { return __uint_as_float(((u32)v.b) << 16); }

// The two 16-bit values of a 32-bit word (low half first) as floats.
// f16 bits to f32, exactly: one conversion instruction.
__device__ __forceinline__ float f16_to_f32(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)h));
    return f;
}
// Two f16 values of a word (the conversion instruction: widening them with integer
// arithmetic instead measured slower on the H200, 20-46 % of a copy against 35-59 %).
__device__ __forceinline__ void unpack2(u32 w, F16, float* v) {
    v[0] = f16_to_f32(w & 0xffffu);
    v[1] = f16_to_f32(w >> 16);
}
__device__ __forceinline__ void unpack2(u32 w, BF16, float* v) {
    v[0] = __uint_as_float(w << 16);
    v[1] = __uint_as_float(w & 0xffff0000u);
}

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
        // a group below fmax / FLT_MAX: the largest finite multiplier (zeros stay zeros), and
        // its reciprocal as the scale
        if (*inv == __int_as_float(0x7f800000)) {
            *inv = __int_as_float(0x7f7fffff);
            *s = __fdiv_rn(1.0f, *inv);
        }
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

__device__ __forceinline__ float max8(const float* v) {
    float m = 0.0f;
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
    return m;
}

__device__ __forceinline__ void store8(u8* q, const float* v, float inv, int e5m2) {
    uint2 o;
    o.x = pack4(v, inv, e5m2);
    o.y = pack4(v + 4, inv, e5m2);
    *reinterpret_cast<uint2*>(q) = o;
}

// A chunk: the 16 bytes one vector load brings, E = 16 / sizeof(T) elements (8 for the 16-bit
// types, 4 for f32). Kernels keep chunks raw in registers (4 registers each) and widen them
// to floats where they are used.
template <typename T>
struct Chunk {
    static const int E = 16 / sizeof(T);
};

__device__ __forceinline__ void widen(uint4 r, float, float* v) {
    v[0] = __uint_as_float(r.x);
    v[1] = __uint_as_float(r.y);
    v[2] = __uint_as_float(r.z);
    v[3] = __uint_as_float(r.w);
    v[4] = v[5] = v[6] = v[7] = 0.0f;
}
template <typename T>
__device__ __forceinline__ void widen(uint4 r, T, float* v) {
    unpack2(r.x, T(), v);
    unpack2(r.y, T(), v + 2);
    unpack2(r.z, T(), v + 4);
    unpack2(r.w, T(), v + 6);
}

template <typename T>
union Raw {
    uint4 u;
    T e[Chunk<T>::E];
};

// The chunk at columns [c, c + E) of row r of a row-major [rows, cols] source, zeros outside
// it: one 16-byte load where the chunk is inside and aligned.
template <typename T>
__device__ __forceinline__ uint4 load_chunk(const T* x, long rows, long cols, long r, long c) {
    const int E = Chunk<T>::E;
    const T* p = x + r * cols + c;
    if (r < rows && c + E <= cols && ((unsigned long)p & 15) == 0) return *reinterpret_cast<const uint4*>(p);
    Raw<T> t;
    t.u = make_uint4(0, 0, 0, 0);  // +0.0 in every format
    if (r < rows) {
        for (int j = 0; j < E; j++) {
            if (c + j < cols) t.e[j] = p[j];
        }
    }
    return t.u;
}

// Largest magnitude in a widened chunk (the unused lanes of an f32 chunk are zeros).
__device__ __forceinline__ float chunk_max(const float* v) { return max8(v); }

// Largest magnitude in a raw chunk, NaNs ignored (as fmaxf ignores them). f16 chunks are
// reduced as packed halves (sign bits cleared, then max.f16x2, which returns the other
// operand where one is NaN), so that only the last two values are widened: the widening
// conversions, not the memory, bounded the f16 kernels. The result is the same value.
template <typename T>
__device__ __forceinline__ float raw_absmax(uint4 r, T) {
    float v[8];
    widen(r, T(), v);
    return chunk_max(v);
}
__device__ __forceinline__ u32 hmax2(u32 a, u32 b) {
    u32 d;
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ float raw_absmax(uint4 r, F16) {
    const u32 m = 0x7fff7fffu;
    u32 w = hmax2(hmax2(r.x & m, r.y & m), hmax2(r.z & m, r.w & m));
    return fmaxf(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16));
}

// The E FP8 bytes of a widened chunk at q (8 bytes for 16-bit sources, 4 for f32).
template <typename T>
__device__ __forceinline__ void store_chunk(u8* q, const float* v, float inv, int e5m2) {
    if (Chunk<T>::E == 8) {
        store8(q, v, inv, e5m2);
    } else {
        *reinterpret_cast<u32*>(q) = pack4(v, inv, e5m2);
    }
}
