// Probe: does a one-thread kernel spinning on another stream slow a cuBLASLt GEMM, and does
// CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET (one SM left to the spinner) or a sleeping spin take
// that cost away? Also times the device-ordering chain of gemmbridge-burn (store kernel on
// stream B, spin kernel on stream A, GEMM, flag memset, wait kernel on stream B) per call.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/spin bench/probes/spin_residency.cu -lcublasLt && /tmp/spin
//
// Prints one line per (shape, mode): ms per GEMM (median of 5 bursts of 40) and the ratio to
// the GEMM alone.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
#define LK(x)                                                             \
    do {                                                                  \
        cublasStatus_t st_ = (x);                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                               \
            fprintf(stderr, "%s:%d cublasLt status %d\n", __FILE__, __LINE__, (int)st_); \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

__global__ void spin_eq(volatile unsigned* flag, unsigned value, int sleep_ns) {
    while (atomicAdd((unsigned*)flag, 0u) != value) {
        if (sleep_ns) __nanosleep(sleep_ns);
    }
    __threadfence();
}
__global__ void store(unsigned* flag, unsigned value) { atomicExch(flag, value); }

struct Gemm {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    void *A, *B, *C, *ws;
    size_t ws_size = 32u << 20;
    int m, n, k;
    Gemm(cublasLtHandle_t h_, int m_, int n_, int k_, int sm_target) : h(h_), m(m_), n(n_), k(k_) {
        CK(cudaMalloc(&A, (size_t)m * k * 2));
        CK(cudaMalloc(&B, (size_t)k * n * 2));
        CK(cudaMalloc(&C, (size_t)m * n * 2));
        CK(cudaMalloc(&ws, ws_size));
        std::vector<__nv_bfloat16> hA((size_t)m * k), hB((size_t)k * n);
        for (auto& v : hA) v = __float2bfloat16((rand() % 2001 - 1000) / 1000.0f);
        for (auto& v : hB) v = __float2bfloat16((rand() % 2001 - 1000) / 1000.0f);
        CK(cudaMemcpy(A, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(B, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice));
        LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
        if (sm_target > 0)
            LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof sm_target));
        // column-major D[n, m] = op_T(w[k, n]) · x[k, m]: the linear layer's TN call
        LK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
        LK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
        LK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, n, m, n));
        cublasLtMatmulPreference_t p;
        LK(cublasLtMatmulPreferenceCreate(&p));
        LK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof ws_size));
        cublasLtMatmulHeuristicResult_t r;
        int got = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, p, 1, &r, &got));
        if (!got) {
            fprintf(stderr, "no algorithm\n");
            exit(1);
        }
        algo = r.algo;
    }
    void run(cudaStream_t s) {
        float alpha = 1, beta = 0;
        LK(cublasLtMatmul(h, op, &alpha, B, a, A, b, &beta, C, c, C, c, &algo, ws, ws_size, s));
    }
};

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cublasLtHandle_t h;
    LK(cublasLtCreate(&h));
    cudaStream_t sa, sb;
    CK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    unsigned* flags;
    CK(cudaMalloc(&flags, 16));
    CK(cudaMemset(flags, 0, 16));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    unsigned seq = 0;
    const int N = 40, BURSTS = 5;
    int shapes[3][3] = {{5120, 2048, 768}, {4096, 4096, 4096}, {8192, 8192, 8192}};
    printf("SMs %d\n%-16s %-34s %10s %8s\n", sms, "m x n x k", "mode", "ms/GEMM", "ratio");
    for (auto& sh : shapes) {
        Gemm g(h, sh[0], sh[1], sh[2], 0), gt(h, sh[0], sh[1], sh[2], sms - 1);
        float alone = 0;
        // mode: 0 alone, 1 resident spinner, 2 resident sleeping spinner, 3 chain, 4 chain sleeping
        for (int target = 0; target < 2; target++) {
            Gemm& G = target ? gt : g;
            for (int mode = 0; mode < 5; mode++) {
                std::vector<float> t;
                for (int b = 0; b < BURSTS + 1; b++) {
                    int sleep = (mode == 2 || mode == 4) ? 200 : 0;
                    CK(cudaStreamSynchronize(sa));
                    CK(cudaStreamSynchronize(sb));
                    if (mode == 1 || mode == 2) {
                        seq++;
                        spin_eq<<<1, 1, 0, sb>>>(flags + 1, seq, sleep);
                    }
                    cudaStream_t timed = (mode >= 3) ? sb : sa;
                    CK(cudaEventRecord(e0, timed));
                    for (int i = 0; i < N; i++) {
                        if (mode >= 3) {
                            seq++;
                            store<<<1, 1, 0, sb>>>(flags, seq);
                            spin_eq<<<1, 1, 0, sa>>>(flags, seq, sleep);
                            G.run(sa);
                            cuMemsetD32Async((CUdeviceptr)(flags + 1), seq, 1, sa);
                            spin_eq<<<1, 1, 0, sb>>>(flags + 1, seq, sleep);
                        } else {
                            G.run(sa);
                        }
                    }
                    CK(cudaEventRecord(e1, timed));
                    if (mode == 1 || mode == 2) cuMemsetD32Async((CUdeviceptr)(flags + 1), seq, 1, sa);
                    CK(cudaEventSynchronize(e1));
                    CK(cudaStreamSynchronize(sa));
                    CK(cudaStreamSynchronize(sb));
                    CK(cudaGetLastError());
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (b > 0) t.push_back(ms / N);
                }
                float m = median(t);
                if (target == 0 && mode == 0) alone = m;
                const char* names[] = {"alone", "resident spinner", "resident spinner, nanosleep 200",
                                       "ordering chain", "ordering chain, nanosleep 200"};
                char label[64];
                snprintf(label, sizeof label, "%s%s", names[mode], target ? " [SM target -1]" : "");
                printf("%5dx%5dx%5d %-34s %10.4f %8.3f\n", sh[0], sh[1], sh[2], label, m, m / alone);
            }
        }
    }
    return 0;
}
