// gemmbridge's own kernels for a mixture-of-experts layer (src/moe/ defines each; its
// reference.rs is the CPU twin, operation for operation): the router's top-k and the stable
// sort of the routed rows by expert, group starts from host sizes, device group starts clamped into
// range, the weighted combine of each token's expert outputs and its backward, and rows gathered
// by index. Compiled after elem.cu and layer.cu (exp_neg); every arithmetic operation a
// correctly rounded intrinsic, so the results equal the CPU's bit for bit.
//
//   moe_topk_T(const T* logits, int tokens, int experts, int top_k, int* ids, float* weights)
//     one warp per token: k rounds of a warp arg-max over the logits ranked after the last
//     choice (larger first, NaN as −∞, ties to the lower expert); weights = exp_neg(v − v0)
//     over the sum of those (added in order), divided.
//   moe_count(const int* ids, int rows, int experts, int* counts)
//     CTA b counts the experts of rows [b·CHUNK, (b+1)·CHUNK) into counts[b·E + e].
//   moe_scan(int* counts, int blocks, int experts, int* starts)
//     one CTA: starts[e] = Σ_{f<e} Σ_b counts[b·E + f]; counts[b·E + e] becomes where CTA b's
//     rows of expert e begin.
//   moe_place(const int* ids, int rows, int experts, int top_k, const int* bases, int* index,
//     int* ks, int* slots, int* pos)  CTA b places its rows in order: row q of expert e goes to
//     p = bases[b·E + e] + (rows of e before q in the CTA's chunk); pos[q] = p.
//   moe_starts(Starts s, int* starts)   starts[s.first + i] = s.v[i], i < s.count.
//   moe_clamp(const int* starts, int* out, int experts, int rows)  one thread: out[e] =
//     starts[e] clamped between out[e − 1] (0 for e = 0) and rows: non-decreasing in [0, rows].
//   moe_pad(const int* starts, const int* index, const int* ks, const int* slots, const int* pos,
//     const int* ids, int rows, int experts, int cap, int* index_p, int* ks_p, int* slots_p,
//     int* pos_p)  the capacity layout: padded row e·cap + i holds expert e's sorted row
//     starts[e] + i (index, ks, slots copied; −1 past the expert's rows); pos_p[q] = e·cap + i
//     for slot q at sorted row starts[e] + i, −1 when i ≥ cap (the slot is dropped).
//   moe_combine_T(const T* o, const float* w, const int* rows, T* y, int tokens, int top_k,
//     long long n, int o_rows)  y[s, c] = Σ_j fma(w[q] (1 without w), o[row(q), c], ·),
//     q = s·k + j, row(q) = rows[q] clamped below o_rows (q without rows), rounded once; a
//     negative rows[q] (a dropped slot) adds nothing.
//   moe_combine_bwd_T(const T* dy, const T* o, const float* w, const int* ids, const int* rows,
//     T* d_o, float* dw, T* dlogits, int top_k, long long n, int experts, int o_rows)
//     one CTA of 256 per token: d_o[row(q)] = w[q]·dy[s] (rounded), dw[q] as reference.rs's
//     combine_backward orders its sums, dlogits[s, ·] = 0 but w_j (dw_j − Σ_i fma(w_i, dw_i, ·))
//     at ids (an id outside [0, E) writes nothing); a negative rows[q] writes no d_o row and
//     has dw[q] = 0.
//   moe_gather_T(const T* in, const int* index, T* out, int rows, long long width, int in_rows)
//     out[r, ·] = in[index[r], ·], the index clamped below in_rows; a negative index (a pad
//     row) writes zeros.
//   moe_zero_rows_T(const int* index, T* out, int rows, long long width)  out[r, ·] = 0 where
//     index[r] < 0 (a capacity layout's pad rows), nothing elsewhere.

#define MOE_CHUNK 2048
#define MOE_MAX_E 4096

__device__ __forceinline__ bool moe_before(float a, int ea, float b, int eb) {
    const float ninf = __int_as_float(0xff800000);
    a = a != a ? ninf : a;
    b = b != b ? ninf : b;
    return a > b || (a == b && ea < eb);
}

template <typename T>
__device__ __forceinline__ void moe_topk(const T* __restrict__ logits, int tokens, int experts, int top_k,
                                         int* __restrict__ ids, float* __restrict__ weights) {
    const int lane = threadIdx.x & 31;
    const long long s = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (s >= tokens) return;
    const T* row = logits + s * experts;
    float last_v = 0.0f, v0 = 0.0f, sum = 0.0f;
    int last_e = -1;
    float vs[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        if (j >= top_k) break;
        float best_v = 0.0f;
        int best_e = -1;
        for (int e = lane; e < experts; e += 32) {
            const float v = to_f(row[e]);
            if (last_e >= 0 && !moe_before(last_v, last_e, v, e)) continue;
            if (best_e < 0 || moe_before(v, e, best_v, best_e)) {
                best_v = v;
                best_e = e;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, off);
            if (oe >= 0 && (best_e < 0 || moe_before(ov, oe, best_v, best_e))) {
                best_v = ov;
                best_e = oe;
            }
        }
        last_v = best_v;
        last_e = best_e;
        if (j == 0) v0 = best_v;
        vs[j] = exp_neg(__fsub_rn(best_v, v0));
        sum = __fadd_rn(sum, vs[j]);
        if (lane == 0) ids[s * top_k + j] = best_e;
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            if (j >= top_k) break;
            weights[s * top_k + j] = __fdiv_rn(vs[j], sum);
        }
    }
}

