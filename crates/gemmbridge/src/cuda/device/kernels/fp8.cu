// The FP8 kernels themselves (amax, the casts per recipe, cast-transpose, transpose, the
// attention backward's scales): compiled as one source after fp8_chunks.cu, whose types,
// conversions, reductions and 16-byte chunk helpers they use (its header states the rounding).

// Largest magnitude of x[0..n) into *out (u32 bits of a non-negative float; zeroed before).
template <typename T>
__device__ void amax_impl(const T* x, long n, u32* out) {
    const int E = Chunk<T>::E;
    float m = 0.0f;
    bool vec = ((unsigned long)x & 15) == 0;
    long nc = vec ? n / E : 0;
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    for (long i = tid; i < nc; i += stride) {
        m = fmaxf(m, raw_absmax(reinterpret_cast<const uint4*>(x)[i], T()));
    }
    for (long i = nc * E + tid; i < n; i += stride) m = fmaxf(m, fabsf(to_f(x[i])));
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(out, __float_as_uint(m));
}

// Tensor-wise: one scale from the amax pass; each thread loads CAST_UNROLL chunks (spaced a
// grid apart, so a warp's loads stay contiguous) before it converts and stores them, so that
// more loads are in flight per thread.
#define CAST_UNROLL 2
template <typename T>
__device__ void cast_tensor_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 const u32* amax, float* scale, float fmax, int e5m2) {
    const int E = Chunk<T>::E;
    float s, inv;
    scale_of(__uint_as_float(*amax), fmax, &s, &inv);
    long chunks = ld / E, total = rows_alloc * chunks;
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    if (tid == 0) scale[0] = s;
    for (long base = tid; base < total; base += stride * CAST_UNROLL) {
        uint4 raw[CAST_UNROLL];
        long at[CAST_UNROLL];
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; u++) {
            long i = base + u * stride;
            at[u] = -1;
            if (i < total) {
                long r = i / chunks, c = (i - r * chunks) * E;
                raw[u] = load_chunk(x, rows, cols, r, c);
                at[u] = r * ld + c;
            }
        }
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; u++) {
            if (at[u] >= 0) {
                float v[8];
                widen(raw[u], T(), v);
                store_chunk<T>(q + at[u], v, inv, e5m2);
            }
        }
    }
}

// Row-wise: one CTA per row. The first ROW_CACHE chunks per thread (8: 16384 columns of a
// 16-bit source, 8192 of f32, at 256 threads) stay in registers between the amax and the
// cast; a longer row's rest is read again. The instance with ROW_CACHE 4 (`cast_rows_short`,
// for rows of up to half that) needs fewer registers, so more CTAs share an SM.
template <typename T, int ROW_CACHE>
__device__ void cast_rows_impl(const T* x, long rows, long cols, u8* q, long ld, float* scale, float fmax, int e5m2) {
    const int E = Chunk<T>::E;
    long r = blockIdx.x;
    long step = blockDim.x * (long)E, first = threadIdx.x * (long)E;
    uint4 cache[ROW_CACHE];
    float m = 0.0f;
#pragma unroll
    for (int it = 0; it < ROW_CACHE; it++) {
        cache[it] = load_chunk(x, rows, cols, r, first + it * step);
        m = fmaxf(m, raw_absmax(cache[it], T()));
    }
    for (long c = first + ROW_CACHE * step; c < cols; c += step) {
        m = fmaxf(m, raw_absmax(load_chunk(x, rows, cols, r, c), T()));
    }
    m = block_max(m);
    float s, inv;
    scale_of(m, fmax, &s, &inv);
    if (threadIdx.x == 0) scale[r] = s;
#pragma unroll
    for (int it = 0; it < ROW_CACHE; it++) {
        long c = first + it * step;
        float v[8];
        widen(cache[it], T(), v);
        if (c < ld) store_chunk<T>(q + r * ld + c, v, inv, e5m2);
    }
    for (long c = first + ROW_CACHE * step; c < ld; c += step) {
        float v[8];
        widen(load_chunk(x, rows, cols, r, c), T(), v);
        store_chunk<T>(q + r * ld + c, v, inv, e5m2);
    }
}

