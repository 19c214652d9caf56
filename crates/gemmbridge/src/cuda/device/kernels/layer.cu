// gemmbridge's own kernels for a transformer layer's elementwise operations: RoPE in place on
// a fused QKV projection's output, SwiGLU and its backward (src/layer_ops/ defines both;
// src/layer_ops/arith.rs is the CPU twin of every function here, operation for operation).
// Compiled at run time with NVRTC, after elem.cu. Each input is widened to f32 exactly and
// each result rounded once to the storage type (round to nearest even). Every arithmetic
// operation is a correctly rounded IEEE operation written as an intrinsic (__fmul_rn,
// __fadd_rn, __fsub_rn, __frcp_rn, __fmaf_rn, __dmul_rn, __fma_rn), which the compiler never
// contracts or reorders (a fused multiply-add is one only where written), and no math-library
// function is called, so the results equal the CPU's bit for bit.
//
// RoPE: pair i < r/2 of a head is (x1, x2) = (x[i], x[i + r/2]) ("neox", rotate-half) or
// (x[2i], x[2i+1]) ("gptj", interleaved), rotated as
//   x1' = x1·c − x2·s,   x2' = x2·c + x1·s
// with (c, s) = (cos_t[p·r/2 + i], sin_t[p·r/2 + i]) from the caller's tables, or
// cos_sin(p·inv_freq[i]) (cos_sin below: an f64 reduction and Taylor polynomials, rounded to
// f32), and s negated for the backward. p = pos[token] (int32 per token) or start + token % seq;
// a position outside 0..max_pos makes the token's rotated elements NaN (the tables are never
// read out of bounds; for angles from θ max_pos is 2^24).
//   rope_{neox,gptj}[_v8]_T(T* qkv, long long ld, long long tokens, int seq, int heads,
//       int head_dim, int half, int groups, int start, const int* pos, const float* cos_t,
//       const float* sin_t, int max_pos, int backward, Freqs inv_freq)
// One thread per (token, group g of heads, unit of P pairs): it computes its P cosines and sines
// once and rotates them in heads g, g + groups, … (the q heads, then the k heads: `heads` in
// all), four heads' loads issued before their stores. P = 8 for neox_v8 (two 16-byte accesses a
// head), 4 for gptj_v8 (one), 1 for the scalar instances. The launcher checks the 8-wide
// instances' alignment: ld, head_dim and half (neox) or r (gptj) multiples of 8, qkv 16-byte
// aligned.
//
// SwiGLU over a [rows, 2f] input (rows ld_in apart; g and u its halves, or interleaved
// g0,u0,g1,u1,…), output [rows, f] (rows ld_out apart):
//   σ(g) = (g < 0 ? e : 1)·rcp(1 + e),  e = exp_neg(−|g|)
//   y = (g·σ)·u;   dg = (dy·u)·(σ·fma(g, 1 − σ, 1)),   du = dy·(g·σ)
// dg and du go where g and u lie, in a buffer laid out as the input.
//   swiglu_T(const T* gu, T* y, long long rows, long long f, long long ld_in, long long ld_out, int il)
//   dswiglu_T(const T* dy, const T* gu, T* dgu, long long rows, long long f, long long ld_in,
//       long long ld_out, int il)
// and eight outputs a thread per step in 16-byte accesses (f, ld_in, ld_out multiples of 8,
// 16-byte aligned buffers, rows·f/8 below 2^31; the launcher checks):
//   swiglu[_il]_v8_T(const T* gu, T* y, unsigned n8, unsigned f8, long long ld_in, long long ld_out)
//   dswiglu[_il]_v8_T(const T* dy, const T* gu, T* dgu, unsigned n8, unsigned f8, long long ld_in,
//       long long ld_out)

// Elements packed for one access: N of them, aligned to A bytes (16 for the 8-wide instances,
// the element's size for the scalar ones).
template <typename T, int N, int A> struct __align__(A) Pack { T v[N]; };

// ---- RoPE ----