extern "C" __global__ void moe_count(const int* __restrict__ ids, int rows, int experts, int* __restrict__ counts) {
    __shared__ int c[MOE_MAX_E];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) c[e] = 0;
    __syncthreads();
    const long long first = (long long)blockIdx.x * MOE_CHUNK;
    for (long long q = first + threadIdx.x; q < first + MOE_CHUNK && q < rows; q += blockDim.x) {
        const int e = ids[q];
        if (e >= 0 && e < experts) atomicAdd(&c[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[(long long)blockIdx.x * experts + e] = c[e];
}

extern "C" __global__ void moe_scan(int* __restrict__ counts, int blocks, int experts, int* __restrict__ starts) {
    __shared__ int tot[MOE_MAX_E];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        int t = 0;
        for (int b = 0; b < blocks; ++b) t += counts[(long long)b * experts + e];
        tot[e] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0;
        for (int e = 0; e < experts; ++e) {
            const int t = tot[e];
            tot[e] = at;
            at += t;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        int run = tot[e];
        starts[e] = run;
        for (int b = 0; b < blocks; ++b) {
            const long long i = (long long)b * experts + e;
            const int c = counts[i];
            counts[i] = run;
            run += c;
        }
    }
}

// blockDim.x = 256: the chunk in tiles of 256 rows.
extern "C" __global__ void moe_place(const int* __restrict__ ids, int rows, int experts, int top_k,
                                     const int* __restrict__ bases, int* __restrict__ index, int* __restrict__ ks,
                                     int* __restrict__ slots, int* __restrict__ pos) {
    __shared__ int run[MOE_MAX_E];
    __shared__ int tile[256];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) run[e] = bases[(long long)blockIdx.x * experts + e];
    const long long first = (long long)blockIdx.x * MOE_CHUNK;
    for (long long t0 = first; t0 < first + MOE_CHUNK && t0 < rows; t0 += 256) {
        const long long q = t0 + threadIdx.x;
        const bool live = q < rows;
        const int e = live ? ids[q] : -1;
        __syncthreads();  // run[] initialised / the last tile's updates done
        tile[threadIdx.x] = e;
        __syncthreads();
        if (live && e >= 0 && e < experts) {
            int rank = 0;
            for (int j = 0; j < (int)threadIdx.x; ++j) rank += tile[j] == e;
            const int p = run[e] + rank;
            index[p] = (int)(q / top_k);
            ks[p] = (int)(q % top_k);
            slots[p] = (int)q;
            pos[q] = p;
        }
        __syncthreads();
        if (live && e >= 0 && e < experts) atomicAdd(&run[e], 1);
    }
}

struct MoeStarts {
    int count;
    int first;
    int v[1000];
};

extern "C" __global__ void moe_starts(const MoeStarts s, int* __restrict__ starts) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.count) starts[s.first + i] = s.v[i];
}

extern "C" __global__ void moe_clamp(const int* __restrict__ starts, int* __restrict__ out, int experts, int rows) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int prev = 0;
        for (int e = 0; e < experts; ++e) {
            const int v = min(max(starts[e], prev), rows);
            out[e] = v;
            prev = v;
        }
    }
}

// Grid-stride over max(experts·cap, rows).
extern "C" __global__ void moe_pad(const int* __restrict__ starts, const int* __restrict__ index,
                                   const int* __restrict__ ks, const int* __restrict__ slots,
                                   const int* __restrict__ pos, const int* __restrict__ ids, int rows, int experts,
                                   int cap, int* __restrict__ index_p, int* __restrict__ ks_p,
                                   int* __restrict__ slots_p, int* __restrict__ pos_p) {
    const long long padded = (long long)experts * cap, stride = (long long)gridDim.x * blockDim.x;
    const long long total = padded > rows ? padded : rows;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        if (i < padded) {
            const int e = (int)(i / cap), r = (int)(i - (long long)e * cap);
            const int s0 = min(max(starts[e], 0), rows);
            const int s1 = e + 1 < experts ? min(max(starts[e + 1], s0), rows) : rows;
            const bool real = r < s1 - s0;
            index_p[i] = real ? index[s0 + r] : -1;
            ks_p[i] = real ? ks[s0 + r] : -1;
            slots_p[i] = real ? slots[s0 + r] : -1;
        }
        if (i < rows) {
            const int e = ids[i], p = pos[i];
            const int r = (e >= 0 && e < experts) ? p - starts[e] : -1;
            pos_p[i] = (r >= 0 && r < cap) ? e * cap + r : -1;
        }
    }
}