// 1x128 blocks: G = 128 / E lanes per (row, K block) (a half-warp for 16-bit sources, a warp
// for f32), one chunk each; every thread serves two groups' lanes, a grid apart (the stride
// is a multiple of 32, so a warp's lanes agree on which groups are live), both loads issued
// before either is reduced.
template <typename T>
__device__ void cast_vec128_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 float* scale, float fmax, int e5m2) {
    const int E = Chunk<T>::E, G = 128 / E;
    long kblocks = (cols + 127) / 128, groups = rows_alloc * kblocks;
    long stride = (long)gridDim.x * blockDim.x;
    int lane = threadIdx.x % G;
    long g[2], r[2], c[2];
    uint4 raw[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        g[u] = (blockIdx.x * (long)blockDim.x + threadIdx.x + u * stride) / G;
        bool live = g[u] < groups;  // dead lanes still join the shuffles
        r[u] = live ? g[u] / kblocks : 0;
        long kb = live ? g[u] - r[u] * kblocks : 0;
        c[u] = kb * 128 + lane * E;
        raw[u] = load_chunk(x, live ? rows : 0, cols, r[u], c[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        bool live = g[u] < groups;
        float m = raw_absmax(raw[u], T());
        for (int o = G / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s, inv;
        scale_of(m, fmax, &s, &inv);
        if (live && lane == 0) scale[(c[u] / 128) * rows_alloc + r[u]] = s;
        if (live && c[u] < ld) {
            float v[8];
            widen(raw[u], T(), v);
            store_chunk<T>(q + r[u] * ld + c[u], v, inv, e5m2);
        }
    }
}

// 128x128 blocks: one CTA of 256 threads per (row block, K block); 128 / E threads per row, so
// 2E rows per pass and 64 / E passes; every chunk stays in registers between the amax and the
// cast, so the tile is read once.
template <typename T>
__device__ void cast_blk128_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                 float* scale, long scale_ld, float fmax, int e5m2) {
    const int E = Chunk<T>::E, PER_ROW = 128 / E, ROWS = 256 / PER_ROW, PASSES = 128 / ROWS;
    long rb = blockIdx.y, kb = blockIdx.x;
    long c = kb * 128 + (threadIdx.x % PER_ROW) * E;
    long r0 = rb * 128 + threadIdx.x / PER_ROW;
    uint4 cache[PASSES];
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        cache[i] = load_chunk(x, rows, cols, r0 + ROWS * i, c);
        m = fmaxf(m, raw_absmax(cache[i], T()));
    }
    m = block_max(m);
    float s, inv;
    scale_of(m, fmax, &s, &inv);
    if (threadIdx.x == 0) scale[rb * scale_ld + kb] = s;
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        long r = r0 + ROWS * i;
        float v[8];
        widen(cache[i], T(), v);
        if (r < rows_alloc && c < ld) store_chunk<T>(q + r * ld + c, v, inv, e5m2);
    }
}

// V = 8 / sizeof(T) consecutive elements of a row (4 of a 16-bit type, 2 of f32) as one
// 8-byte word.
template <typename T>
union Vec8 {
    uint2 w;
    T v[8 / sizeof(T)];
};

// Loads V elements of row-major [nrows, ncols] `p` at (row, col..col+V), zeros outside: one
// 8-byte load where all are inside and the address is aligned.
template <typename T>
__device__ __forceinline__ Vec8<T> load_vec8(const T* base, long nrows, long ncols, long row, long col) {
    const int V = 8 / sizeof(T);
    Vec8<T> t;
    const T* p = base + row * ncols + col;
    if (row < nrows && col + V <= ncols && ((unsigned long)p & 7) == 0) {
        t.w = *reinterpret_cast<const uint2*>(p);
    } else {
        t.w = make_uint2(0, 0);  // +0.0 in every format
#pragma unroll
        for (int j = 0; j < V; j++) {
            if (row < nrows && col + j < ncols) t.v[j] = p[j];
        }
    }
    return t;
}