// The r/2 frequencies of angles from θ (the launcher's f32 values; unused with tables).
struct Freqs { float v[256]; };

#define K_TWO_OVER_PI 0.6366197723675814
#define K_PIO2_1 1.5707963267948966
#define K_PIO2_2 6.123233995736766e-17
#define K_PIO2_3 -1.4973849048591698e-33

// (cos a, sin a) rounded to f32: n = rint(a·2/π), r = a − n·π/2 (three fused steps, the first
// exact), z = r², sin r = r + (r·z)·S(z), cos r = 1 + z·C(z) (S, C: the Taylor coefficients
// ±1/k!, Horner's rule with fused multiply-adds), the quadrant n mod 4 picking and signing them.
__device__ __forceinline__ void cos_sin(float a, float* c, float* s) {
    const double x = (double)a;
    const double n = rint(__dmul_rn(x, K_TWO_OVER_PI));
    double r = __fma_rn(-n, K_PIO2_1, x);
    r = __fma_rn(-n, K_PIO2_2, r);
    r = __fma_rn(-n, K_PIO2_3, r);
    const double z = __dmul_rn(r, r);
    double ps = 1.6059043836821613e-10;
    ps = __fma_rn(ps, z, -2.505210838544172e-08);
    ps = __fma_rn(ps, z, 2.7557319223985893e-06);
    ps = __fma_rn(ps, z, -0.0001984126984126984);
    ps = __fma_rn(ps, z, 0.008333333333333333);
    ps = __fma_rn(ps, z, -0.16666666666666666);
    const double sn = __fma_rn(__dmul_rn(r, z), ps, r);
    double pc = -1.1470745597729725e-11;
    pc = __fma_rn(pc, z, 2.08767569878681e-09);
    pc = __fma_rn(pc, z, -2.755731922398589e-07);
    pc = __fma_rn(pc, z, 2.48015873015873e-05);
    pc = __fma_rn(pc, z, -0.001388888888888889);
    pc = __fma_rn(pc, z, 0.041666666666666664);
    pc = __fma_rn(pc, z, -0.5);
    const double cs = __fma_rn(z, pc, 1.0);
    const long long q = ((long long)n) & 3;
    const double cc = q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn;
    const double ss = q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs;
    *c = __double2float_rn(cc);
    *s = __double2float_rn(ss);
}

// The (cos, sin) of pair i at position p, the sine negated for the backward; NaN for a position
// outside 0..max_pos.
__device__ __forceinline__ void pair_cos_sin(int p, int i, int half, int max_pos, const float* cos_t,
                                             const float* sin_t, const Freqs& f, int backward, float* c,
                                             float* s) {
    if (p < 0 || p >= max_pos) {
        *c = __int_as_float(0x7fc00000);
        *s = *c;
        return;
    }
    if (cos_t) {
        const long long at = (long long)p * half + i;
        *c = cos_t[at];
        *s = sin_t[at];
    } else {
        cos_sin(__fmul_rn((float)p, f.v[i]), c, s);
    }
    if (backward) *s = -*s;
}

// Rotates the pairs of one head held in a (and b for neox) by (c, s).
template <typename T, int P, bool NEOX, typename V>
__device__ __forceinline__ void rotate(V& a, V& b, const float* c, const float* s) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const float x1 = NEOX ? to_f(a.v[j]) : to_f(a.v[2 * j]);
        const float x2 = NEOX ? to_f(b.v[j]) : to_f(a.v[2 * j + 1]);
        const float o1 = __fsub_rn(__fmul_rn(x1, c[j]), __fmul_rn(x2, s[j]));
        const float o2 = __fadd_rn(__fmul_rn(x2, c[j]), __fmul_rn(x1, s[j]));
        if (NEOX) {
            from_f(o1, &a.v[j]);
            from_f(o2, &b.v[j]);
        } else {
            from_f(o1, &a.v[2 * j]);
            from_f(o2, &a.v[2 * j + 1]);
        }
    }
}

struct RopeShape {
    long long ld, tokens;
    int seq, heads, head_dim, half, groups, start, max_pos, backward;
};