template <typename T>
__device__ __forceinline__ void moe_combine(const T* __restrict__ o, const float* __restrict__ w,
                                            const int* __restrict__ rows, T* __restrict__ y, int tokens, int top_k,
                                            long long n, int o_rows) {
    const long long total = (long long)tokens * n, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long s = i / n, c = i - s * n;
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const long long q = s * top_k + j, at = rows ? (long long)min(rows[q], o_rows - 1) : q;
            if (at < 0) continue;
            acc = __fmaf_rn(w ? w[q] : 1.0f, to_f(o[at * n + c]), acc);
        }
        from_f(acc, &y[i]);
    }
}

// blockDim.x = 256, one CTA per token.
template <typename T>
__device__ __forceinline__ void moe_combine_bwd(const T* __restrict__ dy, const T* __restrict__ o,
                                                const float* __restrict__ w, const int* __restrict__ ids,
                                                const int* __restrict__ rows, T* __restrict__ d_o, float* __restrict__ dw,
                                                T* __restrict__ dlogits, int top_k, long long n, int experts,
                                                int o_rows) {
    __shared__ float part[256];
    __shared__ float dws[16];
    const long long s = blockIdx.x;
    for (int j = 0; j < top_k; ++j) {
        const long long q = s * top_k + j, at = rows ? (long long)min(rows[q], o_rows - 1) : q;
        const float wq = w[q];
        float acc = 0.0f;
        for (long long c = threadIdx.x; at >= 0 && c < n; c += 256) {
            const float g = to_f(dy[s * n + c]);
            acc = __fmaf_rn(g, to_f(o[at * n + c]), acc);
            from_f(__fmul_rn(wq, g), &d_o[at * n + c]);
        }
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int half = 128; half > 0; half >>= 1) {
            if (threadIdx.x < half) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + half]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            dws[j] = part[0];
            dw[q] = part[0];
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < experts; e += 256) from_f(0.0f, &dlogits[s * experts + e]);
    __syncthreads();
    if (threadIdx.x == 0) {
        float dot = 0.0f;
        for (int j = 0; j < top_k; ++j) dot = __fmaf_rn(w[s * top_k + j], dws[j], dot);
        for (int j = 0; j < top_k; ++j) {
            const long long q = s * top_k + j;
            const int e = ids[q];
            if (e >= 0 && e < experts) from_f(__fmul_rn(w[q], __fsub_rn(dws[j], dot)), &dlogits[s * experts + e]);
        }
    }
}

template <typename T>
__device__ __forceinline__ void moe_gather(const T* __restrict__ in, const int* __restrict__ index, T* __restrict__ out,
                                           int rows, long long width, int in_rows) {
    const long long total = (long long)rows * width, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long r = i / width, c = i - r * width;
        const int at = index[r];
        if (at < 0) {
            from_f(0.0f, &out[i]);
        } else {
            out[i] = in[(long long)min(at, in_rows - 1) * width + c];
        }
    }
}

template <typename T>
__device__ __forceinline__ void moe_zero_rows(const int* __restrict__ index, T* __restrict__ out, int rows,
                                              long long width) {
    const long long total = (long long)rows * width, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        if (index[i / width] < 0) from_f(0.0f, &out[i]);
    }
}

#define MOE_TYPED(T, S)                                                                                          \
    extern "C" __global__ void moe_topk_##S(const T* l, int tokens, int experts, int top_k, int* ids, float* w) { \
        moe_topk<T>(l, tokens, experts, top_k, ids, w);                                                          \
    }                                                                                                            \
    extern "C" __global__ void moe_combine_##S(const T* o, const float* w, const int* rows, T* y, int tokens,     \
                                               int top_k, long long n, int o_rows) {                             \
        moe_combine<T>(o, w, rows, y, tokens, top_k, n, o_rows);                                                 \
    }                                                                                                            \
    extern "C" __global__ void moe_combine_bwd_##S(const T* dy, const T* o, const float* w, const int* ids,       \
                                                   const int* rows, T* d_o, float* dw, T* dl, int top_k,          \
                                                   long long n, int experts, int o_rows) {                       \
        moe_combine_bwd<T>(dy, o, w, ids, rows, d_o, dw, dl, top_k, n, experts, o_rows);                         \
    }                                                                                                            \
    extern "C" __global__ void moe_gather_##S(const T* in, const int* index, T* out, int rows, long long width,   \
                                              int in_rows) {                                                     \
        moe_gather<T>(in, index, out, rows, width, in_rows);                                                     \
    }                                                                                                            \
    extern "C" __global__ void moe_zero_rows_##S(const int* index, T* out, int rows, long long width) {          \
        moe_zero_rows<T>(index, out, rows, width);                                                               \
    }

MOE_TYPED(float, f32)
MOE_TYPED(F16, f16)
MOE_TYPED(BF16, bf16)