// Fused cast-transpose, tensor-wise: the source is [cols, rows] row-major (src[c*rows + r]);
// q[r, c] = fp8(src[c, r] * inv). 64x64 tiles through shared memory (as floats: the f32
// instance; 16-bit sources take cast_transpose16_impl below), read 8 bytes and written eight
// bytes per thread per access, every load of a thread issued before its first shared-memory
// store; grid (ld/64, rows_alloc/64). (Tiles of 128 output columns
// for 16-bit sources measured slower on the H200: 50-54 % of a copy against 63-67 %, their
// column reads of the tile conflicting 4-way in shared memory.)
template <typename T>
__device__ void cast_transpose_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                    const u32* amax, float* scale, float fmax, int e5m2) {
    const int V = 8 / sizeof(T), PER_ROW = 64 / V, STEP = 256 / PER_ROW, TC = 64;
    __shared__ float tile[TC][65];
    float s, inv;
    scale_of(__uint_as_float(*amax), fmax, &s, &inv);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = s;
    long c0 = blockIdx.x * (long)TC, r0 = blockIdx.y * 64L;
    int part = threadIdx.x % PER_ROW, first = threadIdx.x / PER_ROW;
    Vec8<T> t[TC / STEP];
#pragma unroll
    for (int i = 0; i < TC / STEP; i++) t[i] = load_vec8(x, cols, rows, c0 + first + STEP * i, r0 + part * V);
#pragma unroll
    for (int i = 0; i < TC / STEP; i++) {  // every load issued before the first store
#pragma unroll
        for (int j = 0; j < V; j++) tile[first + STEP * i][part * V + j] = to_f(t[i].v[j]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * (TC / 8); i += blockDim.x) {
        int rr = i / (TC / 8), cc = (i % (TC / 8)) * 8;
        long r = r0 + rr, c = c0 + cc;
        if (r >= rows_alloc || c >= ld) continue;
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = tile[cc + j][rr];
        store8(q + r * ld + c, v, inv, e5m2);
    }
}

// 16 bytes: 8 values of a 16-bit type, or their raw 32-bit words.
template <typename T>
union Vec16 {
    uint4 w;
    T v[8];
};

// Loads 8 16-bit values of row-major [nrows, ncols] `p` at (row, col..col+8), zeros outside:
// one 16-byte load where all are inside and the address is aligned.
template <typename T>
__device__ __forceinline__ Vec16<T> load_vec16(const T* base, long nrows, long ncols, long row, long col) {
    Vec16<T> t;
    const T* p = base + row * ncols + col;
    if (row < nrows && col + 8 <= ncols && ((unsigned long)p & 15) == 0) {
        t.w = *reinterpret_cast<const uint4*>(p);
    } else {
        t.w = make_uint4(0, 0, 0, 0);  // +0.0 in both formats
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (row < nrows && col + j < ncols) t.v[j] = p[j];
        }
    }
    return t;
}

// The same for 16-bit sources, on tiles of 64 output columns by 128 output rows (16 KB of
// source a CTA, as the f32 instance: with 8 KB tiles the 16-bit instance kept too few bytes in
// flight and ran at 69-72 % of a copy). The tile stays in shared memory as the raw 16-bit
// values, two output rows to a 32-bit word, rows of 65 words: one 16-byte load a thread per
// source row chunk; threads 8-15 of each half-warp store their four words in the order
// 2, 3, 0, 1 (else threads p and p + 8, 32 words apart, would share banks); the column reads
// do not conflict (the threads serving output columns 32-63 take the word pairs 4 apart, in
// the banks the other half leaves free). Each thread converts four output rows of 8 columns.
// Launched with __launch_bounds__(256, 6): 40 registers (48 without), 6 CTAs an SM on the
// H200 (96 KB of source in flight); the f32 instance takes 38 under the same bounds (37 without).
// (GPUs with about 100 KB of shared memory an SM, sm_89 and sm_120, hold 5 such tiles.)
template <typename T>
__device__ void cast_transpose16_impl(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                      const u32* amax, float* scale, float fmax, int e5m2) {
    __shared__ u32 tile[64][65];  // tile[cc][w]: source (c0 + cc, r0 + 2w) low, (c0 + cc, r0 + 2w + 1) high
    float s, inv;
    scale_of(__uint_as_float(*amax), fmax, &s, &inv);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = s;
    long c0 = blockIdx.x * 64L, r0 = blockIdx.y * 128L;
    int part = threadIdx.x % 16, first = threadIdx.x / 16;  // 8 values (16 bytes) a load
    Vec16<T> t[4];
#pragma unroll
    for (int i = 0; i < 4; i++) t[i] = load_vec16(x, cols, rows, c0 + first + 16 * i, r0 + part * 8);
    const bool swap = part >= 8;
    const int o = swap ? 2 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {  // all four loads issued before the first store
        u32* row = &tile[first + 16 * i][part * 4];
        u32 a = swap ? t[i].w.z : t[i].w.x, b = swap ? t[i].w.w : t[i].w.y;
        u32 c = swap ? t[i].w.x : t[i].w.z, d = swap ? t[i].w.y : t[i].w.w;
        row[o] = a;
        row[o + 1] = b;
        row[o ^ 2] = c;
        row[(o ^ 2) + 1] = d;
    }
    __syncthreads();
    int cg = threadIdx.x % 8, base = (threadIdx.x / 8) ^ (cg >= 4 ? 4 : 0);
    long c = c0 + cg * 8;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int pair = base + 32 * h;
        float lo[8], hi[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v[2];
            unpack2(tile[cg * 8 + j][pair], T(), v);
            lo[j] = v[0];
            hi[j] = v[1];
        }
        long r = r0 + 2 * pair;
        if (c < ld) {
            if (r < rows_alloc) store8(q + r * ld + c, lo, inv, e5m2);
            if (r + 1 < rows_alloc) store8(q + (r + 1) * ld + c, hi, inv, e5m2);
        }
    }
}