template <typename T, int P, bool NEOX, int A>
__device__ __forceinline__ void rope(T* qkv, const RopeShape& sh, const int* pos, const float* cos_t,
                                     const float* sin_t, const Freqs& f) {
    constexpr int N = NEOX ? P : 2 * P; // elements per access
    typedef Pack<T, N, A> V;
    const int units = sh.half / P;
    const long long items = sh.tokens * sh.groups * units;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (long long)gridDim.x * blockDim.x) {
        const int u = (int)(it % units);
        const long long rest = it / units;
        const int g = (int)(rest % sh.groups);
        const long long tok = rest / sh.groups;
        const int p = pos ? pos[tok] : sh.start + (int)(tok % sh.seq);
        float c[P], s[P];
#pragma unroll
        for (int j = 0; j < P; ++j)
            pair_cos_sin(p, u * P + j, sh.half, sh.max_pos, cos_t, sin_t, f, sh.backward, &c[j], &s[j]);
        T* row = qkv + tok * sh.ld + u * N;
        for (int h = g; h < sh.heads; h += 4 * sh.groups) {
            V a[4], b[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                if (h + k * sh.groups < sh.heads) {
                    const T* x = row + (long long)(h + k * sh.groups) * sh.head_dim;
                    a[k] = *reinterpret_cast<const V*>(x);
                    if (NEOX) b[k] = *reinterpret_cast<const V*>(x + sh.half);
                }
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                if (h + k * sh.groups < sh.heads) {
                    rotate<T, P, NEOX>(a[k], b[k], c, s);
                    T* x = row + (long long)(h + k * sh.groups) * sh.head_dim;
                    *reinterpret_cast<V*>(x) = a[k];
                    if (NEOX) *reinterpret_cast<V*>(x + sh.half) = b[k];
                }
            }
        }
    }
}

// ---- SwiGLU ----

#define K_LN2_HI 0.693359375f
#define K_LN2_LO -2.121944400e-4f
#define K_LOG2E 1.442695041f

// e^x for x <= 0: 0 below −87; j = rint(x·log2 e), r = fma(−j, LN2_LO, fma(−j, LN2_HI, x)) (the
// inner one exact), e^r = fma(r², P(r), r) + 1 (Cephes' expf polynomial by Horner's rule in fused
// multiply-adds), times 2^j (exact: the result is normal).
__device__ __forceinline__ float exp_neg(float x) {
    if (x < -87.0f) return 0.0f;
    const float j = rintf(__fmul_rn(x, K_LOG2E));
    const float r = __fmaf_rn(-j, K_LN2_LO, __fmaf_rn(-j, K_LN2_HI, x));
    float p = 1.9875691500e-4f;
    p = __fmaf_rn(p, r, 1.3981999507e-3f);
    p = __fmaf_rn(p, r, 8.3334519073e-3f);
    p = __fmaf_rn(p, r, 4.1665795894e-2f);
    p = __fmaf_rn(p, r, 1.6666665459e-1f);
    p = __fmaf_rn(p, r, 5.0000001201e-1f);
    const float e = __fadd_rn(__fmaf_rn(__fmul_rn(r, r), p, r), 1.0f);
    return __fmul_rn(e, __int_as_float(((int)j + 127) << 23));
}

__device__ __forceinline__ float sigmoid(float g) {
    const float e = exp_neg(-fabsf(g));
    const float t = __frcp_rn(__fadd_rn(1.0f, e));
    return g < 0.0f ? __fmul_rn(e, t) : t;
}

__device__ __forceinline__ float swiglu(float g, float u) { return __fmul_rn(__fmul_rn(g, sigmoid(g)), u); }

__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, float* dg, float* du) {
    const float s = sigmoid(g);
    const float dsilu = __fmul_rn(s, __fmaf_rn(g, __fsub_rn(1.0f, s), 1.0f));
    *dg = __fmul_rn(__fmul_rn(dy, u), dsilu);
    *du = __fmul_rn(dy, __fmul_rn(g, s));
}

