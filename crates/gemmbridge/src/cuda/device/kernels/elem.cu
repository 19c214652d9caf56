// The element types and conversions every elementwise kernel set shares (compiled in front
// of act.cu and layer.cu): f16 and bf16 as their bits, widened to f32 exactly and rounded from
// f32 to nearest even (NaN stays a NaN), and a pack of eight elements for 16-byte accesses.

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

__device__ __forceinline__ void from_f(float v, float* out) { *out = v; }
__device__ __forceinline__ void from_f(float v, F16* out) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    out->b = h;
}
__device__ __forceinline__ void from_f(float v, BF16* out) {
#if __CUDA_ARCH__ >= 800
    // one conversion instruction: round to nearest even, a NaN to a quiet NaN
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    out->b = h;
#else
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        out->b = (u16)((u >> 16) | 0x40u); // NaN stays a (quiet) NaN
    } else {
        u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
        out->b = (u16)(u >> 16);
    }
#endif
}

// Eight consecutive elements: one aligned 16-byte access for 16-bit types, two for f32.
template <typename T> struct __align__(16) Pack8 { T v[8]; };