// dst[r, c] = src[c, r] for a [cols, rows] row-major source; 64x64 tiles through shared
// memory, V consecutive elements (8 bytes) per thread per access, one 8-byte load or store
// where they are inside and aligned; grid (cols/64, rows/64). (For 16-bit sources the
// cast-transpose's 64 x 128 tiles with 16-byte stores measured slower on the H200: 59-65 % of
// a copy against this kernel's 75-77 %; not kept.)
template <typename T>
__device__ void transpose_impl(const T* src, long rows, long cols, T* dst) {
    const int V = 8 / sizeof(T), PER_ROW = 64 / V, STEP = 256 / PER_ROW;
    __shared__ T tile[64][64 + 4 / sizeof(T)];  // rows of 33 words (16-bit) or 65 (f32)
    long c0 = blockIdx.x * 64L, r0 = blockIdx.y * 64L;
    int part = threadIdx.x % PER_ROW, first = threadIdx.x / PER_ROW;
    Vec8<T> t[64 / STEP];
#pragma unroll
    for (int i = 0; i < 64 / STEP; i++) t[i] = load_vec8(src, cols, rows, c0 + first + STEP * i, r0 + part * V);
#pragma unroll
    for (int i = 0; i < 64 / STEP; i++) {  // every load issued before the first store
#pragma unroll
        for (int j = 0; j < V; j++) tile[first + STEP * i][part * V + j] = t[i].v[j];
    }
    __syncthreads();
    for (int rr = first; rr < 64; rr += STEP) {
        long r = r0 + rr, c = c0 + part * V;
        if (r >= rows) continue;
        Vec8<T> t;
        for (int j = 0; j < V; j++) t.v[j] = tile[part * V + j][rr];
        T* p = dst + r * cols + c;
        if (c + V <= cols && ((unsigned long)p & 7) == 0) {
            // one 8-byte store (written as such: the compiler split a plain one in two)
            asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(t.w.x), "r"(t.w.y) : "memory");
        } else {
            for (int j = 0; j < V; j++) {
                if (c + j < cols) p[j] = t.v[j];
            }
        }
    }
}

// Which cast-transpose a source type takes: the float tile for f32, the 16-bit one otherwise.
__device__ __forceinline__ void cast_transpose_any(const float* x, long rows, long rows_alloc, long cols, u8* q,
                                                   long ld, const u32* amax, float* scale, float fmax, int e5m2) {
    cast_transpose_impl(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);
}
template <typename T>
__device__ __forceinline__ void cast_transpose_any(const T* x, long rows, long rows_alloc, long cols, u8* q, long ld,
                                                   const u32* amax, float* scale, float fmax, int e5m2) {
    cast_transpose16_impl(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);
}