#define GRID_STRIDE_LL(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

template <typename T>
__device__ __forceinline__ void swiglu_s(const T* gu, T* y, long long rows, long long f, long long ld_in,
                                         long long ld_out, int il) {
    GRID_STRIDE_LL(i, rows * f) {
        const long long r = i / f, j = i - r * f;
        const T* in = gu + r * ld_in;
        const float g = to_f(in[il ? 2 * j : j]), u = to_f(in[il ? 2 * j + 1 : f + j]);
        from_f(swiglu(g, u), &y[r * ld_out + j]);
    }
}

template <typename T>
__device__ __forceinline__ void dswiglu_s(const T* dy, const T* gu, T* dgu, long long rows, long long f,
                                          long long ld_in, long long ld_out, int il) {
    GRID_STRIDE_LL(i, rows * f) {
        const long long r = i / f, j = i - r * f;
        const long long gi = r * ld_in + (il ? 2 * j : j), ui = r * ld_in + (il ? 2 * j + 1 : f + j);
        float dg, du;
        swiglu_grad(to_f(dy[r * ld_out + j]), to_f(gu[gi]), to_f(gu[ui]), &dg, &du);
        from_f(dg, &dgu[gi]);
        from_f(du, &dgu[ui]);
    }
}

typedef unsigned long long u64;

// Unit c of eight outputs: its row and the offsets of its g, u (the 8-wide pack of each, or for
// interleaved the two packs of 16 elements) and of its output.
struct Unit {
    u64 in, out, up;
};

template <bool IL>
__device__ __forceinline__ Unit unit(unsigned c, unsigned f8, long long ld_in, long long ld_out) {
    const unsigned r = c / f8, j8 = c - r * f8;
    Unit w;
    w.in = (u64)r * ld_in + (IL ? 16ull * j8 : 8ull * j8);
    w.up = IL ? w.in + 8 : (u64)r * ld_in + 8ull * f8 + 8ull * j8;
    w.out = (u64)r * ld_out + 8ull * j8;
    return w;
}

// The eight (g, u) of a unit from its two packs a (at w.in) and b (at w.up).
template <typename T, bool IL>
__device__ __forceinline__ void split(const Pack<T, 8, 16>& a, const Pack<T, 8, 16>& b, float* g, float* u) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (IL) {
            const Pack<T, 8, 16>& h = j < 4 ? a : b;
            g[j] = to_f(h.v[2 * (j & 3)]);
            u[j] = to_f(h.v[2 * (j & 3) + 1]);
        } else {
            g[j] = to_f(a.v[j]);
            u[j] = to_f(b.v[j]);
        }
    }
}

template <typename T, bool IL>
__device__ __forceinline__ void swiglu_v8(const T* __restrict__ gu, T* __restrict__ y, unsigned n8, unsigned f8,
                                          long long ld_in, long long ld_out) {
    typedef Pack<T, 8, 16> V;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += gridDim.x * blockDim.x) {
        const Unit w = unit<IL>(c, f8, ld_in, ld_out);
        const V a = *reinterpret_cast<const V*>(gu + w.in), b = *reinterpret_cast<const V*>(gu + w.up);
        float g[8], u[8];
        split<T, IL>(a, b, g, u);
        V o;
#pragma unroll
        for (int j = 0; j < 8; ++j) from_f(swiglu(g[j], u[j]), &o.v[j]);
        *reinterpret_cast<V*>(y + w.out) = o;
    }
}

