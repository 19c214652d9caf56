// gemmbridge's append into a paged KV cache (src/paged/ defines it; src/cpu/paged.rs is the CPU
// twin): a step's new key and value rows copied, as raw bits, into their pages, so the result
// equals the CPU's bit for bit. Compiled at run time with NVRTC.
//
//   paged_append[_v8]_b2(const T* k_new, const T* v_new, T* k_cache, T* v_cache,
//       const int* tables, const int* lens, const int* new_lens, long long ld, int seq,
//       int batch, int heads, int d, int page_shift, int width, int pages)
// For sequence n < batch, row i < count(n) (new_lens[n], or seq where new_lens is null; never
// past seq), head h < heads, at position p = lens[n] + i:
//   page = tables[n·width + (p >> page_shift)],   slot = p mod 2^page_shift
//   cache[((page·heads + h)·2^page_shift + slot)·d + e] = new[(n·seq + i)·ld + h·d + e],  e < d
// for k and for v alike. Elements are 2-byte (f16, bf16) bit patterns. A row whose position or
// page falls outside the table (p < 0, p >> page_shift ≥ width) or the container (page outside
// 0..pages) is not written: device tables and lengths are the caller's contract, and this keeps
// a broken one from writing outside the containers (host ones are checked before the launch).
//
// One thread per (token, head, unit of W elements), the unit fastest, in a grid-stride loop;
// both loads (k and v) are issued before both stores. W = 8 (one 16-byte access) for the _v8
// instance, whose launcher checks that the sources, ld and the containers allow it (d is a
// multiple of 8 by the cache's rules); W = 1 for the scalar instance.

typedef unsigned short u16;

#define THREADS 256

template <int W> struct __align__(W * 2) Unit { u16 v[W]; };

template <int W>
__device__ __forceinline__ void paged_append(const u16* __restrict__ k_new, const u16* __restrict__ v_new,
                                             u16* __restrict__ k_cache, u16* __restrict__ v_cache,
                                             const int* __restrict__ tables, const int* __restrict__ lens,
                                             const int* __restrict__ new_lens, long long ld, int seq, int batch,
                                             int heads, int d, int page_shift, int width, int pages) {
    typedef Unit<W> V;
    const int units = d / W;
    const long long items = (long long)batch * seq * heads * units;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (long long)gridDim.x * blockDim.x) {
        const int u = (int)(it % units);
        const long long rest = it / units;
        const int h = (int)(rest % heads);
        const long long tok = rest / heads; // n·seq + i
        const int n = (int)(tok / seq);
        const int i = (int)(tok - (long long)n * seq);
        const int count = new_lens ? min(new_lens[n], seq) : seq;
        if (i >= count) continue;
        const long long p = (long long)lens[n] + i;
        if (p < 0 || (p >> page_shift) >= width) continue;
        const int page = tables[(long long)n * width + (p >> page_shift)];
        if (page < 0 || page >= pages) continue;
        const long long slot = p & ((1ll << page_shift) - 1);
        const long long src = tok * ld + (long long)h * d + (long long)u * W;
        const long long dst = ((((long long)page * heads + h) << page_shift) + slot) * d + (long long)u * W;
        const V k = *reinterpret_cast<const V*>(k_new + src);
        const V v = *reinterpret_cast<const V*>(v_new + src);
        *reinterpret_cast<V*>(k_cache + dst) = k;
        *reinterpret_cast<V*>(v_cache + dst) = v;
    }
}

#define APPEND(name, W)                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        name(const u16* k_new, const u16* v_new, u16* k_cache, u16* v_cache, const int* tables,              \
             const int* lens, const int* new_lens, long long ld, int seq, int batch, int heads, int d,       \
             int page_shift, int width, int pages) {                                                          \
        paged_append<W>(k_new, v_new, k_cache, v_cache, tables, lens, new_lens, ld, seq, batch, heads, d,     \
                        page_shift, width, pages);                                                            \
    }

APPEND(paged_append_v8_b2, 8)
APPEND(paged_append_b2, 1)