// The FP8 attention backward's scales from the dequantisation scales of q, k, v, o and do
// (gemmbridge::attention::fp8::backward_scales: the same f32 operations in the same order, no
// contraction): out = P's scale and inverse, dS's scale and inverse, the graph's scales of dq,
// dk, dv; the three gradients' dequantisation scales into gq, gk, gv. One thread.
__device__ __forceinline__ void attn_bwd_scales_impl(const float* sq, const float* sk, const float* sv,
                                                     const float* so, const float* sdo, float scale, float d,
                                                     float rows, float skv, float f, float u, float* out,
                                                     float* gq, float* gk, float* gv) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const float e4 = 448.0f;
    float a_q = __fmul_rn(e4, *sq), a_k = __fmul_rn(e4, *sk), a_v = __fmul_rn(e4, *sv);
    float a_o = __fmul_rn(e4, *so), a_do = __fmul_rn(f, *sdo);
    float r = __fmul_rn(__fmul_rn(d, a_do), __fadd_rn(a_v, a_o));
    float b = __fmul_rn(__fmul_rn(scale, r), 1.125f);
    float ds = __fdiv_rn(b, f);
    float b9 = __fmul_rn(1.125f, b);
    float bq = __fmul_rn(__fadd_rn(b9, __fmul_rn(__fmul_rn(skv, u), ds)), a_k);
    float bk = __fmul_rn(__fmul_rn(rows, __fadd_rn(b9, __fmul_rn(u, ds))), a_q);
    float bv = __fmul_rn(__fmul_rn(rows, __fadd_rn(1.0625f, __fdiv_rn(u, e4))), a_do);
    out[0] = e4;
    out[1] = __fdiv_rn(1.0f, e4);
    out[2] = __fdiv_rn(f, b);
    out[3] = ds;
    out[4] = __fdiv_rn(f, bq);
    out[5] = __fdiv_rn(f, bk);
    out[6] = __fdiv_rn(f, bv);
    *gq = __fdiv_rn(bq, f);
    *gk = __fdiv_rn(bk, f);
    *gv = __fdiv_rn(bv, f);
}

#define GB_INSTANTIATE(T, SUFFIX, BLK_CTAS)                                                              \
    extern "C" __global__ void attn_bwd_scales_##SUFFIX(const float* sq, const float* sk, const float* sv, \
                                                        const float* so, const float* sdo, float scale,  \
                                                        float d, float rows, float skv, float f, float u,\
                                                        float* out, float* gq, float* gk, float* gv) {   \
        attn_bwd_scales_impl(sq, sk, sv, so, sdo, scale, d, rows, skv, f, u, out, gq, gk, gv);           \
    }                                                                                                    \
    extern "C" __global__ void amax_##SUFFIX(const T* x, long n, u32* out) { amax_impl(x, n, out); }    \
    extern "C" __global__ void cast_tensor_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, const u32* amax, float* scale,        \
                                                    float fmax, int e5m2) {                               \
        cast_tensor_impl(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);                     \
    }                                                                                                     \
    extern "C" __global__ void cast_rows_##SUFFIX(const T* x, long rows, long cols, u8* q, long ld,      \
                                                  float* scale, float fmax, int e5m2) {                   \
        cast_rows_impl<T, 8>(x, rows, cols, q, ld, scale, fmax, e5m2);                                    \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 6) cast_rows_short_##SUFFIX(const T* x, long rows, long cols, u8* q, long ld,\
                                                        float* scale, float fmax, int e5m2) {             \
        cast_rows_impl<T, 4>(x, rows, cols, q, ld, scale, fmax, e5m2);                                    \
    }                                                                                                     \
    extern "C" __global__ void cast_vec128_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, float* scale, float fmax, int e5m2) { \
        cast_vec128_impl(x, rows, rows_alloc, cols, q, ld, scale, fmax, e5m2);                           \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, BLK_CTAS) cast_blk128_##SUFFIX(const T* x, long rows, long rows_alloc, long cols,   \
                                                    u8* q, long ld, float* scale, long scale_ld,          \
                                                    float fmax, int e5m2) {                               \
        cast_blk128_impl(x, rows, rows_alloc, cols, q, ld, scale, scale_ld, fmax, e5m2);                 \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 6) cast_transpose_##SUFFIX(const T* x, long rows, long rows_alloc,           \
                                                       long cols, u8* q, long ld, const u32* amax,        \
                                                       float* scale, float fmax, int e5m2) {              \
        cast_transpose_any(x, rows, rows_alloc, cols, q, ld, amax, scale, fmax, e5m2);                   \
    }                                                                                                     \
    extern "C" __global__ void transpose_##SUFFIX(const T* src, long rows, long cols, T* dst) {          \
        transpose_impl(src, rows, cols, dst);                                                             \
    }

// The last argument: CTAs of cast_blk128 that must fit on an SM at once (registers capped to
// match): 4 for the 16-bit types (8 cached chunks a thread), whose loads then overlap more
// CTAs' conversions; f32's 16 cached chunks need more registers than 4 CTAs allow.
GB_INSTANTIATE(float, f32, 1)
GB_INSTANTIATE(F16, f16, 4)
GB_INSTANTIATE(BF16, bf16, 4)