template <typename T, bool IL>
__device__ __forceinline__ void dswiglu_v8(const T* __restrict__ dy, const T* __restrict__ gu, T* __restrict__ dgu,
                                           unsigned n8, unsigned f8, long long ld_in, long long ld_out) {
    typedef Pack<T, 8, 16> V;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += gridDim.x * blockDim.x) {
        const Unit w = unit<IL>(c, f8, ld_in, ld_out);
        const V d = *reinterpret_cast<const V*>(dy + w.out);
        const V a = *reinterpret_cast<const V*>(gu + w.in), b = *reinterpret_cast<const V*>(gu + w.up);
        float g[8], u[8];
        split<T, IL>(a, b, g, u);
        V oa, ob;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float dg, du;
            swiglu_grad(to_f(d.v[j]), g[j], u[j], &dg, &du);
            if (IL) {
                V& h = j < 4 ? oa : ob;
                from_f(dg, &h.v[2 * (j & 3)]);
                from_f(du, &h.v[2 * (j & 3) + 1]);
            } else {
                from_f(dg, &oa.v[j]);
                from_f(du, &ob.v[j]);
            }
        }
        *reinterpret_cast<V*>(dgu + w.in) = oa;
        *reinterpret_cast<V*>(dgu + w.up) = ob;
    }
}

#define ROPE_ARGS(T)                                                                                       \
    T *qkv, long long ld, long long tokens, int seq, int heads, int head_dim, int half, int groups, int start, \
        const int *pos, const float *cos_t, const float *sin_t, int max_pos, int backward,                   \
        const __grid_constant__ Freqs f
#define ROPE_CALL(T, P, NEOX, A)                                                                              \
    RopeShape sh = {ld, tokens, seq, heads, head_dim, half, groups, start, max_pos, backward};             \
    rope<T, P, NEOX, A>(qkv, sh, pos, cos_t, sin_t, f)

#define DEFINE(T, S)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256) rope_neox_v8_##S(ROPE_ARGS(T)) { ROPE_CALL(T, 8, true, 16); } \
    extern "C" __global__ void __launch_bounds__(256) rope_neox_##S(ROPE_ARGS(T)) { ROPE_CALL(T, 1, true, sizeof(T)); } \
    extern "C" __global__ void __launch_bounds__(256) rope_gptj_v8_##S(ROPE_ARGS(T)) { ROPE_CALL(T, 4, false, 16); } \
    extern "C" __global__ void __launch_bounds__(256) rope_gptj_##S(ROPE_ARGS(T)) { ROPE_CALL(T, 1, false, sizeof(T)); } \
    extern "C" __global__ void swiglu_##S(const T* gu, T* y, long long rows, long long f, long long ld_in,    \
                                          long long ld_out, int il) {                                        \
        swiglu_s<T>(gu, y, rows, f, ld_in, ld_out, il);                                                       \
    }                                                                                                         \
    extern "C" __global__ void dswiglu_##S(const T* dy, const T* gu, T* dgu, long long rows, long long f,     \
                                           long long ld_in, long long ld_out, int il) {                       \
        dswiglu_s<T>(dy, gu, dgu, rows, f, ld_in, ld_out, il);                                                \
    }                                                                                                         \
    extern "C" __global__ void swiglu_v8_##S(const T* gu, T* y, unsigned n8, unsigned f8, long long ld_in,    \
                                             long long ld_out) {                                              \
        swiglu_v8<T, false>(gu, y, n8, f8, ld_in, ld_out);                                                    \
    }                                                                                                         \
    extern "C" __global__ void swiglu_il_v8_##S(const T* gu, T* y, unsigned n8, unsigned f8, long long ld_in, \
                                                long long ld_out) {                                           \
        swiglu_v8<T, true>(gu, y, n8, f8, ld_in, ld_out);                                                     \
    }                                                                                                         \
    extern "C" __global__ void dswiglu_v8_##S(const T* dy, const T* gu, T* dgu, unsigned n8, unsigned f8,     \
                                              long long ld_in, long long ld_out) {                            \
        dswiglu_v8<T, false>(dy, gu, dgu, n8, f8, ld_in, ld_out);                                             \
    }                                                                                                         \
    extern "C" __global__ void dswiglu_il_v8_##S(const T* dy, const T* gu, T* dgu, unsigned n8, unsigned f8,  \
                                                 long long ld_in, long long ld_out) {                         \
        dswiglu_v8<T, true>(dy, gu, dgu, n8, f8, ld_in, ld_out);                                              \
    }

DEFINE(float, f32)
DEFINE(F16, f16)
DEFINE(BF16, bf16)
