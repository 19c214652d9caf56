// gemmbridge's own elementwise kernels for the training layers, where no cuBLASLt epilogue
// applies or the caller placed an activation outside the epilogues (src/train/mod.rs says
// where): activation backward and the GELUs.
// Compiled at run time with NVRTC for the device's architecture. Every value is computed in
// f32 from the stored values and rounded once to the storage type (round to nearest even):
//   dact_relu_T(dy, y, out, n, cols, ld):       out = y > 0 ? dy : 0   (y: the layer's output)
//   dact_gelu_tanh_T(dy, pre, out, n, cols, ld): out = dy * gelu_tanh'(pre)
//   dact_gelu_erf_T(dy, pre, out, n, cols, ld):  out = dy * gelu_erf'(pre)
//   gelu_erf_T(pre, y, n):                      y = 0.5 * pre * (1 + erf(pre / sqrt(2)))
//   gelu_tanh_T(pre, y, n):                     y = 0.5 * pre * (1 + tanh(sqrt(2/pi) * (pre + 0.044715 pre^3)))
//   relu_T(pre, y, n):                          y = pre < 0 ? 0 : pre   (NaN stays NaN; y may be pre)
// and, eight elements a thread per step in 16-byte accesses (two of them for f32), the same arithmetic
// for rows whose length and stride are multiples of 8 in 16-byte-aligned buffers (the launcher
// checks; counts in units of 8 elements, below 2^31):
//   dact_gelu_tanh_v8_T(dy, pre, out, n8, cols8, ld8)
//   gelu_tanh_v8_T(pre, y, n8)
// dy and out are contiguous [n / cols, cols]; the saved y or pre is [n / cols, cols] with row
// stride ld (cuBLASLt's aux rows are padded to a multiple of 8). `out` may be `dy` (in place).
// The GPU tests check them against float64 references (tests/train_gpu.rs,
// tests/train_placement_gpu.rs) and the 8-wide instances against the scalar ones bit for bit
// (src/cuda/train/kernels.rs).

#define K_SQRT_2_OVER_PI 0.7978845608028654f
#define K_INV_SQRT_2 0.7071067811865476f
#define K_INV_SQRT_2PI 0.3989422804014327f

__device__ __forceinline__ float gelu_tanh_grad(float x) {
    float u = K_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * K_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
}

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(K_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * K_INV_SQRT_2)); }

__device__ __forceinline__ float gelu_erf_grad(float x) {
    float cdf = 0.5f * (1.0f + erff(x * K_INV_SQRT_2));
    return cdf + x * K_INV_SQRT_2PI * expf(-0.5f * x * x);
}

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// the saved value of element i of a [rows, cols] matrix stored with row stride ld
#define SAVED(s, i) to_f(s[((i) / cols) * ld + (i) % cols])

#define DEFINE(T, S)                                                                        \
    extern "C" __global__ void dact_relu_##S(const T* dy, const T* y, T* out, long n, long cols, long ld) { \
        GRID_STRIDE(i, n) { from_f(SAVED(y, i) > 0.0f ? to_f(dy[i]) : 0.0f, &out[i]); }    \
    }                                                                                       \
    extern "C" __global__ void dact_gelu_tanh_##S(const T* dy, const T* pre, T* out, long n, long cols, long ld) { \
        GRID_STRIDE(i, n) { from_f(to_f(dy[i]) * gelu_tanh_grad(SAVED(pre, i)), &out[i]); } \
    }                                                                                       \
    extern "C" __global__ void dact_gelu_erf_##S(const T* dy, const T* pre, T* out, long n, long cols, long ld) { \
        GRID_STRIDE(i, n) { from_f(to_f(dy[i]) * gelu_erf_grad(SAVED(pre, i)), &out[i]); } \
    }                                                                                       \
    extern "C" __global__ void gelu_erf_##S(const T* pre, T* y, long n) {                  \
        GRID_STRIDE(i, n) { from_f(gelu_erf(to_f(pre[i])), &y[i]); }                         \
    }                                                                                       \
    extern "C" __global__ void gelu_tanh_##S(const T* pre, T* y, long n) {                 \
        GRID_STRIDE(i, n) { from_f(gelu_tanh(to_f(pre[i])), &y[i]); }                        \
    }                                                                                       \
    extern "C" __global__ void relu_##S(const T* pre, T* y, long n) {                      \
        GRID_STRIDE(i, n) { float v = to_f(pre[i]); from_f(v < 0.0f ? 0.0f : v, &y[i]); }    \
    }

DEFINE(float, f32)
DEFINE(F16, f16)
DEFINE(BF16, bf16)

template <typename T>
__device__ __forceinline__ void dact_gelu_tanh_v8(const T* dy, const T* pre, T* out, unsigned n8, unsigned cols8, unsigned ld8) {
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += gridDim.x * blockDim.x) {
        unsigned s = cols8 == ld8 ? c : (c / cols8) * ld8 + c % cols8;
        Pack8<T> g = reinterpret_cast<const Pack8<T>*>(dy)[c];
        Pack8<T> p = reinterpret_cast<const Pack8<T>*>(pre)[s];
        Pack8<T> o;
#pragma unroll
        for (int j = 0; j < 8; ++j) from_f(to_f(g.v[j]) * gelu_tanh_grad(to_f(p.v[j])), &o.v[j]);
        reinterpret_cast<Pack8<T>*>(out)[c] = o;
    }
}

template <typename T>
__device__ __forceinline__ void gelu_tanh_v8(const T* pre, T* y, unsigned n8) {
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += gridDim.x * blockDim.x) {
        Pack8<T> p = reinterpret_cast<const Pack8<T>*>(pre)[c];
        Pack8<T> o;
#pragma unroll
        for (int j = 0; j < 8; ++j) from_f(gelu_tanh(to_f(p.v[j])), &o.v[j]);
        reinterpret_cast<Pack8<T>*>(y)[c] = o;
    }
}

#define DEFINE_V8(T, S)                                                                                   \
    extern "C" __global__ void dact_gelu_tanh_v8_##S(const T* dy, const T* pre, T* out, unsigned n8,     \
                                                     unsigned cols8, unsigned ld8) {                      \
        dact_gelu_tanh_v8<T>(dy, pre, out, n8, cols8, ld8);                                               \
    }                                                                                                     \
    extern "C" __global__ void gelu_tanh_v8_##S(const T* pre, T* y, unsigned n8) { gelu_tanh_v8<T>(pre, y, n8); }

DEFINE_V8(float, f32)
DEFINE_V8(F16, f16)
DEFINE_V8(BF16, bf16)
